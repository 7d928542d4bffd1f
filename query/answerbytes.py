"""Answers bounded in bytes, not only rows: a writer chooses how long its strings are.

An answer of the Query service holds at most Limits.max_answer_bytes (and always its first row): a page
of events ends where its bytes reach the bound and says where the next one starts; a table's rows stop
there and it says it was truncated. A name that a summary or a lane only shows is cut to
Limits.max_shown_bytes on a character boundary, marked with a trailing MARK and a `<column>_cut` flag;
the whole name is one events query away. Pure: SQL text and arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from tracehouse.model import Limits

MARK = "…"
EVENT_ROW_BYTES = 160  # an event's numbers and dictionary codes in an EventsResponse, at most
TABLE_ROW_BYTES = 128  # a table row's numbers and string offsets in Arrow, about
ANSWER_ROWS = "answer_rows"  # how many rows a bounded table had before its bytes cut it
_SHOWN = "{shown_bytes:UInt32}"


def shown(column: str, length: str = "") -> str:
    """SQL: `column` as shown, cut to at most {shown_bytes} bytes (a broken last character dropped),
    MARK after; as it is when no longer. `length`: SQL for the whole name's bytes, where `column` is its head."""
    head = f"replaceRegexpOne(toValidUTF8(substring({column}, 1, {_SHOWN})), '\\xEF\\xBF\\xBD$', '')"
    return f"if({cut(column, length)}, concat({head}, '{MARK}'), {column})"


def cut(column: str, length: str = "") -> str:
    """SQL: whether shown(column) cut it (Bool)."""
    return f"toBool({length or f'length({column})'} > {_SHOWN})"


def grouped(column: str) -> str:
    """SQL: what to group names by, holding at most {shown_bytes} + 32 bytes a group whatever their length:
    `name_head` (the first {shown_bytes} bytes) and `name_digest` (SHA-256 of the whole); `name_bytes` is the
    whole name's length."""
    return (
        f"substring({column}, 1, {_SHOWN}) AS name_head, SHA256({column}) AS name_digest, "
        f"length({column}) AS name_bytes"
    )


def event_bytes() -> str:
    """SQL: at most what one event takes in an EventsResponse: its strings, its numbers."""
    return (
        "length(run_id) + length(host) + length(kind) + length(name)"
        " + arraySum(arrayMap(k -> length(k) + 16, mapKeys(extras)))"
        f" + arraySum(arrayMap(v -> length(v), mapValues(extras))) + {EVENT_ROW_BYTES}"
    )


def bounded(sql: str, order: str, strings: Sequence[str], drop: Sequence[str] = ()) -> str:
    """SQL: the rows of `sql` in `order` while they add up to at most {max_answer_bytes:UInt64} (the first
    always), each `strings` bytes and TABLE_ROW_BYTES; with ANSWER_ROWS, the rows `sql` has; without the
    columns `drop`."""
    size = " + ".join([*(f"length({column})" for column in strings), str(TABLE_ROW_BYTES)])
    return f"""
SELECT * EXCEPT ({", ".join(["answer_row_bytes", "answer_upto", *drop])}) FROM (
    SELECT *, {size} AS answer_row_bytes, count() OVER () AS {ANSWER_ROWS},
           sum(answer_row_bytes) OVER (ORDER BY {order} ROWS UNBOUNDED PRECEDING) AS answer_upto
    FROM ({sql})
)
WHERE answer_upto <= {{max_answer_bytes:UInt64}} OR answer_upto = answer_row_bytes
ORDER BY {order}"""


def params(limits: Limits) -> dict[str, object]:
    return {"shown_bytes": limits.max_shown_bytes, "max_answer_bytes": limits.max_answer_bytes}


def counted(table: pa.Table) -> tuple[pa.Table, bool]:
    """A bounded table without its ANSWER_ROWS, and whether its bytes left rows out."""
    if ANSWER_ROWS not in table.column_names:
        return table, False
    total = table.column(ANSWER_ROWS)[0].as_py() if table.num_rows else 0
    return table.drop_columns([ANSWER_ROWS]), total > table.num_rows


def rows_within(sizes: np.ndarray, bound: int) -> int:
    """How many of the first rows, of these sizes, add up to at most `bound` bytes (the first always)."""
    if not len(sizes):
        return 0
    return max(1, int(np.searchsorted(np.cumsum(sizes, dtype=np.int64), bound, side="right")))
