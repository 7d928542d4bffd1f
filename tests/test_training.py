"""The training API against the real server: runs, steps, phases and scalars arrive; a server
that is away neither breaks the loop nor loses what it recorded; phases and steps take part in
the analyses and the timeline's lanes like NVTX ranges."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import tracehouse
from query.client import Client
from tests.helpers import request
from tracehouse import training
from tracehouse.batch import BatchBuilder
from tracehouse.channel import ClientSecurity
from tracehouse.cli import main
from tracehouse.v1 import ingest_pb2_grpc

PLAIN = ClientSecurity()  # no credentials, whatever the environment says


def ns(value: Any) -> int:
    return int(pd.Timestamp(value).value)


def closed_port() -> str:
    """An address where nothing listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"127.0.0.1:{port}"


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
    for left in list(training._runs):
        left.end()


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
    assert not (tmp_path / run.run_id).exists(), "an empty spool is removed"

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
        "print(sorted(m for m in ('torch', 'grpc', 'numpy', 'pyarrow', 'agent') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.replace("'", '"')) == []


# -- a server that is away ---------------------------------------------------------------------


def test_a_dead_server_neither_breaks_the_loop_nor_loses_the_run(address: str, client: Client, tmp_path: Path) -> None:
    with tracehouse.run("offline", server=closed_port(), security=PLAIN, spool=tmp_path, flush_interval=0.05) as run:
        train(200)
    report = run.report()
    assert report["steps"] == 200 and report["stored_batches"] == 0 and report["spooled_batches"] >= 1
    assert report["dropped_batches"] == report["dropped_records"] == 0
    spooled = tmp_path / run.run_id
    assert sorted(p.suffix for p in spooled.iterdir()) == ["", *[".batch"] * report["spooled_batches"]]
    assert client.runs().empty

    # the next run on this machine sends what the first left, then removes its spool
    with tracehouse.run("online", server=address, security=PLAIN, spool=tmp_path) as second:
        second._replayer.join(30)
    assert not spooled.exists()
    runs = client.runs(source="user").set_index("run_id")
    assert set(runs.index) == {run.run_id, second.run_id}
    assert runs.loc[run.run_id, "attrs"]["steps"] == "200"
    assert len(events_of(client, run.run_id, "step")) == 200


def test_replay_leaves_the_spools_of_live_runs_alone(address: str, client: Client, tmp_path: Path) -> None:
    live = tracehouse.run("live", server=closed_port(), security=PLAIN, spool=tmp_path)
    live.step(0)
    dead = tracehouse.run("dead", server=closed_port(), security=PLAIN, spool=tmp_path)
    dead.end()
    assert training.replay_spools(tmp_path, address, PLAIN) == dead.report()["spooled_batches"] >= 2
    assert (tmp_path / live.run_id).exists() and not (tmp_path / dead.run_id).exists()
    assert set(client.runs()["run_id"]) == {dead.run_id}
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
    assert answer.loc["forward", "sm_util_avg"] == 50.0

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
    assert (steps.loc[0, "sm_util_avg"], steps.loc[1, "sm_util_avg"]) == (30.0, 31.0)
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
    from tracehouse import demo_train

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
    assert set(profiled["kind"]) == {"step", "cpu_op"}
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
