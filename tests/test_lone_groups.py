"""Import chunks sent together, stored as one group on the embedded store (store/group.py, lone_group):
one insert, one part, listed in ingest_pending without their rows; a group a crash cut is finished by
finding which chunks' events are in, and each chunk is stored once (issue 44)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ingest.validate import ValidatedBatch, validate_batch
from store.group import ALONE_ROWS
from store.store import Store
from tests.helpers import T0, counts, kernels, request
from tracehouse.cli.serve import Server
from tracehouse.model import DEFAULT_LIMITS

DAY_NS = 86_400 * 10**9
CHILD = "from tests.test_lone_groups import _write_and_die; _write_and_die"


def chunks(name: str, count: int, rows: int = ALONE_ROWS, day: int = 0) -> list[ValidatedBatch]:
    """`count` import chunks of `rows` kernels each, on hosts of their own (so their events differ)."""
    return [
        validate_batch(
            request(kernels(f"{name}-{i}", rows, host=f"host-{i}", t0=T0 + day * DAY_NS)).batch, DEFAULT_LIMITS, T0
        )
        for i in range(count)
    ]


def listed(store: Store) -> list[tuple[tuple[str, ...], bool]]:
    """The groups ingest_pending lists (not yet done), with whether it holds their rows."""
    found = store.query(
        "SELECT batch_ids, NOT startsWith(events, 'lone, month ') AS copied FROM {db}.ingest_pending WHERE done = 0"
    )
    return sorted(
        (tuple(ids), bool(copied))
        for ids, copied in zip(found.column("batch_ids").to_pylist(), found.column("copied").to_pylist(), strict=True)
    )


def test_chunks_sent_together_are_one_group_listed_without_their_rows(store: Store) -> None:
    """Four chunks that arrive together are one group commit: one listing in ingest_pending without their
    rows, each stored once, each a duplicate sent again; a chunk of another month is a group of its own."""
    from ingest.groupcommit import LONE_GROUP_ROWS, GroupCommit

    together = chunks("together", 4, rows=LONE_GROUP_ROWS // 4)
    commit = GroupCommit(store)
    try:
        results = [None] * len(together)

        def write(i: int) -> None:
            results[i] = commit.write(together[i], T0)  # type: ignore[call-overload]

        writers = [threading.Thread(target=write, args=(i,)) for i in range(len(together))]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join(60)
        assert all(result is not None and not result.duplicate for result in results)
        [(ids, copied)] = listed(store)
        assert sorted(ids) == [chunk.batch_id for chunk in together] and not copied, "one group, no copy"
        assert commit.write(together[2], T0).duplicate
        [later] = chunks("later", 1, day=40)
        assert not commit.write(later, T0).duplicate
    finally:
        commit.close()
    assert counts(store)["events"] == LONE_GROUP_ROWS + ALONE_ROWS
    assert counts(store)["ingest_batches"] == len(together) + 1


def test_chunks_of_two_months_are_not_one_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """Together only what makes one part: chunks that each stand alone, of one month, one engine block
    in rows and in bytes."""
    import store.group
    from store.group import one_part

    three = chunks("june", 3)
    assert one_part(three)
    assert not one_part([*chunks("june", 1), *chunks("july", 1, day=40)]), "two months: two parts"
    assert not one_part(chunks("big", 31, rows=ALONE_ROWS + 1)), "over one engine block"
    monkeypatch.setattr(store.group, "LONE_GROUP_BYTES", 1 << 20)
    assert not one_part(three[:2]), "over the bytes of a group"
    assert one_part(three[:1]), "one alone, whatever its bytes"


def _write_and_die(folder: str, point: str) -> None:
    """In a process of its own: the chunks written as one group, dying at `point` (TRACEHOUSE_CRASH_AT)."""
    with Store.open(f"chdb://{folder}", DEFAULT_LIMITS) as store:
        store.write_group(chunks("cut", 3), T0)


@pytest.mark.parametrize("point", ["pending", "table:events", "ledger"])
def test_a_group_of_chunks_cut_by_a_crash_is_finished_and_each_stored_once(tmp_path: Path, point: str) -> None:
    """The store's writer dies once the group is listed (nothing in), after its insert (the ledger not
    written), or after the ledger (not marked done). The next to open the store finishes it: the chunks
    whose events are in go to the ledger, the others are left to their writers; sent again, each chunk is
    stored once."""
    folder = tmp_path / "store"
    child = subprocess.run(
        [sys.executable, "-c", f"{CHILD}({str(folder)!r}, {point!r})"],
        env={"TRACEHOUSE_CRASH_AT": point, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    sent = chunks("cut", 3)
    with Store.open(f"chdb://{folder}", DEFAULT_LIMITS) as store:
        assert [copied for _, copied in listed(store)] == [False], "listed, without its rows"
        in_before = counts(store)["events"]
        assert in_before == (0 if point == "pending" else 3 * ALONE_ROWS)
        store.finish_unfinished(0)
        assert counts(store)["ingest_batches"] == (0 if point == "pending" else 3)
        outcomes = store.write_group(sent, T0)  # the writer's retry
        assert [getattr(outcome, "duplicate", None) for outcome in outcomes] == [point != "pending"] * 3
        assert counts(store)["events"] == 3 * ALONE_ROWS
        assert counts(store)["ingest_batches"] == 3
        assert store.write_group(sent, T0)[0].duplicate  # type: ignore[union-attr]


def test_an_importers_writer_sends_its_chunks_four_at_a_time(server: Server, store: Store) -> None:
    """`tracehouse import`'s writer holds a large request until four are ready (or it is flushed) and sends
    them together: the server stores the four as one group (LONE_GROUP_ROWS), and the rest once flushed."""
    import contextlib

    from agent.shipping.writer import BatchWriter
    from ingest.groupcommit import LONE_GROUP_ROWS

    rows = LONE_GROUP_ROWS // 4
    with contextlib.closing(BatchWriter(f"127.0.0.1:{server.port}", patience=30)) as writer:
        for i in range(6):
            writer.write(kernels(f"burst-{i}", rows, host=f"host-{i}").build())
        assert counts(store)["events"] <= 4 * rows, "the last two held back"
        writer.flush()
        assert writer.batches == 6
    groups = sorted(len(ids) for ids, _ in listed(store))
    assert groups in ([4], [2, 4]), "the four together; the last two together, or one at a time"
    assert counts(store)["events"] == 6 * rows
