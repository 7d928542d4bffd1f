"""The items of a Kineto trace's traceEvents list, parsed a block at a time (agent/traces/kineto.py).

The text comes through a TraceText, whose JsonGuard has seen every byte and says where each item
ends (Marks): the list is cut after the last item that ends in what was read, so that a block is
whole items, about READ_BYTES of them, and parsed at once by msgspec (in C) into Event structs.
Memory holds one block and its events, however large the file.

Numbers: integers are Python ints. A number with a fraction or an exponent is a binary float when
its block holds no run of EXACT_DIGITS digits and points (so no number of more than 15 significant
digits, which a float holds exactly: Decimal(repr(x)) is the number written); otherwise the whole
block is parsed again with such numbers as Decimal, as written. Either way what to_ns makes of a
time is exact.

After the list, the rest of the text is read through ijson to its end, so that a file that is not
JSON after its events is refused as before."""

from __future__ import annotations

import re
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import ijson
import msgspec

from agent.traces.kineto_scan import SURROGATE, KinetoError, TraceText, one_line
from agent.traces.tracefile import MAX_VALUE_BYTES, no_collection

READ_BYTES = 1 << 20
MAX_PENDING = 2 * MAX_VALUE_BYTES + READ_BYTES  # an event and what may be around it
EXACT_DIGITS = 16
_LONG_NUMBER = b"0" * EXACT_DIGITS
_DIGITS = bytes(ord("0") if chr(byte) in "0123456789." else ord(" ") for byte in range(256))
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_WHITE_SPACE = b" \t\r\n"


class Event(msgspec.Struct, gc=False):
    """The members of an event that are read; any other member is skipped by the parser. A
    member that is absent or null is None; any value of any type is taken as it is written."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: Any = None


FIELDS = Event.__struct_fields__
_FAST = msgspec.json.Decoder(list[Event | int])
_EXACT = msgspec.json.Decoder(list[Event | int], float_hook=Decimal)
_ANY_FAST = msgspec.json.Decoder()
_ANY_EXACT = msgspec.json.Decoder(float_hook=Decimal)
_EXACT_DECODERS = ((_EXACT, _ANY_EXACT),)
_DECODERS = ((_FAST, _ANY_FAST), *_EXACT_DECODERS)


class EventBlocks:
    """The items of the list, block by block: Event for an object, any other item as it is.
    `read` counts the items parsed so far. Raises KinetoError for text that is not JSON."""

    def __init__(self, text: TraceText, name: str, lists_before: int, layout: str) -> None:
        self._text = text
        self._name = name
        self._lists_before = lists_before  # top-level members' lists before traceEvents'
        self._layout = layout
        self.read = 0

    def __iter__(self) -> Iterator[list[Any]]:
        buffer = bytearray()
        base = 0  # offset of buffer[0] in the text
        start = end = -1  # offsets of the list's brackets
        lists = 0
        first = True
        while data := self._text.read(READ_BYTES):
            buffer += data
            marks = self._text.marks()
            if start < 0:
                if lists + len(marks.lists) <= self._lists_before:
                    lists += len(marks.lists)
                    base += len(buffer)
                    buffer.clear()
                    continue
                start = int(marks.lists[self._lists_before - lists]) + 1
                del buffer[: start - base]
                base = start
            if end < 0:
                later = marks.list_ends[marks.list_ends >= start]
                end = int(later[0]) if len(later) else -1
            cut = end
            if cut < 0:
                ends = marks.item_ends
                cut = int(ends[-1]) if len(ends) and ends[-1] > base else -1
            if cut <= base and len(buffer) > MAX_PENDING:
                raise KinetoError(
                    f"{self._name}: more than {MAX_PENDING >> 20} MiB of its events' list without the end of an "
                    "event; refused (not a trace)"
                )
            if cut > base:
                block = bytes(buffer[: cut - base])
                del buffer[: cut - base]
                base = cut
                items = self._parse(block, first)
                first = False
                self.read += len(items)
                yield items
            if end >= 0:
                self._rest(bytes(buffer[1:]))
                return
        if start < 0 or end < 0:
            raise KinetoError(f"{self._name}: not valid JSON after {self.read} events (parse error: premature EOF)")

    def _parse(self, block: bytes, first: bool) -> list[Any]:
        """Whole items, after the list's `[` (first) or after an item: `, item, item`."""
        text = b"[" + block + b"]" if first else b"[0" + block + b"]"
        exact = block.translate(_DIGITS).find(_LONG_NUMBER) >= 0
        for typed, generic in _EXACT_DECODERS if exact else _DECODERS:
            try:
                try:
                    with no_collection():
                        items = typed.decode(text)
                except msgspec.ValidationError:  # an item neither an object nor an integer, or a float beyond
                    items = [_event(item) for item in generic.decode(text)]
                break
            except (msgspec.DecodeError, msgspec.ValidationError) as error:
                if typed is not _EXACT:
                    continue  # a float beyond binary ones, say: parsed again, exactly
                if _SURROGATE_ESCAPE.search(block) and ("surrogate" in str(error) or "truncated" in str(error)):
                    raise KinetoError(f"{self._name}: {SURROGATE}") from None
                where = f"after {self.read} events"
                raise KinetoError(f"{self._name}: not valid JSON {where} ({one_line(error)})") from None
        return items if first else items[1:]

    def _rest(self, after: bytes) -> None:
        """The text after the list, read to its end: `, "member": value ... }` or nothing."""
        if self._layout == "array":
            while after.strip(_WHITE_SPACE) == b"":
                after = self._text.read(READ_BYTES)
                if not after:
                    self._text.marks()
                    return
            raise KinetoError(f"{self._name}: not valid JSON after {self.read} events (parse error: trailing garbage)")
        try:
            for _ in ijson.basic_parse(_Rest(b'{"":0' + after, self._text)):
                pass
        except ijson.JSONError as error:
            raise KinetoError(f"{self._name}: not valid JSON after {self.read} events ({one_line(error)})") from None
        except UnicodeDecodeError:
            raise KinetoError(f"{self._name}: {SURROGATE}") from None


class _Rest:
    """`first`, then the rest of the text, as ijson reads a file."""

    def __init__(self, first: bytes, text: TraceText) -> None:
        self._first: bytes | None = first
        self._text = text

    def read(self, size: int = -1) -> bytes:
        if size == 0:
            return b""
        if self._first is not None:
            first, self._first = self._first, None
            return first
        data = self._text.read(size)
        self._text.marks()
        return data


def _event(item: Any) -> Any:
    if type(item) is dict:
        return Event(**{field: item.get(field) for field in FIELDS})
    return item
