"""The gRPC Ingest service: validate a batch whole, then store it exactly once."""

from __future__ import annotations

from typing import Any

from ingest.store import Store
from ingest.validate import validate_batch
from tracehouse.timefmt import now_ns
from tracehouse.v1 import ingest_pb2, ingest_pb2_grpc


class IngestService(ingest_pb2_grpc.IngestServicer):
    wants_encoded_request = ("Write",)  # hashing the bytes as sent beats encoding them again

    def __init__(self, store: Store) -> None:
        self.store = store

    def Write(self, request: ingest_pb2.WriteRequest, context: Any, encoded: bytes = b"") -> ingest_pb2.WriteResponse:
        received = now_ns()
        batch = validate_batch(request.batch, self.store.limits, received, encoded)
        result = self.store.write(batch, received)
        return ingest_pb2.WriteResponse(duplicate=result.duplicate, **result.rows)
