"""What the importer needs of a trace file, whatever its format, and how the format is told.

Formats are told by content: an Nsight Systems export is a SQLite file; a PyTorch-profiler
(Kineto) trace is Chrome-trace JSON, plain or gzip. The name only decides which reader refuses
content that is neither (`*.json`: Kineto's; else nsys's, which tells how to export a
`.nsys-rep`), so that the refusal says what was expected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pyarrow as pa

from agent.gpu import DeviceInfo

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
NSYS_REPORTS = (".nsys-rep", ".qdrep")  # gzip-like reports nsys must export first
SNIFF_BYTES = 4096


class TraceFileError(Exception):
    """The file cannot be imported; the message is one line, naming the file, that a person can
    act on. Raised before anything of the run becomes visible."""


@dataclass(frozen=True)
class Part:
    """One stream of event chunks: a table of an export, or a whole Kineto trace."""

    name: str  # the batch id's middle part, and what a progress line calls it
    chunks: Iterator[pa.RecordBatch]  # event columns as BatchBuilder.add_event_table takes them
    estimate: Callable[[int], int]  # rows expected in all, given the rows read so far


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
    missing, unreadable or empty."""
    if not path.is_file():
        raise TraceFileError(f"{path}: no such file")
    try:
        with path.open("rb") as file:
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
    return "kineto" if path.name.endswith((".json", ".json.gz")) else "nsys"
