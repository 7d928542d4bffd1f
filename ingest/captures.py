"""Captures on demand: what a request asks (checked, with the step to start at), what state it is in
given what the run's processes reported, and which orders a polling process gets. Pure: the
Capture service (ingest/capture_service.py) reads and writes the store around these."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from tracehouse.requesterrors import QueryError

DEFAULT_STEPS = 10
MAX_STEPS = 1000
MAX_SECONDS = 600.0
MAX_RANKS = 4096
MAX_TEXT = 1024
MAX_HOST_BYTES = 256  # as a batch's host names (Limits.max_name_bytes)
MAX_RANK = 2**31 - 1  # RANK, as a process polls and reports with it (int32)
MAX_COUNT = 2**63 - 1  # trace bytes and events imported: what every reader takes (int64), though stored as UInt64
# from the request until its processes hear of it (a write's answer, then Poll) and a step begins
LEAD_NS = 3_000_000_000
TAKE_WITHIN_NS = 60_000_000_000  # a process that has not taken a request by then never gets it
ARMED_WITHIN_NS = 150_000_000_000  # a process that took it and has not started by then is given up on
FINISH_WITHIN_NS = 30 * 60_000_000_000  # a process capturing this long without a word is given up on
REPORT_STATES = ("taken", "capturing", "imported", "failed")
FINAL_STATES = ("imported", "failed")
SESSION = re.compile(r"[0-9a-f]{1,24}\.[0-9]{1,10}")


class CaptureRefused(Exception):
    """The run cannot be captured now; the message says why and what to do."""


@dataclass(frozen=True)
class Asked:
    """A request as checked: steps (0: those starting within `seconds`) and ranks (empty: all)."""

    steps: int
    seconds: float
    ranks: tuple[int, ...]
    reason: str


def check_request(steps: int, seconds: float, ranks: Sequence[int], reason: str) -> Asked:
    if steps and seconds:
        raise QueryError("steps", "give steps or seconds, not both")
    if steps > MAX_STEPS:
        raise QueryError("steps", f"{steps} steps; at most {MAX_STEPS} a capture")
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_SECONDS:
        raise QueryError("seconds", f"{seconds}: from 0 to {MAX_SECONDS:g} s")
    if len(ranks) > MAX_RANKS:
        raise QueryError("ranks", f"{len(ranks)} ranks; at most {MAX_RANKS}")
    for i, rank in enumerate(ranks):
        check_range(f"ranks[{i}]", rank, 0, MAX_RANK)
    if len(reason.encode()) > MAX_TEXT:
        raise QueryError("reason", f"{len(reason.encode())} bytes; at most {MAX_TEXT}")
    if not steps and not seconds:
        steps = DEFAULT_STEPS
    return Asked(steps, seconds, tuple(sorted(set(ranks))), reason)


def start_step(steps_seen: Sequence[tuple[int, int, int]], now_ns: int) -> tuple[int, int]:
    """The step every process of the run starts at, and a step's typical length (0: unknown),
    from the run's latest recorded steps (number, start, end): the step that should begin
    LEAD_NS from now, so that each process hears of the request first. -1: the next step each
    process begins (no steps recorded yet)."""
    if not steps_seen:
        return -1, 0
    lengths = sorted(end - start for _, start, end in steps_seen if end > start)
    typical = lengths[len(lengths) // 2] if lengths else 0
    latest, _, latest_end = max(steps_seen, key=lambda seen: (seen[2], seen[0]))  # by time: numbers may start over
    if typical <= 0:
        return latest + 2, 0
    ahead = max(0, now_ns + LEAD_NS - latest_end)
    return latest + 1 + max(1, math.ceil(ahead / typical)), typical


@dataclass
class Report:
    session: str
    rank: int
    host: str
    state: str
    at_ns: int
    first_step: int = -1
    last_step: int = -1
    trace_bytes: int = 0
    events: int = 0
    reason: str = ""


@dataclass
class CaptureRecord:
    request_id: str
    run_id: str
    host: str
    requested_ns: int
    requested_by: str
    reason: str
    first_step: int
    steps: int
    seconds: float
    ranks: tuple[int, ...]
    reports: list[Report] = field(default_factory=list)
    comparisons: dict[str, str] = field(default_factory=dict)  # per session: against the rule's baseline, JSON

    def latest_by_session(self) -> dict[str, Report]:
        latest: dict[str, Report] = {}
        for report in sorted(self.reports, key=lambda r: (r.state in FINAL_STATES, r.at_ns)):  # a final one last
            latest[report.session] = report
        return latest

    def state(self, now_ns: int) -> str:
        """asked, under way, done or expired."""
        latest = self.latest_by_session()
        takable = now_ns - self.requested_ns < TAKE_WITHIN_NS
        if not latest:
            return "asked" if takable else "expired"
        working = [
            r for r in latest.values()
            if (r.state == "taken" and now_ns - r.at_ns < ARMED_WITHIN_NS)
            or (r.state == "capturing" and now_ns - r.at_ns < FINISH_WITHIN_NS)
        ]  # fmt: skip
        return "under way" if working else "done"

    def open(self, now_ns: int) -> bool:
        return self.state(now_ns) in ("asked", "under way")

    def takable(self, now_ns: int) -> bool:
        """Whether processes of the run may still take it (their writes' answers say so)."""
        return now_ns - self.requested_ns < TAKE_WITHIN_NS and self.open(now_ns)

    def knows(self, session: str, state: str) -> bool:
        return any(r.session == session and r.state == state for r in self.reports)

    def order_for(self, session: str, rank: int, now_ns: int) -> bool:
        """Whether a process polling now is to take it: within the time to take it, its rank
        asked, and not taken by it already."""
        if now_ns - self.requested_ns >= TAKE_WITHIN_NS or (self.ranks and rank not in self.ranks):
            return False
        return all(report.session != session for report in self.reports)


def check_range(field: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise QueryError(field, f"{value} is out of range: {low} to {high}")


def check_host(field: str, host: str) -> None:
    """A host name as a batch's: at most MAX_HOST_BYTES, and no control characters (empty: not said)."""
    if len(host.encode()) > MAX_HOST_BYTES:
        raise QueryError(field, f"{len(host.encode())} bytes; at most {MAX_HOST_BYTES}")
    if not host.isprintable():
        raise QueryError(field, f"{host[:64]!r} holds control characters")


def check_poll(session: str, rank: int, step: int) -> None:
    if not SESSION.fullmatch(session):
        raise QueryError("session", f"{session[:64]!r} is not a session (STARTHEX.PID)")
    check_range("rank", rank, 0, MAX_RANK)
    check_range("step", step, -1, 2**63 - 1)


def check_report(
    state: str, session: str, rank: int, host: str, first_step: int, last_step: int, trace_bytes: int, events: int,
    reason: str,
) -> None:  # fmt: skip
    if state not in REPORT_STATES:
        raise QueryError("state", f"{state!r}: one of {', '.join(REPORT_STATES)}")
    check_poll(session, rank, -1)
    check_host("host", host)
    for name, step in (("first_step", first_step), ("last_step", last_step)):  # unordered: numbers start over
        check_range(name, step, -1, 2**63 - 1)
    check_range("trace_bytes", trace_bytes, 0, MAX_COUNT)
    check_range("events", events, 0, MAX_COUNT)
    if len(reason.encode()) > MAX_TEXT:
        raise QueryError("reason", f"{len(reason.encode())} bytes; at most {MAX_TEXT}")


def parse_ranks(text: str) -> tuple[int, ...]:
    """`all` or `0,3,5-7` as the ranks asked (empty: all), for the CLI."""
    text = text.strip()
    if text in ("", "all"):
        return ()
    ranks: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"--ranks: {part.strip()!r} is not a rank or a range like 4-7 (or say all)")
        first, last = int(low), int(high) if dash else int(low)
        if last < first or last - first >= MAX_RANKS:
            raise ValueError(f"--ranks: {part.strip()!r} is not a range of at most {MAX_RANKS} ranks")
        ranks.update(range(first, last + 1))
    return tuple(sorted(ranks))
