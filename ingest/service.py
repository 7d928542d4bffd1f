"""The gRPC Ingest service: admit a batch (ingest/admission.py), validate it whole, check it against the
caller's grant (ingest/grants.py), then store it exactly once, with the batches other writers send
at the same time (ingest/groupcommit.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ingest.admission import Admission, Admitted, Overloaded
from ingest.capture_rules import RuleEngine
from ingest.capture_service import CaptureBoard
from ingest.grants import OutOfBounds, RunLocks, check_bounds, check_descriptions, check_run_hosts, named_runs
from ingest.groupcommit import GroupCommit
from ingest.validate import ValidatedBatch, has_unknown_fields, validate_batch
from store.claim import WriteResult
from store.store import Store
from tracehouse.pushback import PUSHBACK_KEY
from tracehouse.scopes import CALLER, Grant
from tracehouse.timefmt import now_ns
from tracehouse.v1 import ingest_pb2, ingest_pb2_grpc

log = logging.getLogger("tracehouse.ingest")
STORED_HOSTS_KEPT = 100_000  # runs whose host this process remembers


class IngestService(ingest_pb2_grpc.IngestServicer):
    wants_encoded_request = ("Write",)  # hashing the bytes as sent beats encoding them again

    def __init__(
        self,
        store: Store,
        commit: GroupCommit,
        admission: Admission | None = None,
        captures: CaptureBoard | None = None,
        rules: RuleEngine | None = None,
        on_runs_described: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.captures = captures
        self.rules = rules
        self.on_runs_described = on_runs_described  # once stored: an import's end, say (query/keeper.py)
        self.commit = commit
        self.admission = admission or Admission()
        self.run_locks = RunLocks()
        # a stored run keeps its host (ingest/grants.py), so a host once found stays true
        self._stored_hosts: dict[str, str] = {}

    def Write(self, request: ingest_pb2.WriteRequest, context: Any, encoded: bytes = b"") -> ingest_pb2.WriteResponse:
        arrived = now_ns()  # the writer's clock offset leaves out the time from here to the answer
        grant = CALLER.get()
        try:
            with self.admission.admit(len(encoded) or request.ByteSize(), context.time_remaining()) as admitted:
                received = now_ns()
                as_sent = b"" if has_unknown_fields(request) else encoded  # else hashed without them
                batch = validate_batch(request.batch, self.store.limits, received, as_sent, grant.namespace)
                check_bounds(batch, grant)
                result = self._write(batch, received, grant, context.is_active, admitted)
        except Overloaded as refused:
            context.set_trailing_metadata(((PUSHBACK_KEY, str(refused.retry_ms)),))
            raise
        except OutOfBounds as refused:
            log.info("refused a write from %s: %s is outside its token's bounds", context.peer(), refused.field)
            raise
        # a writer bound to run ids could name any host in its samples: its telemetry asks for no capture
        if self.rules is not None and batch.samples is not None and not result.duplicate and grant.runs is None:
            self.rules.observe(batch.samples)
        if batch.runs is not None and not result.duplicate:
            self.on_runs_described()
        waiting = self.captures is not None and self.captures.waiting(request.batch.run_id, request.batch.batch_id)
        return ingest_pb2.WriteResponse(duplicate=result.duplicate, capture_waiting=waiting, server_received_ns=arrived,
                                        server_time_ns=now_ns(), **result.rows)  # fmt: skip

    def _write(
        self, batch: ValidatedBatch, received: int, grant: Grant, wanted: Callable[[], bool], admitted: Admitted
    ) -> WriteResult:
        """Run descriptions answer to the stored ones first, one run at a time in this process. The
        admitted bytes are held until the batch is stored, which may come after the answer."""
        if grant.hosts is not None:
            check_run_hosts(batch, self._run_hosts(named_runs(batch)), grant)
        if batch.runs is None:
            return self.commit.write(batch, received, wanted, admitted.hand_over(), admitted.taken)
        with self.run_locks.holding(batch.runs.column("run_id").to_pylist()):
            stored = self.store.run_states(batch)
            if stored is not None:  # None: this very batch is stored already
                check_descriptions(batch.runs, stored, grant)
            return self.commit.write(batch, received, wanted, admitted.hand_over(), admitted.taken)

    def _run_hosts(self, run_ids: list[str]) -> dict[str, str]:
        missing = [run_id for run_id in run_ids if run_id not in self._stored_hosts]
        if missing:
            if len(self._stored_hosts) > STORED_HOSTS_KEPT:
                self._stored_hosts.clear()
            self._stored_hosts.update(self.store.run_hosts(missing))
        return {run_id: self._stored_hosts[run_id] for run_id in run_ids if run_id in self._stored_hosts}
