"""The embedded store's folder: whether it takes a new file now, and whether another process
holds it. The store keeps the state (its health) that these checks decide."""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from pathlib import Path

from store.storeerrors import StoreNotWritable


def not_writable(folder: Path) -> StoreNotWritable | None:
    """Whether `folder` takes a new file, now (a file made and removed)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        descriptor, probe = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
        os.close(descriptor)
        os.unlink(probe)
    except OSError as error:
        return StoreNotWritable(str(folder), error.strerror or type(error).__name__)
    return None


def held_by_another_process(folder: Path) -> bool:
    """Whether another process holds the embedded store's lock (the engine's `status` file)."""
    try:
        with open(folder / "status", "rb") as status:
            fcntl.flock(status, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as error:
        return error.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    return False
