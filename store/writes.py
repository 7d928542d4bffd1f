"""The store's writes: batches stored exactly once, those of a group commit as one group, claimed
whole in `ingest_pending` first (store/claim.py) so that a group a crash left half-stored is
finished, here or by another server on the store, without storing anything twice."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from store.base import StoreBase
from store.claim import (
    ALREADY_CLAIMED,
    PENDING_SCHEMA,
    Claim,
    WriteResult,
    as_stored,
    crash_point,
    done_row,
    pending_row,
    stored_ns,
)
from store.eventids import EVENT_ID_ROW_BITS, batch_prefix
from store.group import LONE_MARK, TABLES, Batch, Group, decode_tables, lone_group, new_group, one_part
from store.rollup import rollups
from store.storeerrors import BatchRefused, StoreError, clean_error, error_code

log = logging.getLogger(__name__)

# Codes with which the engine refuses an insert for what its rows hold: the batch, not the store, is wrong.
_BAD_DATA = {
    6, 27, 38, 41, 53, 69, 70, 72,  # CANNOT_PARSE_*, TYPE_MISMATCH, ARGUMENT_OUT_OF_BOUND, CANNOT_CONVERT_TYPE
    117, 131, 190, 321, 349,  # INCORRECT_DATA, TOO_LARGE_STRING_SIZE, SIZES_OF_ARRAYS_DONT_MATCH, out of range, NULL
    800,  # PY_EXCEPTION_OCCURED: chDB's Python() read of the rows refused them (store/arrowinsert.py)
}  # fmt: skip


class GroupWrites(StoreBase):
    """Writes batches exactly once, several as one group commit (store/group.py), and reads back
    what the checks of a batch's runs need."""

    def write(self, batch: Batch, received_ns: int) -> WriteResult:
        """Store the batch once. Safe to call again with the same batch after any failure."""
        outcome = self.write_group([batch], received_ns)[0]
        if isinstance(outcome, StoreError):
            raise outcome
        return outcome

    def write_group(self, batches: Sequence[Batch], received_ns: int) -> list[WriteResult | StoreError]:
        """Store each batch once, those not stored before as one group: one insert per table
        (store/group.py). An outcome per batch: a BatchConflict or BatchRefused stands for that
        batch alone. A failure of the store raises; what landed of the group is finished when one
        of its batches is written again (here or by another server on the store), or by
        finish_unfinished."""
        return self.store_claimed(self.claim_group(batches, received_ns))

    def claim_group(self, batches: Sequence[Batch], received_ns: int) -> Claim:
        """The first half of write_group: which batches are stored already, and the others claimed
        as one group, whole in ingest_pending, so that from now on they are stored once whatever
        fails (Claim.settled). Then store_claimed, always, even after the store failed here."""
        self.ensure_ready()
        ids = sorted({batch.batch_id for batch in batches})
        with self._client() as client:
            finished, stored, first = self._claim(client, batches, ids, received_ns)
        fresh = sorted(first.values())
        claimed = self._claimed[batches[fresh[0]].batch_id] if fresh else None
        return Claim(batches, finished, stored, first, claimed)

    def store_claimed(self, claim: Claim) -> list[WriteResult | StoreError]:
        """The second half of write_group: the claimed group stored; an outcome per batch."""
        batches = claim.batches
        refused: dict[int, StoreError] = {}
        fresh = sorted(claim.first.values())
        if claim.claimed is not None:
            group, storing = claim.claimed
            try:
                with self._client() as client:
                    refused_here, taken = self._store_group(client, group)
                    refused = {fresh[j]: error for j, error in refused_here.items()}
                    for winner in {commit for commit in taken.values() if commit is not None}:
                        self._finish(client, winner)  # its server may be gone: answer only once it is stored
                refused.update({fresh[j]: ALREADY_CLAIMED for j in taken})
            except BaseException:
                if self.sole_writer and group.listed:  # a retry, or the sweep, finishes it
                    self._left_unfinished[group.commit] = frozenset(group.batch_ids)
                raise
            finally:
                with self._write_lock:
                    for batch_id in group.batch_ids:
                        del self._claimed[batch_id]
                storing.set()
        outcomes: list[WriteResult | StoreError] = []
        for i, batch in enumerate(batches):
            if refused.get(i) is ALREADY_CLAIMED:
                outcomes.append(WriteResult(duplicate=True, rows=batch.rows()))
            elif i in refused:
                outcomes.append(refused[i])
            elif batch.batch_id in claim.stored or claim.first[batch.batch_id] == i:
                outcomes.append(claim.settled(i) or WriteResult(duplicate=False, rows=batch.rows()))
            else:  # the same batch twice in one group
                earlier = batches[claim.first[batch.batch_id]]
                outcomes.append(
                    refused.get(claim.first[batch.batch_id]) or as_stored(batch, earlier.digest, earlier.rows())
                )
        return outcomes

    def _claim(
        self, client: Client, batches: Sequence[Batch], ids: list[str], received_ns: int
    ) -> tuple[set[str], dict[str, tuple[str, dict[str, int]]], dict[str, int]]:
        """Which of `batches` are stored already (finishing the unfinished groups that hold any),
        and the index of the first of each other batch id, which are claimed as one new group,
        listed in ingest_pending (but for one batch that stands alone: store/group.py). One claim
        at a time in this process; the groups claimed are stored at the same time, and a batch
        claimed already is waited for."""
        while True:
            with self._write_lock:
                busy = {self._claimed[batch_id][1] for batch_id in ids if batch_id in self._claimed}
                if not busy:
                    finished = {
                        batch_id
                        for commit in self._unfinished(client, ids)
                        for batch_id in self._finish(client, commit)
                    }
                    stored = self._ledger(client, ids)
                    first: dict[str, int] = {}
                    for i, batch in enumerate(batches):
                        if batch.batch_id not in stored:
                            first.setdefault(batch.batch_id, i)
                    if first:
                        fresh = [batches[i] for i in sorted(first.values())]
                        if one_part(fresh) and (len(fresh) == 1 or self.sole_writer):
                            group = lone_group(fresh, received_ns)
                        else:
                            group = new_group(fresh, received_ns)
                        if group.listed:
                            self._insert_pending(client, group)
                        claim = (group, threading.Event())
                        self._claimed.update(dict.fromkeys(group.batch_ids, claim))
                    return finished, stored, first
            for storing in busy:
                storing.wait()

    def _insert_pending(self, client: Client, group: Group) -> None:
        """The group, whole, before any of it goes to the tables; with it, the done marks of the
        groups finished since the last one (one insert, so one part, per group)."""
        self._insert_with_done_marks(client, [pending_row(group)])
        crash_point("pending")

    def mark_done(self) -> None:
        """The done marks of the groups finished since the last claim, written now (at a clean stop):
        else the next server on the store takes them for groups a crash left unfinished, stores them
        again (nothing twice: the same tokens) and logs that a stopped server left them unfinished."""
        with self._done_lock:
            if not self._done:
                return
        with self._client() as client:
            self._insert_with_done_marks(client, [])

    def _insert_with_done_marks(self, client: Client, rows: list[dict[str, Any]]) -> None:
        with self._done_lock:
            done, self._done = self._done, []
        rows = [*rows, *(done_row(commit) for commit in done)]
        try:
            self._insert_table(client, "ingest_pending", pa.Table.from_pylist(rows, schema=PENDING_SCHEMA))
        except BaseException:
            with self._done_lock:
                self._done.extend(done)
            raise

    def _store_group(self, client: Client, group: Group) -> tuple[dict[int, BatchRefused], dict[int, int | None]]:
        """Insert the group's rows per table, then its ledger rows. Returns the batches (by index)
        whose rows the store refused, and those another group claimed first (the commit of the
        one to finish, None when stored), which this group leaves out. The same group stored
        again stores nothing twice: the inserts carry its tokens, and what is left out is worked
        out again the same way."""
        taken = self._taken_elsewhere(client, group)
        refused: dict[int, BatchRefused] = {}
        for table in TABLES:
            if table not in group.tables:
                continue
            left_out = set(refused) | set(taken)
            data = group.without(left_out, table) if left_out else group.tables[table]
            try:
                if data.num_rows:
                    self._insert(client, table, data, group.token(table))
            except BatchRefused as error:
                if len(group.batch_ids) == 1:
                    log.error("batch %s is not stored: %s", group.batch_ids[0], error)
                    refused[0] = error
                    continue
                for i, part in enumerate(group.slices(table)):  # which batch: each on its own
                    if i not in refused and part.num_rows:
                        try:
                            self._insert(client, table, part, f"{group.token(table)}/{i}")
                        except BatchRefused as alone:
                            log.error("batch %s is not stored: %s", group.batch_ids[i], alone)
                            refused[i] = alone
            if table == "samples":
                kept = group.without(set(refused) | set(taken), table) if refused or taken else data
                for rollup, rows in rollups(kept).items() if kept.num_rows else ():
                    self._insert(client, rollup, rows, group.token(rollup))
            crash_point(f"table:{table}")
        crash_point("tables")
        kept = [i for i in range(len(group.batch_ids)) if i not in refused and i not in taken]
        self._insert_ledger(client, group, kept)
        crash_point("ledger")
        if group.listed:
            with self._done_lock:
                self._done.append(group.commit)
        return refused, taken

    def _insert_ledger(self, client: Client, group: Group, kept: list[int]) -> None:
        """The ledger's rows of the group's batches at the indexes `kept`: stored."""
        if not kept:
            return
        self._insert_table(
            client,
            "ingest_batches",
            pa.table(
                {
                    "batch_id": [group.batch_ids[i] for i in kept],
                    "digest": [group.digests[i] for i in kept],
                    "received": pa.array([group.received_ns] * len(kept), pa.timestamp("ns", tz="UTC")),
                    **{table: pa.array([group.rows[i].get(table, 0) for i in kept], pa.uint32()) for table in TABLES},
                }
            ),
        )

    def _taken_elsewhere(self, client: Client, group: Group) -> dict[int, int | None]:
        """The group's batches that another group claimed before it, as the engine numbered the
        claims' inserts (two servers that both found a batch unclaimed both claim it; the first
        claim stores it), with that group's commit; or that are stored by now (None). None of
        them when this is the store's only writer, whose claims are taken one at a time."""
        if self.sole_writer:
            return {}
        ids = list(group.batch_ids)
        first: dict[str, int] = {
            str(batch_id): int(commit)
            for batch_id, commit in client.query(
                f"SELECT batch_id, argMin(commit, _block_number) FROM {self.db}.ingest_pending "
                "ARRAY JOIN batch_ids AS batch_id WHERE hasAny(batch_ids, {ids:Array(String)}) "
                "AND batch_id IN {ids:Array(String)} GROUP BY batch_id",
                parameters={"ids": ids},
            ).result_rows
        }
        stored = self._ledger(client, ids)
        taken: dict[int, int | None] = {}
        for i, batch_id in enumerate(ids):
            if batch_id in stored:
                taken[i] = None
            elif first.get(batch_id, group.commit) != group.commit:
                taken[i] = first[batch_id]
        return taken

    def _insert(self, client: Client, table: str, data: pa.Table, token: str) -> None:
        try:
            self._insert_table(
                client,
                table,
                data.combine_chunks(),  # one block for the engine, not one per batch: half the CPU
                settings={"insert_deduplication_token": token},
            )
        except DatabaseError as error:
            if error_code(error) not in _BAD_DATA:
                raise
            # validation lets through nothing the engine refuses: a gap there, logged
            log.error("the store refused %s of insert %s: %s", table, token, clean_error(error))
            raise BatchRefused(f"{table}: the store refused these rows: {clean_error(error)}") from error

    def _unfinished(self, client: Client, batch_ids: list[str]) -> list[int]:
        """The unfinished groups that hold any of `batch_ids`."""
        if self.sole_writer:
            wanted = set(batch_ids)
            return [commit for commit, held in list(self._left_unfinished.items()) if held & wanted]
        found = client.query(
            f"SELECT commit FROM {self.db}.ingest_pending WHERE commit IN "
            f"(SELECT commit FROM {self.db}.ingest_pending WHERE hasAny(batch_ids, {{ids:Array(String)}})) "
            "GROUP BY commit HAVING max(done) = 0",
            parameters={"ids": batch_ids},
        ).result_rows
        with self._done_lock:
            done = set(self._done)  # finished here, not yet marked
        return [int(row[0]) for row in found if int(row[0]) not in done]

    def _finish(self, client: Client, commit: int, busy: set[str] | None = None) -> tuple[str, ...]:
        """Store again what an unfinished group holds (what of it landed is not stored twice); its batch ids.
        Nothing for a group that holds a batch in `busy`: claimed again by this process, being stored."""
        found = client.query(
            f"SELECT received, batch_ids, digests, rows, {', '.join(TABLES)} FROM {self.db}.ingest_pending "
            "WHERE commit = {commit:UInt64} AND done = 0 LIMIT 1",
            parameters={"commit": commit},
            column_formats=dict.fromkeys(TABLES, "bytes"),
        ).result_rows
        if not found:
            return ()
        received, batch_ids, digests, rows, *payloads = found[0]
        if busy and busy.intersection(batch_ids):
            return ()
        if len(self._ledger(client, list(batch_ids))) == len(batch_ids):  # the ledger comes last: all landed
            with self._done_lock:
                self._done.append(commit)
            self._left_unfinished.pop(commit, None)
            return ()
        events = payloads[TABLES.index("events")]
        if events.startswith(LONE_MARK):  # batches that stood alone, listed without their rows (store/group.py)
            month = int(events[len(LONE_MARK) :])
            lone = Group(commit, stored_ns(received), tuple(batch_ids), tuple(digests), tuple(rows), {}, True, month)
            return self._finish_lone(client, lone)
        tables = decode_tables({table: data for table, data in zip(TABLES, payloads, strict=True) if data})
        group = Group(commit, stored_ns(received), tuple(batch_ids), tuple(digests), tuple(rows), tables)
        log.warning("finishing group commit %d (%d batches), left unfinished by its server", commit, len(rows))
        self._store_group(client, group)
        self._left_unfinished.pop(commit, None)
        return group.batch_ids

    def _finish_lone(self, client: Client, group: Group) -> tuple[str, ...]:
        """Finish a group of batches that stood alone: each one's events landed whole or not at all, so
        the ledger takes those whose events are in, and the others are left to their writers, whose
        retries claim them again; the batch ids stored now. Only a store's sole writer makes such groups:
        no other server can be inserting them while this one looks."""
        stored = self._ledger(client, list(group.batch_ids))
        unstored = [i for i, batch_id in enumerate(group.batch_ids) if batch_id not in stored]
        landed = self._landed(client, group, unstored)
        self._insert_ledger(client, group, landed)
        log.warning(
            "finished group commit %d, left unfinished: %d of its %d batches' events were in, the others are "
            "left to their writers' retries", group.commit, len(landed) + len(stored), len(group.batch_ids),
        )  # fmt: skip
        with self._done_lock:
            self._done.append(group.commit)
        self._left_unfinished.pop(group.commit, None)
        return tuple(batch_id for i, batch_id in enumerate(group.batch_ids) if batch_id in stored or i in landed)

    def _landed(self, client: Client, group: Group, indexes: list[int]) -> list[int]:
        """Of the group's batches at `indexes`, those whose events are in the store, found by their
        event ids (store/eventids.py; a scan of the ids of the group's month, made only to finish a group).
        Each landed whole or not at all (one part); a count short of the batch's is another batch's
        events under the same 40 bits, or a break of that rule: logged, and left to the retry."""
        if not indexes:
            return []
        prefixes: dict[int, list[int]] = {}
        for i in indexes:
            prefixes.setdefault(batch_prefix(group.batch_ids[i]), []).append(i)
        found = client.query(
            f"SELECT bitShiftRight(id, {EVENT_ID_ROW_BITS}) AS prefix, count() FROM {self.db}.events "
            "WHERE toYYYYMM(start) = {month:UInt32} AND prefix IN {prefixes:Array(UInt64)} GROUP BY prefix",
            parameters={"month": group.month, "prefixes": list(prefixes)},
        ).result_rows
        landed = []
        for prefix, count in found:
            for i in prefixes[int(prefix)]:
                sent = group.rows[i].get("events", 0)
                if int(count) == sent:
                    landed.append(i)
                else:
                    log.error(
                        "batch %s: %d events in the store under its ids, of its %d", group.batch_ids[i], count, sent
                    )
        return sorted(landed)

    def finish_unfinished(self, older_than_s: float) -> int:
        """Finish the groups left unfinished for over `older_than_s` (their servers stopped, their
        writers gone), and mark the finished ones done; how many were finished."""
        self.ensure_ready()
        with self._client() as client:
            commits = [
                int(row[0])
                for row in client.query(
                    f"SELECT commit FROM {self.db}.ingest_pending GROUP BY commit "
                    "HAVING max(done) = 0 AND min(received) < now64(9) - toIntervalMillisecond({age:UInt64})",
                    parameters={"age": int(older_than_s * 1000)},
                ).result_rows
            ]
            for commit in commits:
                # as a claim does, one at a time, and not a group finished here already nor one holding a batch
                # being stored (a lone group's is found only once its events landed, and its ledger row follows)
                with self._write_lock:
                    with self._done_lock:
                        finished = commit in self._done
                    if not finished:
                        self._finish(client, commit, busy=set(self._claimed))
            with self._done_lock:
                done, self._done = self._done, []
            if done:
                self._insert_table(
                    client,
                    "ingest_pending",
                    pa.Table.from_pylist([done_row(commit) for commit in done], schema=PENDING_SCHEMA),
                )
        return len(commits)

    def _ledger(self, client: Client, batch_ids: list[str]) -> dict[str, tuple[str, dict[str, int]]]:
        # a batch id has one row, or the same row twice until a merge (two servers' claims): any one of them
        # (grouped by the engine, the lookup asked once per group took 1-2 ms more of its 4-8)
        found = client.query(
            f"SELECT batch_id, digest, {', '.join(TABLES)} "
            f"FROM {self.db}.ingest_batches WHERE batch_id IN {{ids:Array(String)}}",
            parameters={"ids": batch_ids},
        ).result_rows
        ledger: dict[str, tuple[str, dict[str, int]]] = {}
        for batch_id, digest, *counts in found:
            ledger.setdefault(str(batch_id), (str(digest), dict(zip(TABLES, (int(v) for v in counts), strict=True))))
        return ledger

    # -- run descriptions, for the checks in ingest/grants.py ------------------------------

    def run_states(self, batch: Batch) -> dict[str, tuple[str, bool]] | None:
        """The latest stored (host, importing) of each run `batch` describes that has one; None
        when this very batch (same id, same content) is stored already: it will store nothing."""
        self.ensure_ready()
        run_ids = [] if batch.runs is None else sorted(set(batch.runs.column("run_id").to_pylist()))
        with self._client() as client:
            stored = self._ledger(client, [batch.batch_id]).get(batch.batch_id)
            if stored is not None and stored[0] == batch.digest:
                return None
            found = self._run_rows(client, run_ids)
        return {str(run_id): (str(host), bool(importing)) for run_id, host, importing in found}

    def run_hosts(self, run_ids: list[str]) -> dict[str, str]:
        """The host each of `run_ids` is stored under, for those that are stored."""
        self.ensure_ready()
        with self._client() as client:
            return {str(run_id): str(host) for run_id, host, _ in self._run_rows(client, run_ids)}

    def _run_rows(self, client: Client, run_ids: list[str]) -> list[Any]:
        return list(
            client.query(
                f"SELECT run_id, host, importing FROM {self.db}.runs FINAL WHERE run_id IN {{ids:Array(String)}}",
                parameters={"ids": run_ids},
            ).result_rows
        )
