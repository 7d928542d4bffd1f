"""Event ids: the same batch gives the same ids, so that a batch sent again pages the same way, and
the store can tell which batches' events are in (store/writes.py, finishing a group stored without
a copy)."""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

EVENT_ID_ROW_BITS = 24  # event id = 40 bits of the batch id's hash, then the row


def batch_prefix(batch_id: str) -> int:
    """The high bits that every event id of the batch `batch_id` shares (the id shifted right by EVENT_ID_ROW_BITS)."""
    return int.from_bytes(hashlib.blake2b(batch_id.encode(), digest_size=5).digest(), "big")


def event_ids(batch_id: str, rows: int) -> npt.NDArray[np.uint64]:
    return (np.uint64(batch_prefix(batch_id)) << np.uint64(EVENT_ID_ROW_BITS)) | np.arange(rows, dtype=np.uint64)
