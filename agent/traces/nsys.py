"""Read Nsight Systems SQLite exports (`nsys export --type sqlite`), nsys 2020.3 to 2026.x.

What a file holds is found by inspection (tables, columns), never by its version string:
columns move, appear and vanish between versions, tables with no rows are left out, and
the ENUM tables only exist from 2022.4. Every source table maps declaratively to the
events model; rows stream out as Arrow record batches of a fixed size, read through the
ADBC SQLite driver, so a multi-GB export is read in bounded memory.

Times in the file are ns relative to the session start. With
TARGET_INFO_SESSION_START_TIME (nsys 2021.3 and later) they become absolute UTC ns;
without it they stay relative (shifted so that none is negative) and the run says so.

The tables and the SQL that reads each are in nsys_sources.py; what each chunk gets before it
leaves, in nsys_columns.py; strings made fit for the store, in nsys_strings.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import adbc_driver_manager as adbc
import adbc_driver_sqlite
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agent.telemetry.gpu import DeviceInfo
from agent.traces.nsys_checks import NsysCheckError, check_tables
from agent.traces.nsys_columns import NvtxDepth, fill_defaults, launch_column
from agent.traces.nsys_sources import (
    API_SUFFIX,
    GPU_WORK_TABLES,
    NONE_32,
    PID,
    TID,
    Inspection,
    Session,
    Source,
    api_link_sql,
    find_sources,
)
from agent.traces.nsys_sources import MEMCPY_KINDS as MEMCPY_KINDS  # for those who import it from here
from agent.traces.nsys_strings import MAX_STRING, clean_strings, cut, decoded, sqlite_text, text_sql
from agent.traces.tracefile import MAX_EVENT_NS, MAX_TIME_NS, SQLITE_MAGIC, TraceFileError, open_regular
from tracehouse.model import DEFAULT_LIMITS

MAX_NAME = DEFAULT_LIMITS.max_name_bytes  # host, metric and GPU names
CHUNK_ROWS = 65_536  # rows per batch; batch ids depend on it, so it is part of the format
_VERSION_IN_PATH = re.compile(r"[Nn]sight[-_ ][Ss]ystems[/-](\d{4}\.\d+(?:\.\d+)*)")


class NsysError(TraceFileError):
    """The file cannot be imported; the message is one line a person can act on."""


class Export:
    """An open, checked export. Use as a context manager."""

    def __init__(self, path: Path) -> None:
        self.path = path
        _check_file(path)
        self._stat = path.stat()
        self._sqlite = self._connect()
        self.replaced_utf8 = False  # some string was not valid UTF-8: replaced with U+FFFD
        try:
            # SQLite reads without the GIL: the integrity check, and the copy of the API calls that GPU work
            # is joined to, run beside the rest. What fails is told in the order the steps come in: a
            # corrupt file is refused as corrupt, whatever else failed on it.
            with self._refusing(), ThreadPoolExecutor(2, thread_name_prefix="nsys-open") as beside:
                integrity = beside.submit(self._check_integrity)
                try:
                    self.inspection = self._inspect()
                    self._database = adbc_driver_sqlite.connect(f"file:{path}?mode=ro")
                    self._connection = adbc.AdbcConnection(self._database)
                    linked = beside.submit(self._link_api_calls)
                    self.strings = self._strings()
                    self._stripped: pa.Array | None = None
                    self.session = self._session()
                    linked.result()
                finally:
                    integrity.result()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Export:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        connection.text_factory = decoded
        return connection

    @contextlib.contextmanager
    def _refusing(self) -> Iterator[None]:
        """SQLite's errors as one line: a page or record can be corrupt where the integrity check does not
        look, and SQLite decodes its messages, which may quote the file's bytes, as strict UTF-8."""
        try:
            yield
        except (sqlite3.Error, UnicodeDecodeError) as error:
            raise NsysError(f"{self.path.name}: corrupt or unreadable SQLite file ({_one_line(error)})") from None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._sqlite.close()
        for handle in (getattr(self, "_connection", None), getattr(self, "_database", None)):
            if handle is not None:
                with contextlib.suppress(Exception):
                    handle.close()

    # -- checks -----------------------------------------------------------------------

    def _check_integrity(self) -> None:
        try:
            with contextlib.closing(self._connect()) as connection:
                problems = [row[0] for row in connection.execute("PRAGMA quick_check(3)")]
        except sqlite3.DatabaseError as error:
            raise NsysError(f"{self.path.name}: corrupt or truncated SQLite file ({_one_line(error)})") from None
        if problems != ["ok"]:
            found = " ".join("; ".join(map(str, problems)).split())  # a problem can span lines
            raise NsysError(f"{self.path.name}: corrupt SQLite file ({found[:200]})")

    def _inspect(self) -> Inspection:
        inspection = Inspection()
        for (table,) in self._sqlite.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            columns = {row[1] for row in self._sqlite.execute(f"PRAGMA table_info('{table}')")}
            inspection.tables[table] = columns
        if not inspection.has("StringIds", "id", "value"):
            raise NsysError(f"{self.path.name}: not an Nsight Systems export (it has no StringIds table)")
        return inspection

    def _strings(self) -> pa.Array:
        """StringIds as one Arrow array indexed by id: names travel as ids and are looked up
        in Arrow, not joined row by row in SQL. Memory grows with distinct strings only."""
        self._check({"StringIds"}, 0, 0)
        sql = f"SELECT id, {text_sql('value')} AS value FROM StringIds ORDER BY id"
        with contextlib.closing(adbc.AdbcConnection(self._database)) as own:  # the other is linking API calls
            batches = list(self._read(sql, "StringIds", own))
        if not batches:
            return pa.array([], pa.string())
        table = pa.Table.from_batches(batches)
        ids = table.column("id").to_numpy()
        values = table.column("value").combine_chunks()
        if values.null_count == len(values):  # then ADBC gave it no string type
            values = values.cast(pa.string())
        values = pc.fill_null(self._clean(values, MAX_STRING), "")
        if ids[0] == 0 and ids[-1] == len(ids) - 1 and (np.diff(ids) == 1).all():
            return values
        if int(ids.max()) >= 2 * len(ids) + (1 << 20):  # a table of positions as long as the largest id
            raise NsysError(f"{self.path.name}: StringIds.id: ids up to {ids.max()} for {len(ids)} strings; too sparse")
        position = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
        position[ids] = np.arange(len(ids))
        return pc.fill_null(values.take(pa.array(position, mask=position < 0)), "")  # an id without a string: ""

    def _link_api_calls(self) -> None:
        sql = api_link_sql(self.inspection)
        gpu_work = any(self.inspection.has(t, "correlationId") for t in GPU_WORK_TABLES)
        if sql is None or not gpu_work:
            return
        try:
            for statement in ("PRAGMA temp_store = FILE", *sql.split(";")):
                with adbc.AdbcStatement(self._connection) as handle:
                    handle.set_sql_query(statement)
                    handle.execute_update()
        except adbc.Error as error:
            raise NsysError(f"{self.path.name}: cannot read CUPTI_ACTIVITY_KIND_RUNTIME: {_one_line(error)}") from None
        self.inspection.api_link = True

    def _check(self, tables: set[str] | None, offset: int, strings: int) -> None:
        """Refuse the file if a column of `tables` (None: all) breaks its rule (agent/traces/nsys_checks.py)."""
        inspected = self.inspection.tables
        chosen = inspected if tables is None else {t: c for t, c in inspected.items() if t in tables}
        try:
            check_tables(self._connect, chosen, self.path.name, offset, strings)
        except NsysCheckError as error:
            raise NsysError(str(error)) from None

    def _clean(self, values: pa.Array, limit: int) -> pa.Array:
        """Strings fit for the store (nsys_strings.clean_strings); remembers whether any was not valid UTF-8."""
        values, replaced = clean_strings(values, limit)
        self.replaced_utf8 = self.replaced_utf8 or replaced
        return values

    def check_unchanged(self) -> None:
        """Raise if the file changed since it was opened (it was still being written)."""
        now = self.path.stat()
        if (now.st_size, now.st_mtime_ns) != (self._stat.st_size, self._stat.st_mtime_ns):
            raise NsysError(f"{self.path.name}: the file changed while it was read; is nsys still writing it?")

    # -- session ----------------------------------------------------------------------

    def _value(self, sql: str) -> Any:
        try:
            row = self._sqlite.execute(sql).fetchone()
        except sqlite3.Error:
            return None
        return None if row is None else sqlite_text(row[0]) if isinstance(row[0], bytes) else row[0]

    def _session(self) -> Session:
        has = self.inspection.has
        start = None
        if has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
            start = self._session_start()
        earliest = self._earliest() if start is None else 0
        offset = int(start) if start is not None else min(max(0, -earliest), MAX_TIME_NS)
        self._check(None, offset, len(self.strings))
        metadata = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if has(t, "name", "value")), None)
        version = schema = ""
        value = text_sql("value", MAX_NAME)
        if metadata:
            version = self._value(f"SELECT {value} FROM {metadata} WHERE name = 'EXPORT_PRODUCT_VERSION'") or ""
            schema = self._value(f"SELECT {value} FROM {metadata} WHERE name = 'EXPORT_SCHEMA_VERSION'") or ""
        if not version:
            version = self._version_from_paths()
        host = command = ""
        if has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
            host = self._value(f"SELECT {value} FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'") or ""
        if has("META_DATA_CAPTURE", "name", "value"):
            command = self._value(f"SELECT {text_sql('value', 4096)} FROM META_DATA_CAPTURE "
                                  "WHERE name = 'PROCESS_0:COMMAND'") or ""  # fmt: skip
        return Session(
            digest=_digest(self.path),
            size=self._stat.st_size,
            start_ns=None if start is None else int(start),
            offset_ns=offset,
            nsys_version=cut(str(version), MAX_NAME),
            schema_version=cut(str(schema), MAX_NAME),
            host=cut(str(host).strip(), MAX_NAME),
            command=cut(str(command), 4096),
            gpus=self._gpus(),
        )

    def _session_start(self) -> int | None:
        """utcEpochNs: an integer time, or the file is refused."""
        table = "TARGET_INFO_SESSION_START_TIME"
        row = self._sqlite.execute(f"SELECT typeof(utcEpochNs), utcEpochNs FROM {table} LIMIT 1").fetchone()
        if row is None or row[0] == "null":
            return None
        if row[0] != "integer":
            raise NsysError(f"{self.path.name}: {table}.utcEpochNs: {row[0]} where an integer belongs (row 1)")
        if not 0 <= row[1] <= MAX_TIME_NS:
            raise NsysError(
                f"{self.path.name}: {table}.utcEpochNs: {row[1]} is out of range for a time (0..{MAX_TIME_NS} ns, "
                "1970..2200) (row 1)"
            )
        return int(row[1])

    def _version_from_paths(self) -> str:
        value = text_sql("value", 4096)
        sources = [f"SELECT {value} FROM StringIds WHERE value LIKE '%ight%ystems%' LIMIT 50"]
        if self.inspection.has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
            sources.insert(0, f"SELECT {value} FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'TargetInstallDir'")
        for sql in sources:
            with contextlib.suppress(sqlite3.Error):
                for (text,) in self._sqlite.execute(sql):
                    found = _VERSION_IN_PATH.search(str(text))
                    if found:
                        return found.group(1)
        return ""

    def _earliest(self) -> int:
        """The smallest time in the file: relative exports are shifted so that none is negative."""
        earliest = 0
        for source in self.sources():
            value = self._value(f"SELECT min(start) FROM {source.table}")
            if isinstance(value, int):
                earliest = min(earliest, value)
        return earliest

    def _gpus(self) -> tuple[DeviceInfo, ...]:
        table = "TARGET_INFO_GPU"
        if not self.inspection.has(table, "id"):
            return ()
        col = self.inspection.col

        def short(expression: str) -> str:
            return text_sql(expression, MAX_NAME)

        sql = f"""
SELECT {col(table, "g", "cuDevice", "g.id")}, {short(col(table, "g", "uuid", "''"))},
       {short(col(table, "g", "name", "''"))}, {col(table, "g", "totalMemory", "0")}, {col(table, "g", "smCount", "0")},
       {short(col(table, "g", "busLocation", "''"))}, {short(col(table, "g", "chipName", "''"))},
       {col(table, "g", "computeMajor", "0")}, {col(table, "g", "computeMinor", "0")}
FROM {table} AS g WHERE {col(table, "g", "cuDevice", "g.id")} IS NOT NULL ORDER BY g.id"""
        driver = ""
        if self.inspection.has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
            driver = self._value(f"SELECT {short('value')} FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'NvDriverVersion'")
            driver = driver or ""
        gpus = []
        for index, uuid, name, memory, sms, bus, chip, major, minor in self._sqlite.execute(sql):
            gpus.append(
                DeviceInfo(
                    index=int(index),
                    uuid=cut(_gpu_uuid(sqlite_text(uuid)), MAX_NAME),
                    name=cut(sqlite_text(name), MAX_NAME),
                    memory_total=max(0, int(memory)),
                    sm_count=int(sms) if 0 <= int(sms) < NONE_32 else 0,
                    pci_bus_id=cut(sqlite_text(bus), MAX_NAME),
                    driver=cut(driver_version(sqlite_text(driver)), MAX_NAME),
                    attrs={"chip": cut(sqlite_text(chip), MAX_NAME), "compute_capability": f"{major}.{minor}"},
                )
            )
        return tuple(gpus)

    # -- names of processes and threads ----------------------------------------------

    def process_names(self, pids: set[int]) -> dict[int, str]:
        names: dict[int, str] = {}
        if self.inspection.has("PROCESSES", "pid", "name"):
            with self._refusing():
                sql = f"SELECT pid, {text_sql('name')} FROM PROCESSES WHERE name IS NOT NULL"
                rows = self._sqlite.execute(sql).fetchall()
            for pid, name in rows:
                if pid in pids:
                    names[int(pid)] = cut(sqlite_text(name), MAX_STRING)
        for (pid, _), name in self.thread_names({(p, p) for p in pids - set(names)}).items():
            names[pid] = name  # a process without a PROCESSES row: its main thread's name
        return names

    def thread_names(self, threads: set[tuple[int, int]]) -> dict[tuple[int, int], str]:
        if not self.inspection.has("ThreadNames", "nameId", "globalTid"):
            return {}
        names: dict[tuple[int, int], str] = {}
        sql = f"""
SELECT {PID.format(col="t.globalTid")}, {TID.format(col="t.globalTid")}, {text_sql("s.value")}
FROM ThreadNames AS t JOIN StringIds AS s ON s.id = t.nameId
ORDER BY {self.inspection.col("ThreadNames", "t", "priority", "0")}"""
        with self._refusing():
            rows = self._sqlite.execute(sql).fetchall()
        for pid, tid, name in rows:
            if (pid, tid) in threads:
                names[(int(pid), int(tid))] = cut(sqlite_text(name), MAX_STRING)
        return names

    # -- events -----------------------------------------------------------------------

    def sources(self) -> list[Source]:
        """The event sources this file has, in import order."""
        return find_sources(self.inspection, getattr(self, "session", None))

    def estimated_rows(self, source: Source) -> int:
        return int(self._value(f"SELECT max(rowid) FROM {source.table}") or 0)

    def chunks(self, source: Source) -> Iterator[pa.RecordBatch]:
        """The source's rows, CHUNK_ROWS at a time: kind, start, end, name, the optional event
        columns the source has, and extras as `x:KEY` columns."""
        depth = NvtxDepth() if source.nvtx_depth else None
        for batch in self._read(source.sql, source.table):
            for column in ("start", "end"):
                if batch.column(column).null_count:
                    raise NsysError(
                        f"{self.path.name}: {source.table} has rows without {column} "
                        f"({batch.column(column).null_count} in one chunk)"
                    )
            backwards = pc.sum(pc.less(batch.column("end"), batch.column("start"))).as_py()
            if backwards:
                raise NsysError(f"{self.path.name}: {source.table} has {backwards} rows that end before they start")
            if pc.min(batch.column("start")).as_py() < 0:
                raise NsysError(f"{self.path.name}: {source.table} has rows before 1970 once made absolute")
            if pc.max(batch.column("end")).as_py() > MAX_TIME_NS:
                raise NsysError(f"{self.path.name}: {source.table} has rows that end after 2200 once made absolute")
            if pc.max(pc.subtract(batch.column("end"), batch.column("start"))).as_py() > MAX_EVENT_NS:
                raise NsysError(f"{self.path.name}: {source.table} has rows that last longer than 366 days")
            batch = fill_defaults(batch)
            if depth is not None:
                batch = depth.apply(batch)
            if "kind" not in batch.schema.names:
                kinds = pa.DictionaryArray.from_arrays(pa.array(np.zeros(batch.num_rows, np.int32)), [source.name])
                batch = batch.append_column("kind", kinds)
            if "l:gridX" in batch.schema.names:
                batch = launch_column(batch)
            yield self._names(batch, source)

    def _names(self, batch: pa.RecordBatch, source: Source) -> pa.RecordBatch:
        """Integer name and extra columns are StringIds ids: make them dictionary arrays over
        StringIds (no string is copied); strip API version suffixes where nsys stats does."""
        for index, field_ in enumerate(batch.schema):
            column = field_.name
            if column != "name" and not column.startswith("x:"):
                continue
            values = batch.column(index)
            strip = source.api_names and column == "name"
            if pa.types.is_integer(field_.type):
                values = self._lookup(values, source, column, strip)
            else:
                values = self._clean(values, MAX_STRING)
                if strip:
                    values = pc.replace_substring_regex(values, pattern=API_SUFFIX, replacement="")
            batch = batch.set_column(index, column, values)
        return batch

    def _lookup(self, ids: pa.Array, source: Source, column: str, strip: bool) -> pa.Array:
        if ids.null_count == len(ids):
            return pa.array([""] * len(ids), pa.string())
        if pc.max(ids).as_py() >= len(self.strings) or pc.min(ids).as_py() < 0:
            raise NsysError(f"{self.path.name}: {source.table} names strings that StringIds does not have")
        if self._stripped is None and strip:
            self._stripped = pc.replace_substring_regex(self.strings, pattern=API_SUFFIX, replacement="")
        dictionary = self._stripped if strip else self.strings
        looked_up = pa.DictionaryArray.from_arrays(ids.cast(pa.int32()), dictionary)
        if column == "name" and looked_up.null_count:
            return pc.fill_null(looked_up.dictionary_decode(), "")
        return looked_up

    def metric_chunks(self) -> Iterator[pa.RecordBatch]:
        """GPU metrics sampled by nsys (--gpu-metrics-devices): ts, gpu, metric, value."""
        if not self.inspection.has("GPU_METRICS", "timestamp", "typeId", "metricId", "value"):
            return
        names = f"COALESCE(NULLIF({text_sql('t.metricName', MAX_NAME)}, ''), 'metric ' || g.metricId)"
        join = ""
        if self.inspection.has("TARGET_INFO_GPU_METRICS", "typeId", "metricId", "metricName"):
            join = """LEFT JOIN (SELECT typeId, metricId, min(metricName) AS metricName
                      FROM TARGET_INFO_GPU_METRICS GROUP BY typeId, metricId) AS t
                      ON t.typeId = g.typeId AND t.metricId = g.metricId"""
        else:
            names = "'metric ' || g.metricId"
        sql = f"""
SELECT g.timestamp + {self.session.offset_ns} AS ts, (g.typeId & 255) AS gpu, {names} AS metric,
       CAST(g.value AS REAL) AS value
FROM GPU_METRICS AS g {join}
WHERE g.timestamp IS NOT NULL AND g.value IS NOT NULL AND g.typeId IS NOT NULL AND g.metricId IS NOT NULL"""
        for batch in self._read(sql, "GPU_METRICS"):
            index = batch.schema.get_field_index("metric")
            yield batch.set_column(index, "metric", self._clean(batch.column(index), MAX_NAME))

    def _read(self, sql: str, table: str, connection: adbc.AdbcConnection | None = None) -> Iterator[pa.RecordBatch]:
        try:
            with adbc.AdbcStatement(connection or self._connection) as statement:
                statement.set_options(**{adbc_driver_sqlite.StatementOptions.BATCH_ROWS.value: str(CHUNK_ROWS)})
                statement.set_sql_query(sql)
                stream, _ = statement.execute_query()
                with pa.RecordBatchReader._import_from_c(stream.address) as reader:
                    for batch in reader:
                        if batch.num_rows:
                            yield batch
        except (adbc.Error, OSError, pa.ArrowException) as error:  # a file changed since it was checked
            raise NsysError(f"{self.path.name}: cannot read {table}: {_one_line(error)}") from None


def _one_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0][:300]


def _check_file(path: Path) -> None:
    for suffix in ("-journal", "-wal"):
        if path.with_name(path.name + suffix).exists():
            raise NsysError(f"{path.name}: still being written ({path.name}{suffix} exists); import it when done")
    try:
        with _opened(path) as file:
            head = file.read(len(SQLITE_MAGIC))
    except OSError as error:
        raise NsysError(f"{path}: cannot read it ({error.strerror})") from None
    if head != SQLITE_MAGIC:
        if head[:4] in (b"\x1f\x8b\x08\x00", b"PK\x03\x04") or path.suffix in (".nsys-rep", ".qdrep"):
            raise NsysError(f"{path.name}: not a SQLite file; export it first: nsys export --type sqlite {path.name}")
        raise NsysError(f"{path.name}: not a SQLite file")


def _opened(path: Path) -> io.BufferedReader:
    try:
        return open_regular(path)
    except TraceFileError as error:
        raise NsysError(str(error)) from None


def _digest(path: Path) -> str:
    with _opened(path) as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def driver_version(text: str) -> str:
    """Nsight's NvDriverVersion as NVIDIA writes a version: 5303002 is 530.30.02, 52510517 525.105.17 (the
    major's three digits, then the minor's, then the patch's two); anything else as it is."""
    if text.isascii() and text.isdigit() and len(text) in (7, 8):
        return f"{text[:3]}.{text[3:-2]}.{text[-2:]}"
    return text


def _gpu_uuid(raw: str) -> str:
    if not raw or set(raw.replace("-", "").replace("GPU", "")) <= {"0"}:
        return ""
    return raw if raw.startswith("GPU-") else f"GPU-{raw}"
