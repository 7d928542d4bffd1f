"""`tracehouse up --demo`'s training run, in a process of its own: started without holding up
`up`, with the agent's token and none of the caller's credentials, stopped when it runs too long
or when `up` stops, and reported in one line. And demo-train itself (needs torch): one range
per step and phase on the timeline, and no import while the server is away."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from query.client import Client
from tests.helpers import closed_port
from tracehouse import config
from tracehouse.channel import ClientSecurity
from tracehouse.cli import demo_train, up
from tracehouse.cli.main import main
from tracehouse.cli.up import Up, demo_train_outcome, torch_hint

PLAIN = ClientSecurity()  # no credentials, whatever the environment says


@pytest.fixture
def fake_trainer(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """demo-train replaced by a Python script (its text appended to the list), torch or not."""
    script: list[str] = []
    monkeypatch.setattr(up, "demo_train_command", lambda address: [sys.executable, "-c", "\n".join(script)])
    monkeypatch.setattr(demo_train, "torch_available", lambda: True)
    yield script


def test_up_runs_demo_train_in_a_process_of_its_own_with_the_agents_token(
    fake_trainer: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = tmp_path / "seen.json"
    fake_trainer += [
        "import json, os",
        "env = dict(os.environ)",
        "token = open(env['TRACEHOUSE_TOKEN_FILE']).read()",
        f"json.dump({{'env': env, 'token': token, 'pid': os.getpid()}}, open({str(seen)!r}, 'w'))",
        "print('torch says hello')",
        "print(json.dumps({'run_id': 'user-1', 'trace': 'x.json.gz', 'import': {'run_id': 'kineto-2'}}))",
    ]
    monkeypatch.setenv(config.ENV_TOKEN_FILE, str(tmp_path / "the callers.token"))
    monkeypatch.setenv(config.ENV_STORE, "http://user:secret@elsewhere:8123/db")
    runner = Up(ui_port=None, demo=True)
    runner.agent_token = "the agent's write token"
    started = time.monotonic()
    runner._demo_train("127.0.0.1:50051")
    assert time.monotonic() - started < 5, "up does not wait for the training run"
    assert runner.trainer_done.wait(60)
    found = json.loads(seen.read_text())
    assert found["token"] == "the agent's write token" and found["pid"] != os.getpid()
    assert found["env"][config.ENV_SERVER] == "127.0.0.1:50051" and config.ENV_STORE not in found["env"]
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "tracehouse: trained the demo run user-1 (its profile: kineto-2)"
    secrets = Path(found["env"][config.ENV_TOKEN_FILE]).parent
    runner.stop()
    assert not secrets.exists(), "the token's folder goes with up"


def test_up_stops_a_demo_train_that_runs_too_long_or_outlives_it(
    fake_trainer: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    fake_trainer += ["import time", "time.sleep(60)"]
    slow = Up(ui_port=None, demo=True)
    slow._demo_train(closed_port(), timeout=0.5)
    assert slow.trainer_done.wait(30) and slow.trainer is not None and slow.trainer.poll() is not None
    assert capsys.readouterr().err.splitlines()[-1] == "tracehouse: demo-train stopped after 0 s"
    stopped = Up(ui_port=None, demo=True)
    stopped._demo_train(closed_port())
    stopped.stop()
    assert stopped.trainer is not None and stopped.trainer.poll() is not None
    assert stopped.trainer_done.wait(30)
    assert "failed" not in capsys.readouterr().err, "stopped by up: nothing to report"


def test_how_demo_train_ended_in_one_line() -> None:
    result = {"run_id": "user-1", "import": None, "import_error": "the server did not answer"}
    assert demo_train_outcome(3, json.dumps(result).encode(), b"") == (
        "trained the demo run user-1 (its profile: the server did not answer)"
    )
    assert demo_train_outcome(1, b"", b"Traceback...\nRuntimeError: CUDA out of memory\n") == (
        "demo-train failed: RuntimeError: CUDA out of memory"
    )
    assert demo_train_outcome(2, b"", b"tracehouse: demo-train needs PyTorch\n") == (
        "demo-train failed: demo-train needs PyTorch"
    )
    assert demo_train_outcome(-9, b"{not json", b"") == "demo-train failed: status -9"


def test_without_torch_up_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo_train, "torch_available", lambda: False)
    runner = Up(ui_port=None, demo=True)
    runner._demo_train(closed_port())
    assert runner.trainer is None and runner.trainer_done.is_set()
    assert f"tracehouse: {torch_hint()} would add a real training run to --demo" in capsys.readouterr().err


# -- demo-train, with torch ------------------------------------------------------------------------


def test_demo_train_draws_each_step_and_phase_once(
    address: str, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API's steps and phases, and the profiler's operators: no record_function ranges or
    ProfilerStep steps that would count each name twice in the run's window."""
    pytest.importorskip("torch")
    monkeypatch.setenv(config.ENV_HOME, str(tmp_path))
    result = demo_train.train(steps=5, server=address, security=PLAIN, trace_dir=tmp_path / "kept")
    assert Path(result["trace"]).is_file() and Path(result["trace"]).parent == tmp_path / "kept"
    profile = result["import"]["run_id"]
    events = client.events(run=profile)
    assert "cpu_op" in set(events["kind"]) and "step" not in set(events["kind"])
    torch_own = set(events[events["kind"] == "nvtx"]["name"])  # Optimizer.step#SGD.step and the like
    assert all(name.startswith("Optimizer.") for name in torch_own), torch_own
    run = client.runs().set_index("run_id").loc[result["run_id"]]
    window = ["--host", run["host"], "--from", str(run["start"].value), "--to", str(run["end"].value + 1)]
    assert main(["query", "nvtx", *window, "--server", address, "--format", "json"]) == 0
    ranges = {row["name"]: row["instances"] for row in json.loads(capsys.readouterr().out)}
    mine = {name: n for name, n in ranges.items() if name not in torch_own}
    assert mine == {"step": 5, "dataloader": 5, "forward": 5, "backward": 5, "optimizer": 5}


def test_demo_train_with_the_server_away_imports_nothing_and_names_no_removed_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv(config.ENV_HOME, str(tmp_path))
    started = time.monotonic()
    result = demo_train.train(steps=2, server=closed_port(), security=PLAIN)
    assert time.monotonic() - started < 30, "no wait on the importer's patience"
    assert result["import"] is None and "did not answer" in result["import_error"] and result["spooled_batches"]
    assert "/" not in result["trace"], "the file's name only: its folder is gone"
