"""`tracehouse bench load --writers`: agents' batches encoded once, patched per send into distinct batches
that the server takes as the agent's own, replayed over many channels with retries of the same bytes, and
counted in the store afterwards: nothing acknowledged lost, nothing stored twice, even across a kill -9."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from ingest.validate import validate_batch
from tracehouse import metrics as m
from tracehouse.bench.fleet import Delivery, Replay, replay
from tracehouse.bench.fleetreport import Server, Stored, fleet_report
from tracehouse.bench.load import bench_fleet
from tracehouse.bench.payloads import MS, FleetBatches
from tracehouse.cli.main import build_parser, main
from tracehouse.model import DEFAULT_LIMITS, NO_GPU
from tracehouse.pushback import PUSHBACK_KEY
from tracehouse.v1 import ingest_pb2

BASE_NS = 1_790_000_000_000_000_000  # 2026-09-21T14:13:20Z
SECOND = 1_000_000_000


def decode(payload: bytes) -> ingest_pb2.WriteRequest:
    return ingest_pb2.WriteRequest.FromString(payload)


def test_a_patched_payload_is_a_distinct_batch_of_its_writer_that_the_server_takes() -> None:
    batches = FleetBatches(writers=3, gpus=2, interval_ms=1000, templates=2)
    template = decode(batches.templates[0].payload).batch
    for writer, k in [(0, 0), (0, 1), (2, 5), (1, 7)]:
        payload = batches.payload(BASE_NS, writer, k)
        batch = decode(payload).batch
        host = f"fleet-{writer:04d}"
        assert (batch.batch_id, batch.host, batch.run_id) == (f"fleet/{writer:04d}/{k:08d}", host, host)
        original = decode(batches.templates[(writer + k) % 2].payload).batch
        start = batches.start_ns(BASE_NS, writer, k)
        ts = np.array(batch.samples.ts)
        shift = start - batches.templates[(writer + k) % 2].origin_ns
        assert np.array_equal(ts, np.array(original.samples.ts) + shift), "every timestamp moved, by the same amount"
        assert start <= ts.min() and ts.max() < start + SECOND, "inside the writer's interval"
        assert list(batch.samples.value) == list(original.samples.value) and batch.dictionary == original.dictionary
        assert len(ts) == batches.values(writer, k) == len(batch.samples.metric) == len(batch.samples.gpu)
        validated = validate_batch(batch, DEFAULT_LIMITS, BASE_NS, payload)
        assert validated.samples is not None and set(validated.samples.column("host").to_pylist()) == {batch.host}
    assert batches.start_ns(BASE_NS, 2, 6) - batches.start_ns(BASE_NS, 2, 5) == SECOND, "a writer's time moves on"
    payloads = {batches.payload(BASE_NS, w, k) for w in range(3) for k in range(4)}
    assert len(payloads) == 12
    # what the agent's sampler makes of 2 simulated GPUs in 1 s: every metric 10 times a second on each
    util = list(template.dictionary).index(m.GPU_UTIL)
    ticks = (np.array(template.samples.gpu) == 0) & (np.array(template.samples.metric) == util)
    assert ticks.sum() == 10 and set(template.samples.gpu) == {0, 1, NO_GPU} and m.GPU_PCIE_RX in template.dictionary
    assert not template.events.start and not template.runs, "the steady state: samples only"


def test_each_writer_starts_at_its_own_moment_and_sends_one_batch_an_interval() -> None:
    batches = FleetBatches(writers=50, gpus=1, interval_ms=2000)
    jitter = batches.jitter_ns
    assert jitter.min() >= 0 and jitter.max() < 2 * SECOND and np.unique(jitter).size > 25
    assert (jitter % MS == 0).all(), "times stay on the ms, as the agent stamps them"
    due = batches.scheduled(10.0)
    assert all(batches.due_s(w, k) < 10.0 for w, k in due) and all(batches.due_s(w, k + 1) >= 10.0 for w, k in due
                                                                    if (w, k + 1) not in set(due))  # fmt: skip
    assert {k for w, k in due if w == 7} == set(range(len({k for w, k in due if w == 7})))
    assert len(due) == pytest.approx(50 * 10 / 2, abs=50)


class Answers:
    """A Write server that answers each call with the next status it was given (code, pushback trailer),
    then OK; it keeps every call's bytes by batch id."""

    def __init__(self, answers: list[tuple[grpc.StatusCode, str | None]]) -> None:
        self.answers = list(answers)
        self.calls: dict[str, list[bytes]] = {}
        self.server = grpc.server(ThreadPoolExecutor(max_workers=4))
        handler = grpc.unary_unary_rpc_method_handler(self._write)
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("tracehouse.v1.Ingest", {"Write": handler}),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _write(self, data: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls.setdefault(decode(data).batch.batch_id, []).append(data)
        if self.answers:
            code, trailer = self.answers.pop(0)
            if trailer is not None:
                context.set_trailing_metadata(((PUSHBACK_KEY, trailer),))
            context.abort(code, "told to refuse")
        return ingest_pb2.WriteResponse(samples=1).SerializeToString()


@pytest.fixture
def answers(request: pytest.FixtureRequest) -> Iterator[Answers]:
    running = Answers(request.param)
    yield running
    running.server.stop(0)


BUSY, AWAY = (grpc.StatusCode.RESOURCE_EXHAUSTED, "20"), (grpc.StatusCode.UNAVAILABLE, None)


@pytest.mark.parametrize("answers", [[BUSY, BUSY, AWAY, (grpc.StatusCode.RESOURCE_EXHAUSTED, None)]], indirect=True)
def test_writers_send_a_refused_batch_again_as_the_same_bytes(answers: Answers) -> None:
    batches = FleetBatches(writers=3, gpus=1, interval_ms=200, templates=1)
    started = time.monotonic()
    run = replay(batches, f"127.0.0.1:{answers.port}", 1.0, 2, BASE_NS, drain_s=20)
    assert time.monotonic() - started < 10
    scheduled = {batches.batch_id(w, k) for w, k in batches.scheduled(1.0)}
    assert set(answers.calls) == scheduled and all(d.acked_s is not None for d in run.deliveries)
    assert all(len(set(sent)) == 1 for sent in answers.calls.values()), "a retry sends the same bytes"
    tally = run.tally
    assert (tally.resource_exhausted, tally.unavailable, tally.refused) == (3, 1, 0)
    assert tally.calls == len(scheduled) + 4 == sum(map(len, answers.calls.values()))
    # the unhinted RESOURCE_EXHAUSTED waited the agent's second at least
    assert max(d.acked_s - d.due_s for d in run.deliveries if d.acked_s is not None) >= 1.0


@pytest.mark.parametrize("answers", [[(grpc.StatusCode.INVALID_ARGUMENT, None)]], indirect=True)
def test_a_batch_refused_as_malformed_is_not_sent_again(answers: Answers) -> None:
    batches = FleetBatches(writers=1, gpus=1, interval_ms=500, templates=1)
    run = replay(batches, f"127.0.0.1:{answers.port}", 1.0, 1, BASE_NS)
    refused = [d for d in run.deliveries if d.refused]
    assert [d.refused for d in refused] == ["INVALID_ARGUMENT"] and run.tally.refused == 1
    assert sum(map(len, answers.calls.values())) == len(run.deliveries)


def test_the_report_counts_lost_and_duplicated_values_batch_by_batch() -> None:
    batches = FleetBatches(writers=2, gpus=1, interval_ms=1000, templates=1)
    n = batches.values(0, 0)
    acked = [
        Delivery(w, k, n, batches.due_s(w, k), batches.due_s(w, k) + 0.1, sent_s=batches.due_s(w, k) + 0.06)
        for w, k in batches.scheduled(2.0)
    ]  # each answered 100 ms after it closed, 40 ms after its last call began
    calling = Delivery(1, 9, n, 1.5, sent_s=1.5, calling=True)  # sent, never answered
    pausing = Delivery(0, 9, n, 2.0, sent_s=2.0)  # refused at 2.0, waiting out the pause asked for at the end
    run = Replay([*acked, calling, pausing], finished_s=2.5)
    stored = {(d.writer, d.k): n for d in acked} | {(0, 0): n - 5, (0, 1): 2 * n, (1, 9): n, (1, 40): 3}
    report = fleet_report(batches, run, 2.0, None, Server(1.0, 0.5, 100.0, 0), Stored(stored, {"samples": 5}, 0))
    assert (report["lost"], report["duplicated"]) == (5, n + 3), "a batch stored without an answer is no duplicate"
    assert report["goal"]["lost"] == {"goal": "<= 0", "measured": 5, "met": False} and not report["goal"]["met"]
    assert report["parts_per_s"] == {"samples": 2.0}
    assert report["ack_latency_ms"]["p50"] == 40 and report["delivery_delay_ms"]["p50"] == 100
    for late in (report["ack_latency_ms"], report["delivery_delay_ms"]):
        assert late["max"] == 1000, "the unanswered batch counts as late as the bench waited"
    delay, took = report["delivery_delay_ms"]["p99"], report["ack_latency_ms"]["p99"]
    assert delay > took, "the batch waiting out its pause is late, but no call of it is"


def test_bench_load_writers_stores_every_value_once_and_reports_its_figures() -> None:
    result = bench_fleet(4, gpus=1, interval=0.5, seconds=2.0, channels=2, baseline_seconds=0.3)
    assert result["offered_values"] == result["acknowledged_values"] == result["stored_values"] > 0, result
    assert (result["lost"], result["duplicated"], result["unacknowledged_values"], result["refused"]) == (0, 0, 0, 0)
    assert result["offered_values_per_s"] == result["offered_values"] / 2.0 == 4 * result["values_per_batch"] / 0.5
    assert 0 < result["accepted_values_per_s"] <= result["offered_values_per_s"]
    latency = result["ack_latency_ms"]
    assert 0 < latency["p50"] <= latency["p99"] <= latency["max"]
    assert result["inserts"]["samples"] >= 1 and result["parts_per_s"]["samples"] > 0
    assert result["server_cpu_us_per_value"] > 0 and result["server_peak_rss_mb"] > 0
    by_thread = result["server_cpu_us_per_value_by_thread"]  # live threads only: at most the process's
    assert set(by_thread) <= {"python", "grpc", "engine_merges", "engine_other"} and by_thread["python"] > 0
    assert sum(by_thread.values()) <= result["server_cpu_us_per_value"] * 1.05 + 1
    assert result["baseline"]["values_per_s"] > 0
    goal = result["goal"]
    assert set(goal) == {"accepted_values_per_s", "server_cpu_us_per_value", "parts_per_s_per_table", "ack_p99_ms",
                         "lost", "duplicated", "met"}  # fmt: skip
    assert goal["lost"]["met"] and goal["duplicated"]["met"] and not goal["accepted_values_per_s"]["met"]


@pytest.mark.slow  # a kill campaign: .ci/run runs it after the default suite
def test_bench_load_writers_with_serve_killed_loses_nothing_and_stores_nothing_twice() -> None:
    result = bench_fleet(
        3, gpus=1, interval=0.5, seconds=3.0, channels=2, kill_at=1.0, restart_after=1.0, baseline_seconds=0.3
    )
    assert result["server_kills"] == 1 and result["unavailable"] > 0, "writers met the server away"
    assert result["offered_values"] == result["acknowledged_values"] == result["stored_values"] > 0, result
    assert (result["lost"], result["duplicated"]) == (0, 0)
    assert set(result["goal"]) == {"lost", "duplicated", "met"} and result["goal"]["met"]


def test_bench_load_writers_beside_readers_reports_both_p99s_and_their_ratio() -> None:
    result = bench_fleet(
        3, gpus=1, interval=0.5, seconds=2.0, channels=2, baseline_seconds=0.3, readers=2, read_events=20_000
    )
    p99 = result["write_p99_ms"]
    assert p99["without_readers"] == result["ack_latency_ms"]["p99"] > 0
    assert p99["with_readers"] == result["with_readers"]["ack_latency_ms"]["p99"] > 0
    assert p99["ratio"] == round(p99["with_readers"] / p99["without_readers"], 2)
    assert result["goal"]["write_p99_beside_readers"]["measured"] == p99["ratio"]
    for figures in (result, result["with_readers"]):
        assert (figures["lost"], figures["duplicated"]) == (0, 0)
    readers = result["readers"]
    assert readers["readers"] == 2 and 18_000 < readers["events"] < 22_000, "about as many events as asked"
    asked = readers.get("answered", 0) + readers.get("refused_busy", 0) + readers.get("refused_too_large", 0)
    assert asked > 0 and not [key for key in readers if key.startswith("failed_")], readers


def test_bench_load_options(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(["bench", "load", "--writers", "1000", "--kill-at", "20", "--channels", "64"])
    assert (args.writers, args.kill_at, args.channels, args.interval, args.gpus) == (1000, 20.0, 64, None, 8)
    assert parser.parse_args(["bench", "load"]).writers is None, "--agents stays the default"
    assert parser.parse_args(["bench", "load", "--writers", "200", "--readers", "12"]).readers == 12
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "load", "--agents", "2", "--writers", "3"])
    capsys.readouterr()
    for refused, field in (
        (["--writers", "2", "--interval", "0.05"], "--interval"),
        (["--writers", "2", "--seconds", "5", "--kill-at", "9"], "--kill-at"),
        (["--agents", "2", "--kill-at", "1"], "--kill-at"),
        (["--agents", "2", "--readers", "4"], "--readers"),
    ):
        assert main(["bench", "load", *refused]) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith(f"tracehouse: {field}") and "\n" not in error
