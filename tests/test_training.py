"""The training API against the real server: runs, steps, phases and scalars arrive; a server
that is away neither breaks the loop nor loses what it recorded; phases and steps take part in
the analyses and the timeline's lanes like NVTX ranges."""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import grpc
import pandas as pd
import pytest

import tracehouse
from agent import training
from agent.runs.runspool import replay_spools
from agent.shipping.batcher import Batcher
from agent.training import current_run, recorder
from agent.training.phases import _Phase
from ingest.validate import check_id
from query.client import Client
from tests.helpers import LateServer, closed_port, request
from tracehouse.batch import BatchBuilder, encode_request
from tracehouse.channel import RECONNECT_MAX_MS, ClientSecurity, encoded_write, open_channel
from tracehouse.cli.main import main
from tracehouse.model import DEFAULT_LIMITS
from tracehouse.v1 import ingest_pb2_grpc

PLAIN = ClientSecurity()  # no credentials, whatever the environment says


def ns(value: Any) -> int:
    return int(pd.Timestamp(value).value)


def events_of(client: Client, run_id: str, *kinds: str) -> pd.DataFrame:
    frame = client.events(kinds=list(kinds), run=run_id)
    return frame.assign(s=frame["start"].map(ns), e=frame["end"].map(ns))


def train(steps: int, phases: tuple[str, ...] = ("dataloader", "forward", "backward")) -> None:
    for i in range(steps):
        tracehouse.step(i)
        for name in phases:
            with tracehouse.phase(name):
                if name == "forward":
                    with tracehouse.phase("attention"):
                        pass
        tracehouse.scalar("loss", 1.0 / (i + 1))
        tracehouse.scalar("lr", 0.1, step=i)


@pytest.fixture(autouse=True)
def no_run_left() -> Any:
    yield
    for left in list(current_run._runs):
        left.end()


def wait_for(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# -- what a run records ------------------------------------------------------------------------


def test_a_run_with_steps_phases_and_scalars_arrives(address: str, client: Client, tmp_path: Path) -> None:
    with tracehouse.run("mlp-bs32", tags={"model": "mlp", "batch": 32}, server=address, security=PLAIN,
                        spool=tmp_path) as run:  # fmt: skip
        assert tracehouse.current() is run
        train(5)
    report = run.report()
    assert tracehouse.current() is None
    assert (report["steps"], report["phases"], report["scalars"]) == (5, 20, 10)
    assert report["spooled_batches"] == 0 and report["stored_batches"] >= 1 and report["dropped_records"] == 0
    assert not Path(report["spool"]).exists() and not list(tmp_path.glob(".*")), "an empty spool is removed"

    [described] = client.runs(source="user").to_dict("records")
    assert (described["run_id"], described["name"], described["host"]) == (run.run_id, "mlp-bs32", run.host)
    assert described["tags"] == {"model": "mlp", "batch": "32"}
    attrs = described["attrs"]
    assert attrs["pid"] == str(os.getpid()) and attrs["status"] == "ok" and attrs["steps"] == "5"
    assert attrs["python"] and attrs["command"] and attrs["nvtx"] == "off"
    assert ns(described["start"]) == run.started_ns and not pd.isna(described["end"])
    end = ns(described["end"])

    steps = events_of(client, run.run_id, "step").sort_values("s")
    assert list(steps["name"]) == ["step"] * 5
    assert [e["step"] for e in steps["extras"]] == [str(i) for i in range(5)]
    assert list(steps["e"][:-1]) == list(steps["s"][1:]), "a step ends where the next begins"
    assert steps["e"].iloc[-1] == end, "the last step ends with the run"
    assert set(steps["tid"]) == {threading.get_native_id()} and set(steps["pid"]) == {os.getpid()}

    phases = events_of(client, run.run_id, "phase")
    assert phases.groupby("name").size().to_dict() == {"dataloader": 5, "forward": 5, "attention": 5, "backward": 5}
    assert set(phases.loc[phases["name"] != "attention", "depth"]) == {0}
    assert set(phases.loc[phases["name"] == "attention", "depth"]) == {1}
    forward = phases[phases["name"] == "forward"].sort_values("s")
    attention = phases[phases["name"] == "attention"].sort_values("s")
    for (_, outer), (_, inner) in zip(forward.iterrows(), attention.iterrows(), strict=True):
        assert outer["s"] <= inner["s"] <= inner["e"] <= outer["e"]
    for _, row in phases.iterrows():  # each phase inside its step
        assert ((steps["s"] <= row["s"]) & (row["e"] <= steps["e"])).sum() == 1

    names = events_of(client, run.run_id, "process", "thread")
    assert set(names["kind"]) == {"process", "thread"}
    assert threading.current_thread().name in set(names["name"])

    samples = client.sql(
        f"SELECT metric, toUnixTimestamp64Nano(ts) AS t, value, gpu, pid FROM samples "
        f"WHERE run_id = '{run.run_id}' ORDER BY metric, t"
    )
    loss = samples[samples["metric"] == "loss"]
    assert list(loss["value"]) == [1.0 / (i + 1) for i in range(5)]
    assert set(samples["gpu"]) == {-1} and set(samples["pid"]) == {os.getpid()}
    lr = samples[samples["metric"] == "lr"]
    assert list(lr["t"]) == list(steps["s"]), "a scalar given its step is stamped at the step's start"


def test_threads_nesting_explicit_step_ends_and_open_phases(address: str, client: Client, tmp_path: Path) -> None:
    run = tracehouse.run("threads", server=address, security=PLAIN, spool=tmp_path)

    def worker() -> None:
        with run.phase("prefetch"), run.phase("decode"):
            pass

    with run.step(0), run.phase("outer"):  # the step ends with the block
        thread = threading.Thread(target=worker, name="loader-0")
        thread.start()
        thread.join()
    run.step(1)
    left_open = run.phase("left open")
    left_open.__enter__()
    report = run.end()
    left_open.__exit__(None, None, None)  # after the end: recorded once, by the end
    assert report["phases"] == 4 and report["steps"] == 2

    phases = events_of(client, run.run_id, "phase").set_index("name")
    assert phases.loc["outer", "tid"] == threading.get_native_id()
    assert phases.loc["prefetch", "tid"] == phases.loc["decode", "tid"] != phases.loc["outer", "tid"]
    assert (phases.loc["prefetch", "depth"], phases.loc["decode", "depth"], phases.loc["outer", "depth"]) == (0, 1, 0)
    [described] = client.runs(source="user").to_dict("records")
    assert phases.loc["left open", "e"] == ns(described["end"]), "an open phase ends with the run"
    steps = events_of(client, run.run_id, "step").sort_values("s")
    assert steps["e"].iloc[0] < steps["s"].iloc[1], "step 0 ended with its block, not at step 1"
    assert "loader-0" in set(events_of(client, run.run_id, "thread")["name"])


def test_bad_values_are_counted_never_raised(address: str, client: Client, tmp_path: Path) -> None:
    with tracehouse.run("bad", tags={"": "no key", "ok": "yes", "k" * 300: "long key"}, server=address,
                        security=PLAIN, spool=tmp_path, run_id="not an id!") as run:  # fmt: skip
        tracehouse.scalar("loss", float("nan"))
        tracehouse.scalar("loss", math.inf)
        tracehouse.scalar("", 1.0)
        tracehouse.scalar("m" * 300, 1.0)
        tracehouse.scalar("loss", "not a number")
        tracehouse.scalar("loss", 0.5)
        with tracehouse.phase("x" * (70 << 10)):
            pass
        with tracehouse.phase(42):  # type: ignore[arg-type]
            pass
    report = run.report()
    assert report["invalid"] == 6 and report["scalars"] == 1 and report["phases"] == 1
    assert report["dropped_batches"] == 0, "nothing the server would refuse was sent"
    [described] = client.runs(source="user").to_dict("records")
    assert described["tags"] == {"ok": "yes"} and described["attrs"]["invalid"] == "6"
    assert run.run_id.startswith("bad.") and run.run_id.endswith(f".{os.getpid()}")
    assert list(events_of(client, run.run_id, "phase")["name"]) == ["42"]


def test_outside_a_run_and_disabled_runs_record_nothing(address: str, client: Client, tmp_path: Path) -> None:
    with tracehouse.step(3), tracehouse.phase("nowhere"):
        tracehouse.scalar("loss", 1.0)
    with tracehouse.run("off", server=address, security=PLAIN, spool=tmp_path, enabled=False) as run:
        train(3)
    assert run.report()["steps"] == 0
    assert client.runs().empty


def test_import_tracehouse_is_light() -> None:
    """Training scripts import tracehouse first thing: neither torch nor grpc comes with it."""
    code = (
        "import sys, tracehouse\n"
        "tracehouse.step(1)\n"
        "with tracehouse.phase('x'): pass\n"
        "tracehouse.scalar('loss', 1.0)\n"
        "heavy = ('torch', 'grpc', 'numpy', 'pyarrow')\n"
        "heavy += ('agent.telemetry', 'agent.traces', 'agent.shipping', 'agent.runs')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.replace("'", '"')) == []


# -- a server that is away ---------------------------------------------------------------------


def test_a_dead_server_neither_breaks_the_loop_nor_loses_the_run(
    late: LateServer, client: Client, tmp_path: Path
) -> None:
    with tracehouse.run("offline", server=late.address, security=PLAIN, spool=tmp_path, flush_interval=0.05) as run:
        train(200)
    report = run.report()
    assert report["steps"] == 200 and report["stored_batches"] == 0 and report["spooled_batches"] >= 1
    assert report["dropped_batches"] == report["dropped_records"] == 0
    spooled = Path(report["spool"])
    assert spooled.parent == tmp_path and spooled.name == f"{run.run_id}.{run.session}"
    assert sorted(p.name for p in spooled.iterdir() if p.suffix != ".batch") == ["lock", "server"]
    assert len(list(spooled.glob("*.batch"))) == report["spooled_batches"]
    assert (spooled / "server").read_text().strip() == late.address, "the spool names the server it is for"
    assert client.runs().empty

    # the next run on this machine aimed at that server sends what the first left, then removes its spool
    late.start()
    with tracehouse.run("online", server=late.address, security=PLAIN, spool=tmp_path) as second:
        second._replayer.join(30)
    assert not spooled.exists()
    runs = client.runs(source="user").set_index("run_id")
    assert set(runs.index) == {run.run_id, second.run_id}
    assert runs.loc[run.run_id, "attrs"]["steps"] == "200"
    assert len(events_of(client, run.run_id, "step")) == 200


def test_replay_leaves_the_spools_of_live_runs_and_other_servers_alone(
    address: str, late: LateServer, client: Client, tmp_path: Path
) -> None:
    live = tracehouse.run("live", server=late.address, security=PLAIN, spool=tmp_path)
    live.step(0)
    dead = tracehouse.run("dead", server=late.address, security=PLAIN, spool=tmp_path)
    dead.end()
    elsewhere = tracehouse.run("elsewhere", server=closed_port(), security=PLAIN, spool=tmp_path)
    elsewhere.end()
    being_made = tmp_path / ".starting.run"  # a run's folder before it is locked and renamed
    being_made.mkdir()
    (being_made / "lock").touch()
    assert replay_spools(tmp_path, address, PLAIN) == 0, "every spool left is for another server"
    late.start()
    assert replay_spools(tmp_path, late.address, PLAIN) == dead.report()["spooled_batches"] >= 2
    assert Path(live.report()["spool"]).exists() and not Path(dead.report()["spool"]).exists()
    assert Path(elsewhere.report()["spool"]).exists() and being_made.exists()
    stored = set(client.runs()["run_id"])  # and the live run's own, sent by its own shipper
    assert dead.run_id in stored and elsewhere.run_id not in stored
    live.end()


# -- phases and steps in the analyses ----------------------------------------------------------


def test_phases_and_steps_take_part_in_every_range_analysis(
    address: str, client: Client, ingest: ingest_pb2_grpc.IngestStub, tmp_path: Path
) -> None:
    with tracehouse.run("analysed", server=address, security=PLAIN, spool=tmp_path) as run:
        train(4, phases=("dataloader", "forward"))
    phases = events_of(client, run.run_id, "phase", "step")
    tid = threading.get_native_id()
    forward = phases[phases["name"] == "forward"].sort_values("s")
    # GPU work launched from inside each forward (so inside its step too), as a trace of the
    # same run would hold it, and the host's telemetry during the run
    builder = BatchBuilder(f"{run.run_id}-gpu", run_id=run.run_id, host=run.host)
    for k, (s, e) in enumerate(zip(forward["s"], forward["e"], strict=True)):
        middle = (s + e) // 2  # launched inside the phase, and done before it ends
        builder.add_events("kernel", [middle], [e], "gemm", gpu=0, stream=7, pid=os.getpid(), tid=tid,
                           correlation_id=k + 1, launch_start=s)  # fmt: skip
    first, last = int(phases["s"].min()), int(phases["e"].max())
    ticks = list(range(first, last, max(1, (last - first) // 50)))
    builder.add_samples("gpu.util_pct", ticks, [50.0] * len(ticks), gpu=0)
    assert not ingest.Write(request(builder), timeout=30).duplicate

    projected = client.nvtx_gpu(run=run.run_id, limit=1000)
    summary = projected["summary"].set_index("name")
    assert summary.loc["forward", "instances"] == 4 and summary.loc["forward", "with_gpu_work"] == 4
    assert summary.loc["step", "instances"] == 4 and summary.loc["step", "with_gpu_work"] == 4, (
        "a step and the phase inside it, both at depth 0, each find the work launched inside"
    )
    assert summary.loc["dataloader", "with_gpu_work"] == 0 and summary.loc["forward", "kernels"] == 4
    assert set(projected["ranges"]["kind"]) == {"phase", "step"}

    answer = client.phases(run=run.run_id).set_index("name")
    assert {"dataloader", "forward", "step"} <= set(answer.index)
    assert answer.loc["forward", "busy_pct"] > 0 and answer.loc["dataloader", "busy_pct"] == 0
    assert answer.loc["forward", "gpu_util_pct_avg"] == 50.0

    second = client.events(kinds=["phase"], run=run.run_id, range="forward", instance=2)
    assert ns(second["start"].min()) >= int(forward["s"].iloc[1])
    lanes = client.lanes(buckets=100, run=run.run_id)
    found = set(zip(lanes["lane"], lanes["depth"], strict=True))
    assert {("phase", 0), ("phase", 1), ("step", 0), ("gpu", 0)} <= found


def test_phases_of_a_run_without_a_trace_have_telemetry_and_no_busy_time(
    address: str, client: Client, ingest: ingest_pb2_grpc.IngestStub, tmp_path: Path
) -> None:
    with tracehouse.run("untraced", server=address, security=PLAIN, spool=tmp_path) as run:
        train(3, phases=("forward",))
    assert client.phases(run=run.run_id).empty, "no GPU of the host has telemetry or work: the phases belong to none"
    # the agent's telemetry of the host's two GPUs (another run) during the training
    first, last = run.started_ns, ns(client.runs(source="user")["end"][0])
    ticks = list(range(first, last, max(1, (last - first) // 100)))
    builder = BatchBuilder("agent-telemetry", run_id="agent.run", host=run.host)
    for gpu in (0, 1):
        builder.add_samples("gpu.util_pct", ticks, [30.0 + gpu] * len(ticks), gpu=gpu)
    assert not ingest.Write(request(builder), timeout=30).duplicate
    answer = client.phases(run=run.run_id)
    assert set(zip(answer["name"], answer["gpu"], strict=True)) == {(n, g) for n in ("forward", "attention", "step")
                                                                     for g in (0, 1)}  # fmt: skip
    assert answer["busy_pct"].isna().all(), "no trace of GPU work: busy time unknown, not zero"
    steps = answer[answer["name"] == "step"].set_index("gpu")
    assert (steps.loc[0, "gpu_util_pct_avg"], steps.loc[1, "gpu_util_pct_avg"]) == (30.0, 31.0)
    summary = client.nvtx_gpu(run=run.run_id)["summary"].set_index("name")
    assert summary.loc["forward", "instances"] == 3 and summary.loc["forward", "with_gpu_work"] == 0


def test_query_phases_from_the_cli(address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with tracehouse.run("cli", server=address, security=PLAIN, spool=tmp_path) as run:
        train(2)
    assert main(["query", "nvtx", "--run", run.run_id, "--server", address, "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {row["name"] for row in listed} == {"dataloader", "forward", "attention", "backward", "step"}
    assert main(["query", "nvtx-gpu", "--run", run.run_id, "--server", address, "--format", "json"]) == 0
    assert "attention" in capsys.readouterr().out


# -- demo-train --------------------------------------------------------------------------------


def test_demo_train_without_torch_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert main(["demo-train", "--server", closed_port()]) == 2
    assert "pip install" in capsys.readouterr().err


def test_demo_train_runs_a_real_loop_and_imports_its_own_trace(
    address: str, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    from tracehouse.cli import demo_train

    monkeypatch.setenv("TRACEHOUSE_HOME", str(tmp_path))
    result = demo_train.train(steps=8, server=address, security=PLAIN)
    runs = client.runs().set_index("run_id")
    assert runs.loc[result["run_id"], "source"] == "user"
    steps = events_of(client, result["run_id"], "step")
    assert len(steps) == 8
    phases = set(events_of(client, result["run_id"], "phase")["name"])
    assert {"dataloader", "forward", "backward", "optimizer"} <= phases
    loss = client.sql(f"SELECT count() AS n FROM samples WHERE run_id = '{result['run_id']}' AND metric = 'loss'")
    assert int(loss["n"][0]) == 8
    assert result["trace"].endswith(".json.gz")
    imported = result["import"]["run_id"]  # the importer recognises a PyTorch-profiler trace
    assert runs.loc[imported, "source"] == "kineto" and runs.loc[imported, "tags"]["training_run"] == result["run_id"]
    profiled = client.events(run=imported, kinds=["step", "cpu_op"])
    assert set(profiled["kind"]) == {"cpu_op"}  # steps and phases come from the API alone
    assert set(profiled["pid"]) == set(steps["pid"]), "the trace and the run describe one process"


def test_records_travel_in_few_large_batches(tmp_path: Path) -> None:
    """A batch closes at BATCH_EVENTS events (or its age): a burst of records is a few batches."""
    with tracehouse.run("burst", server=closed_port(), security=PLAIN, spool=tmp_path, flush_interval=3600) as run:
        for _ in range(2 * training.BATCH_EVENTS + 1):
            with tracehouse.phase("tiny"):
                pass
    report = run.report()
    assert report["phases"] == 2 * training.BATCH_EVENTS + 1 and report["dropped_records"] == 0
    assert report["spooled_batches"] == 4, "the run's start, two full batches, and the rest with the run's end"


# -- clocks, ids, ends and tensors -------------------------------------------------------------


def test_a_wall_clock_set_back_inside_a_phase_loses_nothing(
    address: str, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Times are the run's start plus the monotonic clock: a wall clock set back an hour in a
    phase changes nothing, and a phase whose end still came out before its start (the clamp)
    ends where it starts rather than having its batch refused."""
    with tracehouse.run("clock", server=address, security=PLAIN, spool=tmp_path) as run:
        tracehouse.step(0)
        with monkeypatch.context() as wall, tracehouse.phase("set back"):
            wall.setattr(time, "time_ns", lambda: run.started_ns - 3_600_000_000_000)
        now = time.perf_counter_ns()
        ticks = iter([now, now - 5_000_000_000])  # a clock that goes back: the end is clamped to the start
        with monkeypatch.context() as backwards:
            backwards.setattr("agent.training.phases._perf_ns", lambda: next(ticks))
            with tracehouse.phase("backwards"):
                pass
    report = run.report()
    assert report["dropped_batches"] == 0 and report["spooled_batches"] == 0 and report["phases"] == 2
    spans = {row["name"]: (row["s"], row["e"]) for row in events_of(client, run.run_id, "phase").to_dict("records")}
    (set_back_start, set_back_end), (backwards_start, backwards_end) = spans["set back"], spans["backwards"]
    assert run.started_ns <= set_back_start <= set_back_end <= backwards_start == backwards_end
    [described] = client.runs(source="user").to_dict("records")
    assert ns(described["end"]) >= ns(described["start"]) == run.started_ns


def test_processes_given_one_run_id_send_batches_of_their_own(address: str, client: Client, tmp_path: Path) -> None:
    """A resumed job or several ranks with the same `run_id=`: batch ids carry a session of
    each process (start and pid), so no batch is refused as another's with other content."""
    run_id = "r" * 100  # the longest a run id may be: the batch ids still fit
    first = tracehouse.run("resumed", server=address, security=PLAIN, spool=tmp_path, run_id=run_id)
    second = tracehouse.run("resumed", server=address, security=PLAIN, spool=tmp_path, run_id=run_id)
    for run in (first, second):
        with run.step(0), run.phase(f"phase of {run.session}"):
            pass
    first.end()
    second.end()
    assert first.session != second.session
    prefixes = {first.batcher.batch_prefix, second.batcher.batch_prefix}
    assert len(prefixes) == 2 and all(p.startswith("r" * 80) for p in prefixes)
    for prefix in prefixes:
        check_id("batch_id", f"{prefix}/99999999", DEFAULT_LIMITS)
    for run in (first, second):
        report = run.report()
        assert report["dropped_batches"] == report["spooled_batches"] == 0 and report["stored_batches"] >= 2
    phases = set(events_of(client, run_id, "phase")["name"])
    assert phases == {f"phase of {first.session}", f"phase of {second.session}"}


def test_batcher_batch_prefix_is_optional() -> None:
    sent: list[str] = []
    agent = Batcher("agent.run", "h", lambda batch: sent.append(batch.batch_id))
    agent.describe_run(run_id="agent.run", name="a", host="h", source="agent", start=1)
    agent.flush()
    prefixed = Batcher("run", "h", lambda batch: sent.append(batch.batch_id), batch_prefix="run/session")
    prefixed.describe_run(run_id="run", name="a", host="h", source="user", start=1)
    prefixed.flush()
    assert sent == ["agent.run/00000001", "run/session/00000001"]


def test_a_server_back_before_the_end_gets_everything(late: LateServer, client: Client, tmp_path: Path) -> None:
    """A run that started while the server was away: its end tries the spool at once (the
    shipper may be waiting out a long backoff) and leaves nothing behind."""
    run = tracehouse.run("late", server=late.address, security=PLAIN, spool=tmp_path, end_timeout=20)
    train(3)
    wait_for(lambda: run.spool.batches >= 1)  # the run's start went to the spool
    late.start()
    report = run.end()
    assert report["spooled_batches"] == 0 and report["stored_batches"] >= 2 and report["dropped_batches"] == 0
    assert not Path(report["spool"]).exists()
    [described] = client.runs(source="user").to_dict("records")
    assert described["run_id"] == run.run_id and described["attrs"]["steps"] == "3"


def test_a_channel_of_its_own_is_tried_at_once_where_a_refused_connection_waits_out_its_backoff(
    late: LateServer, client: Client
) -> None:
    """gRPC shares one connection among a process's channels to an address; once refused, it waits out a
    backoff (a second, growing to two minutes) and a new channel's calls fail at once meanwhile. The end's
    shipper opens a connection of its own (`fresh`), so a server back just before the end is reached."""
    batch = BatchBuilder("fresh/00000001", run_id="fresh", host="h")
    batch.add_samples("gpu.util_pct", [time.time_ns()], [50.0], gpu=0)
    payload = encode_request(batch.build())
    with open_channel(late.address) as refused:
        with pytest.raises(grpc.RpcError):
            encoded_write(refused)(payload, timeout=5)
        late.start()
        with open_channel(late.address, fresh=True) as fresh:
            assert not encoded_write(fresh)(payload, timeout=5).duplicate
    assert int(client.sql("SELECT count() AS n FROM samples WHERE host = 'h'")["n"][0]) == 1


def test_a_server_back_after_long_away_is_reached_within_the_reconnect_bound(late: LateServer) -> None:
    """Turned away for 8 s, gRPC's own backoff would wait 5 to 8 s more before it tries again (1 s growing
    1.6 times a try, up to two minutes); a channel tries within RECONNECT_MAX_MS."""
    host, port = late.address.rsplit(":", 1)
    tries: list[float] = []
    away = socket.create_server((host, int(port)))  # takes each connection and closes it

    def turn_away() -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = away.accept()
                tries.append(time.monotonic())
                connection.close()

    threading.Thread(target=turn_away, daemon=True).start()
    channel = open_channel(late.address)
    ready = grpc.channel_ready_future(channel)  # tries to connect until it is
    try:
        with away:
            wait_for(lambda: len(tries) >= 1)
            wait_for(lambda: tries[-1] - tries[0] >= 8)
            away.shutdown(socket.SHUT_RDWR)  # wakes the accept
        late.start()
        back = time.monotonic()
        ready.result(timeout=30)
        waited = time.monotonic() - back
    finally:  # a future left subscribed holds up the channel's close
        ready.cancel()
        channel.close()
    # gRPC's next try after four: 6.5 s, jittered by a fifth; within the bound's 2 s, 2.4 s
    assert RECONNECT_MAX_MS <= 2000
    assert len(tries) >= 4 and waited < 4.0, f"{waited:.1f} s after it was back"


def test_a_server_away_at_the_end_costs_one_failed_send(tmp_path: Path) -> None:
    run = tracehouse.run("away", server=closed_port(), security=PLAIN, spool=tmp_path, end_timeout=60)
    train(3)
    started = time.monotonic()
    report = run.end()
    assert time.monotonic() - started < 10, "the first failed send ends the end's try"
    assert report["spooled_batches"] >= 2 and report["dropped_batches"] == 0


class FakeTensor:
    """Enough of a torch tensor: `detach` shares the value (as a view shares storage), `clone`
    copies it, `+=` changes it in place; `is_cuda` tensors copy to the host with `to`."""

    def __init__(self, cell: list[float], is_cuda: bool = False, events: list[str] | None = None) -> None:
        self.cell = cell
        self.is_cuda = is_cuda
        self.events = events if events is not None else []

    def detach(self) -> FakeTensor:
        return FakeTensor(self.cell, self.is_cuda, self.events)

    def clone(self) -> FakeTensor:
        return FakeTensor(list(self.cell), self.is_cuda, self.events)

    def numel(self) -> int:
        return len(self.cell)

    def to(self, device: str, non_blocking: bool = False) -> FakeTensor:
        assert device == "cpu" and non_blocking
        self.events.append("copy")
        return FakeTensor(list(self.cell), False, self.events)

    def item(self) -> float:
        assert not self.is_cuda
        self.events.append("item")
        [value] = self.cell
        return value

    def __iadd__(self, other: float) -> FakeTensor:
        self.cell[0] += other
        return self


def scalars(client: Client, run_id: str, metric: str) -> list[float]:
    found = client.sql(
        f"SELECT value FROM samples WHERE run_id = '{run_id}' AND metric = '{metric}' ORDER BY ts"
    )  # fmt: skip
    return list(found["value"])


def test_a_tensor_is_read_as_it_was_when_given(address: str, client: Client, tmp_path: Path) -> None:
    with tracehouse.run("tensor", server=address, security=PLAIN, spool=tmp_path) as run:
        total = FakeTensor([0.0])
        for _ in range(5):
            total += 1
            tracehouse.scalar("seen", total)
        tracehouse.scalar("many", FakeTensor([1.0, 2.0]))  # not one value: refused, not copied
    assert run.report()["invalid"] == 1
    assert scalars(client, run.run_id, "seen") == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_a_cuda_tensor_is_copied_at_once_and_read_after_its_event(
    address: str, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []

    class Event:
        def record(self) -> None:
            events.append("record")

        def synchronize(self) -> None:
            events.append("synchronize")

    fake_torch, fake_cuda = types.ModuleType("torch"), types.ModuleType("torch.cuda")
    fake_cuda.Event = Event  # type: ignore[attr-defined]
    fake_torch.cuda = fake_cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    with tracehouse.run("cuda", server=address, security=PLAIN, spool=tmp_path, nvtx=False) as run:
        loss = FakeTensor([0.5], is_cuda=True, events=events)
        tracehouse.scalar("loss", loss)
        assert events == ["copy", "record"], "the copy starts on the caller's thread"
        loss += 1
    assert events == ["copy", "record", "synchronize", "item"]
    assert scalars(client, run.run_id, "loss") == [0.5]


class FakeNvtx:
    def __init__(self, fail_pushes: int) -> None:
        self.fail_pushes = fail_pushes
        self.calls: list[str] = []

    def range_push(self, name: str) -> None:
        if self.fail_pushes:
            self.fail_pushes -= 1
            raise RuntimeError("no NVTX")
        self.calls.append(f"push {name}")

    def range_pop(self) -> None:
        self.calls.append("pop")

    def range_start(self, name: str) -> int:
        self.calls.append(f"start {name}")
        return 1

    def range_end(self, handle: int) -> None:
        self.calls.append("end")


def test_a_phase_whose_nvtx_push_fails_is_left_out(
    address: str, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvtx = FakeNvtx(fail_pushes=1)
    monkeypatch.setattr(recorder, "_nvtx_module", lambda wanted: nvtx)
    with tracehouse.run("nvtx", server=address, security=PLAIN, spool=tmp_path, nvtx=True) as run:
        tracehouse.step(0)
        with tracehouse.phase("failed push"):
            pass
        with tracehouse.phase("pushed"):
            pass
    assert run.report()["phases"] == 1 and run.failures == 1
    assert nvtx.calls == ["start step 0", "push pushed", "pop", "end"]
    phases = events_of(client, run.run_id, "phase")
    assert list(phases["name"]) == ["pushed"] and phases["s"].min() >= run.started_ns


def test_phases_closed_out_of_order_take_the_lowest_free_depth(tmp_path: Path) -> None:
    """Depth is a lane: a phase takes the lowest one no open phase of its thread holds, so
    phases in one lane never overlap, however they close."""
    run = tracehouse.run("lanes", server=closed_port(), security=PLAIN, spool=tmp_path)
    a, b, c, d = (_Phase(run, name) for name in "abcd")
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)  # a closes while b, entered inside it, goes on
    c.__enter__()
    d.__enter__()
    assert (a.depth, b.depth, c.depth, d.depth) == (0, 1, 0, 2)
    for phase in (d, c, b):
        phase.__exit__(None, None, None)
    with _Phase(run, "e") as e:
        assert e.depth == 0
    run.end()


def test_the_most_recent_run_is_current_and_atexit_is_registered_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registered: list[Any] = []
    monkeypatch.setattr(current_run.atexit, "register", registered.append)
    monkeypatch.setattr(current_run, "_atexit_registered", False)
    first, second, third = (
        tracehouse.run(name, server=closed_port(), security=PLAIN, spool=tmp_path, end_timeout=0)
        for name in ("first", "second", "third")
    )
    assert tracehouse.current() is third and registered == [current_run._end_all]
    third.end()
    assert tracehouse.current() is second
    first.end()
    assert tracehouse.current() is second
    second.end()
    assert tracehouse.current() is None and tracehouse.run is training.Run


@pytest.mark.parametrize("grpc_first", [False, True])
def test_starting_a_run_is_light_and_turns_grpc_fork_handlers_off(tmp_path: Path, grpc_first: bool) -> None:
    """No agent daemon (psutil) for a run id; gRPC's fork handlers off (forked DataLoader
    workers crashed with them on), unless grpc was imported before: then they are the caller's."""
    code = (
        f"import sys, os{', grpc' if grpc_first else ''}, tracehouse\n"
        "run = tracehouse.run('light', server='127.0.0.1:1', spool=sys.argv[1], nvtx=False, end_timeout=0)\n"
        "print(sorted(m for m in ('agent.daemon', 'psutil', 'torch') if m in sys.modules))\n"
        "print(os.environ.get('GRPC_ENABLE_FORK_SUPPORT'))\n"
        "run.end()\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=environment)
    assert done.stdout.split() == ["[]", "None" if grpc_first else "false"], done.stderr
