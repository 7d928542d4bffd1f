"""What the importer needs of a trace file, whatever its format, and how the format is told.

Formats are told by content: an Nsight Systems export is a SQLite file; a PyTorch-profiler
(Kineto) trace is Chrome-trace JSON, plain or gzip. The name only decides which reader refuses
content that is neither (`*.json`: Kineto's; a report, `.nsys-rep`, `.qdrep`: nsys's, which
tells how to export it); anything else (CSV, text) is refused naming both formats.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import io
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from agent.telemetry.gpu import DeviceInfo
from tracehouse import model, regularfile

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
NSYS_REPORTS = (".nsys-rep", ".qdrep")  # gzip-like reports nsys must export first
ZIP_MAGIC = b"PK\x03\x04"  # an older report (.qdrep), whatever its name
UNKNOWN_FORMAT = (
    "not a SQLite file, nor JSON: tracehouse imports Nsight Systems SQLite exports (nsys export --type sqlite "
    "REPORT.nsys-rep) and PyTorch-profiler traces (Chrome-trace JSON, .json or .json.gz)"
)
SNIFF_BYTES = 4096
# Times of events from every source are ns in [0, MAX_TIME_NS] (1970 to 2200, as the server
# takes them: tracehouse.model), an event lasts at most MAX_EVENT_NS (366 days) and moves at most
# MAX_EVENT_BYTES: beyond, a trace is refused or the event skipped, before anything is sent.
MAX_TIME_NS = model.MAX_TIME_NS - 1
MAX_EVENT_NS = model.MAX_EVENT_NS
MAX_EVENT_BYTES = model.MAX_EVENT_BYTES


class TraceFileError(Exception):
    """The file cannot be imported; the message is one line, naming the file, that a person can
    act on. Raised before anything of the run becomes visible."""


@dataclass(frozen=True)
class Part:
    """One stream of event chunks: a table of an export, or a whole Kineto trace."""

    name: str  # the batch id's middle part, and what a progress line calls it
    chunks: Iterator[pa.RecordBatch]  # event columns as BatchBuilder.add_event_table takes them
    estimate: Callable[[int], int]  # rows expected in all, given the rows read so far
    # read in a thread of its own while the chunk before is sent: for a reader that works without the
    # GIL (SQLite); one that parses and maps in Python only loses to the switching (agent/traces/kineto.py)
    read_ahead: bool = True


class Trace(Protocol):
    """An open trace file as the importer sees it. A context manager that closes the file."""

    source: str  # runs.source, and the run id's prefix
    digest: str  # sha256 of the file
    host: str  # the host the file names; "" when it names none
    start_ns: int  # the run's start: known before the events are read, final after them
    relative_time: bool  # times count from an unknown origin

    def __enter__(self) -> Trace: ...

    def __exit__(self, *exc: object) -> None: ...

    def default_name(self) -> str:
        """The run's name when none is given."""
        ...

    def attrs(self) -> dict[str, str]:
        """Facts about the file for the run's attrs."""
        ...

    def parts(self) -> Iterator[Part]: ...

    def sample_chunks(self) -> Iterator[pa.RecordBatch]:
        """Counter samples (columns metric, ts, value, gpu); nothing for most formats."""
        ...

    def devices(self) -> Sequence[DeviceInfo]: ...

    def process_names(self, pids: set[int]) -> dict[int, str]: ...

    def thread_names(self, threads: set[tuple[int, int]]) -> dict[tuple[int, int], str]: ...

    def skipped(self) -> dict[str, int]:
        """What was read but not imported, per reason. Final once the parts are read."""
        ...

    def check_unchanged(self) -> None:
        """Raise TraceFileError if the file changed since it was opened."""
        ...


def sniff(path: Path) -> str:
    """'nsys' or 'kineto', from the file's first bytes. Raises TraceFileError for a file that is
    missing, not a regular file, unreadable or empty."""
    try:
        with open_regular(path) as file:
            head = file.read(SNIFF_BYTES)
    except OSError as error:
        raise TraceFileError(f"{path}: cannot read it ({error.strerror})") from None
    if not head:
        raise TraceFileError(f"{path.name}: empty file")
    if head.startswith(SQLITE_MAGIC):
        return "nsys"
    if head.startswith(GZIP_MAGIC):
        return "nsys" if path.suffix in NSYS_REPORTS else "kineto"
    text = head.removeprefix(UTF8_BOM).lstrip(b" \t\r\n")
    if text[:1] in (b"{", b"["):
        return "kineto"
    if not text and len(head) < SNIFF_BYTES:
        raise TraceFileError(f"{path.name}: empty file (only white space)")
    if path.name.endswith((".json", ".json.gz")):
        return "kineto"  # its reader says what is wrong with the JSON
    if path.suffix in NSYS_REPORTS or head.startswith(ZIP_MAGIC):
        return "nsys"  # its reader says how to export the report
    raise TraceFileError(f"{path.name}: {UNKNOWN_FORMAT}")


# -- opening ------------------------------------------------------------------------------------


def open_regular(path: Path) -> io.BufferedReader:
    """`path` opened for reading if it is a regular file (tracehouse/regularfile.py), else TraceFileError:
    a directory, a FIFO or a device is refused before anything blocks or reads forever."""
    try:
        return regularfile.open_regular(path)
    except regularfile.FileRefused as error:
        raise TraceFileError(str(error)) from None


# -- JSON text, checked before any parser sees it ------------------------------------------------

MAX_DEPTH = 64  # nesting of arrays and objects; Kineto writes 6 at most
MAX_NUMBER = 64  # characters of one number
MAX_VALUE_BYTES = 16 << 20  # one string, and one event (an item of traceEvents), as JSON text
MAX_GZIP_RATIO = 256  # decompressed bytes per compressed byte, beyond the first GZIP_SLACK bytes
GZIP_SLACK = 64 << 20  # real traces compress 8..20 times; deflate at most about 1,032 times

_CLASSES = bytearray(256)
_CLASSES[ord('"')] = 1
_CLASSES[ord("\\")] = 2
_CLASSES[ord("[")] = _CLASSES[ord("{")] = 3
_CLASSES[ord("]")] = _CLASSES[ord("}")] = 4
_SLICE = 1 << 16
_KINDS = np.frombuffer(bytes(_CLASSES), np.uint8)
_NUMBER_CHARACTERS = b"0123456789+-.eE"
_NUMBERS = bytes(ord("0") if byte in _NUMBER_CHARACTERS else ord(" ") for byte in range(256))
_LONG_NUMBER = b"0" * (MAX_NUMBER + 1)
_WHITE_SPACE = b" \t\r\n"


class JsonGuard:
    """Sees every byte of JSON text, chunk by chunk, before a parser does, and refuses what would
    make a parser take memory or time out of proportion, or crash (yajl segfaults on a number of
    100,000 digits; ijson's prefixes grow with the square of the nesting): a first byte that
    cannot start a trace, nesting deeper than MAX_DEPTH, a number longer than MAX_NUMBER
    characters, a string or an event longer than MAX_VALUE_BYTES. Strings and escapes are
    followed across chunks; brackets and digits inside strings do not count. The work is done by
    bytes.translate and numpy over the structural characters (quotes, backslashes, brackets), not
    byte by byte. Only valid JSON is followed exactly: at the first error the parser stops anyway.
    """

    def __init__(self, name: str, error: type[TraceFileError] = TraceFileError, marking: bool = False) -> None:
        self.name = name
        self.error = error
        self.marking = marking  # keep Marks for marks()
        self.layout = ""  # "object" or "array", once the first byte is seen
        self.offset = 0  # bytes seen
        self._inside = False  # in a string
        self._string_start = 0  # offset of the open string's first byte
        self._backslashes = 0  # backslashes ending the last chunk, in a string
        self._depth = 0
        self._item_depth = 0  # depth of traceEvents' items: 2 in {"traceEvents": [...]}, 1 in [...]
        self._item_start = -1  # offset of the open item's bracket
        self._number = 0  # characters of the number ending the last chunk
        self._marks: list[tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], npt.NDArray[np.intp]]] = []

    def feed(self, chunk: bytes) -> None:
        for start in range(0, len(chunk), _SLICE):  # numpy's temporaries stay in the cache
            self._feed(chunk[start : start + _SLICE] if len(chunk) > _SLICE else chunk)

    def marks(self) -> Marks:
        """Where the items are, in the text fed since the last call: so a reader can cut the text
        between items without looking at it again."""
        found, self._marks = self._marks, []
        if not found:
            return Marks(_NONE, _NONE, _NONE)
        if len(found) == 1:
            return Marks(*found[0])
        return Marks(*(np.concatenate(column) for column in zip(*found, strict=True)))

    def _feed(self, chunk: bytes) -> None:
        if not self.layout:
            text = chunk.lstrip(_WHITE_SPACE)
            if text:
                self._first(text[0])
        base = self.offset
        inside = self._inside
        data = np.frombuffer(chunk, np.uint8)
        folded = data | np.uint8(0x20)  # [ \ ] fold onto { | }, three bytes in a row
        folded -= np.uint8(0x7B)
        marked = folded < 3
        marked |= data == 0x22
        at = np.flatnonzero(marked)
        kinds = _KINDS[data[at]]
        quotes = kinds == 1
        if self._backslashes or b"\\" in chunk:
            quotes &= ~self._escaped(at, kinds, len(chunk))
        toggles = quotes.astype(np.int64)
        before = (np.cumsum(toggles) - toggles) & 1  # quotes before each character, mod 2
        outside = before == 0 if not inside else before == 1
        self._strings(at[quotes] + base, len(chunk))
        if self._long_gap(at, outside ^ quotes, inside, len(chunk)):
            self._numbers(chunk, at[quotes] + base, inside)
        if self._inside:
            self._number = 0
        else:
            trailing = len(chunk) - len(chunk.rstrip(_NUMBER_CHARACTERS))
            self._number = self._number + trailing if trailing == len(chunk) else trailing
        self._nesting(at, kinds, outside, base)
        self.offset += len(chunk)
        if self._item_start >= 0 and self.offset - self._item_start > MAX_VALUE_BYTES:
            self._refuse(f"an event longer than {_mib(MAX_VALUE_BYTES)}")

    def _first(self, byte: int) -> None:
        if byte == ord("{"):
            self.layout, self._item_depth = "object", 2
        elif byte == ord("["):
            self.layout, self._item_depth = "array", 1
        else:
            raise self.error(f"{self.name}: not JSON (a Chrome trace starts with {{ or [, not {bytes([byte])!r})")

    def _refuse(self, what: str) -> None:
        raise self.error(f"{self.name}: {what} in its JSON; refused (no trace has one)")

    def _escaped(self, at: npt.NDArray[np.intp], kinds: npt.NDArray[np.uint8], size: int) -> npt.NDArray[np.bool_]:
        """Which structural characters are quotes escaped by an odd run of backslashes just before
        them; a run may go on from the last chunk (self._backslashes of it)."""
        backslash = kinds == 2
        index = np.arange(len(at))
        follows = np.zeros(len(at), bool)  # the byte just before is a backslash
        follows[1:] = backslash[:-1] & (at[:-1] == at[1:] - 1)
        carried = bool(len(at)) and at[0] == 0 and self._backslashes > 0
        follows[:1] = carried
        run_start = np.maximum.accumulate(np.where(backslash & ~follows, index, -1))
        run = np.where(run_start >= 0, index - run_start + 1, index + 1 + self._backslashes)  # backslashes ending here
        before = np.zeros(len(at), np.int64)
        before[1:] = run[:-1]
        before[:1] = self._backslashes
        last = len(at) - 1
        self._backslashes = int(run[last]) if last >= 0 and backslash[last] and at[last] == size - 1 else 0
        return (kinds == 1) & follows & (before % 2 == 1)

    def _strings(self, quotes: npt.NDArray[np.intp], size: int) -> None:
        """Strings between unescaped quotes (offsets into the text), the open one carried on."""
        if len(quotes):
            edges = np.concatenate(([self._string_start], quotes)) if self._inside else quotes
            opening, closing = edges[0::2], edges[1::2]
            lengths = closing - opening[: len(closing)] - 1
            if len(lengths) and int(lengths.max()) > MAX_VALUE_BYTES:
                self._refuse(f"a string longer than {_mib(MAX_VALUE_BYTES)}")
            self._inside = len(opening) > len(closing)
            if self._inside:
                self._string_start = int(opening[-1])
        if self._inside and self.offset + size - self._string_start - 1 > MAX_VALUE_BYTES:
            self._refuse(f"a string longer than {_mib(MAX_VALUE_BYTES)}")

    def _long_gap(self, at: npt.NDArray[np.intp], outside: npt.NDArray[np.bool_], inside: bool, size: int) -> bool:
        """Whether some run of bytes outside strings between structural characters (`outside`:
        after each) is longer than a number may be: only then can a number be, and is looked for."""
        if not len(at):
            return not inside and self._number + size > MAX_NUMBER
        if (not inside and self._number + int(at[0]) > MAX_NUMBER) or (outside[-1] and size - int(at[-1]) > MAX_NUMBER):
            return True
        return bool(((np.diff(at) > MAX_NUMBER) & outside[:-1]).any())

    def _numbers(self, chunk: bytes, quotes: npt.NDArray[np.intp], inside: bool) -> None:
        """Runs of number characters outside strings (`inside`: at the chunk's start)."""
        digits = chunk.translate(_NUMBERS)
        if self._number and self._number + len(digits) - len(digits.lstrip(b"0")) > MAX_NUMBER:
            self._refuse(f"a number longer than {MAX_NUMBER} characters")
        found = digits.find(_LONG_NUMBER)
        while found >= 0:
            after = int(np.searchsorted(quotes, self.offset + found, side="right"))
            if not inside ^ (after % 2 == 1):
                self._refuse(f"a number longer than {MAX_NUMBER} characters")
            if after >= len(quotes):
                break
            found = digits.find(_LONG_NUMBER, int(quotes[after]) - self.offset + 1)

    def _nesting(
        self, at: npt.NDArray[np.intp], kinds: npt.NDArray[np.uint8], outside: npt.NDArray[np.bool_], base: int
    ) -> None:
        opens = (kinds == 3) & outside
        closes = (kinds == 4) & outside
        if not (opens.any() or closes.any()):
            return
        steps = opens.astype(np.int64) - closes
        depth = self._depth + np.cumsum(steps)
        if int(depth.max()) > MAX_DEPTH:
            self._refuse(f"nesting deeper than {MAX_DEPTH}")
        self._depth = int(depth[-1])
        item_ends = closes & (depth == self._item_depth)
        edges = (opens & (depth == self._item_depth + 1)) | item_ends
        where = at[edges] + base
        if self.marking:
            lists = at[opens & (depth == self._item_depth)] + base
            ends = at[closes & (depth == self._item_depth - 1)] + base
            self._marks.append((at[item_ends] + (base + 1), lists, ends))
        opening = opens[edges]
        if self._item_start >= 0:
            where = np.concatenate(([self._item_start], where))
            opening = np.concatenate(([True], opening))
        if not len(where):
            return
        pairs = opening[:-1] & ~opening[1:]
        if pairs.any() and int((where[1:][pairs] - where[:-1][pairs]).max()) > MAX_VALUE_BYTES:
            self._refuse(f"an event longer than {_mib(MAX_VALUE_BYTES)}")
        self._item_start = int(where[-1]) if opening[-1] else -1


@dataclass(frozen=True)
class Marks:
    """Offsets into the text (from its first byte, past a byte-order mark) of brackets outside
    strings, at the depth of traceEvents' items (JsonGuard: 2 in {"traceEvents": [...]}, 1 in
    [...])."""

    item_ends: npt.NDArray[np.intp]  # just past the closing bracket of an item (object or array)
    lists: npt.NDArray[np.intp]  # the opening bracket of a value holding items: a top-level member's
    list_ends: npt.NDArray[np.intp]  # its closing bracket


_NONE = np.zeros(0, np.intp)


def _mib(size: int) -> str:
    return f"{size >> 20} MiB"


class _Counted:
    """A binary file that counts the bytes read from it."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self.file.read(size)
        self.count += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.file.close()


class JsonText:
    """A JSON trace file's text, plain or gzip, as a binary stream: without a byte-order mark,
    every byte through a JsonGuard before it is handed on (unless not `guarded`: for a reader
    that hands it to no parser, or guards it itself), and gzip refused once it decompresses
    to more than MAX_GZIP_RATIO times the compressed bytes read (plus GZIP_SLACK): time stays
    linear in the file's size. Reading raises `error` (a TraceFileError) for what it refuses, and
    gzip's own errors (EOFError, gzip.BadGzipFile, zlib.error, OSError) for a corrupt file."""

    def __init__(self, path: Path, error: type[TraceFileError] = TraceFileError, guarded: bool = True) -> None:
        self.name = path.name
        self.error = error
        self._raw = _Counted(open_regular(path))
        try:
            magic = self._raw.file.read(2)
            self._raw.file.seek(0)
        except BaseException:
            self._raw.close()
            raise
        self.gzip = magic == GZIP_MAGIC
        self._stream: Any = gzip.GzipFile(fileobj=self._raw, mode="rb") if self.gzip else self._raw  # type: ignore[call-overload]
        self.guard = JsonGuard(path.name, error) if guarded else None
        self.consumed = 0  # bytes of JSON text handed on

    def read(self, size: int = -1) -> bytes:
        if size == 0:  # how ijson asks whether the stream is of bytes
            return b""
        data = self._stream.read(size if size > 0 else 1 << 20)
        if not self.consumed and data:
            while len(data) < len(UTF8_BOM) and (more := self._stream.read(len(UTF8_BOM) - len(data))):
                data += more
            data = data.removeprefix(UTF8_BOM)
        self.consumed += len(data)
        if self.gzip and self.consumed > MAX_GZIP_RATIO * self._raw.count + GZIP_SLACK:
            raise self.error(
                f"{self.name}: decompresses to more than {MAX_GZIP_RATIO} times its size; a gzip bomb, not a trace"
            )
        if self.guard is not None:
            self.guard.feed(data)
        return data

    def close(self) -> None:
        try:
            if self.gzip:
                self._stream.close()
        finally:
            self._raw.close()


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """The cycle collector held off, and as before after. An import makes no cycles (none were left to
    find after importing any fixture with it off): its parses and rows are many short-lived lists and
    dicts that reference counting frees, and that the collector would walk for nothing, the more often
    the more there are alive (for 1 M Kineto events: 0.3 s of CPU at CPython's default threshold, 0.09 s
    at one collection every 10,000 allocations). The setting is the process's."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
