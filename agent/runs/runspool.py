"""Spools of runs: a folder per producer under `$TRACEHOUSE_HOME/spool/runs`, locked while it
lives, naming the server its batches are for, and replayed by whoever comes next (a later run,
`tracehouse run`, or the agent) once that server answers."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracehouse.regularfile import read_regular

if TYPE_CHECKING:
    from tracehouse.channel import ClientSecurity

log = logging.getLogger("tracehouse.runspool")

CALL_TIMEOUT_S = 5.0  # one Write
REPLAY_PATIENCE_S = 10.0  # a leftover spool that makes no progress this long is left for later
SERVER_FILE = "server"  # in a run's spool folder: the server its batches are for


def spool_folder(root: Path, name: str, server: str) -> tuple[Path, Any]:
    """The run's spool folder `root/name`, locked, with the server it is for in SERVER_FILE.
    It is made under a hidden name and renamed once locked, so that another process's replay
    never finds it unlocked (and removes it as an empty leftover)."""
    root.mkdir(parents=True, exist_ok=True)
    hidden = root / f".{name}"
    hidden.mkdir(exist_ok=True)
    handle = lock(hidden)
    (hidden / SERVER_FILE).write_text(f"{server}\n")
    folder = root / name
    hidden.rename(folder)
    return folder, handle


def lock(folder: Path) -> Any:
    """Hold an exclusive lock on the spool folder while the run lives, so that another run's
    replay leaves it alone; None where there is no fcntl (then nothing is replayed)."""
    try:
        import fcntl
    except ImportError:
        return None
    handle = (folder / "lock").open("a")
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return handle


def spool_server(folder: Path) -> str | None:
    """The server a run's spool is for; None for a folder that does not say."""
    try:
        return read_regular(folder / SERVER_FILE, 4096).decode().strip() or None
    except (OSError, ValueError):  # not a regular file, too long, not UTF-8
        return None


def remove_spool(folder: Path, handle: Any) -> None:
    with contextlib.suppress(OSError):
        (folder / SERVER_FILE).unlink(missing_ok=True)
        (folder / "lock").unlink(missing_ok=True)
        if handle is not None:
            handle.close()
        folder.rmdir()


def replay_spools(
    root: Path,
    server: str,
    security: ClientSecurity | None = None,
    stop: threading.Event | None = None,
    skip: str = "",
) -> int:
    """Send what earlier runs left in their spools under `root` (a folder per run, not locked
    by a live process) for `server` (the server their runs were sent to, or none named),
    oldest batch first; a spool sent whole is removed. One that makes no progress for
    REPLAY_PATIENCE_S (the server is away) is left for later. Returns the batches sent."""
    from agent.shipping.shipper import Shipper
    from agent.shipping.spool import Spool

    try:
        import fcntl
    except ImportError:
        return 0
    stop = stop or threading.Event()
    sent = 0
    folders = sorted(p for p in root.iterdir() if p.is_dir() and p.name != skip) if root.is_dir() else []
    for folder in folders:
        if stop.is_set():
            break
        if folder.name.startswith(".") or spool_server(folder) not in (None, server):
            continue  # one being made, or another server's
        try:
            handle: Any = (folder / "lock").open("a")
        except OSError:
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live run's
            handle.close()
            continue
        try:
            spool = Spool(folder, 1 << 40, on_drop=lambda *_: None)
            if spool.batches:
                before = spool.batches
                log.info("tracehouse: sending %d batches left in %s", before, folder)
                shipper = Shipper(server, spool, on_stored=lambda *_: None, on_dropped=lambda *_: None,
                                  security=security, call_timeout=CALL_TIMEOUT_S)  # fmt: skip
                left, since = spool.batches, time.monotonic()
                while spool.batches and not stop.wait(0.05):
                    if spool.batches < left:
                        left, since = spool.batches, time.monotonic()
                    elif time.monotonic() - since > REPLAY_PATIENCE_S:
                        break
                shipper.shutdown(0.0)
                sent += before - spool.batches
            if not spool.batches:
                remove_spool(folder, handle)
                handle = None
        except Exception as error:
            log.warning("tracehouse: could not replay %s: %s", folder, error)
        finally:
            if handle is not None:
                handle.close()
    return sent
