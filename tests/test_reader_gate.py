"""tracehouse's own reads (the Query service, the keeper) take one of query_max_concurrent places, each
bounded in time and memory; writes have the store's clients to themselves: no crowd of readers holds
them up, and a read that finds no place soon is refused at once with a retry hint."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from clickhouse_connect.driver.client import Client

from store.pools import can_renice
from store.store import Store
from store.storeerrors import QueryTooLarge, StoreError
from tests.conftest import small_limits
from tests.helpers import request, telemetry, wait_until
from tests.timeline_trace import Trace
from tracehouse.pushback import PUSHBACK_KEY
from tracehouse.v1 import ingest_pb2_grpc, query_pb2, query_pb2_grpc

# a read that sleeps in the engine for 30 s (a block a row, so that it can be stopped at each)
SLOW = "SELECT sleepEachRow(0.1) FROM numbers(300) SETTINGS max_block_size = 1 -- slow read"


class SlowReads:
    """`n` slow reads through the store's own read path, each on a thread of its own; stopped by
    KILL QUERY from a client of neither of the store's pools."""

    def __init__(self, store: Store, n: int) -> None:
        self.store = store
        self.outcomes: list[BaseException | None] = []
        self.threads = [threading.Thread(target=self._read) for _ in range(n)]
        self._engine: Client | None = store.location.client()
        for thread in self.threads:
            thread.start()

    def _read(self) -> None:
        try:
            self.store.query(SLOW)
            self.outcomes.append(None)
        except StoreError as error:
            self.outcomes.append(error)

    def running(self) -> int:
        """How many of them the engine is running now."""
        assert self._engine is not None
        found = self._engine.query(
            "SELECT count() FROM system.processes WHERE query LIKE '%-- slow read%' AND query NOT LIKE '%processes%'"
        )
        return int(found.result_rows[0][0])

    def stop(self) -> None:
        if self._engine is None:
            return
        self._engine.command("KILL QUERY WHERE query LIKE '%-- slow read%' AND query NOT LIKE '%processes%' SYNC")
        for thread in self.threads:
            thread.join(timeout=60)
        self._engine.close()
        self._engine = None


@pytest.fixture
def slow_reads() -> Iterator[list[SlowReads]]:
    made: list[SlowReads] = []
    yield made
    for reads in made:
        reads.stop()


def test_a_write_is_stored_while_every_place_for_reads_is_held_by_a_slow_read(
    store: Store, ingest: ingest_pb2_grpc.IngestStub, slow_reads: list[SlowReads]
) -> None:
    # as many slow reads as there are places (before, reads and writes shared 4 clients: these took them all)
    reads = SlowReads(store, store.limits.query_max_concurrent)
    slow_reads.append(reads)
    wait_until(lambda: reads.running() == store.limits.query_max_concurrent, 30, "every slow read runs")
    answer = ingest.Write(request(telemetry("while-reading")), timeout=30)
    assert answer.samples == 400 and not answer.duplicate
    assert reads.running() == store.limits.query_max_concurrent, "the write did not wait for a read to end"
    assert all(thread.is_alive() for thread in reads.threads) and not reads.outcomes


@pytest.mark.parametrize("limits", [small_limits(query_max_concurrent=1, query_queue_seconds=0.2)])
def test_a_read_beyond_the_places_is_refused_at_once_with_a_retry_hint(
    store: Store, channel: grpc.Channel, traces: dict[str, Trace], slow_reads: list[SlowReads]
) -> None:
    stub = query_pb2_grpc.QueryStub(channel)
    lanes = query_pb2.LanesRequest(window=query_pb2.Window(run_id="r1"), buckets=100)
    assert stub.Lanes(lanes, timeout=30).events > 0
    reads = SlowReads(store, 1)
    slow_reads.append(reads)
    wait_until(lambda: reads.running() == 1, 30, "the slow read runs")
    with pytest.raises(grpc.RpcError) as caught:
        stub.Lanes(lanes, timeout=30)
    error = caught.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    assert error.details() == "busy: as many reads are running as may at once (1): try again in 1 s"
    assert dict(error.trailing_metadata() or ())[PUSHBACK_KEY] == "1000"
    assert reads.running() == 1 and reads.threads[0].is_alive(), "refused while the place was still taken"
    reads.stop()
    assert stub.Lanes(lanes, timeout=30).events > 0, "once a place is free, reads are answered again"


@pytest.mark.parametrize("limits", [small_limits(query_max_concurrent=1, query_max_seconds=1.0)])
def test_a_read_past_its_time_is_refused_naming_the_limit(store: Store) -> None:
    started = time.monotonic()
    with pytest.raises(QueryTooLarge, match=r"^the query ran past the 1 s limit of one read \("):
        store.query(SLOW)
    assert time.monotonic() - started < 25, "stopped at its limit, not at its end (30 s)"
    assert store.query("SELECT 1 AS one").to_pylist() == [{"one": 1}], "the next read is answered"


# measured: listing runs needs under 256 KiB, the lanes of run r1 over 1 MiB
@pytest.mark.parametrize("limits", [small_limits(query_max_concurrent=2, query_max_memory_bytes=1 << 20)])
def test_a_read_past_its_share_of_memory_is_refused_and_the_server_answers_the_next(
    channel: grpc.Channel, traces: dict[str, Trace], ingest: ingest_pb2_grpc.IngestStub
) -> None:
    stub = query_pb2_grpc.QueryStub(channel)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Lanes(query_pb2.LanesRequest(window=query_pb2.Window(run_id="r1"), buckets=1000), timeout=30)
    error = caught.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    assert error.details().startswith("the query needed more than its 512 KiB of memory (reads at once share 1 MiB)")
    assert {run.run_id for run in stub.ListRuns(query_pb2.ListRunsRequest(), timeout=30).runs} == {"r1", "r2"}
    assert ingest.Write(request(telemetry("after-refusal")), timeout=30).samples == 400


def test_reads_run_at_the_lowest_priority_where_the_server_can_give_it_back(store: Store) -> None:
    lowest = 19 if can_renice() else 0  # without CAP_SYS_NICE the engine's shared threads would stay low
    assert store.query("SELECT getSetting('os_threads_nice_value_query') AS nice").to_pylist() == [{"nice": lowest}]


def test_users_sql_runs_at_the_lowest_priority_too(store: Store) -> None:
    if not can_renice():
        pytest.skip("this process cannot give a thread's priority back (no CAP_SYS_NICE): reads run as writes do")
    refused: list[BaseException] = []
    user = threading.Thread(target=lambda: _refused(refused, store.user_sql, "SELECT count() FROM numbers(1e11)", 1))
    user.start()
    engine = store.location.client()
    # the query itself, not the checks before it (EXPLAIN AST, DESCRIBE) nor this test's own
    the_users_query = (
        "query LIKE '%numbers(1e11)%' AND query NOT LIKE '%processes%' "
        "AND query NOT LIKE 'EXPLAIN%' AND query NOT LIKE 'DESCRIBE%'"
    )
    try:
        seen: list[tuple[str, ...]] = []

        def running() -> bool:
            seen[:] = map(
                tuple,
                engine.query(
                    "SELECT Settings['os_threads_nice_value_query'], Settings['readonly'] FROM system.processes "
                    f"WHERE {the_users_query}"
                ).result_rows,
            )
            return bool(seen)

        wait_until(running, 30, "the user's query runs")
        assert seen == [("19", "1")]
    finally:
        engine.command(f"KILL QUERY WHERE {the_users_query} SYNC")
        engine.close()
        user.join(60)
    assert not user.is_alive(), "the killed query came back (refused, or cut short where the engine answers a kill so)"


def _refused(into: list[BaseException], call: Callable[..., object], *args: object) -> None:
    try:
        call(*args)
    except StoreError as error:
        into.append(error)
