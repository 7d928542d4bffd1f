"""The gRPC Capture service, and the board of open requests a server keeps in memory: a write's
answer says whether its run has one (WriteResponse.capture_waiting) without touching the store,
and Poll answers from it. The board reads what the store holds anew every second, so that the servers
of one store (a stateless tier) learn of each other's requests."""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from ingest.admission import Overloaded
from ingest.captures import (
    MAX_RANKS,
    MAX_STEPS,
    Asked,
    CaptureRecord,
    CaptureRefused,
    Report,
    check_poll,
    check_report,
    check_request,
    start_step,
)
from ingest.grants import OutOfBounds
from ingest.pace import Pace
from store.store import Store
from store.storeerrors import StoreError
from tracehouse.pushback import PUSHBACK_KEY
from tracehouse.requesterrors import QueryError, RunNotFound
from tracehouse.scopes import CALLER, UNBOUNDED, Grant
from tracehouse.timefmt import now_ns
from tracehouse.v1 import capture_pb2, capture_pb2_grpc

log = logging.getLogger("tracehouse.capture")
REFRESH_S = 1.0
KEPT_NS = 2 * 3600 * 1_000_000_000  # the board reads back this far: past every open request's end
OVERLAP_NS = 30_000_000_000  # each refresh reads again the rows this much older than the last read
FULL_EVERY_S = 300.0  # and reads all KEPT_NS again this often
RECENT_STEPS = 21  # the latest steps the start step is planned from

SCHEMA = pa.schema(
    [
        ("request_id", pa.string()),
        ("run_id", pa.string()),
        ("record", pa.string()),
        ("at", pa.timestamp("ns", tz="UTC")),
        ("requested_by", pa.string()),
        ("reason", pa.string()),
        ("first_step", pa.int64()),
        ("last_step", pa.int64()),
        ("steps", pa.uint32()),
        ("seconds", pa.float64()),
        ("ranks", pa.list_(pa.uint32())),
        ("session", pa.string()),
        ("rank", pa.int32()),
        ("host", pa.string()),
        ("state", pa.string()),
        ("trace_bytes", pa.uint64()),
        ("events", pa.uint64()),
        ("comparison", pa.string()),
    ]
)
_COLUMNS = ", ".join("toUnixTimestamp64Nano(at)" if name == "at" else name for name in SCHEMA.names)


def _row(**values: Any) -> pa.Table:
    defaults: dict[str, Any] = {"requested_by": "", "reason": "", "first_step": -1, "last_step": -1, "steps": 0,
                                "seconds": 0.0, "ranks": [], "session": "", "rank": 0, "host": "", "state": "",
                                "trace_bytes": 0, "events": 0, "comparison": ""}  # fmt: skip
    row = {**defaults, **values}
    return pa.table({name: [row[name]] for name in SCHEMA.names}, schema=SCHEMA)


def _requests(rows: pa.Table, requests: dict[str, CaptureRecord] | None = None) -> dict[str, CaptureRecord]:
    """Requests and their reports from rows of `captures` (in _COLUMNS order), added to `requests`: each
    request, report and comparison once, however often its row is read."""
    requests = {} if requests is None else requests
    reports: list[tuple[str, Report]] = []
    comparisons: list[tuple[str, str, str]] = []
    for values in rows.to_pylist():
        (request_id, run_id, record, at, requested_by, reason, first, last, steps, seconds, ranks,
         session, rank, host, state, trace_bytes, events, comparison) = values.values()  # fmt: skip
        if record == "comparison":
            comparisons.append((request_id, session, comparison))
        elif record == "request":
            if request_id not in requests:
                requests[request_id] = CaptureRecord(request_id, run_id, host, at, requested_by, reason, first, steps,
                                                     seconds, tuple(ranks))  # fmt: skip
        else:
            reports.append(
                (request_id, Report(session, rank, host, state, at, first, last, trace_bytes, events, reason))
            )
    seen: dict[str, set[tuple[str, str, int]]] = {}
    for request_id, report in reports:
        known = requests.get(request_id)
        if known is None:
            continue
        said = seen.get(request_id)
        if said is None:
            said = seen[request_id] = {(r.session, r.state, r.at_ns) for r in known.reports}
        if (report.session, report.state, report.at_ns) not in said:
            said.add((report.session, report.state, report.at_ns))
            known.reports.append(report)
    for request_id, session, comparison in comparisons:
        if request_id in requests:
            requests[request_id].comparisons[session] = comparison
    return requests


class CaptureBoard:
    """The requests of the last two hours; `waiting(run_id)` is a set lookup."""

    def __init__(self, store: Store, refresh_s: float = REFRESH_S) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._requests: dict[str, CaptureRecord] = {}
        self._open_runs: frozenset[str] = frozenset()
        self._stop = threading.Event()
        self._refresh_s = refresh_s
        self._refreshed_at = 0.0
        self._full_at = 0.0
        self._read_ns: int | None = None  # when the last read began
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._refreshing, name="capture-board", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def waiting(self, run_id: str, batch_id: str = "") -> bool:
        """Whether a process writing `batch_id` into the run has a request to take: a set lookup for
        runs without one; for a run with one, whether the writer's session (the training API's batch
        ids are RUN_ID/SESSION/SEQUENCE) has not reported on it yet, so that a process that took it
        stops asking."""
        if run_id not in self._open_runs:
            return False
        parts = batch_id.rsplit("/", 2)
        session = parts[-2] if len(parts) == 3 else ""
        now = now_ns()
        with self._lock:
            return any(
                r.run_id == run_id and r.takable(now) and not any(rep.session == session for rep in r.reports)
                for r in self._requests.values()
            )

    def _refreshing(self) -> None:
        while not self._stop.wait(self._refresh_s):
            try:
                self.refresh()
            except StoreError as error:
                log.debug("capture board not refreshed: %s", error)

    def refresh(self) -> None:
        """Read the rows stored since the last read (less OVERLAP_NS: rows stored a moment after their
        time, by this server or another), and every FULL_EVERY_S the whole KEPT_NS again (a server
        whose clock lags further); requests older than KEPT_NS are let go."""
        now, started = now_ns(), time.monotonic()
        full = self._read_ns is None or started - self._full_at >= FULL_EVERY_S
        since = now - KEPT_NS if full or self._read_ns is None else max(now - KEPT_NS, self._read_ns - OVERLAP_NS)
        rows = self.store.query(
            f"SELECT {_COLUMNS} FROM {{db}}.captures WHERE at > fromUnixTimestamp64Nano({{since:Int64}}) ORDER BY at",
            {"since": since},
        )
        self._refreshed_at = time.monotonic()
        self._full_at = started if full else self._full_at
        with self._lock:  # merged: what this server added while the query ran is kept
            _requests(rows, self._requests)
            for request_id in [i for i, r in self._requests.items() if r.requested_ns <= now - KEPT_NS]:
                del self._requests[request_id]
            self._read_ns = now
            self._reopen()

    def _reopen(self) -> None:
        now = now_ns()
        self._open_runs = frozenset(r.run_id for r in self._requests.values() if r.takable(now))

    def add(self, request: CaptureRecord) -> None:
        with self._lock:
            self._requests[request.request_id] = request
            self._reopen()

    def add_report(self, request_id: str, report: Report) -> None:
        with self._lock:
            if request_id in self._requests:
                self._requests[request_id].reports.append(report)
            self._reopen()

    def add_comparison(self, request_id: str, session: str, comparison: str) -> None:
        with self._lock:
            if request_id in self._requests:
                self._requests[request_id].comparisons[session] = comparison

    def open_request(self, run_id: str) -> CaptureRecord | None:
        now = now_ns()
        with self._lock:
            return next((r for r in self._requests.values() if r.run_id == run_id and r.open(now)), None)

    def orders(self, run_id: str, session: str, rank: int) -> list[CaptureRecord]:
        now = now_ns()
        with self._lock:
            return [r for r in self._requests.values() if r.run_id == run_id and r.order_for(session, rank, now)]

    def get(self, request_id: str) -> CaptureRecord | None:
        """The request, read from the store again when this server does not know it yet (another server
        of the store took it moments ago)."""
        with self._lock:
            known = self._requests.get(request_id)
        if known is None and time.monotonic() - self._refreshed_at >= self._refresh_s:
            self.refresh()
            with self._lock:
                known = self._requests.get(request_id)
        return known


def caller(grant: Grant, context: Any) -> str:
    """Who asked: the peer and, with tokens, what its token may write (never the token)."""
    bounds = [f"{key}={','.join(values)}" for key, values in (("hosts", grant.hosts), ("runs", grant.runs)) if values]
    return " ".join([str(context.peer()), *bounds])[:1024]


def state_message(request: CaptureRecord, now: int) -> capture_pb2.CaptureState:
    outcomes = [
        capture_pb2.CaptureOutcome(
            session=r.session,
            rank=r.rank,
            host=r.host,
            state=r.state,
            at_ns=r.at_ns,
            first_step=r.first_step,
            last_step=r.last_step,
            trace_bytes=r.trace_bytes,
            events=r.events,
            reason=r.reason,
            comparison=request.comparisons.get(r.session, ""),
        )
        for r in sorted(request.latest_by_session().values(), key=lambda r: (r.rank, r.session))
    ]
    return capture_pb2.CaptureState(
        request_id=request.request_id, run_id=request.run_id, requested_ns=request.requested_ns,
        requested_by=request.requested_by, reason=request.reason, first_step=request.first_step,
        steps=request.steps, seconds=request.seconds, ranks=request.ranks, state=request.state(now),
        outcomes=outcomes,
    )  # fmt: skip


class CaptureService(capture_pb2_grpc.CaptureServicer):
    def __init__(self, store: Store, board: CaptureBoard, pace: Pace) -> None:
        self.store = store
        self.board = board
        self.pace = pace  # of a person's requests, per caller and run: each reads the store, even one refused
        self._asking = threading.Lock()  # one request at a time: two at once both saw none under way
        # told of each import a process reports (the rules compare a rule's capture with its baseline)
        self.on_imported: Callable[[CaptureRecord, Report], None] | None = None

    def Request(self, request: capture_pb2.CaptureRequest, context: Any) -> capture_pb2.CaptureState:
        grant = CALLER.get()
        if not request.run_id or len(request.run_id) > 1024:
            raise QueryError("run_id", "required: a run's id or name" if not request.run_id else "too long")
        asked = check_request(request.steps, request.seconds, list(request.ranks), request.reason)
        wait = self.pace.take((grant.holder, request.run_id))
        if wait:
            retry_ms = math.ceil(wait * 1000)
            context.set_trailing_metadata(((PUSHBACK_KEY, str(retry_ms)),))
            raise Overloaded(
                f"capture requests of run {request.run_id[:128]!r}: {self.pace.burst} at once, then "
                f"{self.pace.per_minute:g} a minute from one caller; try again in {math.ceil(wait)} s",
                retry_ms,
            )
        made = self.ask(request.run_id, asked, caller(grant, context), grant)
        return state_message(made, made.requested_ns)

    def ask(self, run: str, asked: Asked, requested_by: str, grant: Grant = UNBOUNDED) -> CaptureRecord:
        """Record a capture request of the run (an id, or the name of one running run), once it is
        found capturable, and put it on the board; a person's (Request) or a rule's."""
        with self._asking:
            run_id, host = self._capturable(run, grant)
            now = now_ns()
            first, typical = start_step(self._recent_steps(run_id, host), now)
            steps = asked.steps
            if asked.seconds and typical:
                steps = min(MAX_STEPS, max(1, math.ceil(asked.seconds * 1e9 / typical)))
            made = CaptureRecord(f"cap-{now:x}-{secrets.token_hex(3)}", run_id, host, now, requested_by, asked.reason,
                           first, steps, asked.seconds, asked.ranks)  # fmt: skip
            self.store.append("captures", _row(
                request_id=made.request_id, run_id=run_id, record="request", at=now, requested_by=requested_by,
                host=host, reason=made.reason, first_step=first, steps=steps, seconds=asked.seconds,
                ranks=list(asked.ranks),
            ))  # fmt: skip
            self.board.add(made)
        log.info("capture %s of run %s asked by %s", made.request_id, run_id, requested_by)
        return made

    def _capturable(self, run: str, grant: Grant) -> tuple[str, str]:
        """The run (an id, else the name of one running run) and its host, once it is found to be a
        running process of the training API that the caller may write, with no capture under way. A
        run outside the caller's bounds is answered as one that does not exist."""
        rows = self.store.query(
            "SELECT run_id, source, host, end IS NULL AS running FROM {db}.runs FINAL "
            "WHERE run_id = {run:String} OR name = {run:String} ORDER BY run_id = {run:String} DESC, start DESC "
            "LIMIT 1000",
            {"run": run},
        ).to_pylist()
        rows = [r for r in rows if grant.allows_run(r["run_id"]) and grant.allows_host(r["host"])]
        if rows and rows[0]["run_id"] != run:  # a name: the one running run of the training API so named
            named = len(rows)
            rows = [r for r in rows if r["running"] and r["source"] == "user"]
            if len(rows) > 1:
                shown = ", ".join(r["run_id"] for r in rows[:5])
                raise QueryError("run_id", f"{len(rows)} running runs are named {run!r}: give the id of one ({shown})")
            if not rows:
                raise CaptureRefused(
                    f"no running run of the training API is named {run!r} ({named} runs are, ended or not from "
                    "tracehouse.run): only a running process can be captured"
                )
        if not rows:
            raise RunNotFound(f"run_id: no run {run!r} (`tracehouse query runs` lists them)")
        run_id, source, host, running = rows[0].values()
        if source != "user":
            raise CaptureRefused(
                f"run {run_id!r} is not instrumented: it came from {source}, and only a process recording "
                "with tracehouse.run(...) can be asked for a profile"
            )
        if not running:
            raise CaptureRefused(f"run {run_id!r} has ended: only a running process can be captured")
        under_way = self.board.open_request(run_id)
        if under_way is not None:
            raise CaptureRefused(
                f"capture {under_way.request_id} of run {run_id!r} is "
                + ("under way" if under_way.state(now_ns()) == "under way" else "waiting for a process to take it")
                + f": one capture at a time per run (`tracehouse captures --run {run_id}` shows it)"
            )
        return str(run_id), str(host)

    def _recent_steps(self, run_id: str, host: str) -> list[tuple[int, int, int]]:
        rows = self.store.query(
            "SELECT toInt64OrDefault(extras['step'], toInt64(-1)) AS n, toUnixTimestamp64Nano(start), "
            "toUnixTimestamp64Nano(end) FROM {db}.events WHERE host = {host:String} AND kind = 'step' "
            "AND run_id = {run:String} AND n >= 0 ORDER BY start DESC LIMIT {limit:UInt32}",
            {"host": host, "run": run_id, "limit": RECENT_STEPS},
        )
        return [tuple(row.values()) for row in rows.to_pylist()]

    def Poll(self, request: capture_pb2.CapturePoll, context: Any) -> capture_pb2.CaptureOrders:
        grant = CALLER.get()
        run_id = _run_id(request.run_id, grant)
        check_poll(request.session, request.rank, request.step)
        return capture_pb2.CaptureOrders(
            orders=[
                capture_pb2.CaptureOrder(
                    request_id=r.request_id, first_step=r.first_step, steps=r.steps, seconds=r.seconds
                )
                for r in self.board.orders(run_id, request.session, request.rank)
                if grant.allows_host(r.host)
            ]
        )

    def Report(self, request: capture_pb2.CaptureReport, context: Any) -> capture_pb2.CaptureReportResponse:
        check_report(request.state, request.session, request.rank, request.host, request.first_step, request.last_step,
                     request.trace_bytes, request.events, request.reason)  # fmt: skip
        known = self._known(request.request_id, request.run_id)
        run_id = known.run_id
        if known.knows(request.session, request.state):
            return capture_pb2.CaptureReportResponse()  # said before: a retry
        if len({r.session for r in known.reports} | {request.session}) > MAX_RANKS:
            raise QueryError("session", f"more than {MAX_RANKS} processes reported on capture {known.request_id}")
        now = now_ns()
        report = Report(request.session, request.rank, request.host, request.state, now, request.first_step,
                        request.last_step, request.trace_bytes, request.events, request.reason)  # fmt: skip
        self.store.append("captures", _row(
            request_id=request.request_id, run_id=run_id, record="report", at=now, reason=report.reason,
            first_step=report.first_step, last_step=report.last_step, session=report.session, rank=report.rank,
            host=report.host, state=report.state, trace_bytes=report.trace_bytes, events=report.events,
        ))  # fmt: skip
        self.board.add_report(request.request_id, report)
        if report.state == "imported" and self.on_imported is not None:
            self.on_imported(known, report)
        return capture_pb2.CaptureReportResponse()

    def add_comparison(self, request: CaptureRecord, session: str, comparison: str) -> None:
        self.store.append("captures", _row(
            request_id=request.request_id, run_id=request.run_id, record="comparison", at=now_ns(), session=session,
            comparison=comparison,
        ))  # fmt: skip
        self.board.add_comparison(request.request_id, session, comparison)

    def List(self, request: capture_pb2.CaptureListRequest, context: Any) -> capture_pb2.CaptureList:
        limit = request.limit or 100
        if limit > 10_000:
            raise QueryError("limit", f"{limit}; at most 10000")
        where = (
            "run_id IN (SELECT run_id FROM {db}.runs FINAL WHERE run_id = {run:String} OR name = {run:String}) AND "
            if request.run_id
            else ""
        )
        rows = self.store.query(
            f"SELECT {_COLUMNS} FROM {{db}}.captures WHERE request_id IN (SELECT request_id FROM {{db}}.captures "
            f"WHERE {where}record = 'request' ORDER BY at DESC LIMIT {{limit:UInt32}}) ORDER BY at",
            {"run": request.run_id, "limit": limit},
        )
        now = now_ns()
        found = sorted(_requests(rows).values(), key=lambda r: r.requested_ns, reverse=True)
        return capture_pb2.CaptureList(captures=[state_message(r, now) for r in found])

    def State(self, request: capture_pb2.CaptureStateRequest, context: Any) -> capture_pb2.CaptureState:
        return state_message(self._known(request.request_id, request.run_id), now_ns())

    def _known(self, request_id: str, run_id: str) -> CaptureRecord:
        """A request of the run, that the caller may write (its run id and its host): else NOT_FOUND."""
        grant = CALLER.get()
        _run_id(run_id, grant)
        known = self.board.get(request_id)
        if known is None or known.run_id != run_id or not grant.allows_host(known.host):
            raise RunNotFound(f"request_id: no capture {request_id[:64]!r} of run {run_id!r}")
        return known


def _run_id(run_id: str, grant: Grant) -> str:
    if not run_id:
        raise QueryError("run_id", "required")
    if len(run_id) > 128:
        raise QueryError("run_id", f"{len(run_id)} characters; at most 128")
    if not grant.allows_run(run_id):
        raise OutOfBounds("run_id", f"{run_id!r} is outside the runs this token may write")
    return run_id
