"""What a token grants: its scopes and, for writes, what it may touch; and the grant of the call
being served. The token check (tracehouse/security.py) sets `CALLER` for each call; without
tokens every call has `UNBOUNDED`. ingest/grants.py checks batches against it."""

from __future__ import annotations

import hashlib
from contextvars import ContextVar
from dataclasses import dataclass
from fnmatch import fnmatchcase


@dataclass(frozen=True)
class Grant:
    """A token's scopes (read, write) and the bounds of what it may write."""

    scopes: frozenset[str]
    hosts: tuple[str, ...] | None = None  # globs; None: any host
    runs: tuple[str, ...] | None = None  # run-id prefixes; None: any run
    holder: str = ""  # which token: a digest of it, never the token; "": the one caller of a server without tokens

    @property
    def bounded(self) -> bool:
        return self.hosts is not None or self.runs is not None

    @property
    def namespace(self) -> str:
        """Where this writer's batch ids live in the ledger: its own, when it is bounded, so that
        no batch id it sends can meet (and so refuse, or tell of) another writer's batch."""
        if not self.bounded:
            return ""
        bounds = repr((self.hosts, self.runs)).encode()
        return f"bounded.{hashlib.sha256(bounds).hexdigest()[:16]}/"

    def allows_host(self, host: str) -> bool:
        return self.hosts is None or any(fnmatchcase(host, glob) for glob in self.hosts)

    def allows_run(self, run_id: str) -> bool:
        return self.runs is None or run_id.startswith(self.runs)


UNBOUNDED = Grant(frozenset({"read", "write"}))
CALLER: ContextVar[Grant] = ContextVar("tracehouse_caller", default=UNBOUNDED)
