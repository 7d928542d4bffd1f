"""What an Nsight Systems export holds and how each of its tables is read (agent/traces/nsys.py):
the inspection of its tables and columns, the session, and one Source per table of events, whose
SQL reads only the columns the file has and names them as the events model does."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.telemetry.gpu import DeviceInfo
from agent.traces.nsys_strings import text_sql

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
API_SUFFIX = r"_v\d+$"


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
class Inspection:
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


# -- source tables ------------------------------------------------------------------------


def api_link_sql(inspection: Inspection) -> str | None:
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


def _thread(inspection: Inspection, table: str, alias: str) -> tuple[str, str]:
    if not inspection.has(table, "globalTid"):
        return "", ""
    return (
        f"{PID.format(col=f'{alias}.globalTid')} AS pid",
        f"{TID.format(col=f'{alias}.globalTid')} AS tid",
    )


def _gpu_activity(inspection: Inspection, table: str, alias: str, offset: int, name: str) -> tuple[str, str]:
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


def _kernels(inspection: Inspection, session: Session | None) -> Source | None:
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


def _memcpy(inspection: Inspection, session: Session | None) -> Source | None:
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


def _memset(inspection: Inspection, session: Session | None) -> Source | None:
    table = "CUPTI_ACTIVITY_KIND_MEMSET"
    if not inspection.has(table, "start", "end"):
        return None
    columns, join = _gpu_activity(inspection, table, "m", _offset(session), "'[CUDA memset]'")
    sql = f"""
SELECT {_select(columns,
               "m.bytes AS bytes" if inspection.has(table, "bytes") else "",
               f'{_case("m.memKind", MEMORY_KINDS)} AS "x:memory"' if inspection.has(table, "memKind") else "",
               f'{text_sql("m.value")} AS "x:value"' if inspection.has(table, "value") else "")}
FROM {table} AS m {join}"""  # fmt: skip
    return Source("memset", table, sql)


def _api(inspection: Inspection, session: Session | None) -> Source | None:
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
               _as(f"CASE WHEN r.returnValue = 0 THEN '' ELSE {text_sql('r.returnValue')} END", "x:return_value")
               if has(table, "returnValue") else "")}
FROM {table} AS r {f"WHERE r.eventClass IN {API_CLASSES}" if has(table, "eventClass") else ""}"""  # fmt: skip
    return Source("cuda_api", table, sql, api_names=True)


def _sync(inspection: Inspection, session: Session | None) -> Source | None:
    table = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    if not inspection.has(table, "start", "end"):
        return None
    sync_kind = _case(inspection.col(table, "y", "syncType", "0"), SYNC_KINDS)
    # the API call names the sync: syncType's numbering changed between versions
    linked = inspection.api_link and inspection.has(table, "correlationId", "globalPid")
    name = f"COALESCE({text_sql('an.value')}, {sync_kind})" if linked else sync_kind
    columns, join = _gpu_activity(inspection, table, "y", _offset(session), name)
    names = "LEFT JOIN StringIds AS an ON an.id = api.name_id" if linked else ""
    sql = f"""
SELECT {_select(columns, f'{sync_kind} AS "x:sync_type"')}
FROM {table} AS y {join} {names}"""
    return Source("sync", table, sql, api_names=True)


def _nvtx(inspection: Inspection, session: Session | None) -> Source | None:
    table = "NVTX_EVENTS"
    if not inspection.has(table, "start", "eventType", "globalTid"):
        return None
    offset = _offset(session)
    has = inspection.has
    text = text_sql("n.text") if has(table, "text") else "NULL"
    registered = text_sql("sid.value") if has(table, "textId") else "NULL"
    label = f"COALESCE({registered}, {text}, '')"
    joins = []
    name = label
    if has(table, "domainId", "text"):
        joins.append(f"""
LEFT JOIN (SELECT domainId AS id, {PID.format(col="globalTid")} AS pid, {text_sql("min(text)")} AS name FROM {table}
           WHERE eventType = {NVTX_DOMAIN_CREATE} GROUP BY 1, 2) AS d
    ON d.id = n.domainId AND d.pid = {PID.format(col="n.globalTid")}""")
        name = text_sql(f"CASE WHEN d.name IS NOT NULL THEN d.name || ':' || {label} ELSE {label} END")
    if has(table, "textId"):
        joins.append("LEFT JOIN StringIds AS sid ON sid.id = n.textId")
    json = ""
    if has(table, "jsonTextId"):
        joins.append("LEFT JOIN StringIds AS jt ON jt.id = n.jsonTextId")
        json = _as(f"COALESCE({text_sql('jt.value')}, '')", "x:json")
    elif has(table, "jsonText"):
        json = _as(f"COALESCE({text_sql('n.jsonText')}, '')", "x:json")
    marks = ", ".join(map(str, NVTX_MARK))
    ranges = ", ".join(map(str, NVTX_PUSHPOP + NVTX_STARTEND))
    end = 'n."end"' if has(table, "end") else "NULL"
    latest = f'(SELECT max(max(start), COALESCE(max("end"), 0)) FROM {table})'
    # x:end_tid: the thread a start/end range ended on, where it is not the one it started on
    sql = f"""
SELECT {_select(
    f"CASE WHEN n.eventType IN ({marks}) THEN 'mark' ELSE 'nvtx' END AS kind",
    f"n.start + {offset} AS start",
    f'CASE WHEN n.eventType IN ({marks}) THEN n.start ELSE COALESCE({end}, {latest}) END + {offset} AS "end"',
    f"{name} AS name",
    *_thread(inspection, table, "n"),
    _as(f"CASE WHEN n.eventType IN {NVTX_PUSHPOP} THEN 'PushPop' WHEN n.eventType IN ({marks}) THEN '' "
        "ELSE 'StartEnd' END", "x:style"),
    _as(f"CASE WHEN n.endGlobalTid IS NULL OR n.endGlobalTid = n.globalTid THEN '' "
        f"ELSE CAST({TID.format(col='n.endGlobalTid')} AS TEXT) END", "x:end_tid")
    if has(table, "endGlobalTid") else "",
    _as("CASE WHEN n.color IS NULL THEN '' ELSE printf('#%08X', n.color) END", "x:color")
    if has(table, "color") else "",
    _as(f"COALESCE({text_sql('n.category')}, '')", "x:category") if has(table, "category") else "",
    json)}
FROM {table} AS n {" ".join(joins)}
WHERE n.eventType IN ({marks}, {ranges})
ORDER BY n.globalTid, n.start, "end" DESC"""  # fmt: skip
    return Source("nvtx", table, sql, nvtx_depth=True)


def _host_calls(kind: str, table: str) -> Any:
    """Calls on the host named by a StringIds id: OS runtime, cuDNN, cuBLAS."""

    def make(inspection: Inspection, session: Session | None) -> Source | None:
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


def find_sources(inspection: Inspection, session: Session | None) -> list[Source]:
    """The event sources a file so inspected has, in import order (`session` None: times as in the file)."""
    found = []
    for make in (_kernels, _memcpy, _memset, _api, _sync, _nvtx, _host_calls("osrt", "OSRT_API"),
                 _host_calls("cudnn", "CUDNN_EVENTS"), _host_calls("cublas", "CUBLAS_EVENTS")):  # fmt: skip
        source = make(inspection, session)
        if source is not None:
            found.append(source)
    return found
