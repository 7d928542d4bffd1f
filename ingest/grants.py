"""The checks of a batch against what its writer may write (tracehouse/scopes.py: the caller's
`Grant`): every host it names must match one of the grant's globs, every run id start with one of
its prefixes. Samples are their host's telemetry, counted for every run on it in their time, so a
writer bound to run ids alone (no hosts) sends none.

Run descriptions also answer to what is stored, whoever sends them: a stored run keeps its host,
and a run that finished importing is never sent back to importing (which would hide it). Renaming
is a new description with the same run id: whoever may write that run (its run id and its host
inside the token's bounds) may rename it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from ingest.validate import BatchError, ValidatedBatch
from tracehouse.scopes import Grant

SHOWN_CHARS = 64  # of a value the caller sent, in a refusal


class OutOfBounds(Exception):
    """A batch names a host or run outside the caller's token: PERMISSION_DENIED."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field


class RunConflict(BatchError):
    """A run description that contradicts the stored one (INVALID_ARGUMENT, like any bad batch)."""


def show(value: str) -> str:
    """A value the caller sent, quoted and cut short for a message."""
    return repr(value[:SHOWN_CHARS] + ("…" if len(value) > SHOWN_CHARS else ""))


def _bounds(names: tuple[str, ...]) -> str:
    return ", ".join(names)[:200]


def _refusal(grant: Grant, field: str, value: str, kind: str) -> OutOfBounds:
    bounds, named = (grant.hosts, "hosts") if kind == "host" else (grant.runs, "run-id prefixes")
    return OutOfBounds(field, f"{show(value)} is outside this token's {named} ({_bounds(bounds or ())})")


def _allows(grant: Grant, kind: str, value: str) -> bool:
    return grant.allows_host(value) if kind == "host" else grant.allows_run(value)


def _check_column(grant: Grant, field: str, values: pa.ChunkedArray, kind: str) -> None:
    for value in pc.unique(values).to_pylist():
        if not _allows(grant, kind, value):
            plain = values.cast(pa.string()) if pa.types.is_dictionary(values.type) else values
            raise _refusal(grant, f"{field}[{pc.index(plain, value).as_py()}]", value, kind)


def _unhosted_samples(grant: Grant, hosts: pa.ChunkedArray) -> OutOfBounds:
    """Samples are their host's telemetry, read for every run on the host in their time: only a
    writer bound to hosts may send them, never one bound to run ids alone."""
    plain = hosts.cast(pa.string()) if pa.types.is_dictionary(hosts.type) else hosts
    return OutOfBounds(
        "batch.samples",
        f"this token is bound to run ids ({_bounds(grant.runs or ())}) but not to hosts, and samples count as "
        f"host {show(plain[0].as_py())}'s telemetry for every run on it: send them with a token bound to "
        "their host (hosts=GLOB in the tokens file)",
    )


def check_bounds(batch: ValidatedBatch, grant: Grant) -> None:
    """Every host and run id the batch names is inside the grant's bounds; raises OutOfBounds."""
    if not grant.bounded:
        return
    for table in ("samples", "events"):
        data = getattr(batch, table)
        if data is not None:
            _check_column(grant, f"batch.{table}.host", data.column("host"), "host")
            _check_column(grant, f"batch.{table}.run", data.column("run_id"), "run")
    for table in ("runs", "devices"):
        data = getattr(batch, table)
        if data is None:
            continue
        rows = zip(data.column("host").to_pylist(), data.column("run_id").to_pylist(), strict=True)
        for i, (host, run_id) in enumerate(rows):
            for kind, field, value in (("host", "host", host), ("run", "run_id", run_id)):
                if not _allows(grant, kind, value):
                    raise _refusal(grant, f"batch.{table}[{i}].{field}", value, kind)
    if batch.samples is not None and grant.hosts is None:
        raise _unhosted_samples(grant, batch.samples.column("host"))


def named_runs(batch: ValidatedBatch) -> list[str]:
    """The run ids the batch's rows (samples, events, devices) are filed under."""
    found: set[str] = set()
    for table in ("samples", "events", "devices"):
        data = getattr(batch, table)
        if data is not None:
            found.update(value for value in pc.unique(data.column("run_id")).to_pylist() if value)
    return sorted(found)


def check_run_hosts(batch: ValidatedBatch, stored_hosts: Mapping[str, str], grant: Grant) -> None:
    """Rows may be filed only under runs whose stored host is inside the grant's hosts: a bounded
    writer cannot add its rows to another host's run."""
    for run_id in named_runs(batch):
        host = stored_hosts.get(run_id)
        if host is not None and not grant.allows_host(host):
            raise OutOfBounds(
                "batch.run_id",
                f"run {show(run_id)} belongs to host {show(host)}, outside this token's hosts "
                f"({_bounds(grant.hosts or ())}): this token may not add rows to it",
            )


def check_descriptions(runs: pa.Table, stored: Mapping[str, tuple[str, bool]], grant: Grant) -> None:
    """The run descriptions of a batch (in bounds already) against what is stored, `stored`
    mapping run id to (host, importing). The rows count in order: a later row of the batch
    answers to an earlier one as to a stored description."""
    seen = dict(stored)
    columns = (runs.column(name).to_pylist() for name in ("run_id", "host", "importing"))
    for i, (run_id, host, importing) in enumerate(zip(*columns, strict=True)):
        before = seen.get(run_id)
        seen[run_id] = (host, importing)
        if before is None:
            continue
        field = f"batch.runs[{i}]"
        stored_host, was_importing = before
        if not grant.allows_host(stored_host):
            raise OutOfBounds(
                f"{field}.run_id",
                f"run {show(run_id)} belongs to host {show(stored_host)}, outside this token's hosts "
                f"({_bounds(grant.hosts or ())}): this token may not describe it",
            )
        if host != stored_host:
            raise RunConflict(
                f"{field}.host",
                f"run {show(run_id)} is stored under host {show(stored_host)}, not {show(host)}: a run keeps "
                "its host (give the run a new id to file it elsewhere)",
            )
        if importing and not was_importing:
            raise RunConflict(
                f"{field}.importing",
                f"run {show(run_id)} has finished importing and cannot be sent back to importing "
                "(describe it with importing false to rename it or change its tags)",
            )


class RunLocks:
    """Descriptions of one run are checked and stored one at a time in this process."""

    def __init__(self) -> None:
        self._held: set[str] = set()
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def holding(self, run_ids: Iterable[str]) -> Iterator[None]:
        wanted = set(run_ids)
        with self._changed:
            while wanted & self._held:
                self._changed.wait()
            self._held |= wanted
        try:
            yield
        finally:
            with self._changed:
                self._held -= wanted
                self._changed.notify_all()
