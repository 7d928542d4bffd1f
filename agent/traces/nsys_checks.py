"""What an Nsight Systems export must hold before any of it is sent: every column tracehouse reads
can hold any SQLite type in any row, so each is checked, one query per table, before the run is
declared. A file that fails is refused with one line naming the table, the column, the row and why.

The checks run in SQLite (typeof, BETWEEN), each table scanned once, in rowid ranges on as many
connections as there are cores (SQLite runs without the GIL), beside the file's integrity check and
the copy of its API calls (agent/traces/nsys.py Export): nothing is read for sending meanwhile. The
rows are then read through ADBC, which needs one type per column anyway. Strings are not checked
here: any type reads as text (CAST), no more than a bound of it, invalid UTF-8 is replaced and long
strings are cut (agent/traces/nsys_strings.py).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from agent.traces.tracefile import MAX_EVENT_BYTES, MAX_EVENT_NS, MAX_TIME_NS, TraceFileError
from tracehouse.model import DEFAULT_LIMITS

NONE_32 = 4294967295  # "none" as nsys writes it in 32-bit columns
INT63 = (1 << 63) - 1


class NsysCheckError(TraceFileError):
    """A column holds what it cannot; one line naming the file, table, column and row."""


# rule -> (what the column holds, in words; SQL that is true for a good value of {c})
RULES: Mapping[str, tuple[str, str]] = {
    "int": ("an integer", "typeof({c}) = 'integer'"),
    "uint": ("an integer from 0", "typeof({c}) = 'integer' AND {c} >= 0"),
    "gpu": (f"a GPU index (0..{DEFAULT_LIMITS.max_gpu_index})",
            f"typeof({{c}}) = 'integer' AND {{c}} BETWEEN 0 AND {DEFAULT_LIMITS.max_gpu_index}"),
    "stream": ("a stream id (0..2^31-1)", f"typeof({{c}}) = 'integer' AND ({{c}} BETWEEN 0 AND {(1 << 31) - 1} "
               f"OR {{c}} = {NONE_32})"),
    "bytes": ("a byte count (0..1 PiB)", f"typeof({{c}}) = 'integer' AND {{c}} BETWEEN 0 AND {MAX_EVENT_BYTES}"),
    "depth": ("a nesting level (0..65535)", "typeof({c}) = 'integer' AND {c} BETWEEN 0 AND 65535"),
    "number": ("a finite number", "typeof({c}) IN ('integer', 'real') AND {c} BETWEEN -1.7e308 AND 1.7e308"),
    # filled in per file: times shifted by the session's start, string ids by the StringIds read
    "time": ("a time", "typeof({c}) = 'integer' AND {c} BETWEEN {low} AND {high}"),
    "id": ("a StringIds id", "typeof({c}) = 'integer' AND {c} BETWEEN 0 AND {strings}"),
}  # fmt: skip
EVENT_TIMES = {"start": "time!", "end": "time!"}  # `!`: the column may not be NULL
GPU_WORK = {**EVENT_TIMES, "deviceId": "gpu", "streamId": "stream", "globalPid": "int", "correlationId": "uint"}
HOST_CALLS = {**EVENT_TIMES, "nameId": "id", "globalTid": "int", "nestingLevel": "depth"}
LAUNCH = ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread", "staticSharedMemory",
          "dynamicSharedMemory")  # fmt: skip
# table -> column -> rule, for every column tracehouse reads as a number (strings: any type)
COLUMNS: Mapping[str, Mapping[str, str]] = {
    "StringIds": {"id": "string_id!"},
    "CUPTI_ACTIVITY_KIND_KERNEL": {**GPU_WORK, "demangledName": "id", "shortName": "id", "mangledName": "id",
                                   **dict.fromkeys(LAUNCH, "int")},
    "CUPTI_ACTIVITY_KIND_MEMCPY": {**GPU_WORK, "copyKind": "int", "srcKind": "int", "dstKind": "int", "bytes": "bytes"},
    "CUPTI_ACTIVITY_KIND_MEMSET": {**GPU_WORK, "memKind": "int", "bytes": "bytes"},
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": {**GPU_WORK, "syncType": "int"},
    "CUPTI_ACTIVITY_KIND_RUNTIME": {**EVENT_TIMES, "nameId": "id", "globalTid": "int", "correlationId": "uint",
                                    "eventClass": "int"},
    "NVTX_EVENTS": {"start": "time!", "end": "time", "eventType": "int", "globalTid": "int", "textId": "id",
                    "jsonTextId": "id", "domainId": "int", "color": "int"},
    "OSRT_API": HOST_CALLS,
    "CUDNN_EVENTS": HOST_CALLS,
    "CUBLAS_EVENTS": HOST_CALLS,
    "GPU_METRICS": {"timestamp": "time", "typeId": "int", "metricId": "int", "value": "number"},
    "TARGET_INFO_GPU_METRICS": {"typeId": "int", "metricId": "int"},
    "TARGET_INFO_GPU": {"id": "gpu", "cuDevice": "gpu", "totalMemory": "uint", "smCount": "int",
                        "computeMajor": "int", "computeMinor": "int"},
    "ThreadNames": {"nameId": "id", "globalTid": "int", "priority": "int"},
    "PROCESSES": {"pid": "int"},
}  # fmt: skip
ORDERED = {"NVTX_EVENTS", *(t for t, c in COLUMNS.items() if c.get("end") == "time!")}  # end >= start


SPLIT_ROWS = 50_000  # a table of more rows is checked in ranges of rowids, one per connection


def check_tables(
    connect: Callable[[], sqlite3.Connection],
    tables: Mapping[str, set[str]],
    name: str,
    offset: int,
    strings: int,
    workers: int = 0,
) -> None:
    """Refuse (NsysCheckError) the first row of any table whose columns break their rule; times
    must lie in [0, MAX_TIME_NS] once `offset` (the session's start) is added. `connect` opens the
    file (each of `workers` threads its own connection; 0: one per core)."""
    checks = _checks(tables, offset, strings)
    if not checks:
        return
    workers = workers or min(4, os.cpu_count() or 1)
    connections: list[sqlite3.Connection] = []
    mine = threading.local()

    def first_bad(piece: tuple[str, str, int | None, int | None]) -> int | None:
        table, where, low, high = piece
        if not hasattr(mine, "connection"):
            mine.connection = connect()
            connections.append(mine.connection)
        in_range = "" if low is None else f"rowid BETWEEN {low} AND {high} AND "
        sql = f'SELECT rowid FROM "{table}" WHERE {in_range}NOT ({where}) LIMIT 1'
        try:
            bad = mine.connection.execute(sql).fetchone()
        except sqlite3.Error as error:
            raise NsysCheckError(f"{name}: cannot read {table} ({str(error).splitlines()[0][:200]})") from None
        return None if bad is None else int(bad[0])

    main = connect()
    try:
        pieces = [
            (table, where, *span) for table, (_, where) in checks.items() for span in _spans(main, table, workers)
        ]
        with ThreadPoolExecutor(workers, thread_name_prefix="nsys-check") as pool:
            found = list(pool.map(first_bad, pieces))
        for table, (conditions, _) in checks.items():  # the first table, and its first row, as one scan finds them
            rows = [row for piece, row in zip(pieces, found, strict=True) if piece[0] == table and row is not None]
            if rows:
                present = {column: rule for column, rule in COLUMNS[table].items() if column in tables[table]}
                raise NsysCheckError(f"{name}: {_diagnose(main, table, conditions, present, min(rows))}")
    finally:
        for connection in (main, *connections):
            connection.close()


def _checks(tables: Mapping[str, set[str]], offset: int, strings: int) -> dict[str, tuple[dict[str, str], str]]:
    """Per table that has any column with a rule, in COLUMNS order: each column's condition, and all of them."""
    checks = {}
    for table, rules in COLUMNS.items():
        present = {column: rule for column, rule in rules.items() if column in tables.get(table, ())}
        if not present:
            continue
        conditions = {column: _condition(column, rule, offset, strings) for column, rule in present.items()}
        if table in ORDERED and {"start", "end"} <= present.keys():
            conditions["end "] = f'"end" IS NULL OR start IS NULL OR "end" BETWEEN start AND start + {MAX_EVENT_NS}'
        checks[table] = (conditions, " AND ".join(f"({condition})" for condition in conditions.values()))
    return checks


def _spans(connection: sqlite3.Connection, table: str, parts: int) -> list[tuple[int | None, int | None]]:
    """Rowid ranges that cover the table, `parts` of them for a large one; (None, None): the whole table."""
    try:
        low, high = connection.execute(f'SELECT min(rowid), max(rowid) FROM "{table}"').fetchone()
    except sqlite3.Error:
        return [(None, None)]  # the check itself says why the table cannot be read
    if low is None or parts < 2 or high - low < SPLIT_ROWS:
        return [(None, None)]
    step = (high - low) // parts + 1
    return [(start, min(high, start + step - 1)) for start in range(low, high + 1, step)]


def _condition(column: str, rule: str, offset: int, strings: int) -> str:
    required = rule.endswith("!")
    rule = rule.rstrip("!")
    if rule == "string_id":
        test = f"typeof({{c}}) = 'integer' AND {{c}} BETWEEN 0 AND {(1 << 31) - 1}"
    else:
        test = RULES[rule][1]
    quoted = f'"{column}"'
    test = test.format(c=quoted, low=-offset, high=MAX_TIME_NS - offset, strings=max(strings - 1, -1))
    return test if required else f"{quoted} IS NULL OR ({test})"


def _diagnose(
    connection: sqlite3.Connection, table: str, conditions: Mapping[str, str], rules: Mapping[str, str], row: int
) -> str:
    """Why `row` of `table` was refused: the first of its columns that breaks its rule."""
    for column, condition in conditions.items():
        ok = connection.execute(f'SELECT ({condition}) FROM "{table}" WHERE rowid = ?', (row,)).fetchone()
        if ok is None or ok[0]:
            continue
        if column == "end ":
            late = connection.execute(f'SELECT "end" >= start FROM "{table}" WHERE rowid = ?', (row,)).fetchone()[0]
            if late:
                return f"{table} has rows that last longer than {MAX_EVENT_NS // 86_400_000_000_000} days (row {row})"
            return f"{table} has rows that end before they start (row {row})"
        number = f"""CASE WHEN typeof("{column}") IN ('integer', 'real') THEN "{column}" END"""  # not a long string
        kind, value = connection.execute(f'SELECT typeof("{column}"), {number} FROM "{table}" WHERE rowid = ?',
                                         (row,)).fetchone()  # fmt: skip
        rule = rules[column].rstrip("!")
        if kind == "null":
            return f"{table} has rows without {column} (row {row})"
        if kind != "integer" and not (rule == "number" and kind == "real"):
            belongs = "a number" if rule == "number" else "an integer"
            return f"{table}.{column}: {kind} where {belongs} belongs (row {row})"
        return f"{table}.{column}: {_shown(value)} is out of range for {_what(rule)} (row {row})"
    return f"{table}: row {row} holds what it cannot"


def _what(rule: str) -> str:
    if rule == "time":
        return f"a time (0..{MAX_TIME_NS} ns, 1970..2200, once made absolute)"
    if rule == "string_id":
        return "a StringIds id (0..2^31-1)"
    if rule == "id":
        return "a StringIds id (one StringIds has)"
    return RULES[rule][0]


def _shown(value: object) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."
