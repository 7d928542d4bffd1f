"""The gRPC Ingest service: admit a batch (ingest/admission.py), validate it whole, then store it exactly once."""

from __future__ import annotations

from typing import Any

from ingest.admission import Admission, Overloaded
from ingest.store import Store
from ingest.validate import validate_batch
from tracehouse.pushback import PUSHBACK_KEY
from tracehouse.timefmt import now_ns
from tracehouse.v1 import ingest_pb2, ingest_pb2_grpc


class IngestService(ingest_pb2_grpc.IngestServicer):
    wants_encoded_request = ("Write",)  # hashing the bytes as sent beats encoding them again

    def __init__(self, store: Store, admission: Admission | None = None) -> None:
        self.store = store
        self.admission = admission or Admission()

    def Write(self, request: ingest_pb2.WriteRequest, context: Any, encoded: bytes = b"") -> ingest_pb2.WriteResponse:
        try:
            with self.admission.admit(len(encoded) or request.ByteSize()):
                received = now_ns()
                batch = validate_batch(request.batch, self.store.limits, received, encoded)
                result = self.store.write(batch, received)
        except Overloaded as refused:
            context.set_trailing_metadata(((PUSHBACK_KEY, str(refused.retry_ms)),))
            raise
        return ingest_pb2.WriteResponse(duplicate=result.duplicate, **result.rows)
