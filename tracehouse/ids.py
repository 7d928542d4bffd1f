"""Run ids, shared by the agent and the training API; imports nothing heavy."""

from __future__ import annotations

import re
from datetime import UTC, datetime

_NOT_IN_ID = re.compile(r"[^A-Za-z0-9._:-]+")


def make_run_id(name: str, host: str, started_ns: int) -> str:
    """NAME.HOST.STAMP (UTC, microseconds), characters outside [A-Za-z0-9._:-] as `-`, at most 128."""
    stamp = datetime.fromtimestamp(started_ns / 1e9, tz=UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    parts = [_NOT_IN_ID.sub("-", part).strip("-") for part in (name or "agent", host)]
    return ".".join([*parts, stamp])[-128:].lstrip(".-")
