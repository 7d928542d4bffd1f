"""The real agent against the real server on loopback: nothing sampled is lost or stored twice,
whatever happens to the server."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.daemon import Agent, AgentConfig
from agent.shipping.spool import Spool
from agent.telemetry.simulated import SimulatedBackend
from query.client import Client
from store.store import Store
from tests.helpers import wait_until
from tests.test_serve import serve
from tracehouse.cli.serve import Server, create_server
from tracehouse.model import DEFAULT_LIMITS


def config(server: str, spool: Path, **changes: object) -> AgentConfig:
    base = AgentConfig(
        server=server,
        spool=spool,
        interval=0.02,
        slow_interval=0.1,
        flush_interval=0.2,
        shutdown_timeout=15.0,
        max_backoff=0.5,
        host="test-host",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def sample_count(store: Store, run_id: str | None = None) -> tuple[int, int]:
    """(rows, distinct rows) of samples, for one run or all."""
    where = f"WHERE run_id = '{run_id}'" if run_id else ""
    table = store.query(
        f"SELECT count() AS n, uniqExact(run_id, host, gpu, pid, metric, ts) AS u FROM {{db}}.samples {where}"
    )
    return int(table.column("n")[0].as_py()), int(table.column("u")[0].as_py())


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_everything_sampled_is_stored_once(server: Server, store: Store, tmp_path: Path) -> None:
    agent = Agent(config(f"127.0.0.1:{server.port}", tmp_path / "spool"), SimulatedBackend(2))
    agent.start()
    time.sleep(1.5)
    report = agent.stop()
    assert report["sampled"] and report["stored"] == report["sampled"]
    assert (report["dropped"], report["spooled"], report["invalid"]) == (0, 0, 0)
    assert sample_count(store) == (report["sampled"], report["sampled"])
    with Client(f"127.0.0.1:{server.port}") as client:
        runs = client.runs()
        assert list(runs["run_id"]) == [agent.run_id]
        assert runs["end"].notna().all(), "the run is closed on stop"
        assert list(client.devices()["uuid"]) == [d.uuid for d in SimulatedBackend(2).devices()]
        util = client.series("gpu.util_pct", run=agent.run_id, gpu=0, max_points=10_000)
        assert util["count"].sum() >= 1.5 / 0.02 * 0.8
        assert client.series("host.cpu_pct", run=agent.run_id)["count"].sum() > 0
        assert "process" in set(client.events(run=agent.run_id)["kind"])


def test_an_agent_whose_clock_runs_50_ms_ahead_measures_its_offset_to_the_server(
    server: Server, store: Store, tmp_path: Path
) -> None:
    ahead = 50_000_000
    agent = Agent(
        config(f"127.0.0.1:{server.port}", tmp_path / "spool"), SimulatedBackend(1), lambda: time.time_ns() + ahead
    )
    before = time.time_ns() + ahead

    def records() -> list[dict[str, Any]]:
        return store.query(
            """SELECT ts, gpu, host, sumIf(value, metric = 'agent.clock_offset_ns') AS offset,
                      sumIf(value, metric = 'agent.clock_offset_uncertainty_ns') AS uncertainty, count() AS n
               FROM {db}.samples WHERE run_id = {run:String} AND metric LIKE 'agent.clock_offset%'
               GROUP BY ts, gpu, host ORDER BY ts""",
            {"run": agent.run_id},
        ).to_pylist()

    agent.start()
    try:
        wait_until(lambda: len(records()) >= 3, 60, "three records, one after each write", every=0.2)
    finally:
        report = agent.stop()
    assert report["stored"] == report["sampled"]
    rows = records()
    for row in rows:
        assert (row["n"], row["gpu"], row["host"]) == (2, -1, "test-host")
        assert row["ts"].value >= before // 1_000_000 * 1_000_000, "stamped on the agent's own clock"
        # the server's clock less the host's: -50 ms, within its uncertainty
        assert abs(row["offset"] + ahead) <= row["uncertainty"], row
    assert min(row["uncertainty"] for row in rows) < ahead / 2, "a round trip on loopback: well under 50 ms"


def test_server_down_at_start_then_the_spool_is_replayed(store: Store, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    away = Agent(config(f"127.0.0.1:{closed_port()}", spool, shutdown_timeout=0.5), SimulatedBackend(2))
    away.start()
    time.sleep(1.0)
    first = away.stop()
    assert first["stored"] == 0 and first["dropped"] == 0
    assert first["spooled"] == first["sampled"] > 0
    server = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS)
    try:
        back = Agent(config(f"127.0.0.1:{server.port}", spool), SimulatedBackend(2))
        back.start()
        time.sleep(0.5)
        second = back.stop()
    finally:
        server.stop(5)
    assert second["recovered"] == first["sampled"], "the earlier session's batches were replayed"
    assert second["stored"] == second["sampled"] and second["spooled"] == 0
    assert sample_count(store, away.run_id) == (first["sampled"], first["sampled"])
    assert sample_count(store, back.run_id) == (second["sampled"], second["sampled"])
    assert not list(spool.glob("*.batch"))


def test_server_killed_and_restarted_mid_run(store: Store, tmp_path: Path) -> None:
    server = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS)
    port = server.port
    agent = Agent(config(f"127.0.0.1:{port}", tmp_path / "spool"), SimulatedBackend(3))
    agent.start()
    time.sleep(0.7)
    server.stop(grace=0)
    time.sleep(1.0)  # the agent spools meanwhile
    assert agent.spool.batches > 0
    server = create_server(store, f"127.0.0.1:{port}", DEFAULT_LIMITS)
    try:
        time.sleep(0.7)
        report = agent.stop()
    finally:
        server.stop(5)
    assert report["stored"] == report["sampled"] and report["dropped"] == 0 and report["spooled"] == 0
    assert sample_count(store) == (report["sampled"], report["sampled"])


def test_server_restarted_with_a_new_store(tmp_path: Path) -> None:
    old_store = Store.open(f"chdb://{tmp_path / 'old'}", DEFAULT_LIMITS)
    server = create_server(old_store, "127.0.0.1:0", DEFAULT_LIMITS)
    port = server.port
    agent = Agent(config(f"127.0.0.1:{port}", tmp_path / "spool"), SimulatedBackend(2))
    agent.start()
    time.sleep(0.6)
    server.stop(grace=5)
    old_rows = sample_count(old_store)[0]
    old_store.close()
    time.sleep(0.5)
    new_store = Store.open(f"chdb://{tmp_path / 'new'}", DEFAULT_LIMITS)
    server = create_server(new_store, f"127.0.0.1:{port}", DEFAULT_LIMITS)
    try:
        time.sleep(0.6)
        report = agent.stop()
        new_rows, distinct = sample_count(new_store)
    finally:
        server.stop(5)
        new_store.close()
    assert report["stored"] == report["sampled"] and report["dropped"] == 0
    assert old_rows > 0 and new_rows == distinct > 0
    assert old_rows + new_rows == report["sampled"]


def test_a_full_spool_drops_the_oldest_and_says_how_much(tmp_path: Path) -> None:
    agent = Agent(
        config(f"127.0.0.1:{closed_port()}", tmp_path / "spool", spool_max_bytes=40_000, shutdown_timeout=0.3),
        SimulatedBackend(2),
    )
    agent.start()
    time.sleep(2.0)
    report = agent.stop()
    assert report["dropped"] > 0 and report["spooled"] > 0
    assert report["sampled"] == report["stored"] + report["spooled"] + report["dropped"]
    assert sum(p.stat().st_size for p in (tmp_path / "spool").glob("*.batch")) <= 40_000


def _agent_cli(*args: str, env: dict[str, str], **popen: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tracehouse.cli.main", "agent", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **popen,  # type: ignore[arg-type]
    )


def test_done_when_server_killed_and_restarted_under_a_running_agent(tmp_path: Path) -> None:
    """`tracehouse serve` + `tracehouse agent --simulate 4`, the server killed (-9) and
    restarted in the middle: dropped 0, stored == sampled, and the samples are queryable."""
    port = closed_port()
    env = {**os.environ, "TRACEHOUSE_HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    with serve(home=tmp_path, listen=f"127.0.0.1:{port}") as (first, _, _):
        agent = _agent_cli("--simulate", "4", "--server", f"127.0.0.1:{port}", "--duration", "7",
                           "--interval", "0.05", "--flush-interval", "0.5", env=env)  # fmt: skip
        time.sleep(2.5)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    time.sleep(1.5)
    with serve(home=tmp_path, listen=f"127.0.0.1:{port}") as (second, address, _):
        out, err = agent.communicate(timeout=90)
        assert agent.returncode == 0, err
        report = json.loads(out.strip().splitlines()[-1])
        with Client(address) as client:
            rows = client.sql(
                "SELECT count() AS n, uniqExact(run_id, host, gpu, pid, metric, ts) AS u FROM samples"
            ).iloc[0]
            series = client.series("gpu.util_pct", run=report["run_id"], max_points=50)
        second.send_signal(signal.SIGTERM)
    assert report["dropped"] == 0 and report["stored"] == report["sampled"] > 0, report
    assert rows["n"] == rows["u"] == report["sampled"]
    assert set(series["gpu"]) == {0, 1, 2, 3} and len(series) <= 4 * 50
    assert "lost" in err and "is back" in err, "one log line when the server goes, one when it returns"


def test_unwritable_spool_disk_drops_and_counts_without_crashing(tmp_path: Path) -> None:
    """The spool's disk refuses writes (RLIMIT_FSIZE: every write past 1 KiB fails) while
    the server is away: the agent keeps sampling, and what it drops is counted."""
    import resource

    def small_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    env = {**os.environ, "TRACEHOUSE_HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    agent = _agent_cli("--simulate", "2", "--server", f"127.0.0.1:{closed_port()}", "--duration", "2.5",
                       "--flush-interval", "0.5", env=env, preexec_fn=small_disk)  # fmt: skip
    out, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["sampled"] > 0 and report["stored"] == 0
    assert report["dropped"] + report["spooled"] == report["sampled"] and report["dropped"] > 0
    assert "cannot write to the spool" in err


def test_agent_refuses_bad_options(tmp_path: Path) -> None:
    env = {**os.environ, "TRACEHOUSE_HOME": str(tmp_path)}
    for args, message in (
        (["--interval", "0"], "positive number of seconds"),
        (["--interval", "nan"], "positive number of seconds"),
        (["--spool-max-bytes", "lots"], "not a size"),
        (["--simulate", "-2"], "above 0"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "tracehouse.cli.main", "agent", *args], env=env, capture_output=True, text=True
        )
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
    empty = tmp_path / "token"
    empty.write_text("\n")
    result = subprocess.run(
        [sys.executable, "-m", "tracehouse.cli.main", "agent", "--simulate", "1", "--token-file", str(empty)],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode != 0 and "is empty" in result.stderr


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this machine has a GPU")
def test_agent_without_driver_suggests_simulate(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tracehouse.cli.main", "agent", "--duration", "1"],
        env={**os.environ, "TRACEHOUSE_HOME": str(tmp_path)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1 and "--simulate" in result.stderr


def test_up_runs_server_agent_and_ui_with_the_demo_and_stops_cleanly(tmp_path: Path) -> None:
    """The README's first command, `tracehouse up`, with --demo, on a machine without a GPU."""
    port, ui_port = closed_port(), closed_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tracehouse.cli.main", "up", "--listen", f"127.0.0.1:{port}", "--ui-port", str(ui_port),
         "--demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TRACEHOUSE_HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert process.stdout is not None
    banner = [process.stdout.readline() for _ in range(5)]
    assert banner[0].startswith(f"tracehouse is up: gRPC on 127.0.0.1:{port}, agent sampling 2 simulated GPUs")
    assert banner[1].strip() == f"UI: http://127.0.0.1:{ui_port}" and banner[4].strip() == "Ctrl-C stops it."
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/_stcore/health", timeout=10) as health:
        assert health.status == 200
    time.sleep(2.0)
    with Client(f"127.0.0.1:{port}") as client:
        runs = client.runs(source="agent")
        util = client.series("gpu.util_pct", run=runs["run_id"][0])
        demo = client.runs(source="nsys").set_index("name")
        phases = client.phases(run=demo.loc["demo tuned", "run_id"])
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["stored"] == report["sampled"] > 0 and report["dropped"] == 0
    assert set(util["gpu"]) == {0, 1} and util["count"].sum() > 0
    assert (tmp_path / "store").is_dir(), "the embedded store lives under TRACEHOUSE_HOME"
    assert set(demo.index) == {"demo baseline", "demo tuned"} and all(t == {"demo": "true"} for t in demo["tags"])
    assert set(phases["name"]) >= {"train_step", "forward", "backward"}
    assert phases["gpu_util_pct_avg"].notna().all(), "the demo's telemetry lies under its runs"
    with pytest.raises(OSError):  # the UI stopped with the rest
        urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/_stcore/health", timeout=5)


def test_a_crashed_agents_spool_is_replayed_once_by_the_next(tmp_path: Path) -> None:
    """kill -9 while the server is away: the next agent on the same spool replays what the
    first one spooled, and a replay of a batch the server already had stores nothing twice."""

    spool = tmp_path / "spool"
    env = {**os.environ, "TRACEHOUSE_HOME": str(tmp_path)}
    crashed = _agent_cli("--simulate", "2", "--server", f"127.0.0.1:{closed_port()}", "--spool", str(spool),
                         "--flush-interval", "0.3", env=env)  # fmt: skip
    time.sleep(3.0)
    crashed.kill()
    crashed.communicate(timeout=30)
    left = Spool(spool, 1 << 30, on_drop=lambda *_: None)
    waiting = left.values_of()
    assert waiting > 0
    oldest = left.oldest()
    assert oldest is not None
    with serve(home=tmp_path) as (_, address, _):
        with grpc.insecure_channel(address) as channel:  # the server got this one before the crash
            write = channel.unary_unary("/tracehouse.v1.Ingest/Write", request_serializer=None)
            write(oldest.payload, timeout=30)
        replay = _agent_cli("--simulate", "1", "--server", address, "--spool", str(spool), "--duration", "1",
                            env=env)  # fmt: skip
        out, err = replay.communicate(timeout=60)
        report = json.loads(out.strip().splitlines()[-1])
        with Client(address) as client:
            earlier = client.sql(
                "SELECT count() AS n, uniqExact(gpu, metric, ts) AS u FROM samples "
                f"WHERE run_id != '{report['run_id']}'"
            ).iloc[0]
    assert report["recovered"] == waiting - oldest.values, err
    assert report["already_stored"] == oldest.values, "the batch the server had is not recovered again"
    assert earlier["n"] == earlier["u"] == waiting
    assert not list(spool.glob("*.batch"))
