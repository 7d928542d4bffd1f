"""What `bench load --writers` reports: the store's own count of each batch, read after the server stopped,
against what the fleet sent and what the server acknowledged; and the issue's figures, met or not."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracehouse.bench.fleet import Delivery, Replay
from tracehouse.bench.payloads import FleetBatches

# issue 17's figures for `bench load --writers 1000`; with --kill-at, only lost and duplicated
GOALS = {
    "accepted_values_per_s": (">=", 500_000),
    "server_cpu_us_per_value": ("<=", 3.0),
    "parts_per_s_per_table": ("<=", 5.0),
    "ack_p99_ms": ("<=", 1_000),
    "lost": ("<=", 0),
    "duplicated": ("<=", 0),
}
KILL_GOALS = ("lost", "duplicated")


@dataclass(frozen=True)
class Stored:
    per_batch: dict[tuple[int, int], int]  # values stored of each (writer, k)
    inserts: dict[str, int]  # per table, since the store was made
    values: int  # all rows of samples


@dataclass(frozen=True)
class Server:
    cpu_seconds: float  # serve's, over the measured window (those of a killed serve included)
    generator_cpu_seconds: float  # this process's, over the same window
    peak_rss_mb: float
    kills: int
    cpu_by_thread: Mapping[str, float] = field(default_factory=dict)  # serve's, by what its threads do


def read_store(folder: str, batches: FleetBatches, base_ns: int) -> Stored:
    """Counted in the embedded store in `folder`, which no server holds now: each batch's values, told
    by its host and time; and each table's inserts: an insert into a MergeTree takes the table's next
    block number, which the part that holds it (or the part it was merged into) keeps."""
    from store.store import Store
    from tracehouse.model import DEFAULT_LIMITS

    origin = base_ns - batches.interval_ns  # batch 0 starts one interval before the run
    offsets = ",".join(map(str, batches.jitter_ns.tolist()))
    with Store.open(f"chdb://{folder}/store", DEFAULT_LIMITS) as store:
        per_batch = store.query(
            "SELECT toUInt32(substring(host, 7)) AS writer, "
            f"intDiv(toUnixTimestamp64Nano(ts) - {origin} - toInt64([{offsets}][writer + 1]), {batches.interval_ns}) "
            "AS k, count() AS n FROM {db}.samples GROUP BY writer, k"
        ).to_pylist()
        parts = store.query(
            "SELECT table, max(max_block_number) AS inserts FROM system.parts "
            "WHERE database = {database:String} AND active GROUP BY table ORDER BY table",
            {"database": store.location.database},
        ).to_pylist()
        values = int(store.query("SELECT count() AS n FROM {db}.samples").column("n")[0].as_py())
    return Stored(
        {(int(row["writer"]), int(row["k"])): int(row["n"]) for row in per_batch},
        {row["table"]: int(row["inserts"]) for row in parts if row["inserts"]},
        values,
    )


def fleet_report(
    batches: FleetBatches, run: Replay, seconds: float, kill_at: float | None, server: Server, stored: Stored
) -> dict[str, Any]:
    offered = sum(batches.values(w, k) for w, k in batches.scheduled(seconds))
    acked = {(d.writer, d.k): d for d in run.deliveries if d.acked_s is not None}
    sent = {(d.writer, d.k): d.values for d in run.deliveries}
    acked_values = sum(d.values for d in acked.values())
    in_window = sum(d.values for d in acked.values() if (d.acked_s or 0.0) <= seconds)
    lost = sum(max(0, d.values - stored.per_batch.get(key, 0)) for key, d in acked.items())
    duplicated = sum(max(0, n - sent.get(key, 0)) for key, n in stored.per_batch.items())
    # a batch still unanswered when the bench gave up on it took at least that long; a call too, if one
    # was under way (not a writer waiting out the pause the server asked for)
    unanswered = [d for d in run.deliveries if d.acked_s is None and not d.refused]

    def milliseconds_since(start: Callable[[Delivery], float], given_up: list[Delivery]) -> np.ndarray[Any, Any]:
        answered = [(d.acked_s or 0.0) - start(d) for d in acked.values()]
        return 1000 * np.array(answered + [run.finished_s - start(d) for d in given_up])

    took = milliseconds_since(lambda d: d.sent_s, [d for d in unanswered if d.calling])  # the call's own time
    delayed = milliseconds_since(lambda d: d.due_s, unanswered)  # from the batch's close
    measured = {
        "accepted_values_per_s": round(in_window / seconds),
        "server_cpu_us_per_value": round(server.cpu_seconds * 1e6 / in_window, 2) if in_window else None,
        "parts_per_s_per_table": round(max(stored.inserts.values(), default=0) / run.finished_s, 2),
        "ack_p99_ms": _percentile(took, 99),
        "lost": lost,
        "duplicated": duplicated,
    }
    goals = {name: goal for name, goal in GOALS.items() if kill_at is None or name in KILL_GOALS}
    goal: dict[str, Any] = {name: _judge(measured[name], *goal) for name, goal in goals.items()}
    tally = run.tally
    return {
        "offered_values_per_s": round(offered / seconds),
        "accepted_values_per_s": measured["accepted_values_per_s"],
        "ratio": round(in_window / offered, 3) if offered else None,
        "ack_latency_ms": _spread(took),
        "delivery_delay_ms": _spread(delayed),
        "server_cpu_seconds": round(server.cpu_seconds, 1),
        "server_cpu_us_per_value": measured["server_cpu_us_per_value"],
        "server_cpu_us_per_value_by_thread": (
            {kind: round(cpu * 1e6 / in_window, 2) for kind, cpu in sorted(server.cpu_by_thread.items())}
            if in_window
            else {}
        ),
        "generator_cpu_seconds": round(server.generator_cpu_seconds, 1),
        "inserts": stored.inserts,
        "parts_per_s": {table: round(n / run.finished_s, 2) for table, n in stored.inserts.items()},
        "server_peak_rss_mb": server.peak_rss_mb,
        "server_kills": server.kills,
        "offered_values": offered,
        "acknowledged_values": acked_values,
        "stored_values": stored.values,
        "lost": lost,
        "duplicated": duplicated,
        "unacknowledged_values": offered - acked_values,
        "calls": tally.calls,
        "resource_exhausted": tally.resource_exhausted,
        "unavailable": tally.unavailable,
        "deadline_exceeded": tally.deadline_exceeded,
        "other_errors": tally.other_errors,
        "first_other_error": tally.first_error or None,
        "refused": tally.refused,
        "duplicate_answers": sum(1 for d in acked.values() if d.duplicate),
        "drain_seconds": round(max(0.0, run.finished_s - seconds), 2),
        "goal": goal | {"met": all(judged["met"] for judged in goal.values())},
    }


def _spread(milliseconds: np.ndarray[Any, Any]) -> dict[str, int | None]:
    return {
        "p50": _percentile(milliseconds, 50),
        "p99": _percentile(milliseconds, 99),
        "max": _percentile(milliseconds, 100),
    }


def _percentile(milliseconds: np.ndarray[Any, Any], q: float) -> int | None:
    return round(float(np.percentile(milliseconds, q))) if milliseconds.size else None


def _judge(measured: float | None, relation: str, goal: float) -> dict[str, Any]:
    met = measured is not None and (measured >= goal if relation == ">=" else measured <= goal)
    return {"goal": f"{relation} {goal}", "measured": measured, "met": met}
