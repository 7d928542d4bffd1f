"""What the Ingest service and its writers agree on when the server asks for a pause.

The server (ingest/admission.py) refuses a write it cannot take yet with RESOURCE_EXHAUSTED,
a message that says why and a retry hint; the writers (agent/shipping/shipper.py) spool and wait.
"""

from __future__ import annotations

# gRPC's standard trailer for "retry after this many milliseconds" (gRFC A6)
PUSHBACK_KEY = "grpc-retry-pushback-ms"
# in every refusal's message, for the person reading a writer's log
BEHIND = "the store is behind"
# the largest message either side sends or takes; gRPC itself refuses a bigger one with
# RESOURCE_EXHAUSTED, the one such answer that no amount of waiting turns into a success
TRANSPORT_MAX_BYTES = 256 << 20
