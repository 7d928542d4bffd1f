"""Strings of an Nsight Systems export made fit for the store (agent/traces/nsys.py): read through
SQL that hands over no more than a bound (text_sql), invalid UTF-8 replaced with U+FFFD, cut to the
store's limits on a character boundary."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracehouse.model import DEFAULT_LIMITS

MAX_STRING = DEFAULT_LIMITS.max_string_bytes


def text_sql(expression: str, limit: int = MAX_STRING) -> str:
    """SQL for `expression` as text of at most `limit` + 1 bytes, however long the value in the file:
    SQLite hands over no more, and one byte past the limit tells a string that was cut (cut by bytes,
    it may end inside a character: clean_strings and cut drop that end). SQLite's substr makes an
    empty blob NULL: the second part gives it back as ''."""
    bounded = f"CAST(substr(CAST({expression} AS BLOB), 1, {limit + 1}) AS TEXT)"
    return f"COALESCE({bounded}, CASE WHEN ({expression}) IS NOT NULL THEN '' END)"


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


def whole_chars(raw: bytes) -> bytes:
    """`raw` less the start of a UTF-8 character at its end, which a cut by bytes can leave."""
    for back in range(1, min(4, len(raw)) + 1):
        lead = raw[-back]
        if lead & 0xC0 != 0x80:  # not a continuation byte: where the last character starts
            length = 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1
            return raw[:-back] if length > back else raw
    return raw


def clean_strings(values: pa.Array, limit: int) -> tuple[pa.Array, bool]:
    """Strings fit for the store: cut to `limit` bytes on a character boundary, invalid UTF-8
    replaced with U+FFFD, and whether some string kept was not valid UTF-8. Arrow checks them all
    at once; only long or bad ones are fixed one by one."""
    if pa.types.is_dictionary(values.type):
        return values, False
    if not (pa.types.is_string(values.type) or pa.types.is_binary(values.type)):
        return values, False
    if len(values) and (pc.max(pc.binary_length(values)).as_py() or 0) > limit:
        raw = values.cast(pa.binary()).to_pylist()
        values = pa.array([v if v is None or len(v) <= limit else whole_chars(v[:limit]) for v in raw], pa.binary())
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
