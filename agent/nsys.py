"""Read Nsight Systems SQLite exports (`nsys export --type sqlite`), nsys 2020.3 to 2026.x.

What a file holds is found by inspection (tables, columns), never by its version string:
columns move, appear and vanish between versions, tables with no rows are left out, and
the ENUM tables only exist from 2022.4. Every source table maps declaratively to the
events model; rows stream out as Arrow record batches of a fixed size, read through the
ADBC SQLite driver, so a multi-GB export is read in bounded memory.

Times in the file are ns relative to the session start. With
TARGET_INFO_SESSION_START_TIME (nsys 2021.3 and later) they become absolute UTC ns;
without it they stay relative (shifted so that none is negative) and the run says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import adbc_driver_sqlite
import adbc_driver_sqlite.dbapi as adbc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agent.gpu import DeviceInfo
from agent.nsys_checks import NsysCheckError, check_tables
from agent.tracefile import MAX_EVENT_NS, MAX_TIME_NS, SQLITE_MAGIC, TraceFileError, check_regular
from tracehouse.batch import EVENT_OPTIONAL_COLUMNS
from tracehouse.model import DEFAULT_LIMITS

MAX_STRING = DEFAULT_LIMITS.max_string_bytes  # longer strings are cut, as Kineto's are
MAX_NAME = DEFAULT_LIMITS.max_name_bytes  # host, metric and GPU names
CHUNK_ROWS = 65_536  # rows per batch; batch ids depend on it, so it is part of the format
NONE_32 = 4294967295  # "none" as nsys writes it in 32-bit columns
PID = "(({col} >> 24) & 16777215)"
TID = "({col} & 16777215)"

# Labels as the ENUM tables of nsys 2022.4+ give them; older exports have no ENUM tables.
MEMCPY_KINDS = {
    0: "Unknown", 1: "Host-to-Device", 2: "Device-to-Host", 3: "Host-to-Array", 4: "Array-to-Host",
    5: "Array-to-Array", 6: "Array-to-Device", 7: "Device-to-Array", 8: "Device-to-Device",
    9: "Host-to-Host", 10: "Peer-to-Peer", 11: "Unified Host-to-Device", 12: "Unified Device-to-Host",
    13: "Unified Device-to-Device",
}  # fmt: skip
MEMORY_KINDS = {
    0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
    6: "Managed Static", 7: "Unknown",
}  # fmt: skip
SYNC_KINDS = {0: "Unknown", 1: "Event sync", 2: "Stream wait sync", 3: "Stream sync", 4: "Context sync"}
NVTX_MARK = (34, 65)
NVTX_PUSHPOP = (59, 70)
NVTX_STARTEND = (60, 71)
NVTX_DOMAIN_CREATE = 75
API_CLASSES = (0, 1)  # CUDA runtime, CUDA driver; others (67: backtraces) repeat real calls
GPU_WORK_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
)  # fmt: skip
_VERSION_IN_PATH = re.compile(r"[Nn]sight[-_ ][Ss]ystems[/-](\d{4}\.\d+(?:\.\d+)*)")
API_SUFFIX = r"_v\d+$"


class NsysError(TraceFileError):
    """The file cannot be imported; the message is one line a person can act on."""


@dataclass(frozen=True)
class Session:
    digest: str  # sha256 of the file
    size: int
    start_ns: int | None  # UTC ns at session start; None when the file has only relative time
    offset_ns: int  # added to every time in the file
    nsys_version: str
    schema_version: str
    host: str
    command: str
    gpus: tuple[DeviceInfo, ...]


@dataclass(frozen=True)
class Source:
    """One table of the export, as events of one family."""

    name: str  # the kind of most of its rows, and the batch id's middle part
    table: str
    sql: str
    nvtx_depth: bool = False  # rows come ordered by thread and start; nest push/pop ranges
    api_names: bool = False  # names are CUDA API names: drop the _vNNNN suffix, as nsys stats does


@dataclass
class _Inspection:
    tables: dict[str, set[str]] = field(default_factory=dict)
    api_link: bool = False  # the temporary api_link table exists

    def has(self, table: str, *columns: str) -> bool:
        return table in self.tables and set(columns) <= self.tables[table]

    def col(self, table: str, alias: str, column: str, default: str) -> str:
        return f"COALESCE({alias}.{column}, {default})" if self.has(table, column) else default


def _case(column: str, labels: Mapping[int, str], default: str = "Unknown") -> str:
    whens = " ".join(f"WHEN {key} THEN '{value}'" for key, value in labels.items())
    return f"CASE {column} {whens} ELSE '{default}' END"


def strip_api_version(name: str) -> str:
    """cudaMemcpy_v3020 -> cudaMemcpy, as nsys stats names CUDA API calls."""
    return re.sub(API_SUFFIX, "", name)


class Export:
    """An open, checked export. Use as a context manager."""

    def __init__(self, path: Path) -> None:
        self.path = path
        _check_file(path)
        self._stat = path.stat()
        self._sqlite = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        self._sqlite.text_factory = _decoded
        self.replaced_utf8 = False  # some string was not valid UTF-8: replaced with U+FFFD
        try:
            with self._refusing():
                self._check_integrity()
                self.inspection = self._inspect()
                self._connection = adbc.connect(f"file:{path}?mode=ro")
                self.strings = self._strings()
                self._stripped: pa.Array | None = None
                self.session = self._session()
                self._link_api_calls()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Export:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        connection = getattr(self, "_connection", None)
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()

    # -- checks -----------------------------------------------------------------------

    def _check_integrity(self) -> None:
        try:
            problems = [row[0] for row in self._sqlite.execute("PRAGMA quick_check(3)")]
        except sqlite3.DatabaseError as error:
            raise NsysError(f"{self.path.name}: corrupt or truncated SQLite file ({_one_line(error)})") from None
        if problems != ["ok"]:
            found = " ".join("; ".join(map(str, problems)).split())  # a problem can span lines
            raise NsysError(f"{self.path.name}: corrupt SQLite file ({found[:200]})")

    def _inspect(self) -> _Inspection:
        inspection = _Inspection()
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
        sql = "SELECT id, CAST(value AS TEXT) AS value FROM StringIds ORDER BY id"
        batches = list(self._read(sql, "StringIds"))
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
        sql = _api_link(self.inspection)
        gpu_work = any(self.inspection.has(t, "correlationId") for t in GPU_WORK_TABLES)
        if sql is None or not gpu_work:
            return
        try:
            with self._connection.cursor() as cursor:
                cursor.execute("PRAGMA temp_store = FILE")
                for statement in sql.split(";"):
                    cursor.execute(statement)
        except adbc.Error as error:
            raise NsysError(f"{self.path.name}: cannot read CUPTI_ACTIVITY_KIND_RUNTIME: {_one_line(error)}") from None
        self.inspection.api_link = True

    def _check(self, tables: set[str] | None, offset: int, strings: int) -> None:
        """Refuse the file if a column of `tables` (None: all) breaks its rule (agent/nsys_checks.py)."""
        inspected = self.inspection.tables
        chosen = inspected if tables is None else {t: c for t, c in inspected.items() if t in tables}
        try:
            check_tables(self._sqlite, chosen, self.path.name, offset, strings)
        except NsysCheckError as error:
            raise NsysError(str(error)) from None

    def _clean(self, values: pa.Array, limit: int) -> pa.Array:
        """Strings fit for the store: invalid UTF-8 replaced with U+FFFD, cut to `limit` bytes on a
        character boundary. Arrow checks them all at once; only bad ones are fixed one by one."""
        if pa.types.is_dictionary(values.type):
            return values
        if not (pa.types.is_string(values.type) or pa.types.is_binary(values.type)):
            return values
        try:
            values.cast(pa.string()).validate(full=True)
            valid = values.cast(pa.string())
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            self.replaced_utf8 = True
            raw = values.cast(pa.binary()).to_pylist()
            valid = pa.array([None if v is None else v.decode("utf-8", "replace") for v in raw], pa.string())
        lengths = pc.binary_length(valid)
        if len(valid) and (pc.max(lengths).as_py() or 0) > limit:
            long = np.flatnonzero(pc.fill_null(pc.greater(lengths, limit), False).to_numpy(zero_copy_only=False))
            texts = valid.to_pylist()
            for row in long:
                texts[row] = cut(texts[row], limit)
            valid = pa.array(texts, pa.string())
        return valid

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
        return None if row is None else _str(row[0]) if isinstance(row[0], bytes) else row[0]

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
        if metadata:
            version = self._value(f"SELECT value FROM {metadata} WHERE name = 'EXPORT_PRODUCT_VERSION'") or ""
            schema = self._value(f"SELECT value FROM {metadata} WHERE name = 'EXPORT_SCHEMA_VERSION'") or ""
        if not version:
            version = self._version_from_paths()
        host = command = ""
        if has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
            host = self._value("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'") or ""
        if has("META_DATA_CAPTURE", "name", "value"):
            command = self._value("SELECT value FROM META_DATA_CAPTURE WHERE name = 'PROCESS_0:COMMAND'") or ""
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
        sources = ["SELECT value FROM StringIds WHERE value LIKE '%ight%ystems%' LIMIT 50"]
        if self.inspection.has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
            sources.insert(0, "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'TargetInstallDir'")
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
        sql = f"""
SELECT {col(table, "g", "cuDevice", "g.id")}, {col(table, "g", "uuid", "''")}, {col(table, "g", "name", "''")},
       {col(table, "g", "totalMemory", "0")}, {col(table, "g", "smCount", "0")},
       {col(table, "g", "busLocation", "''")}, {col(table, "g", "chipName", "''")},
       {col(table, "g", "computeMajor", "0")}, {col(table, "g", "computeMinor", "0")}
FROM {table} AS g WHERE {col(table, "g", "cuDevice", "g.id")} IS NOT NULL ORDER BY g.id"""
        driver = ""
        if self.inspection.has("TARGET_INFO_SYSTEM_ENV", "name", "value"):
            driver = self._value("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'NvDriverVersion'") or ""
        gpus = []
        for index, uuid, name, memory, sms, bus, chip, major, minor in self._sqlite.execute(sql):
            gpus.append(
                DeviceInfo(
                    index=int(index),
                    uuid=cut(_gpu_uuid(_str(uuid)), MAX_NAME),
                    name=cut(_str(name), MAX_NAME),
                    memory_total=max(0, int(memory)),
                    sm_count=int(sms) if 0 <= int(sms) < NONE_32 else 0,
                    pci_bus_id=cut(_str(bus), MAX_NAME),
                    driver=cut(_str(driver), MAX_NAME),
                    attrs={"chip": cut(_str(chip), MAX_NAME), "compute_capability": f"{major}.{minor}"},
                )
            )
        return tuple(gpus)

    # -- names of processes and threads ----------------------------------------------

    def process_names(self, pids: set[int]) -> dict[int, str]:
        names: dict[int, str] = {}
        if self.inspection.has("PROCESSES", "pid", "name"):
            with self._refusing():
                rows = self._sqlite.execute("SELECT pid, name FROM PROCESSES WHERE name IS NOT NULL").fetchall()
            for pid, name in rows:
                if pid in pids:
                    names[int(pid)] = cut(_str(name), MAX_STRING)
        for (pid, _), name in self.thread_names({(p, p) for p in pids - set(names)}).items():
            names[pid] = name  # a process without a PROCESSES row: its main thread's name
        return names

    def thread_names(self, threads: set[tuple[int, int]]) -> dict[tuple[int, int], str]:
        if not self.inspection.has("ThreadNames", "nameId", "globalTid"):
            return {}
        names: dict[tuple[int, int], str] = {}
        sql = f"""
SELECT {PID.format(col="t.globalTid")}, {TID.format(col="t.globalTid")}, s.value
FROM ThreadNames AS t JOIN StringIds AS s ON s.id = t.nameId
ORDER BY {self.inspection.col("ThreadNames", "t", "priority", "0")}"""
        with self._refusing():
            rows = self._sqlite.execute(sql).fetchall()
        for pid, tid, name in rows:
            if (pid, tid) in threads:
                names[(int(pid), int(tid))] = cut(_str(name), MAX_STRING)
        return names

    # -- events -----------------------------------------------------------------------

    def sources(self) -> list[Source]:
        """The event sources this file has, in import order."""
        found = []
        for make in (_kernels, _memcpy, _memset, _api, _sync, _nvtx, _host_calls("osrt", "OSRT_API"),
                     _host_calls("cudnn", "CUDNN_EVENTS"), _host_calls("cublas", "CUBLAS_EVENTS")):  # fmt: skip
            source = make(self.inspection, getattr(self, "session", None))
            if source is not None:
                found.append(source)
        return found

    def estimated_rows(self, source: Source) -> int:
        return int(self._value(f"SELECT max(rowid) FROM {source.table}") or 0)

    def chunks(self, source: Source) -> Iterator[pa.RecordBatch]:
        """The source's rows, CHUNK_ROWS at a time: kind, start, end, name, the optional event
        columns the source has, and extras as `x:KEY` columns."""
        depth = _NvtxDepth() if source.nvtx_depth else None
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
            batch = _defaults(batch)
            if depth is not None:
                batch = depth.apply(batch)
            if "kind" not in batch.schema.names:
                kinds = pa.DictionaryArray.from_arrays(pa.array(np.zeros(batch.num_rows, np.int32)), [source.name])
                batch = batch.append_column("kind", kinds)
            if "l:gridX" in batch.schema.names:
                batch = _launch(batch)
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
        names = "COALESCE(NULLIF(CAST(t.metricName AS TEXT), ''), 'metric ' || g.metricId)"
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

    def _read(self, sql: str, table: str) -> Iterator[pa.RecordBatch]:
        try:
            with self._connection.cursor() as cursor:
                cursor.adbc_statement.set_options(
                    **{adbc_driver_sqlite.StatementOptions.BATCH_ROWS.value: str(CHUNK_ROWS)}
                )
                cursor.execute(sql)
                for batch in cursor.fetch_record_batch():
                    if batch.num_rows:
                        yield batch
        except (adbc.Error, OSError, pa.ArrowException) as error:  # a file changed since it was checked
            raise NsysError(f"{self.path.name}: cannot read {table}: {_one_line(error)}") from None


def _decoded(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _str(value: Any) -> str:
    """A value read through sqlite3 as text: a blob decoded, NULL empty."""
    if isinstance(value, bytes):
        return _decoded(value)
    return "" if value is None else str(value)


def cut(text: str, limit: int) -> str:
    """`text` in at most `limit` bytes of UTF-8, cut on a character boundary."""
    if len(text) * 4 <= limit:
        return text
    return text.encode("utf-8", "replace")[:limit].decode("utf-8", "ignore")


def _one_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0][:300]


def _check_file(path: Path) -> None:
    try:
        check_regular(path)
    except TraceFileError as error:
        raise NsysError(str(error)) from None
    for suffix in ("-journal", "-wal"):
        if path.with_name(path.name + suffix).exists():
            raise NsysError(f"{path.name}: still being written ({path.name}{suffix} exists); import it when done")
    try:
        with path.open("rb") as file:
            head = file.read(len(SQLITE_MAGIC))
    except OSError as error:
        raise NsysError(f"{path}: cannot read it ({error.strerror})") from None
    if head != SQLITE_MAGIC:
        if head[:4] in (b"\x1f\x8b\x08\x00", b"PK\x03\x04") or path.suffix in (".nsys-rep", ".qdrep"):
            raise NsysError(f"{path.name}: not a SQLite file; export it first: nsys export --type sqlite {path.name}")
        raise NsysError(f"{path.name}: not a SQLite file")


def _digest(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _gpu_uuid(raw: str) -> str:
    if not raw or set(raw.replace("-", "").replace("GPU", "")) <= {"0"}:
        return ""
    return raw if raw.startswith("GPU-") else f"GPU-{raw}"


# -- source tables ------------------------------------------------------------------------


def _api_link(inspection: _Inspection) -> str | None:
    """A temporary, indexed copy of what GPU work needs of the CUDA API calls: built once,
    in the temporary store (on disk), and joined by every source of GPU work."""
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not inspection.has(table, "correlationId", "globalTid", "start", "nameId"):
        return None
    classes = f"WHERE eventClass IN {API_CLASSES}" if inspection.has(table, "eventClass") else ""
    return f"""
CREATE TEMP TABLE api_link AS
SELECT correlationId AS correlation, {PID.format(col="globalTid")} AS pid, {TID.format(col="globalTid")} AS tid,
       start, nameId AS name_id
FROM {table} {classes};
CREATE INDEX temp.api_link_by_correlation ON api_link (correlation, pid)"""


def _offset(session: Session | None) -> int:
    return 0 if session is None else session.offset_ns


def _as(expression: str, column: str) -> str:
    return f'{expression} AS "{column}"'


def _select(*columns: str) -> str:
    """Only real columns are read: a column every row would have the same value in is left
    out, and the event takes the model's default for it (or the source's kind)."""
    return ",\n       ".join(c for c in columns if c)


def _thread(inspection: _Inspection, table: str, alias: str) -> tuple[str, str]:
    if not inspection.has(table, "globalTid"):
        return "", ""
    return (
        f"{PID.format(col=f'{alias}.globalTid')} AS pid",
        f"{TID.format(col=f'{alias}.globalTid')} AS tid",
    )


def _gpu_activity(inspection: _Inspection, table: str, alias: str, offset: int, name: str) -> tuple[str, str]:
    """Columns shared by kernels, memcpy, memset and syncs, and the join to their API call."""
    has = inspection.has
    pid = PID.format(col=f"{alias}.globalPid") if has(table, "globalPid") else ""
    columns = _select(
        f"{alias}.start + {offset} AS start",
        f'{alias}."end" + {offset} AS "end"',
        f"{name} AS name",
        f"{alias}.deviceId AS gpu" if has(table, "deviceId") else "",
        f"CASE WHEN {alias}.streamId = {NONE_32} THEN -1 ELSE {alias}.streamId END AS stream"
        if has(table, "streamId")
        else "",
        f"{pid} AS pid" if pid else "",
        f"COALESCE({alias}.correlationId, 0) AS correlation_id" if has(table, "correlationId") else "",
        "COALESCE(api.tid, 0) AS tid" if inspection.api_link and pid else "",
        f"COALESCE(api.start + {offset}, -1) AS launch_start" if inspection.api_link and pid else "",
    )
    join = ""
    if inspection.api_link and pid and has(table, "correlationId"):
        join = f"LEFT JOIN temp.api_link AS api ON api.correlation = {alias}.correlationId AND api.pid = {pid}"
    return columns, join


LAUNCH_COLUMNS = ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
                  "staticSharedMemory", "dynamicSharedMemory")  # fmt: skip


def _kernels(inspection: _Inspection, session: Session | None) -> Source | None:
    table = "CUPTI_ACTIVITY_KIND_KERNEL"
    if not inspection.has(table, "start", "end", "demangledName"):
        return None
    columns, join = _gpu_activity(inspection, table, "k", _offset(session), "k.demangledName")
    launch = [f'k.{c} AS "l:{c}"' for c in LAUNCH_COLUMNS] if inspection.has(table, *LAUNCH_COLUMNS) else []
    sql = f"""
SELECT {_select(columns,
               'k.shortName AS "x:short_name"' if inspection.has(table, "shortName") else "",
               'k.mangledName AS "x:mangled_name"' if inspection.has(table, "mangledName") else "",
               *launch)}
FROM {table} AS k {join}"""  # fmt: skip
    return Source("kernel", table, sql)


def _memcpy(inspection: _Inspection, session: Session | None) -> Source | None:
    table = "CUPTI_ACTIVITY_KIND_MEMCPY"
    if not inspection.has(table, "start", "end"):
        return None
    kind = _case(inspection.col(table, "m", "copyKind", "0"), MEMCPY_KINDS)
    columns, join = _gpu_activity(inspection, table, "m", _offset(session), f"'[CUDA memcpy ' || {kind} || ']'")
    memory = ""
    if inspection.has(table, "srcKind", "dstKind"):
        memory = _as(f"{_case('m.srcKind', MEMORY_KINDS)} || ' to ' || {_case('m.dstKind', MEMORY_KINDS)}", "x:memory")
    sql = f"""
SELECT {_select(columns, "m.bytes AS bytes" if inspection.has(table, "bytes") else "", memory)}
FROM {table} AS m {join}"""
    return Source("memcpy", table, sql)


def _memset(inspection: _Inspection, session: Session | None) -> Source | None:
    table = "CUPTI_ACTIVITY_KIND_MEMSET"
    if not inspection.has(table, "start", "end"):
        return None
    columns, join = _gpu_activity(inspection, table, "m", _offset(session), "'[CUDA memset]'")
    sql = f"""
SELECT {_select(columns,
               "m.bytes AS bytes" if inspection.has(table, "bytes") else "",
               f'{_case("m.memKind", MEMORY_KINDS)} AS "x:memory"' if inspection.has(table, "memKind") else "",
               'CAST(m.value AS TEXT) AS "x:value"' if inspection.has(table, "value") else "")}
FROM {table} AS m {join}"""  # fmt: skip
    return Source("memset", table, sql)


def _api(inspection: _Inspection, session: Session | None) -> Source | None:
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not inspection.has(table, "start", "end", "nameId"):
        return None
    offset = _offset(session)
    has = inspection.has
    sql = f"""
SELECT {_select(f"r.start + {offset} AS start", f'r."end" + {offset} AS "end"', "r.nameId AS name",
               *_thread(inspection, table, "r"),
               "COALESCE(r.correlationId, 0) AS correlation_id" if has(table, "correlationId") else "",
               _as("CASE r.eventClass WHEN 1 THEN 'driver' ELSE 'runtime' END", "x:api")
               if has(table, "eventClass") else "",
               _as("CASE WHEN r.returnValue = 0 THEN '' ELSE CAST(r.returnValue AS TEXT) END", "x:return_value")
               if has(table, "returnValue") else "")}
FROM {table} AS r {f"WHERE r.eventClass IN {API_CLASSES}" if has(table, "eventClass") else ""}"""  # fmt: skip
    return Source("cuda_api", table, sql, api_names=True)


def _sync(inspection: _Inspection, session: Session | None) -> Source | None:
    table = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    if not inspection.has(table, "start", "end"):
        return None
    sync_kind = _case(inspection.col(table, "y", "syncType", "0"), SYNC_KINDS)
    # the API call names the sync: syncType's numbering changed between versions
    linked = inspection.api_link and inspection.has(table, "correlationId", "globalPid")
    name = f"COALESCE(an.value, {sync_kind})" if linked else sync_kind
    columns, join = _gpu_activity(inspection, table, "y", _offset(session), name)
    names = "LEFT JOIN StringIds AS an ON an.id = api.name_id" if linked else ""
    sql = f"""
SELECT {_select(columns, f'{sync_kind} AS "x:sync_type"')}
FROM {table} AS y {join} {names}"""
    return Source("sync", table, sql, api_names=True)


def _nvtx(inspection: _Inspection, session: Session | None) -> Source | None:
    table = "NVTX_EVENTS"
    if not inspection.has(table, "start", "eventType", "globalTid"):
        return None
    offset = _offset(session)
    has = inspection.has
    text = "CAST(n.text AS TEXT)" if has(table, "text") else "NULL"
    registered = "sid.value" if has(table, "textId") else "NULL"
    label = f"COALESCE({registered}, {text}, '')"
    joins = []
    name = label
    if has(table, "domainId", "text"):
        joins.append(f"""
LEFT JOIN (SELECT domainId AS id, {PID.format(col="globalTid")} AS pid, CAST(min(text) AS TEXT) AS name FROM {table}
           WHERE eventType = {NVTX_DOMAIN_CREATE} GROUP BY 1, 2) AS d
    ON d.id = n.domainId AND d.pid = {PID.format(col="n.globalTid")}""")
        name = f"CASE WHEN d.name IS NOT NULL THEN d.name || ':' || {label} ELSE {label} END"
    if has(table, "textId"):
        joins.append("LEFT JOIN StringIds AS sid ON sid.id = n.textId")
    json = ""
    if has(table, "jsonTextId"):
        joins.append("LEFT JOIN StringIds AS jt ON jt.id = n.jsonTextId")
        json = _as("COALESCE(jt.value, '')", "x:json")
    elif has(table, "jsonText"):
        json = _as("COALESCE(CAST(n.jsonText AS TEXT), '')", "x:json")
    marks = ", ".join(map(str, NVTX_MARK))
    ranges = ", ".join(map(str, NVTX_PUSHPOP + NVTX_STARTEND))
    end = 'n."end"' if has(table, "end") else "NULL"
    latest = f'(SELECT max(max(start), COALESCE(max("end"), 0)) FROM {table})'
    sql = f"""
SELECT {_select(
    f"CASE WHEN n.eventType IN ({marks}) THEN 'mark' ELSE 'nvtx' END AS kind",
    f"n.start + {offset} AS start",
    f'CASE WHEN n.eventType IN ({marks}) THEN n.start ELSE COALESCE({end}, {latest}) END + {offset} AS "end"',
    f"{name} AS name",
    *_thread(inspection, table, "n"),
    _as(f"CASE WHEN n.eventType IN {NVTX_PUSHPOP} THEN 'PushPop' WHEN n.eventType IN ({marks}) THEN '' "
        "ELSE 'StartEnd' END", "x:style"),
    _as("CASE WHEN n.color IS NULL THEN '' ELSE printf('#%08X', n.color) END", "x:color")
    if has(table, "color") else "",
    _as("COALESCE(CAST(n.category AS TEXT), '')", "x:category") if has(table, "category") else "",
    json)}
FROM {table} AS n {" ".join(joins)}
WHERE n.eventType IN ({marks}, {ranges})
ORDER BY n.globalTid, n.start, "end" DESC"""  # fmt: skip
    return Source("nvtx", table, sql, nvtx_depth=True)


def _host_calls(kind: str, table: str) -> Any:
    """Calls on the host named by a StringIds id: OS runtime, cuDNN, cuBLAS."""

    def make(inspection: _Inspection, session: Session | None) -> Source | None:
        if not inspection.has(table, "start", "end", "nameId"):
            return None
        offset = _offset(session)
        sql = f"""
SELECT {_select(f"e.start + {offset} AS start", f'e."end" + {offset} AS "end", e.nameId AS name',
               *_thread(inspection, table, "e"),
               "COALESCE(e.nestingLevel, 0) AS depth" if inspection.has(table, "nestingLevel") else "")}
FROM {table} AS e"""  # fmt: skip
        return Source(kind, table, sql)

    return make


def _defaults(batch: pa.RecordBatch) -> pa.RecordBatch:
    """NULL in an optional column (a file may leave any cell empty) is the column's default: 0 in launch
    columns."""
    for index, field_ in enumerate(batch.schema):
        default = EVENT_OPTIONAL_COLUMNS.get(field_.name, 0 if field_.name.startswith("l:") else None)
        if default is not None and batch.column(index).null_count:
            filled = pc.fill_null(batch.column(index).cast(pa.int64()), default)
            batch = batch.set_column(index, field_.name, filled)
    return batch


def _launch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """One display string per distinct launch configuration (kernels of a program have few),
    shared by every kernel launched so."""
    values = np.stack([batch.column(f"l:{c}").to_numpy(zero_copy_only=False) for c in LAUNCH_COLUMNS]).astype(np.uint64)
    key = np.zeros(batch.num_rows, np.uint64)
    for column in values:  # a 64-bit mix of the configuration; equal keys are the same launch
        key = (key ^ column) * np.uint64(0x100000001B3)
    _, first, which = np.unique(key, return_index=True, return_inverse=True)
    labels = []
    for row in first:
        gx, gy, gz, bx, by, bz, registers, static, dynamic = (int(v) for v in values[:, row])
        labels.append(f"grid {gx}x{gy}x{gz}, block {bx}x{by}x{bz}, {registers} registers, {static + dynamic} B shared")
    keep = [i for i, name in enumerate(batch.schema.names) if not name.startswith("l:")]
    launch = pa.DictionaryArray.from_arrays(pa.array(which.astype(np.int32)), labels)
    return pa.RecordBatch.from_arrays(
        [*(batch.column(i) for i in keep), launch], names=[*(batch.schema.names[i] for i in keep), "x:launch"]
    )


class _NvtxDepth:
    """The row of each NVTX range in its thread's lanes, over rows ordered by (thread, start,
    end descending): a push/pop range's nesting depth; for start/end ranges, which may overlap
    in any way, the first lane free at its start. Ranges in one lane of one thread never overlap,
    which the GPU projection relies on. Open ranges carry over from chunk to chunk."""

    def __init__(self) -> None:
        self._stacks: dict[tuple[int, int], list[int]] = {}
        self._lanes: dict[tuple[int, int], list[int]] = {}

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        starts = batch.column("start").to_pylist()
        ends = batch.column("end").to_pylist()
        pids = batch.column("pid").to_pylist()
        tids = batch.column("tid").to_pylist()
        styles = batch.column("x:style").to_pylist()
        depths = []
        for start, end, pid, tid, style in zip(starts, ends, pids, tids, styles, strict=True):
            if style == "PushPop":
                stack = self._stacks.setdefault((pid, tid), [])
                while stack and stack[-1] <= start:
                    stack.pop()
                depths.append(len(stack))
                stack.append(end)
            elif style == "StartEnd":
                lanes = self._lanes.setdefault((pid, tid), [])
                lane = next((i for i, busy_until in enumerate(lanes) if busy_until <= start), len(lanes))
                if lane == len(lanes):
                    lanes.append(end)
                else:
                    lanes[lane] = end
                depths.append(lane)
            else:
                depths.append(0)
        return batch.append_column("depth", pa.array(depths, pa.int64()))
