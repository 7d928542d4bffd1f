"""`tracehouse bench verdict`: how often the verdict is right, on seeded synthetic runs with a known
truth (tracehouse/bench/verdict_runs.py), beside two baselines on the same runs: every step taken
as an independent sample (Welch's t over the pooled steps), and the percentile bootstrap that
resamples runs, then steps within them. Then the time one verdict takes through a real server
and store, beside `compare` of the same runs."""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from scipy import stats

from query.verdict_stats import LEVEL, NO_CHANGE, group_of, relative_difference, warmup_steps
from tracehouse.bench.verdict_runs import COPY_NS, KERNELS, LAUNCH_NS, LOAD_NS, RunShape, synthetic_run

GEMM = "sgemm_128x64_nn"
RUNS = 3
RESAMPLES = 1000
T0 = 1_790_000_000_000_000_000

Interval = tuple[float, float]


def _kept(seed: int, shape: RunShape) -> tuple[np.ndarray, int]:
    """A run's steps past its warm-up, and how many that dropped."""
    steps = synthetic_run(f"r{seed}", seed, T0, shape)[1].step_ns.astype(np.float64)
    dropped = warmup_steps(steps)
    return steps[dropped:], dropped


def stall_per_step(dropped: int) -> float:
    """The stall time per kept step of a run of STALL that dropped its first `dropped` steps."""
    stalls = sum((k + 1) % STALL.stall_every == 0 for k in range(dropped, STALL.steps))
    return STALL.stall_ns * stalls / (STALL.steps - dropped)


def expected_step_ns(shape: RunShape) -> float:
    """A step's expected length past warm-up, without stalls (each duration's lognormal mean)."""
    base = LOAD_NS + COPY_NS + sum(KERNELS.values()) + LAUNCH_NS * (len(KERNELS) + 2)
    return base * math.exp((shape.run_sd**2 + shape.step_sd**2) / 2)


def _ours(a: list[np.ndarray], b: list[np.ndarray]) -> tuple[Interval, str]:
    difference = relative_difference(group_of(a), group_of(b), 0.02, ("faster", "slower"), True)
    return (difference.low or math.nan, difference.high or math.nan), difference.word


def _pooled(a: list[np.ndarray], b: list[np.ndarray]) -> Interval:
    """Every step an independent sample: Welch's t on log step times."""
    x, y = np.log(np.concatenate(a)), np.log(np.concatenate(b))
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    half = float(stats.t.ppf(0.5 + LEVEL / 2, df)) * math.sqrt(vx + vy)
    centre = float(np.log(np.mean(np.exp(y))) - np.log(np.mean(np.exp(x))))
    return math.expm1(centre - half), math.expm1(centre + half)


def _bootstrap(a: list[np.ndarray], b: list[np.ndarray], rng: np.random.Generator) -> Interval:
    """Resample runs, then steps within each: the percentile interval of the ratio of group means."""

    def means(runs: list[np.ndarray]) -> np.ndarray:
        picked = rng.integers(0, len(runs), size=(RESAMPLES, len(runs)))
        run_means = np.array([[runs[i][rng.integers(0, len(runs[i]), len(runs[i]))].mean() for i in row]
                              for row in picked])  # fmt: skip
        return run_means.mean(axis=1)

    ratio = means(b) / means(a) - 1
    tail = 100 * (1 - LEVEL) / 2
    return float(np.percentile(ratio, tail)), float(np.percentile(ratio, 100 - tail))


def _rates(trials: int, b_shape: RunShape, truth_of: Callable[[list[int]], float]) -> dict[str, Any]:
    """Over seeded trials of 3 runs of A against 3 of `b_shape`: the verdict's words, and how often
    each method's interval covers the truth (`truth_of` the warm-up each B run dropped) or leaves out 0."""
    rng = np.random.default_rng(0)
    methods: dict[str, Callable[[list[np.ndarray], list[np.ndarray]], Interval]] = {
        "verdict": lambda a, b: _ours(a, b)[0], "pooled_steps": _pooled,
        "bootstrap_runs_then_steps": lambda a, b: _bootstrap(a, b, rng),
    }  # fmt: skip
    covered = dict.fromkeys(methods, 0)
    changed = dict.fromkeys(methods, 0)
    words: dict[str, int] = {}
    truths = []
    for seed in range(trials):
        a = [_kept(seed * 1000 + i, RunShape())[0] for i in range(RUNS)]
        b, dropped = zip(*(_kept(seed * 1000 + 500 + i, b_shape) for i in range(RUNS)), strict=True)
        truths.append(truth := truth_of(list(dropped)))
        word = _ours(a, list(b))[1]
        words[word] = words.get(word, 0) + 1
        for name, method in methods.items():
            low, high = method(a, list(b))
            covered[name] += low <= truth <= high
            changed[name] += low > 0 or high < 0
    return {"truth": float(np.mean(truths)), "words": words,
            "interval_covers_truth": {name: n / trials for name, n in covered.items()},
            "says_changed": {name: n / trials for name, n in changed.items()}}  # fmt: skip


@contextlib.contextmanager
def _served() -> Iterator[tuple[Any, Any]]:
    """A real server over a real store in a scratch folder: (the Ingest stub, a Query client)."""
    import grpc

    from query.client import Client
    from store.store import Store
    from tracehouse.cli.serve import create_server
    from tracehouse.model import DEFAULT_LIMITS
    from tracehouse.v1 import ingest_pb2_grpc

    with tempfile.TemporaryDirectory(prefix="tracehouse-bench-verdict-") as folder:
        store = Store.open(f"chdb://{folder}/store", DEFAULT_LIMITS)
        server = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS)
        address = f"127.0.0.1:{server.port}"
        try:
            with grpc.insecure_channel(address) as channel, Client(address, timeout=120) as client:
                yield ingest_pb2_grpc.IngestStub(channel), client
        finally:
            server.stop(grace=1)
            store.close()


class _Writer:
    """Stores synthetic runs one after another on one host's timeline."""

    def __init__(self, stub: Any) -> None:
        self.stub, self.t0 = stub, T0

    def write(self, run_id: str, seed: int, shape: RunShape) -> None:
        from tracehouse.v1 import ingest_pb2

        builder, truth = synthetic_run(run_id, seed, self.t0, shape)
        self.stub.Write(ingest_pb2.WriteRequest(batch=builder.build()), timeout=60)
        self.t0 += int(truth.step_ns.sum()) + 10**9


STALL = RunShape(stall_every=10, stall_ns=2_000_000)
IDLE = "GPU idle, host elsewhere"


def _attributed(trials: int, stub: Any, client: Any) -> dict[str, Any]:
    """Per trial, 3 runs of A, of B with the kernel 3 % longer and of B with a stall every 10th step,
    through the server: how often the largest part is the cause, and its interval covers the truth
    (the kernel: 3 % of its time per step; the stall: its time per kept step, from the warm-up each
    run dropped)."""
    writer, longer = _Writer(stub), RunShape(longer={GEMM: 0.03})
    for trial in range(trials):
        for i in range(RUNS):
            for arm, shape in (("a", RunShape()), ("k", longer), ("s", STALL)):
                writer.write(f"{arm}{trial}.{i}", 7_000_000 + trial * 100 + i * 10 + ord(arm), shape)
    found = {"kernel_3pct_longer": [0, 0], "stall_every_10th_step": [0, 0]}
    for trial in range(trials):
        runs = {arm: [f"{arm}{trial}.{i}" for i in range(RUNS)] for arm in "aks"}
        kernel = client.verdict(runs["a"], runs["k"], measures=["step_time"])["parts"]
        found["kernel_3pct_longer"][0] += kernel["part"].iloc[0] == GEMM
        found["kernel_3pct_longer"][1] += _covers(kernel, GEMM, 0.03 * KERNELS[GEMM])
        stall = client.verdict(runs["a"], runs["s"], measures=["step_time"])
        dropped = stall["runs"][stall["runs"]["group"] == "B"]["warmup_dropped"]
        truth = float(np.mean([stall_per_step(int(d)) for d in dropped]))
        found["stall_every_10th_step"][0] += stall["parts"]["part"].iloc[0] == IDLE
        found["stall_every_10th_step"][1] += _covers(stall["parts"], IDLE, truth)
    return {case: {"largest_part_is_the_cause": named / trials, "its_interval_covers_truth": covered / trials}
            for case, (named, covered) in found.items()}  # fmt: skip


def _covers(parts: Any, part: str, truth: float) -> bool:
    row = parts.set_index("part").loc[part]
    return bool(row["low_ns"] <= truth <= row["high_ns"])


def _timed(repeats: int, stub: Any, client: Any) -> dict[str, Any]:
    """Seconds for one verdict of 3 runs against 3 (1,000 steps each), and for `compare` of them."""
    writer = _Writer(stub)
    shapes = [RunShape(steps=1000)] * RUNS + [RunShape(steps=1000, longer={GEMM: 0.03})] * RUNS
    for i, shape in enumerate(shapes):
        writer.write(f"long{i}", i, shape)
    a, b = [f"long{i}" for i in range(RUNS)], [f"long{i}" for i in range(RUNS, 2 * RUNS)]
    seconds: dict[str, list[float]] = {"verdict": [], "compare": []}
    for _ in range(repeats):
        started = time.perf_counter()
        client.verdict(a, b)
        seconds["verdict"].append(time.perf_counter() - started)
        started = time.perf_counter()
        client.compare([*a, *b])
        seconds["compare"].append(time.perf_counter() - started)
    median = {name: float(np.median(values)) for name, values in seconds.items()}
    return {"runs": 2 * RUNS, "steps_per_run": 1000, "median_s": median,
            "verdict_over_compare": median["verdict"] / median["compare"]}  # fmt: skip


def bench_verdict(trials: int, served_trials: int) -> dict[str, Any]:
    plain = RunShape()
    same = _rates(trials, plain, lambda dropped: 0.0)
    longer = _rates(
        trials, RunShape(longer={GEMM: 0.03}), lambda dropped: 0.03 * KERNELS[GEMM] / expected_step_ns(plain)
    )
    stall = _rates(
        trials, STALL, lambda dropped: float(np.mean([stall_per_step(d) for d in dropped])) / expected_step_ns(plain)
    )
    with _served() as (stub, client):
        attributed = _attributed(served_trials, stub, client)
        timed = _timed(5, stub, client)
    no_change = same["words"].get(NO_CHANGE, 0) / trials
    covered = min(longer["interval_covers_truth"]["verdict"], stall["interval_covers_truth"]["verdict"])
    found = min(case["largest_part_is_the_cause"] for case in attributed.values())
    return {
        "trials": trials, "runs_per_group": RUNS,
        "a_vs_a": {**same, "verdict_no_detectable_change": no_change},
        "kernel_3pct_longer": longer,
        "stall_every_10th_step": stall,
        "attribution": {"trials": served_trials, **attributed},
        "time": timed,
        "goal": {"a_vs_a_no_change_at_least": 0.95, "coverage_at_least": 0.95, "cause_found_at_least": 0.95,
                 "met": no_change >= 0.95 and covered >= 0.95 and found >= 0.95},
    }  # fmt: skip
