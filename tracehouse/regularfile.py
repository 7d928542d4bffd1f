"""Files named from outside (options, config, folders others can write to), opened only when they
are regular files and read only up to a bound: a FIFO, a device or a directory is refused before
anything blocks or reads forever, and a file too large is refused by its size before it is read."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path


class FileRefused(ValueError):
    """A path that names no regular file, cannot be read, or is larger than allowed."""


def open_regular(path: Path) -> io.BufferedReader:
    """`path` opened for reading, if it is a regular file (or a link to one): checked before the open
    and again on the descriptor (O_NONBLOCK: a FIFO swapped in after the check does not block)."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        raise FileRefused(f"{path}: no such file") from None
    except OSError as error:
        raise FileRefused(f"{path}: cannot read it ({error.strerror})") from None
    if not stat.S_ISREG(found.st_mode):
        raise FileRefused(f"{path}: not a regular file ({file_kind(found.st_mode)})")
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise FileRefused(f"{path}: cannot read it ({error.strerror})") from None
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        raise FileRefused(f"{path}: not a regular file ({file_kind(mode)})")
    return os.fdopen(descriptor, "rb")


def read_regular(path: Path, max_bytes: int) -> bytes:
    """The whole of a regular file of at most `max_bytes`; refused by its size before it is read,
    and never more than `max_bytes` + 1 read even if it grows meanwhile."""
    with open_regular(path) as file:
        size = os.fstat(file.fileno()).st_size
        if size > max_bytes:
            raise FileRefused(f"{path}: {size:,} bytes, more than the {max_bytes:,} allowed")
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileRefused(f"{path}: more than the {max_bytes:,} bytes allowed")
    return data


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return kind
    return "not a file"
