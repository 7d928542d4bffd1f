"""Whether this host's agent is running, for `tracehouse run`: a running `tracehouse agent`
holds a lock on a file that names the server it ships to, in the host's runtime folder
($TRACEHOUSE_RUNTIME_DIR, else /run/tracehouse, which the systemd unit makes, readable by
every user), else under its $TRACEHOUSE_HOME."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import IO, Any

from tracehouse import config
from tracehouse.regularfile import FileRefused, open_regular

SYSTEM_RUNTIME_DIR = Path("/run/tracehouse")


def _folders() -> list[Path]:
    given = os.environ.get(config.ENV_RUNTIME_DIR)
    folders = [Path(given)] if given else []
    return [*folders, SYSTEM_RUNTIME_DIR, config.home() / "agent"]


def _name(server: str) -> str:
    return f"agent-{hashlib.sha256(server.encode()).hexdigest()[:16]}.json"


def announce(server: str, facts: dict[str, Any]) -> IO[str] | None:
    """Say that an agent for `server` runs here, until the returned file is closed (or this
    process ends); None when another agent already says so (this one runs all the same)."""
    *shared, own = _folders()
    folder = next((f for f in shared if f.is_dir() and os.access(f, os.W_OK)), own)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / _name(server)
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    os.chmod(path, 0o644)
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"server": server, "pid": os.getpid(), **facts}))
    handle.flush()
    return handle


def running_agent(server: str) -> dict[str, Any] | None:
    """What the running agent for `server` said about itself; None when none runs."""
    for folder in _folders():
        try:
            handle = open_regular(folder / _name(server))  # a shared folder: a FIFO there would block
        except (OSError, FileRefused):
            continue
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:  # held: an agent runs
                with contextlib.suppress(ValueError):
                    facts = json.loads(handle.read(64 << 10) or "{}")
                    if isinstance(facts, dict) and facts.get("server") == server:
                        return facts
                return {"server": server}
    return None
