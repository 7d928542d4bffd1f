"""Strings of an Nsight Systems export made fit for the store (agent/traces/nsys.py): invalid UTF-8
replaced with U+FFFD, cut to the store's limits on a character boundary."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def decoded(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def sqlite_text(value: Any) -> str:
    """A value read through sqlite3 as text: a blob decoded, NULL empty."""
    if isinstance(value, bytes):
        return decoded(value)
    return "" if value is None else str(value)


def cut(text: str, limit: int) -> str:
    """`text` in at most `limit` bytes of UTF-8, cut on a character boundary."""
    if len(text) * 4 <= limit:
        return text
    return text.encode("utf-8", "replace")[:limit].decode("utf-8", "ignore")


def clean_strings(values: pa.Array, limit: int) -> tuple[pa.Array, bool]:
    """Strings fit for the store: invalid UTF-8 replaced with U+FFFD, cut to `limit` bytes on a
    character boundary, and whether some string was not valid UTF-8. Arrow checks them all at once;
    only bad ones are fixed one by one."""
    if pa.types.is_dictionary(values.type):
        return values, False
    if not (pa.types.is_string(values.type) or pa.types.is_binary(values.type)):
        return values, False
    replaced = False
    try:
        values.cast(pa.string()).validate(full=True)
        valid = values.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        replaced = True
        raw = values.cast(pa.binary()).to_pylist()
        valid = pa.array([None if v is None else v.decode("utf-8", "replace") for v in raw], pa.string())
    lengths = pc.binary_length(valid)
    if len(valid) and (pc.max(lengths).as_py() or 0) > limit:
        long = np.flatnonzero(pc.fill_null(pc.greater(lengths, limit), False).to_numpy(zero_copy_only=False))
        texts = valid.to_pylist()
        for row in long:
            texts[row] = cut(texts[row], limit)
        valid = pa.array(texts, pa.string())
    return valid, replaced
