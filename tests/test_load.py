"""Admission control and load: when the store is behind, the server refuses writes at once
with RESOURCE_EXHAUSTED and a retry hint; writers wait and spool, and nothing is lost."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.daemon import Agent
from agent.shipping.shipper import UNHINTED_PUSHBACK_S, Outcome, Shipper, classify, pushback_seconds
from agent.shipping.spool import EncodedBatch, Spool
from agent.shipping.writer import BatchWriter, WriteFailed
from agent.telemetry.simulated import SimulatedBackend
from ingest.admission import (
    DEFAULT_MAX_PENDING_BYTES,
    DEFAULT_TARGET_MS,
    FIRST_CALLS,
    MAX_RETRY_MS,
    MIN_CROWD_MS,
    Admission,
    Overloaded,
)
from ingest.validate import ValidatedBatch
from store.claim import Claim
from store.store import Store
from tests.helpers import Clock, counts, telemetry
from tests.test_agent import config, sample_count
from tracehouse.batch import encode_request
from tracehouse.bench.load import bench_load
from tracehouse.channel import encoded_write
from tracehouse.cli.main import build_parser
from tracehouse.cli.serve import Server, create_server
from tracehouse.model import DEFAULT_LIMITS
from tracehouse.pushback import BEHIND, PUSHBACK_KEY, TRANSPORT_MAX_BYTES
from tracehouse.v1 import ingest_pb2

WRITE = "/tracehouse.v1.Ingest/Write"


class HeldStore(Store):
    """A real store whose writes wait at a gate until `release` is set; `entered` is set
    when the first write reaches it."""

    entered: threading.Event
    release: threading.Event

    def claim_group(self, batches: Sequence[ValidatedBatch], received_ns: int) -> Claim:
        self.entered.set()
        self.release.wait(60)
        return super().claim_group(batches, received_ns)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[HeldStore]:
    opened = HeldStore.open(f"chdb://{tmp_path / 'store'}", DEFAULT_LIMITS)
    assert isinstance(opened, HeldStore)
    opened.entered, opened.release = threading.Event(), threading.Event()
    yield opened
    opened.release.set()
    opened.close()


@pytest.fixture
def tight(held: HeldStore) -> Iterator[Server]:
    """The server with a bound of one byte: a write is admitted only when none is in flight."""
    running = create_server(held, "127.0.0.1:0", DEFAULT_LIMITS, max_pending_bytes=1)
    yield running
    held.release.set()
    running.stop(grace=5)


def test_admission_holds_the_bound_and_always_admits_a_write_alone() -> None:
    admission = Admission(100)
    with admission.admit(150):  # larger than the bound, but nothing else is in flight
        with pytest.raises(Overloaded) as near, admission.admit(10):
            pass
        with pytest.raises(Overloaded) as far, admission.admit(1_000):
            pass
        assert BEHIND in str(near.value) and "--max-pending-bytes" in str(near.value)
        assert 0 < near.value.retry_ms < far.value.retry_ms, "the further over, the longer the wait"
        assert admission.counts().pending_bytes == 150
    with admission.admit(60), admission.admit(40):
        assert admission.counts().pending_calls == 2
    final = admission.counts()
    assert (final.pending_bytes, final.pending_calls, final.peak_bytes) == (0, 0, 150)
    assert (final.admitted, final.refused) == (3, 2)


def test_admission_holds_the_bound_on_calls() -> None:
    admission = Admission(1 << 20, max_calls=2)
    with admission.admit(10), admission.admit(10):
        with pytest.raises(Overloaded) as refused, admission.admit(10):
            pass
        assert BEHIND in str(refused.value) and "2 writes" in str(refused.value) and refused.value.retry_ms > 0
    with admission.admit(10), admission.admit(10):
        pass
    assert (admission.counts().admitted, admission.counts().refused) == (4, 1)


def test_admission_is_released_when_the_write_fails() -> None:
    admission = Admission(100)
    with pytest.raises(RuntimeError), admission.admit(80):
        raise RuntimeError("the store went away")
    with admission.admit(100):
        assert admission.counts().pending_bytes == 100


def _finish(admission: Admission, clock: Clock, took_s: float, *sizes: int) -> None:
    """Writes of `sizes` bytes, one after another, each `took_s` long."""
    for size in sizes:
        with admission.admit(size):
            clock.now += took_s


def test_admission_takes_no_more_than_the_store_answers_within_the_target() -> None:
    clock = Clock()
    admission = Admission(1 << 30, max_calls=500, target_ms=1_000, clock=clock)
    _finish(admission, clock, 0.6, 1_000, 1_000)  # 2,000 bytes a second, each write longer than half the target
    with admission.admit(1_000):
        with pytest.raises(Overloaded) as refused, admission.admit(1_500):  # 2,500 bytes ahead: 1.25 s
            pass
        assert "s of work" in str(refused.value) and "--ack-target-ms" in str(refused.value)
        assert refused.value.retry_ms > 0
        with admission.admit(500):  # 1,500 bytes: 0.75 s
            pass
    assert admission.counts().refused == 1


def test_admission_leaves_the_pace_alone_while_the_store_keeps_up() -> None:
    clock = Clock()
    admission = Admission(1 << 30, max_calls=500, target_ms=1_000, clock=clock)
    _finish(admission, clock, 0.4, 1_000, 1_000)  # quicker than half the target: the pace is what was offered
    with admission.admit(1_000), admission.admit(5_000):
        assert admission.counts().pending_bytes == 6_000


def test_admission_does_not_foretell_a_large_write_from_the_pace_of_small_ones() -> None:
    """A store's writes cost mostly per insert: small writes finishing slowly (run descriptions under
    load) say nothing of how long a large one takes. It is taken; once the store has stored as many
    bytes lately, the wait bound holds again."""
    clock = Clock()
    admission = Admission(1 << 30, max_calls=500, target_ms=1_000, clock=clock)
    _finish(admission, clock, 0.6, 300, 300)  # 600 bytes in 3 s: a 1 MB chunk would be "1,700 s of work"
    with admission.admit(300), admission.admit(1_000_000):
        assert admission.counts().pending_bytes == 1_000_300
    measured = Admission(1 << 30, max_calls=500, target_ms=1_000, clock=clock)
    _finish(measured, clock, 0.6, 1_000_000, 1_000_000)  # 2 MB a second, on writes as large
    with measured.admit(1_000_000), pytest.raises(Overloaded), measured.admit(2_000_000):  # 1.5 s ahead
        pass


def test_a_write_taken_into_its_group_waited_only_until_then() -> None:
    """A batch that stands alone is answered once its group is stored (ingest/groupcommit.py): its time
    counts until its group was taken, not the insert of the chunks sent with it. Writes that waited 0.1 s
    of their 0.6 say the store keeps up (the pace is what was offered), where 0.6 s would say it is behind."""
    clock = Clock()
    for waited, refused in ((0.1, False), (None, True)):
        admission = Admission(1 << 30, max_calls=500, target_ms=1_000, clock=clock)
        for _ in range(2):
            with admission.admit(1_000) as admitted:
                release = admitted.hand_over()
                if waited is not None:
                    clock.now += waited
                    admitted.taken()
                clock.now += 0.6 - (waited or 0.0)
            release()
        with admission.admit(1_000):  # 2,500 bytes ahead at 2,000 a second: 1.25 s, if the store is behind
            if refused:
                with pytest.raises(Overloaded), admission.admit(1_500):
                    pass
            else:
                with admission.admit(1_500):
                    pass


def test_admission_keeps_a_write_within_a_third_of_its_callers_deadline() -> None:
    clock = Clock()
    admission = Admission(1 << 30, max_calls=500, target_ms=60_000, clock=clock)
    _finish(admission, clock, 0.5, 1_000, 1_000)
    with admission.admit(1_000):  # with one more, 2,000 bytes in flight: 1 s at 2,000 bytes a second
        with pytest.raises(Overloaded) as refused, admission.admit(1_000, deadline_s=2.4):  # may wait 0.8 s
            pass
        assert "a third of the call's deadline" in str(refused.value)
        with admission.admit(1_000, deadline_s=3.6):  # may wait 1.2 s
            pass


def test_admission_survives_writes_of_no_bytes() -> None:
    clock = Clock()
    admission = Admission(1 << 30, max_calls=500, target_ms=1_000, clock=clock)
    _finish(admission, clock, 0.6, 0, 0)  # empty requests, slow: no pace to divide by
    with admission.admit(10), admission.admit(10):
        assert admission.counts().pending_calls == 2


def test_admission_takes_a_first_few_writes_until_it_knows_the_pace() -> None:
    admission = Admission(1 << 30, max_calls=500)
    with contextlib.ExitStack() as in_flight:
        for _ in range(FIRST_CALLS):
            in_flight.enter_context(admission.admit(10))
        with pytest.raises(Overloaded) as refused, admission.admit(10):
            pass
        assert refused.value.retry_ms > 0 and f"(--max-pending-bytes), {FIRST_CALLS} writes" in str(refused.value)
    with admission.admit(10):
        pass
    with contextlib.ExitStack() as in_flight:  # the pace known, the bound is the target's
        for _ in range(FIRST_CALLS + 1):
            in_flight.enter_context(admission.admit(0))


def test_server_refuses_with_a_pushback_hint_and_writes_nothing_of_it(tight: Server, held: HeldStore) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{tight.port}") as channel:
        write = encoded_write(channel)
        first = write.future(encode_request(telemetry("held", run_id="held").build()), timeout=60)
        assert held.entered.wait(30), "the first write is in the store, holding the bound"
        refused_batch = encode_request(telemetry("later", run_id="later").build())
        with pytest.raises(grpc.RpcError) as refused:
            write(refused_batch, timeout=30)
        error = refused.value
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and BEHIND in error.details()
        trailer = dict(error.trailing_metadata())
        assert int(trailer[PUSHBACK_KEY]) > 0 and pushback_seconds(error) == int(trailer[PUSHBACK_KEY]) / 1000
        assert counts(held)["ingest_batches"] == 0 and counts(held)["samples"] == 0, "nothing half-written"
        held.release.set()
        assert first.result().samples == 400
        answer = write(refused_batch, timeout=30)
    assert (answer.duplicate, answer.samples) == (False, 400)
    # taken within 3 s of a refusal, it may be answered once claimed, its rows in a moment later
    assert tight.commit is not None
    tight.commit.settle_answered()
    assert counts(held)["ingest_batches"] == 2 and counts(held)["samples"] == 800


def test_writes_beyond_the_workers_are_refused_at_once_not_left_to_time_out(held: HeldStore) -> None:
    """At the default bound, agent-sized batches never fill it while the store is stalled: the
    writes in flight hold worker threads instead. Those beyond what the workers can hold are
    refused with a retry hint, rather than left in gRPC's queue until their deadline."""
    workers, writers = 16, 40
    running = create_server(held, "127.0.0.1:0", DEFAULT_LIMITS, workers=workers)
    batches = [encode_request(telemetry(f"w{i}", run_id="many", n=14_000).build()) for i in range(writers)]
    assert len(batches[0]) > 1_000_000 and sum(map(len, batches)) < DEFAULT_MAX_PENDING_BYTES
    answers: queue.Queue[Any] = queue.Queue()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            write = encoded_write(channel)
            for batch in batches:
                write.future(batch, timeout=30).add_done_callback(answers.put)
            # with the store held, only refusals come back: at least those beyond the workers
            early = [answers.get(timeout=60) for _ in range(writers - workers)]
            for call in early:
                assert call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, call.code()
                assert BEHIND in call.details() and pushback_seconds(call.exception()) is not None
            held.release.set()
            rest = [answers.get(timeout=60) for _ in range(workers)]
    finally:
        held.release.set()
        running.stop(grace=5)
    stored = [call for call in rest if call.code() == grpc.StatusCode.OK]
    refused = [call for call in rest if call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert 0 < len(stored) < workers and len(stored) + len(refused) == workers, [c.code() for c in rest]
    assert all(pushback_seconds(call.exception()) is not None for call in refused)
    assert counts(held)["ingest_batches"] == len(stored)


def test_an_agent_told_to_wait_spools_and_then_delivers_everything(
    tight: Server, held: HeldStore, tmp_path: Path
) -> None:
    address = f"127.0.0.1:{tight.port}"
    with grpc.insecure_channel(address) as channel:
        holder = encoded_write(channel).future(encode_request(telemetry("held", run_id="held").build()), timeout=60)
        assert held.entered.wait(30)
        agent = Agent(config(address, tmp_path / "spool"), SimulatedBackend(2))
        busy = threading.Semaphore(0)
        agent.shipper.on_write = lambda _, outcome: busy.release() if outcome is Outcome.BUSY else None
        agent.start()
        try:
            # the second refusal is of a batch that the first one sent to the spool
            assert busy.acquire(timeout=30) and busy.acquire(timeout=30)
            assert agent.spool.batches > 0 and agent.stats.snapshot()["stored"] == 0
        finally:
            held.release.set()
        holder.result()
        report = agent.stop()
    assert report["sampled"] and report["stored"] == report["sampled"]
    assert (report["dropped"], report["spooled"]) == (0, 0)
    assert agent.shipper.busy_answers >= 2 and agent.shipper.spooled_batches > 0
    assert tight.commit is not None
    tight.commit.settle_answered()  # as a read through the server does: the writes answered once claimed
    assert sample_count(held, agent.run_id)[0] == report["sampled"], "each value stored once"


class FakeIngest:
    """An Ingest server that answers each Write with the next status it was given
    (code, pushback trailer or None), then stores nothing and says OK."""

    def __init__(self, answers: list[tuple[grpc.StatusCode, str | None]]) -> None:
        self.answers = list(answers)
        self.received: list[str] = []
        self.calls = 0
        self.server = grpc.server(ThreadPoolExecutor(max_workers=2))
        handler = grpc.unary_unary_rpc_method_handler(
            self._write, request_deserializer=None, response_serializer=lambda answer: answer.SerializeToString()
        )
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("tracehouse.v1.Ingest", {"Write": handler}),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _write(self, data: bytes, context: grpc.ServicerContext) -> ingest_pb2.WriteResponse:
        self.calls += 1
        if self.answers:
            code, trailer = self.answers.pop(0)
            if trailer is not None:
                context.set_trailing_metadata(((PUSHBACK_KEY, trailer),))
            context.abort(code, "told to refuse")
        self.received.append(ingest_pb2.WriteRequest.FromString(data).batch.batch_id)
        return ingest_pb2.WriteResponse()


@pytest.fixture
def fake(request: pytest.FixtureRequest) -> Iterator[FakeIngest]:
    running = FakeIngest(request.param)
    yield running
    running.server.stop(0)


def _batches(count: int) -> list[EncodedBatch]:
    return [EncodedBatch(f"b{i}", encode_request(telemetry(f"b{i}", n=10).build()), 40) for i in range(count)]


def _shipper(port: int, tmp_path: Path, fates: dict[str, list[str]]) -> Shipper:
    spool = Spool(tmp_path / "spool", 1 << 20, on_drop=lambda batch_id, _: fates["dropped"].append(batch_id))
    return Shipper(
        f"127.0.0.1:{port}",
        spool,
        on_stored=lambda batch_id, _: fates["stored"].append(batch_id),
        on_dropped=lambda batch_id, _: fates["dropped"].append(batch_id),
        max_backoff=0.2,
    )


@pytest.mark.parametrize("fake", [[(grpc.StatusCode.RESOURCE_EXHAUSTED, "30")] * 3], indirect=True)
def test_the_shipper_waits_as_asked_and_keeps_the_order(fake: FakeIngest, tmp_path: Path) -> None:
    fates: dict[str, list[str]] = {"stored": [], "dropped": []}
    shipper = _shipper(fake.port, tmp_path, fates)
    for batch in _batches(5):
        shipper.submit(batch)
    shipper.shutdown(timeout=30)
    assert fates == {"stored": [f"b{i}" for i in range(5)], "dropped": []}
    assert fake.received == fates["stored"] and fake.calls == 8
    assert shipper.busy_answers == 3 and shipper.spooled_batches > 0 and shipper.spool.batches == 0


@pytest.mark.parametrize(
    "fake",
    [[(grpc.StatusCode.RESOURCE_EXHAUSTED, None)], [(grpc.StatusCode.RESOURCE_EXHAUSTED, "-1")]],
    indirect=True,
    ids=["no-hint", "do-not-retry"],
)
def test_resource_exhausted_without_a_hint_is_retried_after_a_pause(fake: FakeIngest, tmp_path: Path) -> None:
    """As gRPC's own limit on concurrent calls, a resource quota or a proxy answers."""
    fates: dict[str, list[str]] = {"stored": [], "dropped": []}
    shipper = _shipper(fake.port, tmp_path, fates)
    for batch in _batches(2):
        shipper.submit(batch)
    shipper.shutdown(timeout=30)
    assert fates == {"stored": ["b0", "b1"], "dropped": []} and fake.calls == 3
    assert shipper.busy_answers == 1


@pytest.mark.parametrize("fake", [[(grpc.StatusCode.RESOURCE_EXHAUSTED, None)]], indirect=True)
def test_only_a_batch_over_the_transport_limit_is_refused_for_good(fake: FakeIngest) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{fake.port}") as channel, pytest.raises(grpc.RpcError) as failed:
        encoded_write(channel)(_batches(1)[0].payload, timeout=30)
    assert classify(failed.value, TRANSPORT_MAX_BYTES) == (Outcome.BUSY, UNHINTED_PUSHBACK_S)
    assert classify(failed.value, TRANSPORT_MAX_BYTES + 1) == (Outcome.REFUSED, 0.0)


def _write_one(fake: FakeIngest) -> None:
    """`tracehouse import`'s writer sends one batch, w0, to the fake and waits for its answer."""
    writer = BatchWriter(f"127.0.0.1:{fake.port}", concurrency=1)
    try:
        writer.write(telemetry("w0", n=10).build())
        writer.flush()
    finally:
        writer.close()


@pytest.mark.parametrize("fake", [[(grpc.StatusCode.RESOURCE_EXHAUSTED, "20")] * 2], indirect=True)
def test_the_import_writer_waits_as_asked(fake: FakeIngest) -> None:
    _write_one(fake)
    assert fake.received == ["w0"] and fake.calls == 3


@pytest.mark.parametrize("fake", [[(grpc.StatusCode.RESOURCE_EXHAUSTED, None)]], indirect=True)
def test_the_import_writer_pauses_on_resource_exhausted_without_a_hint(
    fake: FakeIngest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agent.shipping.shipper.UNHINTED_PUSHBACK_S", 0.01)
    _write_one(fake)
    assert fake.received == ["w0"] and fake.calls == 2


@pytest.mark.parametrize("fake", [[(grpc.StatusCode.INVALID_ARGUMENT, None)]], indirect=True)
def test_the_import_writer_gives_up_on_a_refused_batch(fake: FakeIngest) -> None:
    with pytest.raises(WriteFailed) as failed:
        _write_one(fake)
    assert failed.value.code == grpc.StatusCode.INVALID_ARGUMENT and fake.calls == 1


def test_max_pending_bytes_option() -> None:
    parser = build_parser()
    for command in (["serve"], ["up"], ["bench", "load"]):
        assert parser.parse_args(command).max_pending_bytes == DEFAULT_MAX_PENDING_BYTES
    assert parser.parse_args(["serve", "--max-pending-bytes", "64K"]).max_pending_bytes == 64 << 10
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--max-pending-bytes", "lots"])


def test_ack_target_option(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    for command in (["serve"], ["up"], ["bench", "load"]):
        assert parser.parse_args(command).ack_target_ms == DEFAULT_TARGET_MS
    assert parser.parse_args(["serve", "--ack-target-ms", "1500"]).ack_target_ms == 1_500
    for bad, why in (("soon", "is not a whole number of milliseconds"), ("0", "0 ms is not within 10..600000")):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--ack-target-ms", bad])
        assert why in capsys.readouterr().err


def test_bench_load_loses_nothing_and_reports_its_figures() -> None:
    result = bench_load(agents=2, gpus=2, interval=0.1, seconds=3.0, max_pending_bytes=1)
    assert result["lost"] == 0 and result["goal"]["met"], result
    assert result["sampled_values"] == result["stored_values"] > 0 and result["stored_twice"] == 0
    assert (result["dropped"], result["left_in_spool"]) == (0, 0)
    assert result["offered_values_per_s"] > 0 and result["write_calls"] > 0
    assert result["write_latency_ms"]["p99"] >= result["write_latency_ms"]["p50"] > 0
    assert result["server_peak_rss_mb"] > 0 and result["server_away"] == 0
    # whether two writes meet at the one-byte bound is up to timing; a refused batch always waits in the spool
    assert result["resource_exhausted"] == 0 or result["spooled_batches"] > 0


def test_writers_turned_away_get_turns_one_after_another_at_the_stores_pace() -> None:
    """Writers refused while the store is behind are each given a turn after those refused before
    them, a write's bytes at the recent pace apart, so that they come back spread out at the pace the
    store takes them, not all at once; a schedule that has passed delays no one."""
    clock = Clock()
    admission = Admission(1 << 30, max_calls=500, target_ms=1_000, clock=clock)
    _finish(admission, clock, 0.6, 1_000, 1_000)  # 2,000 bytes a second, each write longer than half the target
    turns = []
    with admission.admit(1_000), admission.admit(1_000):  # with one more, 1.5 s of work ahead
        for _ in range(4):
            with pytest.raises(Overloaded) as refused, admission.admit(1_000):
                pass
            turns.append(refused.value.retry_ms)
    assert turns == [1_000, 1_500, 2_000, 2_500]  # until it fits (less half the target), then 0.5 s apart
    clock.now += 10.0
    _finish(admission, clock, 0.6, 1_000, 1_000)  # the same pace again, the turns long past
    with admission.admit(1_000), admission.admit(1_000):
        with pytest.raises(Overloaded) as refused, admission.admit(1_000):
            pass
        assert refused.value.retry_ms == 1_000


def test_the_bound_stays_on_while_writers_turned_away_are_yet_to_come_back() -> None:
    clock = Clock()
    admission = Admission(1 << 30, max_calls=500, target_ms=1_000, clock=clock)
    _finish(admission, clock, 0.6, 1_000, 1_000)
    with admission.admit(1_000), admission.admit(1_000), pytest.raises(Overloaded) as refused, admission.admit(1_000):
        pass
    assert refused.value.retry_ms == 1_000  # a turn from 1 s on, until 1.5 s
    # the two writes held finished at once: taken alone, the writes of late say the store keeps up
    with admission.admit(1_000), admission.admit(1_000):
        with pytest.raises(Overloaded), admission.admit(4_000):  # yet the turn given is to come
            pass
        clock.now += 2.5  # the turns given, this write's too, have come and gone
        with admission.admit(4_000):
            assert admission.counts().pending_bytes == 6_000


def _turn_away(admission: Admission, size: int) -> int:
    with pytest.raises(Overloaded) as refused, admission.admit(size):
        pass
    return refused.value.retry_ms


def test_turns_run_no_further_ahead_than_the_longest_pause_whatever_the_pace() -> None:
    """A pace measured on the first few writes can be far below the store's: turns given at it would
    run minutes ahead, and every write turned away after them, the pace known by then, would wait the
    longest pause for turns that no one holds."""
    clock = Clock()
    admission = Admission(1 << 30, max_calls=500, target_ms=1_000, clock=clock)
    _finish(admission, clock, 0.6, 1_000)  # 1,000 bytes a second: a turn a second for writes of 1,000
    with admission.admit(1_000):
        turns = [_turn_away(admission, 1_000) for _ in range(12)]
    assert turns[:3] == [1_500, 2_500, 3_500] and turns[-3:] == [MAX_RETRY_MS] * 3
    clock.now += MAX_RETRY_MS / 1000
    _finish(admission, clock, 0.6, *[1_000] * 4)  # 4,000 bytes in the 1.8 s since the first finished
    with admission.admit(1_000), admission.admit(1_000):
        assert _turn_away(admission, 1_000) == 850  # once 3,000 bytes would fit at that pace, less half the target


def test_a_crowd_turned_away_comes_back_spread_out_at_the_stores_pace() -> None:
    """More writes turned away over the window than the server takes at once: writers that are behind
    take the room as soon as they are answered, so turns would only bring the others back to be refused
    again. Each is asked to stay away until the store has taken, at the recent pace, what is in flight
    and what the writers turned away before it bring back: at least a second, at most the longest
    pause. One pause for all brought a crowd back at once, and left the server idle meanwhile."""
    clock = Clock()
    admission = Admission(1 << 30, max_calls=3, target_ms=1_000, clock=clock)
    _finish(admission, clock, 0.6, 1_000, 1_000)  # 2,000 bytes a second
    assert not admission.turning_away()
    with admission.admit(1_000), admission.admit(1_000):
        hints = [_turn_away(admission, 1_000) for _ in range(7)]
        # three turns, then the crowd: 2,000 bytes in flight, 1,000 more for each writer away, its own
        assert hints == [1_000, 1_500, 2_000, 1_500, 2_000, 2_500, 3_000]
        assert admission.turning_away()
    clock.now += 30.0  # the crowd is back, no refusal over the window
    assert not admission.turning_away()
    _finish(admission, clock, 0.6, 1_000, 1_000)
    with admission.admit(1_000), admission.admit(1_000):
        assert [_turn_away(admission, 1_000) for _ in range(3)] == [1_000, 1_500, 2_000]  # a burst: turns
        # a crowd again, which brings back none of the crowd before it; never longer than the longest pause
        assert [_turn_away(admission, 1_000), _turn_away(admission, 20_000)] == [1_500, MAX_RETRY_MS]


def test_a_crowd_turned_away_while_the_pace_is_unknown_comes_back_in_a_second() -> None:
    clock = Clock()
    admission = Admission(1 << 30, max_calls=2, target_ms=1_000, clock=clock)
    with admission.admit(1_000), admission.admit(1_000):
        hints = [_turn_away(admission, 1_000) for _ in range(4)]
    assert hints[2:] == [MIN_CROWD_MS, MIN_CROWD_MS] and max(hints[:2]) < MIN_CROWD_MS
    clock.now += MIN_CROWD_MS / 1000
    assert admission.turning_away(), "refused within the window"
    clock.now += 3.0
    assert not admission.turning_away()
