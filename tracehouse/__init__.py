"""tracehouse: GPU telemetry and Nsight Systems traces on one timeline, in ClickHouse.

This package holds what the agent, ingest and query parts share: the generated wire
protocol (`tracehouse.v1`), the data model's vocabulary and limits, time helpers, the
batch encoder, the server wiring and the CLI.
"""

__version__ = "0.1.0"
