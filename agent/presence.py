"""Whether this host's agent is running, for `tracehouse run`: a running `tracehouse agent`
holds a lock on a file under $TRACEHOUSE_HOME that names the server it ships to."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import IO, Any

from tracehouse import config


def presence_file(server: str) -> Path:
    digest = hashlib.sha256(server.encode()).hexdigest()[:16]
    return config.home() / "agent" / f"running-{digest}.json"


def announce(server: str, facts: dict[str, Any]) -> IO[str] | None:
    """Say that an agent for `server` runs here, until the returned file is closed (or this
    process ends); None when another agent already says so (this one runs all the same)."""
    path = presence_file(server)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"server": server, "pid": os.getpid(), **facts}))
    handle.flush()
    return handle


def running_agent(server: str) -> dict[str, Any] | None:
    """What the running agent for `server` said about itself; None when none runs."""
    path = presence_file(server)
    try:
        handle = path.open("r")
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:  # held: an agent runs
            with contextlib.suppress(ValueError):
                facts = json.loads(handle.read() or "{}")
                if isinstance(facts, dict) and facts.get("server") == server:
                    return facts
            return {"server": server}
        return None
