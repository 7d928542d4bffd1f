"""Ingest over real gRPC into a real chDB store: exactly once, and bad batches refused whole."""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc
import numpy as np
import pytest

from ingest.validate import ValidatedBatch
from store.store import Store
from tests.helpers import MS, T0, S, counts, kernels, request, telemetry
from tracehouse.batch import BatchBuilder
from tracehouse.model import DEFAULT_LIMITS
from tracehouse.v1 import batch_pb2, ingest_pb2, ingest_pb2_grpc


def test_write_then_read_back_once(ingest: ingest_pb2_grpc.IngestStub, store: Store) -> None:
    batch = telemetry("b-1").add_run("run-a", host="host-a", source="agent", start=T0)
    answer = ingest.Write(request(batch), timeout=30)
    assert not answer.duplicate
    assert (answer.samples, answer.events, answer.runs) == (400, 0, 1)
    assert counts(store)["samples"] == 400
    values = store.query(
        "SELECT gpu, metric, toUnixTimestamp64Nano(ts) AS ts, value FROM {db}.samples "
        "WHERE metric = 'gpu.util' ORDER BY gpu, ts"
    )
    assert values.column("ts").to_pylist()[:2] == [T0, T0 + 100 * MS]
    assert values.column("value").to_pylist()[:3] == [0.0, 1.0, 2.0]
    assert values.column("gpu").to_pylist()[100] == 1


def test_same_batch_id_is_stored_once_whatever_the_retries(ingest: ingest_pb2_grpc.IngestStub, store: Store) -> None:
    builder = telemetry("b-retry")
    builder.add_events("kernel", [T0, T0 + MS], [T0 + MS, T0 + 2 * MS], "gemm", gpu=0)
    batch = builder.build()
    first = ingest.Write(request(batch), timeout=30)
    assert not first.duplicate
    for _ in range(3):
        again = ingest.Write(request(batch), timeout=30)
        assert again.duplicate
        assert (again.samples, again.events) == (first.samples, first.events)
    assert counts(store)["samples"] == 400
    assert counts(store)["events"] == 2
    assert counts(store)["ingest_batches"] == 1


def test_concurrent_writes_of_one_batch_store_it_once(ingest: ingest_pb2_grpc.IngestStub, store: Store) -> None:
    message = request(telemetry("b-race", n=2000))
    answers: list[ingest_pb2.WriteResponse] = []
    threads = [threading.Thread(target=lambda: answers.append(ingest.Write(message, timeout=60))) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(a.duplicate for a in answers) == [False] + [True] * 5
    assert counts(store)["samples"] == 8000


def test_a_retry_after_a_partial_write_completes_it_without_duplicates(
    ingest: ingest_pb2_grpc.IngestStub, store: Store
) -> None:
    builder = telemetry("b-partial")
    builder.add_events("kernel", [T0], [T0 + MS], "k")
    message = request(builder)
    # the group and its samples reached the store, then the server died before the events and the ledger
    from ingest.validate import validate_batch
    from store.group import new_group

    group = new_group([validate_batch(message.batch, DEFAULT_LIMITS, T0)], T0)
    with store._client() as raw:
        store._insert_pending(raw, group)
        store._insert(raw, "samples", group.tables["samples"], group.token("samples"))
    store._left_unfinished = store._unfinished_groups()  # what the store's only writer finds when it starts again
    assert counts(store)["samples"] == 400
    answer = ingest.Write(message, timeout=30)
    assert not answer.duplicate
    assert counts(store)["samples"] == 400
    assert counts(store)["events"] == 1


def test_a_group_whose_batches_are_all_left_out_keeps_none_of_their_rows() -> None:
    """Finishing a group whose every batch another claim stores (two servers claimed them) leaves all out."""
    from ingest.validate import validate_batch
    from store.group import new_group

    batches = [validate_batch(request(telemetry(f"left-{i}", n=5)).batch, DEFAULT_LIMITS, T0) for i in range(2)]
    group = new_group(batches, T0)
    assert group.without({1}, "samples").num_rows == 20
    none = group.without({0, 1}, "samples")
    assert none.num_rows == 0 and none.schema == group.tables["samples"].schema


@pytest.mark.parametrize(
    "other",
    [
        lambda: telemetry("b-x", n=20),  # other row counts
        lambda: telemetry("b-x", n=10, host="host-b"),  # the same counts, other content
        lambda: telemetry("b-x", n=10, t0=T0 + 1),
    ],
)
def test_same_batch_id_with_other_content_is_refused(
    ingest: ingest_pb2_grpc.IngestStub, store: Store, other: Callable[[], BatchBuilder]
) -> None:
    ingest.Write(request(telemetry("b-x", n=10)), timeout=30)
    with pytest.raises(grpc.RpcError) as caught:
        ingest.Write(request(other()), timeout=30)
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "b-x" in caught.value.details()
    assert counts(store)["samples"] == 40
    assert ingest.Write(request(telemetry("b-x", n=10)), timeout=30).duplicate, "the same content still is"


def test_a_batch_over_too_many_months_is_refused_whole(ingest: ingest_pb2_grpc.IngestStub, store: Store) -> None:
    builder = telemetry("months", n=5)
    month = 31 * 86_400 * 10**9
    builder.add_events("kernel", T0 + np.arange(150) * month, T0 + np.arange(150) * month + 5, "k")
    with pytest.raises(grpc.RpcError) as caught:
        ingest.Write(request(builder), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("events.start: spans 150 months")
    assert counts(store) == {"samples": 0, "events": 0, "runs": 0, "devices": 0, "ingest_batches": 0}


def _samples(**columns: list) -> batch_pb2.Batch:  # type: ignore[type-arg]
    batch = batch_pb2.Batch(batch_id="bad", run_id="r", host="h", dictionary=["gpu.util", "x" * 300])
    base = {"ts": [T0, T0 + 1], "metric": [0, 0], "value": [1.0, 2.0]}
    base.update(columns)
    for name, values in base.items():
        getattr(batch.samples, name).extend(values)
    return batch


def _events(**columns: list) -> batch_pb2.Batch:  # type: ignore[type-arg]
    batch = batch_pb2.Batch(batch_id="bad", run_id="r", host="h", dictionary=["kernel", "gemm", "bogus"])
    base = {"kind": [0, 0], "start": [T0, T0 + 10], "end": [T0 + 5, T0 + 20], "name": [1, 1]}
    base.update(columns)
    for name, values in base.items():
        getattr(batch.events, name).extend(values)
    return batch


def _with(make: Callable[[], batch_pb2.Batch], change: Callable[[batch_pb2.Batch], object]) -> batch_pb2.Batch:
    batch = make()
    change(batch)
    return batch


BAD_BATCHES = {
    "samples value length mismatch": (_samples(value=[1.0]), "samples.value"),
    "samples metric length mismatch": (_samples(metric=[0, 0, 0]), "samples.metric"),
    "optional gpu column half full": (_samples(gpu=[0]), "samples.gpu"),
    "metric outside the dictionary": (_samples(metric=[0, 9]), "samples.metric[1]"),
    "metric name too long": (_samples(metric=[0, 1]), "samples.metric"),
    "timestamp before 1970": (_samples(ts=[T0, -5]), "samples.ts[1]"),
    "NaN value": (_samples(value=[1.0, float("nan")]), "samples.value[1]"),
    "infinite value": (_samples(value=[float("inf"), 1.0]), "samples.value[0]"),
    "gpu index out of range": (_samples(gpu=[0, 99999]), "samples.gpu[1]"),
    "end before start": (_events(end=[T0 + 5, T0 + 1]), "events.end[1]"),
    "unknown kind": (_events(kind=[0, 2]), "events.kind"),
    "events length mismatch": (_events(name=[1]), "events.name"),
    "extras row that does not exist": (
        _events(extra_row=[5], extra_key=[1], extra_value=[1]),
        "events.extra_row[0]",
    ),
    "server-set id in a write": (_events(id=[1, 2]), "events.id"),
    "no batch id": (_with(_samples, lambda b: setattr(b, "batch_id", "")), "batch.batch_id"),
    "batch id with spaces": (_with(_samples, lambda b: setattr(b, "batch_id", "a b")), "batch.batch_id"),
    "no run for samples": (_with(_samples, lambda b: setattr(b, "run_id", "")), "samples.run"),
    "string over the limit": (
        _with(_samples, lambda b: b.dictionary.append("y" * (DEFAULT_LIMITS.max_string_bytes + 1))),
        "batch.dictionary[2]",
    ),
    "empty batch": (batch_pb2.Batch(batch_id="bad"), "batch"),
    "unknown run source": (
        _with(_samples, lambda b: b.runs.add(run_id="r", source="martian")),
        "runs[0].source",
    ),
    "run ends before it starts": (
        _with(_samples, lambda b: b.runs.add(run_id="r", source="user", start=T0, end=T0 - 1)),
        "runs[0].end",
    ),
    "device without host": (_with(_samples, lambda b: b.devices.add(gpu=0)), "devices[0].host"),
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_bad_batch_is_refused_whole_and_the_server_stays_up(
    case: str, ingest: ingest_pb2_grpc.IngestStub, store: Store
) -> None:
    batch, field = BAD_BATCHES[case]
    before = counts(store)
    with pytest.raises(grpc.RpcError) as caught:
        ingest.Write(ingest_pb2.WriteRequest(batch=batch), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith(field), caught.value.details()
    assert counts(store) == before, "nothing of a refused batch is stored"
    assert not ingest.Write(request(telemetry(f"good-after-{len(case)}", n=5)), timeout=30).duplicate


def test_bad_rows_after_good_ones_store_nothing(ingest: ingest_pb2_grpc.IngestStub, store: Store) -> None:
    builder = telemetry("mixed")  # 400 good samples
    builder.add_events("kernel", [T0, T0 + 10], [T0 + 5, T0 + 1], "k")  # the second ends before it starts
    with pytest.raises(grpc.RpcError) as caught:
        ingest.Write(request(builder), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert counts(store)["samples"] == 0
    assert counts(store)["ingest_batches"] == 0


def test_nan_timestamps_are_refused_by_the_encoder() -> None:
    with pytest.raises(ValueError, match=r"samples.ts\[1\]"):
        BatchBuilder("b").add_samples("m", np.array([1.0, np.nan]), [1.0, 2.0])
    with pytest.raises(ValueError, match=r"events.end\[0\]"):
        BatchBuilder("b").add_events("kernel", [1.0], [np.inf], "k")


def test_malformed_bytes_are_invalid_argument(channel: grpc.Channel, store: Store) -> None:
    raw = channel.unary_unary("/tracehouse.v1.Ingest/Write", request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as caught:
        raw(b"\xff\xff\xff\xff not protobuf", timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tracehouse.v1.WriteRequest" in caught.value.details()


def test_oversized_message_is_refused_naming_the_limit(ingest: ingest_pb2_grpc.IngestStub, store: Store) -> None:
    batch = batch_pb2.Batch(batch_id="huge", run_id="r", host="h")
    batch.dictionary.extend(["x" * 60_000] * 1200)  # ~72 MB, over the 64 MiB batch limit
    batch.samples.ts.append(T0)
    batch.samples.metric.append(0)
    batch.samples.value.append(1.0)
    with pytest.raises(grpc.RpcError) as caught:
        ingest.Write(ingest_pb2.WriteRequest(batch=batch), timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "limit" in caught.value.details()
    assert counts(store)["samples"] == 0
    assert not ingest.Write(request(telemetry("after-huge", n=3)), timeout=30).duplicate


def test_too_many_rows_in_one_batch(ingest: ingest_pb2_grpc.IngestStub, store: Store) -> None:
    n = DEFAULT_LIMITS.max_rows_per_table + 1
    batch = batch_pb2.Batch(batch_id="rows", run_id="r", host="h", dictionary=["m"])
    batch.samples.ts.extend(np.full(n, T0).tolist())
    batch.samples.metric.extend([0] * n)
    batch.samples.value.extend([0.0] * n)
    with pytest.raises(grpc.RpcError) as caught:
        ingest.Write(ingest_pb2.WriteRequest(batch=batch), timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("samples:")


def test_run_and_device_descriptions_replace_earlier_ones(ingest: ingest_pb2_grpc.IngestStub, store: Store) -> None:
    opened = BatchBuilder("run-open").add_run("run-z", name="z", host="h", source="agent", start=T0)
    opened.add_device("h", 0, uuid="GPU-0", name="old name")
    ingest.Write(request(opened), timeout=30)
    closed = BatchBuilder("run-closed").add_run("run-z", name="z", host="h", source="agent", start=T0, end=T0 + 5)
    closed.add_device("h", 0, uuid="GPU-0", name="new name")
    ingest.Write(request(closed), timeout=30)
    runs = store.query("SELECT toUnixTimestamp64Nano(end) AS end FROM {db}.runs FINAL WHERE run_id = 'run-z'")
    assert runs.column("end").to_pylist() == [T0 + 5]
    devices = store.query("SELECT name FROM {db}.devices FINAL")
    assert devices.column("name").to_pylist() == ["new name"]


def test_the_same_batch_encoded_again_is_a_duplicate_whatever_its_map_order(
    channel: grpc.Channel, store: Store
) -> None:
    from tracehouse.batch import encode_request

    write = channel.unary_unary(
        "/tracehouse.v1.Ingest/Write",
        request_serializer=None,
        response_deserializer=ingest_pb2.WriteResponse.FromString,
    )
    first = BatchBuilder("maps").add_run("r", source="user", tags={"a": "1", "b": "2", "c": "3"})
    again = BatchBuilder("maps").add_run("r", source="user", tags={"c": "3", "a": "1", "b": "2"})
    assert not write(encode_request(first.build()), timeout=30).duplicate
    assert write(encode_request(again.build()), timeout=30).duplicate
    assert counts(store)["runs"] == 1


def test_a_group_holds_at_most_commit_rows_rows_and_the_rest_waits_for_the_next(store: Store) -> None:
    """Six writers of 100 samples each at once, groups of at most 250 rows: no group of more than two
    batches (the first group may hold one), each writer answered once its own group is stored."""
    from ingest.commitpolicy import CommitPolicy
    from ingest.groupcommit import GroupCommit
    from ingest.validate import validate_batch

    batches = [validate_batch(request(telemetry(f"cap-{i}", n=25)).batch, DEFAULT_LIMITS, T0) for i in range(6)]
    assert {sum(batch.rows().values()) for batch in batches} == {100}
    commit = GroupCommit(store, CommitPolicy(interval_s=1.0, max_rows=250))
    answered: list[str] = []
    writers = [threading.Thread(target=lambda b=b: (commit.write(b, T0), answered.append(b.batch_id))) for b in batches]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
    commit.close()
    assert sorted(answered) == sorted(batch.batch_id for batch in batches)
    groups = (
        store.query("SELECT batch_ids FROM {db}.ingest_pending WHERE done = 0 ORDER BY _block_number")
        .column("batch_ids")
        .to_pylist()
    )
    assert sorted(id for ids in groups for id in ids) == sorted(answered)
    assert max(len(ids) for ids in groups) == 2 and len(groups) >= 3
    assert counts(store)["samples"] == 600


def test_a_writer_is_answered_once_its_batch_is_claimed_when_storing_takes_longer(store: Store) -> None:
    """Answers within 0 s: a writer of 200,000 samples is answered once its group is claimed (in
    ingest_pending, so stored once whatever fails), before its rows are in; `on_stored` comes once
    they are. A batch that describes a run is answered only once it is stored."""
    from ingest.commitpolicy import CommitPolicy
    from ingest.groupcommit import GroupCommit
    from ingest.validate import validate_batch

    big = validate_batch(request(telemetry("early", n=50_000)).batch, DEFAULT_LIMITS, T0)
    described = validate_batch(
        request(telemetry("described", n=50_000, t0=T0 + 3600 * 10**9).add_run("run-a", host="host-a", start=T0)).batch,
        DEFAULT_LIMITS,
        T0,
    )
    commit = GroupCommit(store, CommitPolicy(interval_s=0, answer_within_s=0))
    seen_when_stored: list[int] = []
    try:
        answer = commit.write(big, T0, on_stored=lambda: seen_when_stored.append(counts(store)["samples"]))
        assert (answer.duplicate, answer.rows["samples"]) == (False, 200_000)
        assert commit.answered_early == 1
        claimed = store.query("SELECT count() AS n FROM {db}.ingest_pending WHERE has(batch_ids, 'early')")
        assert claimed.column("n")[0].as_py() == 1, "answered once claimed"
        commit.write(described, T0)
        assert commit.answered_early == 1, "a run's description is answered once stored"
        assert counts(store)["samples"] == 400_000
    finally:
        commit.close()
    assert seen_when_stored == [200_000], "the bytes held for the write are let go once its rows are in"


def test_a_query_sees_the_writes_its_server_answered_once_claimed(store: Store) -> None:
    """By default (`--ack-within-ms 0`) writers are answered once their group is claimed, before its rows
    are in; a query on the same server, right after, waits for them and counts every row."""
    from ingest.commitpolicy import CommitPolicy
    from query.client import Client
    from tracehouse.cli.serve import create_server

    assert CommitPolicy() == CommitPolicy(answer_within_s=0)
    running = create_server(store, "127.0.0.1:0", DEFAULT_LIMITS)
    address = f"127.0.0.1:{running.port}"
    try:
        with grpc.insecure_channel(address) as channel, Client(address) as client:
            write = ingest_pb2_grpc.IngestStub(channel).Write
            for i in range(3):
                write(request(telemetry(f"seen-{i}", n=50_000, t0=T0 + i * 3600 * S)), timeout=60)
                seen = client.sql("SELECT count() AS n FROM samples")
                assert int(seen["n"][0]) == 200_000 * (i + 1)
            assert running.commit is not None and running.commit.answered_early == 3
    finally:
        running.stop(grace=5)


def test_writers_are_answered_at_the_claim_while_the_admission_turns_writers_away(store: Store) -> None:
    """With --ack-once-stored, a writer is answered once its batch is stored, but while the admission
    turns writers away (`answer_at_claim`), once its group is claimed: the writes it takes then are
    answered within the claim, not within the store's whole queue."""
    from ingest.commitpolicy import CommitPolicy
    from ingest.groupcommit import GroupCommit
    from ingest.validate import validate_batch

    behind = [True]
    batches = [
        validate_batch(request(telemetry(name, n=50_000, t0=T0 + i * 3600 * S)).batch, DEFAULT_LIMITS, T0)
        for i, name in enumerate(("while-behind", "caught-up"))
    ]
    commit = GroupCommit(store, CommitPolicy(interval_s=0, answer_within_s=None), answer_at_claim=lambda: behind[0])
    try:
        assert commit.write(batches[0], T0).rows["samples"] == 200_000
        assert commit.answered_early == 1
        claimed = store.query("SELECT count() AS n FROM {db}.ingest_pending WHERE has(batch_ids, 'while-behind')")
        assert claimed.column("n")[0].as_py() == 1, "answered once claimed"
        commit.settle_answered()
        assert counts(store)["samples"] == 200_000, "a read waits for the writes answered before they were stored"
        behind[0] = False
        commit.write(batches[1], T0)
        assert commit.answered_early == 1, "answered once stored"
        assert counts(store)["samples"] == 400_000
    finally:
        commit.close()


def test_a_clean_stop_marks_its_last_group_done(store: Store) -> None:
    """A group's done mark goes with the next group's claim; the last ones are written when the group
    commit stops, so the next server does not take them for groups a crash left unfinished."""
    from ingest.commitpolicy import CommitPolicy
    from ingest.groupcommit import GroupCommit
    from ingest.validate import validate_batch

    commit = GroupCommit(store, CommitPolicy(interval_s=0))
    try:
        for i in range(2):
            commit.write(validate_batch(request(telemetry(f"stop-{i}", n=25)).batch, DEFAULT_LIMITS, T0), T0)
    finally:
        commit.close()
    groups = store.query("SELECT commit, max(done) AS done FROM {db}.ingest_pending GROUP BY commit")
    assert groups.num_rows == 2 and groups.column("done").to_pylist() == [1, 1]


def test_a_batch_worth_an_insert_of_its_own_does_not_wait_for_the_interval(store: Store) -> None:
    """With a group a minute at most, a second small batch waits for the minute; a batch of
    ALONE_ROWS rows (an import's chunk) is stored as soon as the store can take it, with what waits."""
    from ingest.commitpolicy import CommitPolicy
    from ingest.groupcommit import ALONE_ROWS, GroupCommit
    from ingest.validate import validate_batch

    small = [validate_batch(request(telemetry(f"small-{i}", n=25)).batch, DEFAULT_LIMITS, T0) for i in range(2)]
    large = validate_batch(request(telemetry("large", n=ALONE_ROWS // 4)).batch, DEFAULT_LIMITS, T0)
    assert sum(large.rows().values()) == ALONE_ROWS
    commit = GroupCommit(store, CommitPolicy(interval_s=60.0))
    try:
        commit.write(small[0], T0)  # the first group is taken at once
        waiting = threading.Thread(target=commit.write, args=(small[1], T0))
        waiting.start()
        waiting.join(1.0)
        assert waiting.is_alive(), "the small batch waits for the minute"
        stored = threading.Thread(target=commit.write, args=(large, T0))
        stored.start()
        stored.join(50)
        waiting.join(10)
        assert not stored.is_alive() and not waiting.is_alive(), "stored before the minute was up"
    finally:
        commit.close()
    assert counts(store)["samples"] == 2 * 100 + ALONE_ROWS


def test_the_group_thread_wakes_for_a_first_batch_and_for_commit_rows_not_for_the_minute(store: Store) -> None:
    """The group's thread sleeps through the interval (and, with nothing waiting, until its next sweep) and
    is woken only by what changes that: a batch arriving when none waits is taken at once, batches
    reaching commit rows are taken before the interval is up, and what is left waits for the minute."""
    from ingest.commitpolicy import CommitPolicy
    from ingest.groupcommit import GroupCommit
    from ingest.validate import validate_batch

    batches = [validate_batch(request(telemetry(f"wake-{i}", n=25)).batch, DEFAULT_LIMITS, T0) for i in range(3)]
    commit = GroupCommit(store, CommitPolicy(interval_s=60.0, max_rows=150), sweep_s=3600.0)
    writers = [threading.Thread(target=commit.write, args=(batch, T0)) for batch in batches]
    try:
        writers[0].start()
        writers[0].join(50)
        assert not writers[0].is_alive(), "the first batch did not wait for the sweep an hour away"
        writers[1].start()
        writers[1].join(1.0)
        assert writers[1].is_alive(), "100 rows of 150: it waits for the minute"
        writers[2].start()  # 200 rows wait: the first 100 are a group at once, the others wait
        writers[1].join(50)
        assert not writers[1].is_alive() and writers[2].is_alive()
    finally:
        commit.close()
    for writer in writers:
        writer.join(50)
    assert counts(store)["samples"] == 300


def test_an_import_chunk_is_a_group_of_its_own_with_no_copy_in_pending(store: Store) -> None:
    """A batch that stands alone (ALONE_ROWS events of one month) is stored as a group by itself, not
    copied to ingest_pending, and answered only once stored; sent again it is a duplicate. The same
    events over two months (two parts) are a group like any other."""
    from ingest.commitpolicy import CommitPolicy
    from ingest.groupcommit import GroupCommit
    from ingest.validate import validate_batch
    from store.group import ALONE_ROWS

    def validated(builder: BatchBuilder) -> ValidatedBatch:
        return validate_batch(request(builder).batch, DEFAULT_LIMITS, T0)

    small = [validated(telemetry(f"small-{i}", n=25)) for i in range(2)]
    chunk = validated(kernels("chunk", ALONE_ROWS))
    two_months = validated(kernels("two-months", ALONE_ROWS, span_ns=40 * 86_400 * S))
    commit = GroupCommit(store, CommitPolicy(interval_s=60.0, answer_within_s=0))
    try:
        commit.write(small[0], T0)  # the first group is taken at once
        waiting = threading.Thread(target=commit.write, args=(small[1], T0))
        waiting.start()
        waiting.join(1.0)
        assert commit.write(chunk, T0).rows["events"] == ALONE_ROWS
        assert counts(store)["events"] == ALONE_ROWS, "answered once stored"
        waiting.join(30)
        assert commit.answered_early == 2, "the small batches only"
        assert commit.write(chunk, T0).duplicate
        commit.write(two_months, T0)
    finally:
        commit.close()
    pending = store.query("SELECT batch_ids FROM {db}.ingest_pending WHERE done = 0 ORDER BY received, commit")
    assert sorted(map(tuple, pending.column("batch_ids").to_pylist())) == [("small-0",), ("small-1",), ("two-months",)]
    assert counts(store)["events"] == 2 * ALONE_ROWS


def test_what_stands_alone_is_many_events_and_nothing_else_in_one_part() -> None:
    """Events only, from ALONE_ROWS to one engine block's rows, of one month: one insert, one part."""
    import pyarrow as pa

    from ingest.commitpolicy import DEFAULT_MAX_ROWS
    from store.group import ALONE_ROWS, stands_alone

    def batch(rows: int, span_ns: int = S, samples: bool = False) -> ValidatedBatch:
        starts = pa.array(T0 + np.arange(rows, dtype=np.int64) * (span_ns // rows), pa.timestamp("ns", tz="UTC"))
        extra = pa.table({"ts": starts[:1]}) if samples else None
        return ValidatedBatch("b", "d", samples=extra, events=pa.table({"start": starts}), runs=None, devices=None)

    assert stands_alone(batch(ALONE_ROWS))
    assert stands_alone(batch(DEFAULT_MAX_ROWS))
    assert not stands_alone(batch(ALONE_ROWS - 1)), "a fleet's batch: grouped"
    assert not stands_alone(batch(DEFAULT_MAX_ROWS + 1)), "more than one block of the engine's"
    assert not stands_alone(batch(ALONE_ROWS, span_ns=40 * 86_400 * S)), "two months: two parts"
    assert not stands_alone(batch(ALONE_ROWS, samples=True)), "samples and their rollups: several inserts"
