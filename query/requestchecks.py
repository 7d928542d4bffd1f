"""What a Query request asks, checked against the limits before any SQL is made of it: the window,
bounded counts, event kinds, tag selectors. A request that fails a check is a QueryError naming
its field (INVALID_ARGUMENT at the edge)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from query.window import Window
from tracehouse.model import EVENT_KINDS, Limits
from tracehouse.requesterrors import QueryError
from tracehouse.v1 import query_pb2


def window_of(message: query_pb2.Window, limits: Limits) -> Window:
    return Window(
        run_id=message.run_id,
        hosts=tuple(message.hosts),
        gpus=tuple(message.gpus),
        from_ns=message.from_ns if message.HasField("from_ns") else None,
        to_ns=message.to_ns if message.HasField("to_ns") else None,
    ).check(limits)


def bounded(value: int, default: int, maximum: int, field: str) -> int:
    if value > maximum:
        raise QueryError(field, f"{value} is over the limit of {maximum}")
    return value or default


def check_kinds(kinds: Sequence[str]) -> None:
    for kind in kinds:
        if kind not in EVENT_KINDS:
            raise QueryError("kinds", f"unknown kind {kind[:64]!r}; known: {', '.join(EVENT_KINDS)}")


def check_tags(field: str, tags: Mapping[str, str], limits: Limits) -> dict[str, str]:
    if len(tags) > limits.max_map_entries:
        raise QueryError(field, f"{len(tags)} pairs; the limit is {limits.max_map_entries}")
    for key, value in tags.items():
        if not key or len(key.encode()) > limits.max_name_bytes:
            raise QueryError(field, f"key {key[:64]!r} is not 1 to {limits.max_name_bytes} bytes")
        if len(value.encode()) > limits.max_string_bytes:
            raise QueryError(f"{field}[{key[:64]!r}]", f"longer than {limits.max_string_bytes} bytes")
    return dict(tags)
