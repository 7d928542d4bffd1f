"""Counts of sample values, so that nothing the agent samples is lost silently."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields


@dataclass
class Stats:
    sampled: int = 0  # valid values this session put into batches
    invalid: int = 0  # readings refused as garbage (NaN, out of range)
    stored: int = 0  # values of this session the server acknowledged
    dropped: int = 0  # values of this session given up (spool full, corrupt, refused by the server)
    recovered: int = 0  # values of earlier sessions replayed from the spool and stored now
    already_stored: int = 0  # values of earlier sessions replayed that the server had stored before
    missed_ticks: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, count in counts.items():
                setattr(self, name, getattr(self, name) + count)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
