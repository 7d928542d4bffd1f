"""Capture requests as the Python client hands them out: one dict per request (Client.capture_list,
Client.capture_state), and as one frame of a row per request and process (the CLI and the UI)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from tracehouse.v1 import capture_pb2


def capture_dict(state: capture_pb2.CaptureState) -> dict[str, Any]:
    return {
        "request_id": state.request_id, "run_id": state.run_id, "requested_ns": state.requested_ns,
        "requested_by": state.requested_by, "reason": state.reason, "first_step": state.first_step,
        "steps": state.steps, "seconds": state.seconds, "ranks": list(state.ranks), "state": state.state,
        "outcomes": [
            {"session": o.session, "rank": o.rank, "host": o.host, "state": o.state, "at_ns": o.at_ns,
             "first_step": o.first_step, "last_step": o.last_step, "trace_bytes": o.trace_bytes,
             "events": o.events, "reason": o.reason, "comparison": json.loads(o.comparison) if o.comparison else None}
            for o in state.outcomes
        ],
    }  # fmt: skip


def captures_frame(captures: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Capture requests (Client.capture_list) as one row per request and process that reported (one
    for a request no process took yet): what was asked, and each outcome; exact ns and bytes."""
    rows = []
    for c in captures:
        asked = {
            "request_id": c["request_id"],
            "run_id": c["run_id"],
            "requested_ns": c["requested_ns"],
            "requested_by": c["requested_by"],
            "state": c["state"],
            "asked": _asked(c),
            "reason": c["reason"],
        }
        for o in c["outcomes"] or [None]:
            rows.append(
                {
                    **asked,
                    "rank": None if o is None else o["rank"],
                    "host": "" if o is None else o["host"],
                    "outcome": "" if o is None else o["state"],
                    "steps": "" if o is None else _captured(o),
                    "trace_bytes": None if o is None else o["trace_bytes"],
                    "events": None if o is None else o["events"],
                    "why": "" if o is None else o["reason"],
                }
            )
    frame = pd.DataFrame(rows, columns=[
        "request_id", "run_id", "state", "asked", "outcome", "steps", "rank", "host", "trace_bytes", "events", "why",
        "vs_baseline", "reason", "requested_ns", "requested_by",
    ])  # fmt: skip
    frame["rank"] = frame["rank"].astype("Int64")
    for column in ("trace_bytes", "events"):  # UInt64, as stored: a value past int64 (an old record) still reads
        frame[column] = frame[column].astype("UInt64")
    return frame


def _asked(capture: Mapping[str, Any]) -> str:
    what = f"{capture['steps']} steps" if capture["steps"] else f"{capture['seconds']:g} s"
    start = f" from step {capture['first_step']}" if capture["first_step"] >= 0 else " from the next step"
    ranks = f", ranks {','.join(map(str, capture['ranks']))}" if capture["ranks"] else ""
    return what + start + ranks


def _captured(outcome: Mapping[str, Any]) -> str:
    first, last = outcome["first_step"], outcome["last_step"]
    if first < 0:
        return ""
    return f"{first}" if last < 0 else f"{first} to {last}"
