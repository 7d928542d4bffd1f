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

from agent.traces.tracefile import JsonText, TraceFileError, open_regular

READ_BYTES = 1 << 20
TAIL_BYTES = 1 << 20  # the end of the text, where the members after traceEvents are
HEAD_TOKENS = 1_000_000  # a member before traceEvents larger than this is not kept
_STRUCTURE = re.compile(rb'["\[\]{}]')
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*$')


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
        text = JsonText(path, KinetoError)  # refuses hostile text (tracefile.JsonGuard) as it is read
        with contextlib.closing(text):
            while chunk := text.read(READ_BYTES):
                first = first or chunk.lstrip()[:1]
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
    if first not in (b"{", b"["):
        raise KinetoError(f"{path.name}: not JSON (a Chrome trace starts with {{ or [)")
    layout = "object" if first == b"{" else "array"
    closing = "}" if layout == "object" else "]"
    if bytes(tail.rstrip()[-1:]) != closing.encode():
        raise KinetoError(f"{path.name}: not JSON, or truncated (it does not end with the {closing} it opens with)")
    text_tail = bytes(tail[-TAIL_BYTES:])
    trailer = _trailer(text_tail, whole=total <= TAIL_BYTES) if layout == "object" else {}
    if not _unicode(trailer):  # json, unlike yajl, takes any escaped surrogate
        raise KinetoError(f"{path.name}: {SURROGATE}")
    return Scan(digest, stat.st_size, stat.st_mtime_ns, gzipped, total, utf8, layout, trailer)


def _escaped(text: bytes, position: int) -> bool:
    """Whether the quote at `position` is escaped: an odd number of backslashes before it."""
    before = position
    while before > 0 and text[before - 1] == 0x5C:
        before -= 1
    return (position - before) % 2 == 1


def _trailer(tail: bytes, whole: bool) -> dict[str, Any]:
    """The top-level members after the traceEvents array, read backwards from the end of the text.
    Outside strings, a quote ends a string when read backwards; inside, the first unescaped quote
    starts it. The array is the top-level one whose `[` follows the key "traceEvents" or, when the
    window starts inside a top-level array, that one (nothing else in a trace is that big)."""
    depth = 0
    inside = False
    closing = -1  # the `]` of the top-level array being read, if the one being read is an array
    for match in reversed(list(_STRUCTURE.finditer(tail))):
        position = match.start()
        char = tail[position]
        if inside:
            inside = not (char == 0x22 and not _escaped(tail, position))
        elif char == 0x22:
            inside = True
        elif char in b"]}":
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
    try:
        members = json.loads(b"{" + rest[1:], parse_float=Decimal)
    except ValueError:
        return {}
    return members if isinstance(members, dict) else {}


# -- the second pass --------------------------------------------------------------------------


class TraceText:
    """The trace's JSON text as ijson reads it: without a byte-order mark, checked by a JsonGuard
    (so the file is checked again if it changed since the first pass), invalid UTF-8 replaced when
    the first pass found some, and the bytes read so far counted."""

    def __init__(self, path: Path, scan: Scan) -> None:
        self._raw = JsonText(path, KinetoError)  # the file may have changed since the first pass: checked again
        self._decoder = None if scan.utf8 else codecs.getincrementaldecoder("utf-8")("replace")
        self.consumed = 0

    def read(self, size: int = -1) -> bytes:
        while True:
            data = self._raw.read(size)
            self.consumed += len(data)
            if self._decoder is None:
                return data
            text = self._decoder.decode(data, final=not data)
            if text or not data:
                return text.encode()

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


def head_members(text: TraceText, name: str) -> dict[str, Any]:
    """The top-level members before traceEvents; the stream is left at the array's first item."""
    events = ijson.parse(text)
    _, event, _ = next(events)
    if event != "start_map":
        return {}  # an array: the events themselves
    head: dict[str, Any] = {}
    for prefix, event, value in events:
        if prefix == "" and event == "map_key":
            if value == "traceEvents":
                _, opened, _ = next(events)
                if opened != "start_array":
                    raise KinetoError(f"{name}: not a Chrome trace (its traceEvents is not a list)")
                return head
            head[value] = _value(events, next(events))
        elif prefix == "" and event == "end_map":
            break
    raise KinetoError(f"{name}: JSON, but not a Chrome trace (it has no traceEvents)")
