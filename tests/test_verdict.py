"""`tracehouse verdict`: the statistics on seeded synthetic runs with a known truth, and the whole
path (real server, real store, the CLI) on a few of them."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import numpy as np
import pandas as pd
import pytest
from helpers import MS, T0

from query.client import Client, QueryFailed
from query.verdict_stats import NO_CHANGE, group_of, relative_difference, warmup_steps
from tracehouse.bench.verdict_runs import KERNELS, WARMUP_STEPS, RunShape, synthetic_run
from tracehouse.cli.main import main
from tracehouse.v1 import ingest_pb2, ingest_pb2_grpc

GEMM = "sgemm_128x64_nn"
TRIALS = 100


def _kept(seed: int, shape: RunShape) -> np.ndarray:
    truth = synthetic_run(f"r{seed}", seed, T0, shape)[1]
    steps = truth.step_ns.astype(np.float64)
    return steps[warmup_steps(steps) :]


def _step_time_verdict(seed: int, runs: int, a: RunShape, b: RunShape):  # type: ignore[no-untyped-def]
    group_a = group_of([_kept(seed * 1000 + i, a) for i in range(runs)])
    group_b = group_of([_kept(seed * 1000 + 500 + i, b) for i in range(runs)])
    return relative_difference(group_a, group_b, 0.02, ("faster", "slower"), lower_is_better=True)


def test_warm_up_is_found_and_a_stall_does_not_prolong_it() -> None:
    warm = synthetic_run("w", 1, T0, RunShape())[1].step_ns
    assert warmup_steps(warm) == WARMUP_STEPS
    assert warmup_steps(synthetic_run("c", 2, T0, RunShape(warmup=False))[1].step_ns) == 0
    stalled = synthetic_run("s", 3, T0, RunShape(stall_every=10, stall_ns=2 * MS))[1].step_ns
    assert warmup_steps(stalled) == WARMUP_STEPS
    assert warmup_steps(np.full(100, 5.0)) == 0  # steps of equal length: nothing to drop
    late = np.concatenate([np.full(80, 1000.0), np.full(20, 10.0)])
    assert warmup_steps(late) == 0  # settles only past half the run: nothing is dropped


def test_a_against_a_says_no_detectable_change_in_at_least_95_percent_of_trials() -> None:
    words = [_step_time_verdict(seed, 3, RunShape(), RunShape()).word for seed in range(TRIALS)]
    assert words.count(NO_CHANGE) >= 0.95 * TRIALS, {w: words.count(w) for w in set(words)}


def test_a_kernel_3_percent_longer_is_found_and_its_interval_covers_the_truth() -> None:
    longer = RunShape(longer={GEMM: 0.03})
    base = sum(KERNELS.values())
    truth = 0.03 * KERNELS[GEMM] / (base + 2 * MS + 500_000 + 5 * 8_000)  # the generator's step: load, copy, 5 launches
    found = [_step_time_verdict(seed, 3, RunShape(), longer) for seed in range(TRIALS)]
    covered = sum(d.low is not None and d.high is not None and d.low <= truth <= d.high for d in found)
    assert covered >= 0.95 * TRIALS
    assert sum(d.word == "slower" for d in found) >= 0.95 * TRIALS


def test_a_stall_every_10th_step_is_found_and_its_interval_covers_the_truth() -> None:
    from tracehouse.bench.verdict import STALL, expected_step_ns, stall_per_step

    covered = slower = 0
    for seed in range(TRIALS):
        a = group_of([_kept(seed * 1000 + i, RunShape()) for i in range(3)])
        b_steps = [synthetic_run("s", seed * 1000 + 500 + i, T0, STALL)[1].step_ns.astype(np.float64) for i in range(3)]
        dropped = [warmup_steps(steps) for steps in b_steps]
        b = group_of([steps[d:] for steps, d in zip(b_steps, dropped, strict=True)])
        found = relative_difference(a, b, 0.02, ("faster", "slower"), lower_is_better=True)
        truth = np.mean([stall_per_step(d) for d in dropped]) / expected_step_ns(RunShape())
        covered += found.low is not None and found.high is not None and found.low <= truth <= found.high
        slower += found.word == "slower"
    assert covered >= 0.95 * TRIALS and slower == TRIALS


def test_one_run_per_side_measures_steps_in_batches() -> None:
    difference = _step_time_verdict(7, 1, RunShape(), RunShape(longer={GEMM: 0.10}))
    assert difference.word == "slower"
    assert difference.df is not None and difference.df < 20  # batches of steps, not 96 independent steps


def test_too_noisy_says_how_many_more_runs_would_tell() -> None:
    noisy = RunShape(run_sd=0.03)
    difference = _step_time_verdict(3, 2, noisy, RunShape(run_sd=0.03, longer={GEMM: 0.02}))
    assert difference.word == "too noisy to tell"
    assert difference.more_runs is not None and difference.more_runs >= 1


# --- the whole path ---------------------------------------------------------------------------------


def _store(address: str, runs: dict[str, RunShape], tags: dict[str, dict[str, str]] | None = None) -> None:
    stub = ingest_pb2_grpc.IngestStub(grpc.insecure_channel(address))
    t0 = T0
    for seed, (run_id, shape) in enumerate(runs.items()):
        builder, truth = synthetic_run(run_id, seed + 11, t0, shape)
        for key, value in (tags or {}).get(run_id, {}).items():
            builder._batch.runs[0].tags[key] = value
        stub.Write(ingest_pb2.WriteRequest(batch=builder.build()), timeout=30)
        t0 += int(truth.step_ns.sum()) + 2_000_000_000


@pytest.fixture
def stored(address: str) -> str:
    longer, stall = RunShape(longer={GEMM: 0.05}), RunShape(stall_every=10, stall_ns=2 * MS)
    runs = {"a1": RunShape(), "a2": RunShape(), "a3": RunShape(), "b1": longer, "b2": longer, "b3": longer,
            "s1": stall, "s2": stall, "s3": stall}  # fmt: skip
    _store(address, runs, {run: {"arm": run[0]} for run in runs})
    return address


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    code = main(["verdict", *argv])
    return code, json.loads(capsys.readouterr().out)


def test_verdict_finds_the_longer_kernel_and_its_parts_add_up(stored: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, answer = _json(capsys, "a1,a2,a3", "arm=b", "--server", stored, "--format", "json")
    assert code == 0
    measures = {row["measure"]: row for row in answer["measures"]}
    assert measures["step_time"]["verdict"] == "slower"
    assert measures["step_time"]["low"] <= 0.05 * KERNELS[GEMM] / 11_540_000 <= measures["step_time"]["high"]
    assert measures["throughput"]["verdict"] == "slower"
    assert measures["energy"]["verdict"] == "more energy"
    assert (measures["step_time"]["runs_a"], measures["step_time"]["runs_b"]) == (3, 3)
    parts = answer["parts"]
    assert parts[0]["part"] == GEMM
    assert parts[0]["low_ns"] <= 0.05 * KERNELS[GEMM] <= parts[0]["high_ns"]
    step_delta = measures["step_time"]["b"] - measures["step_time"]["a"]
    assert sum(part["delta_ns"] for part in parts) == pytest.approx(step_delta, rel=1e-9)
    assert {run["warmup_dropped"] for run in answer["runs"]} == {WARMUP_STEPS}
    launched = {row["part"]: row for row in answer["phase_work"]}  # kernels launched from "compute"
    assert answer["phase_work"][0]["part"] == "compute" and set(launched) == {"compute"}
    assert launched["compute"]["low_ns"] <= 0.05 * KERNELS[GEMM] <= launched["compute"]["high_ns"]


def test_a_data_loading_stall_is_put_on_the_idle_gpu(stored: str) -> None:
    with Client(stored, timeout=60) as client:
        frames = client.verdict({"arm": "a"}, ["s1", "s2", "s3"], measures=["step_time", "gpu_busy"])
    parts = frames["parts"].set_index("part")
    top = frames["parts"]["part"].iloc[0]
    assert top == "GPU idle, host elsewhere"
    assert parts.loc[top, "low_ns"] <= 2 * MS / 10 <= parts.loc[top, "high_ns"]
    measures = frames["measures"].set_index("measure")
    assert list(measures.index) == ["step_time", "gpu_busy"]
    assert measures.loc["gpu_busy", "verdict"] == "less busy"
    phases = frames["phases"].set_index("part")
    assert frames["phases"]["part"].iloc[0] == "data"
    assert phases.loc["data", "low_ns"] <= 2 * MS / 10 <= phases.loc["data", "high_ns"]
    assert phases.loc["outside phases", "delta_ns"] == pytest.approx(0, abs=1)


def test_the_gate_fails_when_b_may_be_slower_than_allowed(stored: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verdict", "arm=a", "arm=b", "--server", stored, "--fail-if-slower", "1%"]) == 1
    assert "may be up to" in capsys.readouterr().err
    assert main(["verdict", "arm=a", "arm=b", "--server", stored, "--fail-if-slower", "10%"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("B is slower than A: step time +")
    assert GEMM in out and "Where the step time went" in out
    assert main(["verdict", "arm=a", "arm=b", "--server", stored, "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out
    assert "| step time |" in markdown and "| measure | A | B | change |" in markdown


def test_runs_named_by_nvtx_ranges_and_runs_without_steps(address: str) -> None:
    from tracehouse.batch import BatchBuilder
    from tracehouse.metrics import GPU_ENERGY, GPU_UTIL

    stub = ingest_pb2_grpc.IngestStub(grpc.insecure_channel(address))
    rng = np.random.default_rng(5)
    for i, (run_id, length) in enumerate((("n1", 10 * MS), ("n2", 12 * MS))):
        t0 = T0 + i * 100_000 * MS
        builder = BatchBuilder(f"{run_id}/1", run_id=run_id, host="h")
        lengths = (length * rng.lognormal(0, 0.01, 60)).astype(np.int64)
        starts = t0 + np.concatenate([[0], np.cumsum(lengths)[:-1]])
        builder.add_run(run_id, name=run_id, host="h", start=t0, end=int(starts[-1] + lengths[-1]))
        builder.add_events("nvtx", starts, starts + lengths, [f"train_step {k}" for k in range(60)], tid=9)
        builder.add_events("nvtx", starts, starts + lengths // 2, "forward", tid=9, depth=1)
        stub.Write(ingest_pb2.WriteRequest(batch=builder.build()), timeout=30)
    for i, (run_id, watts) in enumerate((("t1", 300.0), ("t2", 330.0))):
        t0 = T0 + (10 + i) * 100_000 * MS
        builder = BatchBuilder(f"{run_id}/1", run_id=run_id, host="h2")
        ticks = t0 + np.arange(0, 120_000, 100, dtype=np.int64) * MS
        builder.add_run(run_id, name=run_id, host="h2", start=t0, end=int(ticks[-1]), tags={"batch": "32"})
        builder.add_samples(GPU_ENERGY, ticks, watts * (ticks - t0) / 1e9 * rng.lognormal(0, 1e-4, len(ticks)), gpu=0)
        builder.add_samples(GPU_UTIL, ticks, rng.normal(80, 5, len(ticks)), gpu=0)
        stub.Write(ingest_pb2.WriteRequest(batch=builder.build()), timeout=30)
    with Client(address, timeout=60) as client:
        frames = client.verdict(["n1"], ["n2"])
        measures = frames["measures"].set_index("measure")
        assert measures.loc["step_time", "verdict"] == "slower"
        assert frames["runs"]["steps_from"].str.startswith("NVTX ranges matching").all()
        assert set(frames["runs"]["steps"]) == {60}
        windows = client.verdict(["t1"], ["t2"], window_ns=10_000 * MS)
    measures = windows["measures"].set_index("measure")
    assert not {"step_time", "throughput"} & set(measures.index)  # windows of one length: no step time
    assert measures.loc["energy", "verdict"] == "more energy"
    assert measures.loc["energy", "change"] == pytest.approx(0.1, abs=0.01)
    assert set(windows["runs"]["steps_from"]) == {"12 windows of 9.99 s"}  # 119.9 s, covered whole


def test_bad_requests_name_the_field(stored: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Client(stored, timeout=60) as client:
        for a, b, options, field in (
            (["a1"], ["a1"], {}, "b: run 'a1' is in both groups"),
            (["a1"], ["b1"], {"step_pattern": "(unclosed"}, "step_pattern: not a regular expression"),
            (["a1"], ["b1"], {"step_pattern": r"(step)\1"}, "step_pattern: not a regular expression RE2 accepts"),
            (["a1"], ["b1"], {"measures": ["speed"]}, "measures: 'speed' is not one of"),
            (["a1"], ["b1"], {"min_effect": 2.0}, "min_effect"),
            (["a1"], ["b1"], {"window_ns": 5}, "window_ns"),
            ({"arm": "zzz"}, ["b1"], {}, "no run carries the tags arm=zzz"),
            (["nope"], ["b1"], {}, "nope"),
        ):
            with pytest.raises(QueryFailed) as failed:
                client.verdict(a, b, **options)
            assert field in str(failed.value)
        assert client.verdict(["a1"], ["b1"])["measures"]["verdict"].iloc[0] == "slower"  # the server stayed up
    for argv, said in ((["a1,arm=b", "b1"], "mixes runs and tags"), (["a1", "b1", "--measure", "speed"], "'speed'"),
                       (["a1", "b1", "--fail-if-slower", "200%"], "between 0 and 100 %")):  # fmt: skip
        with pytest.raises(SystemExit):
            main(["verdict", *argv, "--server", stored])
        assert said in capsys.readouterr().err


def test_bench_verdict_counts_right_answers_beside_its_baselines(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "verdict", "--trials", "4", "--served-trials", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["a_vs_a"]["verdict_no_detectable_change"] == 1.0
    assert result["kernel_3pct_longer"]["says_changed"]["verdict"] == 1.0
    assert set(result["kernel_3pct_longer"]["interval_covers_truth"]) == {
        "verdict", "pooled_steps", "bootstrap_runs_then_steps"
    }  # fmt: skip
    assert result["time"]["median_s"]["verdict"] > 0
    assert result["attribution"]["stall_every_10th_step"]["largest_part_is_the_cause"] == 1.0
    assert result["stall_every_10th_step"]["says_changed"]["verdict"] == 1.0


def test_demo_train_at_two_batch_sizes_gives_the_same_verdict_on_every_rerun(
    address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real workload: demo-train on the CPU, three repeats at each of two batch sizes."""
    pytest.importorskip("torch")
    from tracehouse import config
    from tracehouse.channel import ClientSecurity
    from tracehouse.cli import demo_train

    monkeypatch.setenv(config.ENV_HOME, str(tmp_path))
    for batch, arm in ((64, "small"), (1024, "big")):
        for _ in range(3):
            result = demo_train.train(
                steps=30, server=address, security=ClientSecurity(), batch=batch, tags={"arm": arm}
            )
            assert "spooled_batches" not in result, result  # every record reached the server
    with Client(address, timeout=120) as client:
        first, again = (client.verdict({"arm": "small"}, {"arm": "big"}) for _ in range(2))
    for name, frame in first.items():
        pd.testing.assert_frame_equal(frame, again[name])
    step = first["measures"].set_index("measure").loc["step_time"]
    assert (step["verdict"], step["runs_a"], step["runs_b"]) == ("slower", 3, 3)
    assert set(first["runs"]["batch"]) == {64.0, 1024.0}
    assert first["measures"]["measure"].iloc[0] == "throughput"  # batch sizes differ: work per step differs
    assert {"dataloader", "forward", "backward", "optimizer"} <= set(first["phases"]["part"])


def test_past_the_limit_of_gpu_operations_the_parts_are_left_out_and_said_so(
    stored: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from query import verdict

    monkeypatch.setattr(verdict, "MAX_WORK_ROWS", 100)
    with Client(stored, timeout=60) as client:
        frames = client.verdict(["a1"], ["b1"])
    assert frames["parts"].empty and frames["measures"]["measure"].iloc[0] == "step_time"
    assert frames["measures"].attrs["notes"] == ["parts left out: the runs hold over 100 GPU operations and API calls"]
    assert main(["verdict", "a1", "b1", "--server", stored]) == 0
    assert "tracehouse: parts left out" in capsys.readouterr().err
