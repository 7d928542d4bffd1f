"""Compare's one-sentence answer, built from the real answers of `compare` and `diff` (a real
server over a real chDB store): which run is faster and by how much, then the biggest changes."""

from __future__ import annotations

import pandas as pd
import pytest

from query.client import Client
from query.headline import compare_headline
from tests.helpers import MS, T0, S, request
from tracehouse.batch import BatchBuilder
from tracehouse.shortnames import short_name, unique_short_names
from tracehouse.v1 import ingest_pb2_grpc

HOST = "node-h"
LONG = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3>>"
# per run: name, seconds, and per call name: (kind, calls, seconds each)
RUNS = {
    "base": ("demo baseline", 40, {"cudaDeviceSynchronize": ("cuda_api", 4, 5.0), "softmax_kernel": ("kernel", 2, 1.6),
                                   LONG: ("kernel", 2, 1.2), "gemm": ("kernel", 2, 1.0)}),
    "tuned": ("demo tuned", 34, {"cudaDeviceSynchronize": ("cuda_api", 4, 3.8), "softmax_kernel": ("kernel", 1, 1.6),
                                 LONG: ("kernel", 2, 0.5), "gemm": ("kernel", 2, 1.01)}),
    "same": ("same length", 40, {"gemm": ("kernel", 2, 1.0), "fused_kernel": ("kernel", 1, 5.0)}),
    "idle": ("demo baseline", 40, {}),  # the same name as `base`, no traced work
    "open": ("still going", None, {"gemm": ("kernel", 1, 3.0)}),
}  # fmt: skip


def _write(ingest: ingest_pb2_grpc.IngestStub) -> None:
    for number, (run_id, (name, seconds, calls)) in enumerate(RUNS.items()):
        start = T0 + number * 100 * S
        batch = BatchBuilder(f"run-{run_id}", run_id=run_id, host=HOST)
        end = None if seconds is None else start + seconds * S
        batch.add_run(run_id, name=name, host=HOST, source="nsys", start=start, end=end)
        at = start + MS
        for call, (kind, count, each) in calls.items():
            for _ in range(count):
                length = round(each * S)
                batch.add_events(kind, [at], [at + length], call, gpu=0 if kind == "kernel" else -1, stream=7)
                at += length + MS
        ingest.Write(request(batch), timeout=60)


@pytest.fixture
def answers(client: Client, ingest: ingest_pb2_grpc.IngestStub) -> Client:
    _write(ingest)
    return client


def _headline(client: Client, a: str, b: str) -> str:
    return compare_headline(client.compare((a, b)), client.diff(a, b))


def test_the_faster_run_and_the_three_biggest_changes(answers: Client) -> None:
    long = unique_short_names([LONG, "cudaDeviceSynchronize", "softmax_kernel"])[LONG]
    assert long == short_name(LONG), "as every table and chart names it"
    assert _headline(answers, "base", "tuned") == (
        "demo tuned is 15.0 % faster than demo baseline (40 s → 34 s). Biggest changes: "
        f"cudaDeviceSynchronize -4.8 s (-24.0 %), softmax_kernel -1.6 s (-50.0 %), {long} -1.4 s (-58.3 %)."
    )
    assert _headline(answers, "tuned", "base") == (
        "demo baseline is 17.6 % slower than demo tuned (34 s → 40 s). Biggest changes: "
        f"cudaDeviceSynchronize +4.8 s (+31.6 %), softmax_kernel +1.6 s (+100.0 %), {long} +1.4 s (+140.0 %)."
    )


def test_equal_durations_new_work_and_shared_names(answers: Client) -> None:
    assert _headline(answers, "base", "same") == (
        "same length takes as long as demo baseline (40 s → 40 s). Biggest changes: "
        "cudaDeviceSynchronize -20 s (-100.0 %), fused_kernel +5 s (new in B), softmax_kernel -3.2 s (-100.0 %)."
    )
    assert _headline(answers, "base", "idle").startswith(
        "demo baseline (idle) takes as long as demo baseline (base) (40 s → 40 s). Biggest changes:"
    ), "two runs of one name are told apart by their ids"


def test_no_traced_work_and_no_change(answers: Client) -> None:
    frame = answers.compare(("idle", "idle"))
    assert answers.diff("idle", "idle").empty
    twice = pd.concat([answers.compare(("idle",)), answers.compare(("base",))], ignore_index=True)
    assert compare_headline(twice, answers.diff("idle", "idle")) == (
        "demo baseline (base) takes as long as demo baseline (idle) (40 s → 40 s)."
    ), "no traced work: no changes to name"
    assert compare_headline(frame, answers.diff("base", "base")) == "", "one run is no comparison"
    assert compare_headline(twice, answers.diff("base", "base")).endswith(
        "No change in kernels, CUDA API calls or memory operations."
    )


def test_an_open_run_or_a_missing_duration_gives_no_verdict(answers: Client) -> None:
    runs = answers.compare(("base", "open"))
    assert runs["status"].tolist()[1] == "running"
    headline = compare_headline(runs, answers.diff("base", "open"))
    assert headline.startswith(
        "No verdict on speed yet: demo baseline took 40 s; still going is still running (3 s so far). "
        "Biggest changes: cudaDeviceSynchronize -20 s (-100.0 %)"
    ), headline
    runs = answers.compare(("base", "tuned"))
    runs.loc[1, "duration_s"] = float("nan")
    assert compare_headline(runs, answers.diff("base", "tuned")).startswith(
        "The duration of demo tuned is unknown. Biggest changes: cudaDeviceSynchronize -4.8 s"
    )
