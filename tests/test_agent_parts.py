"""The agent's schedule, spool and batcher on their own."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from agent.shipping.batcher import Batcher
from agent.shipping.spool import EncodedBatch, Spool
from agent.telemetry.schedule import run_fixed_rate
from tests.agent_helpers import decode


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.now += seconds
        return False


def test_schedule_does_not_drift_and_skips_overruns() -> None:
    clock = FakeClock()
    stop = threading.Event()
    started: list[tuple[float, int]] = []
    work = {3: 0.05, 5: 0.35}  # tick 5 (due 0.4) runs until 0.75: due times 0.5, 0.6 and 0.7 pass

    def tick(missed: int) -> None:
        started.append((round(clock.now - 100.0, 9), missed))
        clock.now += work.get(len(started), 0.013)
        if len(started) == 10:
            stop.set()

    run_fixed_rate(0.1, stop, tick, clock.monotonic, clock.wait)
    times = [t for t, _ in started]
    # the latest overdue tick runs at once, the older ones are skipped and counted; then the
    # schedule is back on its grid
    assert times == [0.0, 0.1, 0.2, 0.3, 0.4, 0.75, 0.8, 0.9, 1.0, 1.1]
    assert [missed for _, missed in started] == [0, 0, 0, 0, 0, 2, 0, 0, 0, 0]


def test_schedule_stops_promptly() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=run_fixed_rate, args=(3600.0, stop, lambda missed: None))
    thread.start()
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()


def batch(n: int, values: int = 10, size: int = 200) -> EncodedBatch:
    """A stand-in batch; a payload of a real one's size at least (17 bytes a value: else not believed)."""
    return EncodedBatch(f"run/{n:08d}", bytes([n % 256]) * size, values)


class Drops:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def __call__(self, batch_id: str, values: int) -> None:
        self.seen.append((batch_id, values))


def test_spool_keeps_order_across_restarts(tmp_path: Path) -> None:
    drops = Drops()
    spool = Spool(tmp_path, 1 << 20, drops)
    for n in range(5):
        assert spool.put(batch(n))
    spool.remove("run/00000000")
    reopened = Spool(tmp_path, 1 << 20, drops)
    assert reopened.batches == 4 and reopened.values_of("run/") == 40
    seen = []
    while (oldest := reopened.oldest()) is not None:
        seen.append(oldest)
        reopened.remove(oldest.batch_id)
    assert [b.batch_id for b in seen] == [f"run/{n:08d}" for n in range(1, 5)]
    assert seen[0] == batch(1)
    reopened.put(batch(9))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000000000000000006.batch"], "sequence continues"
    assert drops.seen == []


def test_spool_bound_drops_the_oldest_and_counts_them(tmp_path: Path) -> None:
    drops = Drops()
    one = len(b"THSPOOL2") + 4 + 22 + len("run/00000000") + 200
    spool = Spool(tmp_path, 3 * one, drops)
    for n in range(5):
        assert spool.put(batch(n))
    assert spool.batches == 3 and spool.size <= 3 * one
    assert drops.seen == [("run/00000000", 10), ("run/00000001", 10)]
    assert not spool.put(batch(7, size=10 * one)), "a batch larger than the spool is dropped itself"
    assert drops.seen[-1] == ("run/00000007", 10)


def test_corrupt_spool_files_are_moved_aside_and_counted(tmp_path: Path) -> None:
    drops = Drops()
    spool = Spool(tmp_path, 1 << 20, drops)
    for n in range(3):
        spool.put(batch(n, values=5))
    first, second, _ = sorted(tmp_path.glob("*.batch"))
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF  # a bit flipped in the payload
    first.write_bytes(bytes(data))
    second.write_bytes(b"garbage")  # a header nobody wrote
    reopened = Spool(tmp_path, 1 << 20, drops)
    assert reopened.oldest() == batch(2, values=5)
    assert drops.seen == [("", 0), ("run/00000000", 5)]
    assert len(list(tmp_path.glob("*.corrupt"))) == 2


def test_unwritable_spool_drops_and_counts(tmp_path: Path) -> None:
    drops = Drops()
    spool = Spool(tmp_path / "spool", 1 << 20, drops)
    (tmp_path / "spool").rmdir()
    (tmp_path / "spool").write_text("a file where the folder was")
    assert not spool.put(batch(1))
    assert drops.seen == [("run/00000001", 10)]


def test_batcher_ids_are_sequential_and_batches_close_by_size() -> None:
    sent: list[EncodedBatch] = []
    batcher = Batcher("run-1", "h", sent.append, max_values=6, max_age=3600)
    for tick in range(5):
        batcher.add(1_000 + tick, 0, {"gpu.util_pct": 50.0, "gpu.temp_c": 60.0})
    batcher.flush()
    assert [b.batch_id for b in sent] == ["run-1/00000001", "run-1/00000002"]
    assert [b.values for b in sent] == [6, 4]
    request = decode(sent[0])
    assert request.batch.batch_id == "run-1/00000001" and request.batch.host == "h"
    assert list(request.batch.samples.ts) == [1000, 1000, 1001, 1001, 1002, 1002]
    assert batcher.flush() is None, "nothing open, nothing sent"


@pytest.mark.parametrize("age, due", [(1.9, False), (2.0, True)])
def test_batcher_closes_by_age(age: float, due: bool) -> None:
    now = [0.0]
    batcher = Batcher("r", "h", lambda b: None, max_age=2.0, monotonic=lambda: now[0])
    now[0] += age
    assert batcher.due() is due
