"""The file-level reading of a Kineto trace (agent/traces/kineto.py): the first pass over the whole
file (hash, gzip, UTF-8, that the text starts and ends as complete JSON, the top-level members
after `traceEvents`), and, for the second pass, the text as ijson reads it and the top-level
members before `traceEvents`."""

from __future__ import annotations

import codecs
import contextlib
import gzip
import hashlib
import json
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import ijson
import numpy as np

from agent.traces.tracefile import JsonGuard, JsonText, Marks, TraceFileError, open_regular

READ_BYTES = 1 << 20
TAIL_BYTES = 1 << 20  # the end of the text, where the members after traceEvents are
HEAD_TOKENS = 1_000_000  # a member before traceEvents larger than this is not kept
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*$')
_WHITE_SPACE = b" \t\r\n"


class KinetoError(TraceFileError):
    """The trace cannot be imported; the message is one line a person can act on."""


SURROGATE = "a string escapes an unpaired UTF-16 surrogate (\\ud800..\\udfff); not valid Unicode"


def one_line(error: BaseException) -> str:
    message = error.args[0] if error.args else error
    if isinstance(message, bytes):
        message = message.decode("utf-8", "replace")
    return str(message).strip().splitlines()[0][:200] if str(message).strip() else type(error).__name__


# -- the first pass ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Scan:
    digest: str
    size: int
    mtime_ns: int
    gzip: bool
    text_bytes: int  # of JSON text, decompressed
    utf8: bool  # every byte is valid UTF-8
    layout: str  # "object" ({"traceEvents": [...], ...}) or "array" ([...])
    trailer: dict[str, Any]  # top-level members after traceEvents


def first_pass(path: Path) -> Scan:
    try:
        with open_regular(path) as raw:
            stat = os.fstat(raw.fileno())
            digest = hashlib.file_digest(raw, "sha256").hexdigest()
        decoder = codecs.getincrementaldecoder("utf-8")()
        utf8 = True
        first = b""
        tail = bytearray()
        text = JsonText(path, KinetoError, guarded=False)  # no parser reads it (TraceText guards what one does)
        with contextlib.closing(text):
            while chunk := _read_or_refuse(text, path):
                if not first:
                    first = chunk.lstrip(_WHITE_SPACE)[:1]
                    if first not in (b"", b"{", b"["):
                        raise KinetoError(f"{path.name}: not JSON (a Chrome trace starts with {{ or [)")
                if utf8:
                    try:
                        decoder.decode(chunk)
                    except UnicodeDecodeError:
                        utf8 = False
                tail += chunk
                if len(tail) > 2 * TAIL_BYTES:
                    del tail[:-TAIL_BYTES]
        total = text.consumed
        gzipped = text.gzip
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            utf8 = False
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise KinetoError(f"{path.name}: truncated or corrupt gzip file ({one_line(error)})") from None
    except OSError as error:
        raise KinetoError(f"{path.name}: cannot read it ({error.strerror or one_line(error)})") from None
    if not first:
        raise KinetoError(f"{path.name}: empty{' once decompressed' if gzipped else ''}; not a trace")
    layout = "object" if first == b"{" else "array"
    closing = "}" if layout == "object" else "]"
    if bytes(tail.rstrip()[-1:]) != closing.encode():
        raise KinetoError(f"{path.name}: not JSON, or truncated (it does not end with the {closing} it opens with)")
    text_tail = bytes(tail[-TAIL_BYTES:])
    trailer = _trailer(text_tail, whole=total <= TAIL_BYTES) if layout == "object" else {}
    if not _unicode(trailer):  # json, unlike yajl, takes any escaped surrogate
        raise KinetoError(f"{path.name}: {SURROGATE}")
    return Scan(digest, stat.st_size, stat.st_mtime_ns, gzipped, total, utf8, layout, trailer)


def _read_or_refuse(text: JsonText, path: Path) -> bytes:
    """The next chunk; a gzip bomb refused as the guard would refuse it, if it would first (a string
    too long, say), so that the reason is the first one found in the text."""
    try:
        return text.read(READ_BYTES)
    except KinetoError:
        guarded = JsonText(path, KinetoError)
        with contextlib.closing(guarded):
            while guarded.read(READ_BYTES):
                pass
        raise


def _outside_brackets(tail: bytes) -> list[int]:
    """Offsets of the brackets outside strings, as read backwards from the end (outside any
    string): a bracket is outside when an even number of unescaped quotes follow it."""
    data = np.frombuffer(tail, np.uint8)
    quotes = np.flatnonzero(data == 0x22)
    if len(quotes) and b"\\" in tail:
        index = np.arange(len(data))
        not_backslash = np.maximum.accumulate(np.where(data == 0x5C, -1, index))  # last one at or before
        before = np.maximum(quotes - 1, 0)
        run = np.where(quotes > 0, before - not_backslash[before], 0)  # backslashes just before each quote
        quotes = quotes[run % 2 == 0]
    folded = data | np.uint8(0x20)  # [ ] fold onto { }
    brackets = np.flatnonzero((folded == 0x7B) | (folded == 0x7D))
    following = len(quotes) - np.searchsorted(quotes, brackets, side="right")
    return brackets[following % 2 == 0].tolist()


def _trailer(tail: bytes, whole: bool) -> dict[str, Any]:
    """The top-level members after the traceEvents array, read backwards from the end of the text.
    The array is the top-level one whose `[` follows the key "traceEvents" or, when the window
    starts inside a top-level array, that one (nothing else in a trace is that big)."""
    depth = 0
    closing = -1  # the `]` of the top-level array being read, if the one being read is an array
    for position in reversed(_outside_brackets(tail)):
        char = tail[position]
        if char in b"]}":
            depth += 1
            if depth == 2:
                closing = position if char == 0x5D else -1
        else:
            depth -= 1
            if depth == 1 and closing >= 0:
                if char == 0x5B and _EVENTS_KEY.search(tail, max(0, position - 64), position):
                    return _members(tail[closing + 1 :])
                closing = -1
            if depth <= 0:
                return {}
    if not whole and depth >= 2 and closing >= 0:
        return _members(tail[closing + 1 :])
    return {}


def _unicode(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False, default=str).encode()
    except UnicodeEncodeError:
        return False
    return True


def _members(text: bytes) -> dict[str, Any]:
    """`, "key": value, ... }` as a dict; {} when it is not that."""
    rest = text.strip()
    if not rest.startswith(b","):
        return {}
    members_text = b"{" + rest[1:]
    try:
        JsonGuard("", KinetoError).feed(members_text)  # what json parses is guarded as the events are
        members = json.loads(members_text, parse_float=Decimal)
    except (KinetoError, ValueError):
        return {}  # the second pass refuses it, if it is the file's
    return members if isinstance(members, dict) else {}


# -- the second pass --------------------------------------------------------------------------


class TraceText:
    """The trace's JSON text as the parsers read it: without a byte-order mark, invalid UTF-8
    replaced when the first pass found some, then checked by a JsonGuard (so the file is checked
    again if it changed since the first pass, and the guard sees the very bytes handed on), and
    the bytes read so far counted. `marks()`, when `marking`: where the items are in what was
    read since the last call."""

    def __init__(self, path: Path, scan: Scan, marking: bool = False) -> None:
        self._raw = JsonText(path, KinetoError, guarded=False)
        self._guard = JsonGuard(path.name, KinetoError, marking)
        self._decoder = None if scan.utf8 else codecs.getincrementaldecoder("utf-8")("replace")
        self.consumed = 0

    def read(self, size: int = -1) -> bytes:
        while True:
            data = self._raw.read(size)
            self.consumed += len(data)
            if self._decoder is not None:
                text = self._decoder.decode(data, final=not data)
                if not text and data:
                    continue
                data = text.encode()
            self._guard.feed(data)
            return data

    def marks(self) -> Marks:
        return self._guard.marks()

    def close(self) -> None:
        self._raw.close()


def _value(events: Iterator[tuple[str, str, Any]], first: tuple[str, str, Any]) -> Any:
    """The value starting with `first`, built from parse events; None if it is too large."""
    _, event, value = first
    if event not in ("start_map", "start_array"):
        return value
    builder = ijson.common.ObjectBuilder()
    builder.event(event, value)
    depth = 1
    tokens = 0
    for _, event, value in events:
        depth += event in ("start_map", "start_array")
        depth -= event in ("end_map", "end_array")
        tokens += 1
        if tokens <= HEAD_TOKENS:
            builder.event(event, value)
        if depth == 0:
            break
    return builder.value if tokens <= HEAD_TOKENS else None


def head_members(path: Path, scan: Scan) -> tuple[dict[str, Any], int]:
    """The top-level members before traceEvents, and how many of them are objects or lists (so
    the events' list is the next top-level member's list: Marks.lists), read through a TraceText of
    their own; none for a trace that is a bare list. Raises KinetoError."""
    if scan.layout != "object":
        return {}, 0
    text = TraceText(path, scan)
    try:
        return _head_members(text, path.name)
    except ijson.JSONError as error:
        raise KinetoError(f"{path.name}: not valid JSON ({one_line(error)})") from None
    except UnicodeDecodeError:
        raise KinetoError(f"{path.name}: {SURROGATE}") from None
    finally:
        text.close()


def _head_members(text: TraceText, name: str) -> tuple[dict[str, Any], int]:
    events = ijson.parse(text)
    _, event, _ = next(events)
    if event != "start_map":
        return {}, 0  # an array: the events themselves
    head: dict[str, Any] = {}
    containers = 0
    for prefix, event, value in events:
        if prefix == "" and event == "map_key":
            if value == "traceEvents":
                _, opened, _ = next(events)
                if opened != "start_array":
                    raise KinetoError(f"{name}: not a Chrome trace (its traceEvents is not a list)")
                return head, containers
            first = next(events)
            containers += first[1] in ("start_map", "start_array")
            head[value] = _value(events, first)
        elif prefix == "" and event == "end_map":
            break
    raise KinetoError(f"{name}: JSON, but not a Chrome trace (it has no traceEvents)")
