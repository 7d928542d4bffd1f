"""`tracehouse run`: a command (or a matrix of them) as a run, against the real server, with
the agent it starts sampling simulated GPUs; `tracehouse run` itself runs as a subprocess,
so that exit statuses and signals are the real ones."""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import json
import os
import pty
import signal
import subprocess
import sys
import termios
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pytest

from agent.daemon import Agent, AgentConfig
from agent.telemetry.simulated import SimulatedBackend
from query.client import Client
from tests.helpers import LateServer

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


def run_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEHOUSE_")}
    return {**env, "TRACEHOUSE_HOME": str(home), "PYTHONPATH": str(REPO), **extra}


def run_args(address: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "tracehouse.cli.main", "run", "--server", address, "--simulate", "2",
            "--interval", "0.05", *args]  # fmt: skip


def tracehouse_run(address: str, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(run_args(address, *args), env=run_env(home, **env), capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def python(code: str) -> list[str]:
    return ["--", sys.executable, "-c", textwrap.dedent(code)]


def the_run(client: Client, name: str) -> dict[str, Any]:
    runs = client.runs(source="user")
    found = runs[runs["name"] == name]
    assert len(found) == 1, f"runs named {name!r}: {list(runs['name'])}"
    return dict(found.iloc[0])


def ns(value: Any) -> int:
    return int(pd.Timestamp(value).value)


def processes_of(client: Client, run_id: str) -> pd.DataFrame:
    return client.events(["process"], run=run_id)


# -- one command ----------------------------------------------------------------------------


def test_a_short_command_becomes_a_run_with_telemetry_and_its_processes(
    address: str, client: Client, home: Path
) -> None:
    done = tracehouse_run(
        address, home, "--name", "demo", "--tag", "bs=64", "--tag", "model=tiny", "--gpus", "1", "--env", "MY_KNOB",
        *python("import os, time; time.sleep(1.2); print('visible', os.environ['CUDA_VISIBLE_DEVICES'])"),
        MY_KNOB="7", OMP_NUM_THREADS="3",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "visible 1" in done.stdout, "the command's output is its own, and it got its GPU"
    run = the_run(client, "demo")
    attrs = run["attrs"]
    assert run["tags"] == {"bs": "64", "model": "tiny"}
    assert attrs["status"] == "ok" and attrs["exit_code"] == "0"
    assert attrs["gpus"] == "1" and attrs["env.CUDA_VISIBLE_DEVICES"] == "1"
    assert attrs["env.CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and attrs["env.OMP_NUM_THREADS"] == "3"
    assert attrs["env.MY_KNOB"] == "7"
    assert "time.sleep(1.2)" in attrs["command"] and attrs["launcher"] == "tracehouse run"
    assert attrs["telemetry"].startswith("started for the run: simulated")
    start, end = ns(run["start"]), ns(run["end"])
    assert 1.2e9 <= end - start < 30e9
    processes = processes_of(client, run["run_id"])
    assert list(processes["pid"]) == [int(attrs["pid"])]
    assert processes["extras"].iloc[0]["root"] == "true"
    # the agent started for the run sampled both simulated GPUs all along
    sampled = client.sql(
        f"SELECT gpu, count() AS n, min(ts) AS first, max(ts) AS last FROM samples WHERE metric = 'gpu.util_pct'"
        f" AND ts >= fromUnixTimestamp64Nano({start}) AND ts < fromUnixTimestamp64Nano({end}) GROUP BY gpu ORDER BY gpu"
    )  # fmt: skip
    assert list(sampled["gpu"]) == [0, 1] and (sampled["n"] >= 10).all()
    assert "tracehouse: run demo" in done.stderr and ": ok after" in done.stderr


def test_a_failing_command_gives_its_exit_status_and_a_failed_run(address: str, client: Client, home: Path) -> None:
    done = tracehouse_run(address, home, "--name", "fails", *python("import sys; sys.exit(3)"))
    assert done.returncode == 3
    attrs = the_run(client, "fails")["attrs"]
    assert attrs["status"] == "failed: exit 3" and attrs["exit_code"] == "3"


def test_a_command_that_does_not_exist_is_127_and_a_failed_run(address: str, client: Client, home: Path) -> None:
    done = tracehouse_run(address, home, "--name", "missing", "--", "no-such-command-th", "--flag")
    assert done.returncode == 127
    assert "command not found: no-such-command-th" in done.stderr
    run = the_run(client, "missing")
    assert run["attrs"]["status"] == "failed: command not found: no-such-command-th"
    assert run["attrs"]["exit_code"] == "127" and not pd.isna(run["end"])


def test_a_command_killed_by_a_signal_is_128_plus_it(address: str, client: Client, home: Path) -> None:
    done = tracehouse_run(address, home, "--name", "killed", *python("import os, signal; os.kill(os.getpid(), 9)"))
    assert done.returncode == 128 + 9
    assert the_run(client, "killed")["attrs"]["status"] == "killed: SIGKILL"


def counting_command(ready: Path, got: Path) -> list[str]:
    """A command that says when it is ready, writes a line per SIGINT/SIGTERM it receives,
    and exits 5 a second after the first (time for a second one to arrive)."""
    return python(f"""
        import pathlib, signal, sys, time
        def note(number, frame):
            with open({str(got)!r}, "a") as out:
                out.write(signal.Signals(number).name + "\\n")
        signal.signal(signal.SIGTERM, note)
        signal.signal(signal.SIGINT, note)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # it dies of SIGHUP, even where nohup made it ignored
        pathlib.Path({str(ready)!r}).touch()
        while not pathlib.Path({str(got)!r}).exists():
            time.sleep(0.01)
        time.sleep(1)
        sys.exit(5)
    """)


def wait_until_ready(ready: Path, process: subprocess.Popen[Any]) -> None:
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline and process.poll() is None, "the command never got ready"
        time.sleep(0.02)


@pytest.mark.parametrize(("number", "to_group"), [(signal.SIGTERM, False), (signal.SIGINT, False),
                                                  (signal.SIGTERM, True), (signal.SIGHUP, True)])  # fmt: skip
def test_a_signal_sent_to_tracehouse_run_reaches_the_command_once_and_the_run_is_closed(
    address: str, client: Client, home: Path, tmp_path: Path, number: int, to_group: bool
) -> None:
    """To its pid (kill) or to its whole process group (kill -- -PGID, as a shell does with a
    job): the command, in a group of its own, receives it once, passed on."""
    ready, got = tmp_path / "ready", tmp_path / "got"
    process = subprocess.Popen(
        run_args(address, "--name", "stopped", *counting_command(ready, got)), env=run_env(home),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    wait_until_ready(ready, process)
    if to_group:
        os.killpg(process.pid, number)
    else:
        process.send_signal(number)
    _, stderr = process.communicate(timeout=60)
    if number == signal.SIGHUP:  # not handled by the command: it dies of it
        assert process.returncode == 128 + signal.SIGHUP, stderr
        assert the_run(client, "stopped")["attrs"]["status"] == "killed: SIGHUP"
        return
    assert process.returncode == 5, stderr
    assert got.read_text().split() == [signal.Signals(number).name], "once, not twice"
    assert "passed on to the command" in stderr
    run = the_run(client, "stopped")
    assert run["attrs"]["status"] == "failed: exit 5" and not pd.isna(run["end"])


def test_ctrl_c_at_the_terminal_reaches_the_command_once(address: str, client: Client, home: Path,
                                                          tmp_path: Path) -> None:  # fmt: skip
    """`tracehouse run` on a terminal (a pseudo-terminal here) gives the command the terminal:
    Ctrl-C reaches the command, once, and tracehouse is not interrupted."""
    ready, got = tmp_path / "ready", tmp_path / "got"
    primary, secondary = pty.openpty()

    def take_the_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    process = subprocess.Popen(
        run_args(address, "--name", "typed", *counting_command(ready, got)), env=run_env(home),
        stdin=secondary, stdout=secondary, stderr=secondary, start_new_session=True, preexec_fn=take_the_terminal,
    )  # fmt: skip
    os.close(secondary)
    said = b""
    try:
        wait_until_ready(ready, process)
        os.write(primary, b"\x03")  # Ctrl-C
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # EIO: every process on the terminal is gone
                break
            if not chunk:
                break
            said += chunk
        assert process.wait(timeout=60) == 5
    finally:
        os.close(primary)
    assert got.read_text().split() == ["SIGINT"]
    assert b"passed on" not in said and b"run typed" in said, "the terminal's Ctrl-C went to the command alone"
    assert the_run(client, "typed")["attrs"]["status"] == "failed: exit 5"


def test_gpu_memory_of_forked_children_goes_to_their_run_not_to_a_neighbour(
    address: str, client: Client, home: Path
) -> None:
    """A neighbour on the same simulated GPU (its own process, not in the run) and the
    simulated training of the agent itself use GPU 0 too; only the run's tree counts."""
    neighbour = subprocess.Popen(
        [sys.executable, "-c", "from agent.telemetry.simulated import use_gpu; import time; use_gpu(0, 7 << 30, 90);"
         " print('ready', flush=True); time.sleep(60)"],
        env=run_env(home), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert neighbour.stdout is not None and neighbour.stdout.readline().strip() == "ready"
        code = """
            import os, time
            from agent.telemetry.simulated import use_gpu
            children = []
            for size in (1, 2):
                pid = os.fork()
                if pid == 0:
                    use_gpu(0, size << 30, 20 * size)
                    time.sleep(2.5)
                    os._exit(0)
                children.append(pid)
            for pid in children:
                os.waitpid(pid, 0)
        """
        done = tracehouse_run(address, home, "--name", "forks", "--gpus", "0", *python(code))
    finally:
        neighbour.kill()
        neighbour.wait()
    assert done.returncode == 0, done.stderr
    run = the_run(client, "forks")
    processes = processes_of(client, run["run_id"])
    root = int(run["attrs"]["pid"])
    children = set(processes["pid"]) - {root}
    assert len(children) == 2 and neighbour.pid not in set(processes["pid"])
    assert {e["ppid"] for e in processes["extras"] if "root" not in e} == {str(root)}
    pids = ",".join(str(p) for p in processes["pid"])
    memory = client.sql(
        f"SELECT pid, max(value) AS peak FROM samples WHERE metric = 'proc.gpu_mem_bytes' AND gpu = 0"
        f" AND pid IN ({pids}) GROUP BY pid ORDER BY peak"
    )  # fmt: skip
    assert list(memory["peak"]) == [1 * GIB, 2 * GIB], "each child's own memory, sampled by the run's agent"
    neighbours = client.sql(f"SELECT max(value) AS peak FROM samples WHERE pid = {neighbour.pid}")
    assert neighbours["peak"].iloc[0] == 7 * GIB, "the neighbour was sampled too, under its own pid"
    figures = client.compare([run["run_id"]]).iloc[0]
    assert figures["gpu_mem_peak_bytes"] == 3 * GIB, "both children at once; not the neighbour's 7 GiB"


def test_the_host_agent_is_used_when_it_runs(
    address: str, client: Client, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent runs as another user would, with a home of its own; it says it runs in the
    host's runtime folder."""
    runtime = tmp_path / "run-tracehouse"
    runtime.mkdir()
    monkeypatch.setenv("TRACEHOUSE_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("TRACEHOUSE_HOME", str(tmp_path / "agent-home"))
    config = AgentConfig(server=address, spool=tmp_path / "spool", interval=0.05, host_agent=True,
                         run_name="host agent")  # fmt: skip
    agent = Agent(config, SimulatedBackend(3))
    agent.start()
    try:
        done = tracehouse_run(address, home, "--name", "guest", "--gpus", "2", *python("pass"),
                              TRACEHOUSE_RUNTIME_DIR=str(runtime))  # fmt: skip
        refused = tracehouse_run(address, home, "--gpus", "5", *python("pass"), TRACEHOUSE_RUNTIME_DIR=str(runtime))
    finally:
        agent.stop()
    assert not (tmp_path / "agent-home" / "agent").exists(), "the runtime folder, not the agent's home"
    assert done.returncode == 0, done.stderr
    attrs = the_run(client, "guest")["attrs"]
    assert attrs["telemetry"] == f"host agent (pid {os.getpid()}, run {agent.run_id})"
    assert set(client.runs(source="agent")["run_id"]) == {agent.run_id}, "no agent of its own"
    assert refused.returncode == 2 and "GPU 5 is not on this host (GPUs: 0,1,2)" in refused.stderr


# -- Nsight Systems -----------------------------------------------------------------------------


@pytest.fixture
def fake_nsys(tmp_path: Path) -> str:
    """A folder holding an `nsys` that is tests/fake_nsys.py, for PATH."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "nsys"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{REPO / "tests" / "fake_nsys.py"}" "$@"\n')
    script.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def test_nsys_profiles_the_command_and_its_trace_joins_the_run(
    address: str, client: Client, home: Path, fake_nsys: str
) -> None:
    done = tracehouse_run(
        address, home, "--name", "traced", "--nsys", "--nsys-args", "--trace=cuda,nvtx --sample none",
        *python("import sys, time; time.sleep(0.5); sys.exit(4)"), PATH=fake_nsys,
    )  # fmt: skip
    assert done.returncode == 4, done.stderr
    run = the_run(client, "traced")
    attrs = run["attrs"]
    assert attrs["status"] == "failed: exit 4" and attrs["trace"] == "nsys", attrs
    assert attrs["trace.nsys_version"] == "2026.1.1.204" and attrs["nsys.args"] == "--trace=cuda,nvtx --sample none"
    assert Path(attrs["nsys.report"]).exists() and Path(attrs["nsys.export"]).exists()
    kernels = client.events(["kernel"], run=run["run_id"])
    assert len(kernels) == 10 * 5, "the synthetic export's kernels, in the run itself"
    assert ns(run["start"]) <= ns(kernels["start"].min()) and ns(kernels["end"].max()) <= ns(run["end"])
    profiled = set(kernels["pid"])
    tree = processes_of(client, run["run_id"])
    assert profiled <= set(tree["pid"]) and int(attrs["pid"]) not in profiled, "the app under nsys, a grandchild"
    assert [pid for pid, extras in zip(tree["pid"], tree["extras"], strict=True) if "root" in extras] == [
        int(attrs["pid"])
    ], "nsys itself is the root"
    figures = client.compare([run["run_id"]]).iloc[0]
    assert figures["kernels"] == 50 and 0 < figures["busy_pct"] <= 100


def test_nsys_missing_is_refused_before_anything_starts(address: str, client: Client, home: Path) -> None:
    done = tracehouse_run(address, home, "--nsys", *python("pass"), PATH="/nonexistent")
    assert done.returncode == 2
    assert "--nsys: no `nsys` on PATH" in done.stderr
    assert client.runs().empty


# -- the server away ------------------------------------------------------------------------------


def test_with_the_server_away_the_run_is_spooled_and_arrives_when_it_is_back(
    late: LateServer, client: Client, home: Path
) -> None:
    done = tracehouse_run(late.address, home, "--name", "offline", *python("print('still ran')"))
    assert done.returncode == 0 and "still ran" in done.stdout
    assert "did not answer" in done.stderr and "batches wait in" in done.stderr
    spools = [p for p in (home / "spool" / "runs").iterdir() if not p.name.startswith(".")]
    assert len(spools) == 2, "the run's and its agent's"
    late.start()
    again = tracehouse_run(late.address, home, "--name", "online", *python("pass"))
    assert again.returncode == 0, again.stderr
    deadline = time.monotonic() + 30
    while set(client.runs(source="user")["name"]) != {"offline", "online"}:
        assert time.monotonic() < deadline, "the spooled run never arrived"
        time.sleep(0.1)
    offline = the_run(client, "offline")
    assert offline["attrs"]["status"] == "ok" and len(processes_of(client, offline["run_id"])) == 1
    assert not [p for p in (home / "spool" / "runs").iterdir() if not p.name.startswith(".")]


def test_the_host_agent_sends_what_runs_left_in_their_spools(
    late: LateServer, client: Client, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = tracehouse_run(late.address, home, "--name", "left-behind", "--agent", "none", *python("pass"))
    assert done.returncode == 0 and "did not answer" in done.stderr
    late.start()
    monkeypatch.setenv("TRACEHOUSE_HOME", str(home))
    config = AgentConfig(server=late.address, spool=tmp_path / "spool", host_agent=True, replay_interval=0.2)
    agent = Agent(config, SimulatedBackend(1))
    agent.start()
    try:
        deadline = time.monotonic() + 30
        while "left-behind" not in set(client.runs(source="user")["name"]):
            assert time.monotonic() < deadline, "the agent never sent the run's spool"
            time.sleep(0.1)
    finally:
        agent.stop()
    assert the_run(client, "left-behind")["attrs"]["telemetry"] == "none (--agent none)"


# -- options refused ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tag", f"{'k' * 300}=v", "--", "true"], "--tag 'kkkk"),
        (["--tag", "k=" + "v" * 70_000, "--", "true"], "a tag's value is at most 65536 bytes"),
        (["--gpus", "0,x", "--", "true"], "--gpus '0,x': 'x' is not a GPU index"),
        (["--gpus", "7", "--", "true"], "--gpus: GPU 7 is not on this host (GPUs: 0,1)"),
        (["--env", "HF_TOKEN", "--", "true"], "--env HF_TOKEN: looks like it holds a secret"),
        (["--env", "1BAD", "--", "true"], "--env '1BAD': not an environment variable name"),
        ([], "nothing to run: give a COMMAND after --, or --matrix FILE"),
        ([*[a for i in range(65) for a in ("--env", f"V{i}")], "--", "true"], "--env: at most 64 names"),
        (["--nsys-args=--trace=cuda", "--", "true"], "--nsys-args: only with --nsys"),
        (["--nsys", "--nsys-args", "'unclosed", "--", "true"], '--nsys-args "\'unclosed": No closing quotation'),
    ],
)
def test_bad_options_are_refused_naming_the_option(
    address: str, client: Client, home: Path, args: list[str], message: str
) -> None:
    done = tracehouse_run(address, home, *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert client.runs().empty, "nothing started: no run, not even the agent's"
    assert not [p for p in (home / "spool" / "runs").glob("*") if p.is_dir()] if (home / "spool").exists() else True


# -- matrices ------------------------------------------------------------------------------------


def test_a_matrix_runs_every_entry_tags_them_and_prints_the_summary(
    address: str, client: Client, home: Path, tmp_path: Path
) -> None:
    matrix = tmp_path / "experiments.yaml"
    script = "import sys, time; from agent.telemetry.simulated import use_gpu;" \
             " use_gpu(0, int(sys.argv[1]) << 30, 40); time.sleep(3); sys.exit(int(sys.argv[2]))"  # fmt: skip
    matrix.write_text(textwrap.dedent(f"""\
        defaults:
          gpus: "0"
          tags: {{suite: smoke}}
        experiments:
          - name: "train-bs{{batch}}"
            command: [{json.dumps(sys.executable)}, "-c", {json.dumps(script)}, "{{batch}}", "0"]
            params: {{batch: [1, 2]}}
          - name: shared
            collocated:
              - {{name: left, command: [{json.dumps(sys.executable)}, "-c", {json.dumps(script)}, "3", "0"]}}
              - {{name: right, command: [{json.dumps(sys.executable)}, "-c", {json.dumps(script)}, "1", "9"]}}
    """))  # fmt: skip
    done = tracehouse_run(address, home, "--matrix", str(matrix), "--tag", "campaign=c1", "--format", "csv")
    assert done.returncode == 1, done.stderr  # one run failed; the matrix went on
    summary = {row["name"]: row for row in csv.DictReader(io.StringIO(done.stdout))}
    assert set(summary) == {"train-bs1", "train-bs2", "left", "right"}
    assert summary["right"]["status"] == "failed: exit 9" and summary["right"]["exit_code"] == "9"
    assert summary["train-bs2"]["tag.batch"] == "2" and summary["left"]["tag.campaign"] == "c1"
    for name, gib in (("train-bs1", 1), ("train-bs2", 2), ("left", 3), ("right", 1)):
        assert float(summary[name]["gpu_mem_peak_bytes"]) == gib * GIB, name
        assert 1.5 <= float(summary[name]["duration_s"]) < 30
        assert float(summary[name]["energy_j"]) > 0 and float(summary[name]["sm_util_pct"]) == 40
    runs = client.runs(source="user", tags={"suite": "smoke", "campaign": "c1"}).set_index("name")
    assert set(runs.index) == set(summary)
    assert runs.loc["train-bs1", "tags"] == {"suite": "smoke", "campaign": "c1", "batch": "1", "repetition": "1"}
    left, right = runs.loc["left"], runs.loc["right"]
    assert ns(left["start"]) < ns(right["end"]) and ns(right["start"]) < ns(left["end"]), "collocated: together"
    assert ns(runs.loc["train-bs1", "end"]) <= ns(runs.loc["train-bs2", "start"]), "the others one after another"


def test_a_bad_matrix_is_refused_naming_the_line_before_anything_starts(
    address: str, client: Client, home: Path, tmp_path: Path
) -> None:
    matrix = tmp_path / "experiments.yaml"
    matrix.write_text("experiments:\n  - name: a\n    command: 'true'\n  - name: b\n    comand: 'true'\n")
    done = tracehouse_run(address, home, "--matrix", str(matrix))
    assert done.returncode == 2
    assert "experiments.yaml line 5: unknown key 'comand'" in done.stderr, done.stderr
    assert client.runs().empty


def test_a_run_past_its_timeout_is_stopped_and_the_matrix_goes_on(
    address: str, client: Client, home: Path, tmp_path: Path
) -> None:
    matrix = tmp_path / "timeouts.csv"
    matrix.write_text(
        "name,command,timeout\n"
        "# a comment line\n"
        f"slow,{sys.executable} -c 'import time; time.sleep(60)',0.5\n"
        f"quick,{sys.executable} -c 'pass',\n"
    )
    started = time.monotonic()
    done = tracehouse_run(address, home, "--matrix", str(matrix), "--format", "json")
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 30
    summary = {row["name"]: row for row in json.loads(done.stdout)}
    assert summary["slow"]["status"] == "failed: timeout after 0.5 s (killed: SIGTERM)"
    assert summary["slow"]["exit_code"] == 128 + signal.SIGTERM and summary["quick"]["status"] == "ok"
    assert the_run(client, "slow")["attrs"]["matrix_line"] == "3"


def test_processes_left_running_when_the_command_ends_are_stopped(
    address: str, client: Client, home: Path, tmp_path: Path
) -> None:
    """A background process the command left behind, and one a timeout left behind, do not
    outlive their runs (in a matrix they would share the GPU with the next run)."""
    matrix = tmp_path / "leftovers.csv"
    matrix.write_text(
        "name,command,timeout\n"
        "background,sh -c '(sleep 41.25 &); sleep 0.7',\n"
        "timed-out,sh -c 'sleep 41.5; echo never',0.5\n"
    )
    done = tracehouse_run(address, home, "--matrix", str(matrix), "--format", "json")
    assert done.returncode == 1, done.stderr
    left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if "41.25" in str(p.info["cmdline"])
            or "41.5" in str(p.info["cmdline"])]  # fmt: skip
    assert left == [], "nothing of either run still runs"
    assert "still running after it ended: stopping them" in done.stderr
    summary = {row["name"]: row for row in json.loads(done.stdout)}
    assert summary["background"]["status"] == "ok" and summary["background"]["duration_s"] < 5, "not the cleanup"
    assert summary["timed-out"]["status"] == "failed: timeout after 0.5 s (killed: SIGTERM)"


def test_secrets_on_the_command_line_are_not_recorded(address: str, client: Client, home: Path) -> None:
    done = tracehouse_run(
        address, home, "--name", "secretive", "--env", "TOKENIZERS_PARALLELISM", "--", "env", "WANDB_API_KEY=w1",
        "true", "--hf-token", "h2", "--api-key=k3", "--use-auth-token", "--hub-token", "h4", "--max-tokens", "5",
        "--tokenizer", "gpt2", "https://user:pw5@example.com/x", "Authorization: Bearer b6",
        TOKENIZERS_PARALLELISM="false",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    attrs = the_run(client, "secretive")["attrs"]
    assert attrs["command"] == (
        "env 'WANDB_API_KEY=***' true --hf-token '***' '--api-key=***' --use-auth-token --hub-token '***'"
        " --max-tokens 5 --tokenizer gpt2 'https://user:***@example.com/x' 'Authorization: ***'"
    )
    assert attrs["env.TOKENIZERS_PARALLELISM"] == "false", "a tokenizer is not a token"


def test_a_long_name_still_makes_a_run(address: str, client: Client, home: Path) -> None:
    name = "resnet50-" + "x" * 300
    done = tracehouse_run(address, home, "--name", name, *python("pass"))
    assert done.returncode == 0 and "lost" not in done.stderr, done.stderr
    run = the_run(client, name)
    assert len(run["run_id"]) <= 119 and run["attrs"]["status"] == "ok"


def test_ctrl_z_stops_the_command_and_tracehouse_and_continuing_goes_on(
    address: str, client: Client, home: Path, tmp_path: Path
) -> None:
    """Ctrl-Z at the terminal stops the command, and tracehouse stops itself so that a shell
    would get the terminal back; continued (a shell's `fg`), it gives the command the
    terminal again and continues it."""
    ready = tmp_path / "ready"
    primary, secondary = pty.openpty()

    def take_the_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    code = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch()\nfor _ in range(40): time.sleep(0.05)"
    process = subprocess.Popen(
        run_args(address, "--name", "suspended", "--", sys.executable, "-c", code), env=run_env(home),
        stdin=secondary, stdout=secondary, stderr=secondary, start_new_session=True, preexec_fn=take_the_terminal,
    )  # fmt: skip
    os.close(secondary)
    reader = threading.Thread(target=drain, args=(primary,), daemon=True)
    reader.start()
    try:
        wait_until_ready(ready, process)
        os.write(primary, b"\x1a")  # Ctrl-Z
        wait_for(lambda: psutil.Process(process.pid).status() == psutil.STATUS_STOPPED, "tracehouse stopped")
        command = [c for c in psutil.Process(process.pid).children() if "range(40)" in " ".join(c.cmdline())]
        assert command and command[0].status() == psutil.STATUS_STOPPED
        assert os.tcgetpgrp(primary) == process.pid, "the terminal is tracehouse's group's again"
        time.sleep(2.5)  # longer than the command's 40 short sleeps: stopped, it cannot have ended
        os.kill(process.pid, signal.SIGCONT)
        assert process.wait(timeout=60) == 0
    finally:
        os.close(primary)
    run = the_run(client, "suspended")
    assert run["attrs"]["status"] == "ok" and ns(run["end"]) - ns(run["start"]) > 4.5e9


def drain(fd: int) -> None:
    with contextlib.suppress(OSError):
        while os.read(fd, 4096):
            pass


def wait_for(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.02)


def test_the_cli_starts_no_thread_before_it_blocks_the_signals_it_forwards() -> None:
    """A thread started at import (the store's libraries start some) would leave SIGTERM and SIGINT
    unblocked in it: sent to `tracehouse run`, they would kill it there instead of reaching the command."""
    found = subprocess.run(
        [sys.executable, "-c", "import os, sys, tracehouse.cli.main; print(len(os.listdir('/proc/self/task')), "
         "sorted({'clickhouse_connect', 'pyarrow', 'chdb'} & set(sys.modules)))"],
        capture_output=True, text=True, check=True, env=run_env(Path("/nonexistent")),
    )  # fmt: skip
    assert found.stdout.split(None, 1) == ["1", "[]\n"], found.stdout
