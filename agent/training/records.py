"""What a run's records are and the limits they are held to: the constants, the tags of the
tuples the caller's thread appends, the checks of names and tags against the store's limits,
the run's ids, and the columns the worker gathers events in."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("tracehouse.training")

BUFFER_RECORDS = 1 << 18  # records waiting for the worker; past this a call's record is dropped and counted
DRAIN_INTERVAL_S = 0.1  # how often the worker empties the buffer
FLUSH_INTERVAL_S = 1.0  # a batch closes after this long...
BATCH_EVENTS = 50_000  # ...or with this many events (or the Batcher's 50,000 sample values)
END_TIMEOUT_S = 5.0  # at the end of a run: time for the pending batches to reach a server that answers
CALL_TIMEOUT_S = 5.0  # one Write
STEP_STARTS_KEPT = 4096  # steps whose start a late scalar(..., step=i) can still find
MAX_NAME_BYTES = 256  # metric names and tag keys (tracehouse.model.Limits.max_name_bytes)
MAX_TEXT_BYTES = 64 << 10  # event names, tag values (Limits.max_string_bytes)
STEP_NAME = "step"
MAX_ID_BYTES = 128  # batch ids (Limits.max_id_bytes)
_RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,100}")
_perf_ns = time.perf_counter_ns

# records the caller's thread appends: a tag, then the fields
_STEP = 0  # (tag, t, i, tid): step i starts, the thread's previous step ends
_STEP_END = 1  # (tag, t, tid): the thread's step ends
_PHASE = 2  # (tag, start, end, name, depth, tid)
_SCALAR = 3  # (tag, t, name, value, step or None)
_THREAD = 4  # (tag, t, tid, thread name): a thread's first record

_NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()


def _fits(text: str, limit: int) -> bool:
    """Whether `text` takes at most `limit` bytes in UTF-8 (without encoding it when it is short)."""
    return len(text) * 4 <= limit or len(text.encode()) <= limit


def _clean_map(mapping: Mapping[Any, Any] | None, what: str) -> dict[str, str]:
    """Keys and values as strings within the store's limits; what does not fit is logged and left out."""
    clean: dict[str, str] = {}
    for key, value in (mapping or {}).items():
        key, value = str(key), str(value)
        if not key or not _fits(key, MAX_NAME_BYTES) or not _fits(value, MAX_TEXT_BYTES):
            log.warning("tracehouse: %s %r left out: keys are 1..%d bytes, values up to %d", what, key[:64],
                        MAX_NAME_BYTES, MAX_TEXT_BYTES)  # fmt: skip
            continue
        clean[key] = value
    return dict(list(clean.items())[:256])


def _run_id(name: str, host: str, started_ns: int, pid: int) -> str:
    """NAME.HOST.STAMP.PID, as the agent names its runs plus the pid: unique per process."""
    from tracehouse.ids import make_run_id

    return f"{make_run_id(name[:40], host[:40], started_ns)}.{pid}"


def _batch_prefix(run_id: str, session: str) -> str:
    """RUN_ID/SESSION, the run id cut short where the batch ids (PREFIX/SEQUENCE, 8 digits)
    would pass MAX_ID_BYTES: the session alone tells the run's batches from others'."""
    room = MAX_ID_BYTES - len("/00000000") - len("/") - len(session)
    return f"{run_id[:room]}/{session}"


class _EventColumns:
    """Events as columns, ready for Batcher.add_events."""

    def __init__(self) -> None:
        self.kind: list[str] = []
        self.start: list[int] = []
        self.end: list[int] = []
        self.name: list[str] = []
        self.tid: list[int] = []
        self.depth: list[int] = []
        self.extras: list[dict[str, str]] = []

    def __len__(self) -> int:
        return len(self.start)

    def add(
        self, kind: str, start: int, end: int, name: str, tid: int, depth: int = 0, extras: dict[str, str] | None = None
    ) -> None:
        self.kind.append(kind)
        self.start.append(start)
        self.end.append(end)
        self.name.append(name)
        self.tid.append(tid)
        self.depth.append(depth)
        self.extras.append(extras or {})
