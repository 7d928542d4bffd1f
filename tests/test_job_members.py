"""Runs become a job's ranks: the training API, `tracehouse run --job` (a subprocess, as a user runs it),
`tracehouse import --job` (the rank from distributedInfo, else the file's place), through the real server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracehouse
from agent.traces.kineto_synthetic import KinetoSpec, write_trace
from query.client import Client
from tests.conftest import FIXTURES
from tests.test_run import python, tracehouse_run
from tracehouse.channel import ClientSecurity
from tracehouse.cli.main import main

PLAIN = ClientSecurity()


def _attrs(client: Client, name: str) -> dict[str, str]:
    runs = client.runs()
    found = runs[runs["name"] == name]
    assert len(found) == 1, list(runs["name"])
    return dict(found.iloc[0]["attrs"])


def test_the_training_api_names_its_job_and_rank(
    address: str, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with tracehouse.run("api-r1", server=address, security=PLAIN, spool=tmp_path, job="api-job"):
        tracehouse.step(0)
    attrs = _attrs(client, "api-r1")
    assert (attrs["job"], attrs["rank"], attrs["world_size"], attrs["local_rank"]) == ("api-job", "1", "2", "1")


def test_tracehouse_run_job_names_the_job_and_the_view_takes_the_training_run(
    address: str, client: Client, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    code = """
        import tracehouse
        with tracehouse.run("train-r0"):
            for i in range(4):
                tracehouse.step(i)
    """
    for rank in (0, 1):
        done = tracehouse_run(
            address, home, "--name", f"launch-r{rank}", "--job", "rj", "--agent", "none",
            *python(code.replace("train-r0", f"train-r{rank}")),
            RANK=str(rank), WORLD_SIZE="2", TRACEHOUSE_SERVER=address,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert _attrs(client, "launch-r0")["job"] == "rj" and _attrs(client, "train-r1")["rank"] == "1"
    view = client.job("rj")
    assert sorted(view.ranks["run_id"]) == sorted(
        client.runs().set_index("name").loc[["train-r0", "train-r1"], "run_id"]
    )  # each rank's launcher left out: it has no steps
    assert (view.ranks["steps"] == 4).all()
    assert sum("is claimed by 2 runs" in note for note in view.notes) == 2


def test_import_job_takes_the_rank_from_distributed_info_else_the_file_order(
    address: str, client: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    write_trace(first, KinetoSpec(steps=6, gzip=False))
    write_trace(second, KinetoSpec(steps=6, kernels_per_step=4, gzip=False))
    text = first.read_text().replace('"rank": 0, "world_size": 1', '"world_size": 1')  # no rank: the file's place
    first.write_text(text)
    text = second.read_text().replace('"rank": 0, "world_size": 1', '"rank": 1, "world_size": 2')
    second.write_text(text)
    assert main(["import", "--job", "imp", "--host", "node-a", str(first), str(second), "--server", address]) == 0
    imported = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_run = client.runs().set_index("run_id")
    attrs = [dict(by_run.loc[row["run_id"], "attrs"]) for row in imported]
    assert [(a["job"], a["rank"], a["world_size"]) for a in attrs] == [("imp", "0", "2"), ("imp", "1", "2")]
    view = client.job("imp")
    assert list(view.ranks["rank"]) == [0, 1] and (view.ranks["steps"] == 6).all()
    parts = view.ranks[["mean_compute_ns", "mean_comm_ns", "mean_data_ns", "mean_idle_ns"]].sum(axis=1)
    assert ((parts - view.ranks["mean_dur_ns"]).abs() <= 1).all()
    assert (view.ranks["mean_compute_ns"] > 0).all()  # its kernels
    assert main(["import", "--job", "bad id!", str(first), "--server", address]) == 2
    assert "--job: 'bad id!' is not a job id" in capsys.readouterr().err


def test_a_file_imported_before_joins_a_job_when_imported_again_with_job(
    address: str, client: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The begin describes the file alone: imported again with --job it is the very begin stored (not
    a finished run sent back to importing), and the end files the run in the job."""
    trace = tmp_path / "rank.json"
    write_trace(trace, KinetoSpec(steps=4, gzip=False))
    assert main(["import", "--host", "node-a", str(trace), "--server", address]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    assert main(["import", "--job", "later", "--host", "node-a", str(trace), "--server", address]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == run_id
    attrs = dict(client.runs().set_index("run_id").loc[run_id, "attrs"])
    assert (attrs["job"], attrs["rank"]) == ("later", "0")
    assert list(client.job("later").ranks["run_id"]) == [run_id]


def test_real_kineto_traces_as_a_job_say_their_duplicate_ranks_and_missing_peers(
    address: str, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = FIXTURES / "kineto"
    alexnet = folder / "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz"
    sampled = folder / "trace_filter_sampled_rank-0.json.gz"
    if not (alexnet.exists() and sampled.exists()):
        pytest.skip("the Kineto fixtures are not here")
    # both say rank 0 in distributedInfo; the second, of a job of 128 ranks on NCCL
    assert main(["import", "--job", "real", str(alexnet), str(sampled), "--server", address]) == 0
    capsys.readouterr()
    view = client.job("real")
    notes = "\n".join(view.notes)
    assert "rank 0 is claimed by 2 runs" in notes
    assert "127 rank(s) of 128 have no run" in notes
    assert "a job of 1 rank(s) with steps" in notes or "a job of 0 rank(s)" in notes
    assert list(view.ranks["rank"]) == [0] and view.stragglers.empty


def _with_allreduces(path: Path, rank: int, steps: int, kernels: int, late_ns: int) -> None:
    """A synthetic Kineto trace of `rank` of 2, an NCCL all-reduce kernel ending each step, as PyTorch 2.2 on
    writes them: 1 Mi floats in and out."""
    write_trace(path, KinetoSpec(steps=steps, kernels_per_step=kernels, gzip=False))
    step_ns = (kernels + 4) * 20_000
    events = []
    for step in range(steps):
        start = 1_000_000 + step * step_ns + 100_000 + late_ns  # µs from baseTimeNanoseconds, as written
        events.append(
            f'{{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", '
            f'"pid": 0, "tid": 9, "ts": {start / 1000:.3f}, "dur": {(40_000 - late_ns) / 1000:.3f}, "args": '
            '{"device": 0, "stream": 9, "correlation": 1, "In msg nelems": 1048576, "Out msg nelems": 1048576, '
            '"dtype": "Float", "Group size": 2}}'
        )
    text = path.read_text().replace('"rank": 0, "world_size": 1', f'"rank": {rank}, "world_size": 2')
    path.write_text(text.replace('"traceEvents": [', '"traceEvents": [\n  ' + ",\n  ".join(events) + ",", 1))


def test_kineto_collectives_carry_their_bytes_into_the_job_view(
    address: str, client: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [tmp_path / "r0.json", tmp_path / "r1.json"]
    _with_allreduces(files[0], 0, 6, 5, 0)
    _with_allreduces(files[1], 1, 6, 5, 5_000)  # rank 1 arrives 5 µs later
    assert main(["import", "--job", "nccl", "--host", "node-a", *map(str, files), "--server", address]) == 0
    capsys.readouterr()
    row = client.job("nccl").collectives.iloc[0]
    assert (row["kind"], row["bytes"], row["count"], row["ranks"]) == ("all_reduce", 4 << 20, 6, 2)
    assert (row["last_rank"], row["last_rank_count"], row["arrival_skew_ns"]) == (1, 6, 5_000)
    assert row["algbw_bytes_per_s"] == round((4 << 20) * 1e9 / 35_000)  # from the last arrival to the end
    assert row["busbw_bytes_per_s"] == row["algbw_bytes_per_s"]  # 2 (n - 1) / n = 1 for two ranks
