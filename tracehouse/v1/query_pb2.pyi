from tracehouse.v1 import batch_pb2 as _batch_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Window(_message.Message):
    __slots__ = ("run_id", "hosts", "gpus", "from_ns", "to_ns", "range_name", "range_instance")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    FROM_NS_FIELD_NUMBER: _ClassVar[int]
    TO_NS_FIELD_NUMBER: _ClassVar[int]
    RANGE_NAME_FIELD_NUMBER: _ClassVar[int]
    RANGE_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    hosts: _containers.RepeatedScalarFieldContainer[str]
    gpus: _containers.RepeatedScalarFieldContainer[int]
    from_ns: int
    to_ns: int
    range_name: str
    range_instance: int
    def __init__(self, run_id: _Optional[str] = ..., hosts: _Optional[_Iterable[str]] = ..., gpus: _Optional[_Iterable[int]] = ..., from_ns: _Optional[int] = ..., to_ns: _Optional[int] = ..., range_name: _Optional[str] = ..., range_instance: _Optional[int] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("host", "source", "name_contains", "limit", "tags")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HOST_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    NAME_CONTAINS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    host: str
    source: str
    name_contains: str
    limit: int
    tags: _containers.ScalarMap[str, str]
    def __init__(self, host: _Optional[str] = ..., source: _Optional[str] = ..., name_contains: _Optional[str] = ..., limit: _Optional[int] = ..., tags: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[_batch_pb2.Run]
    def __init__(self, runs: _Optional[_Iterable[_Union[_batch_pb2.Run, _Mapping]]] = ...) -> None: ...

class ListDevicesRequest(_message.Message):
    __slots__ = ("host",)
    HOST_FIELD_NUMBER: _ClassVar[int]
    host: str
    def __init__(self, host: _Optional[str] = ...) -> None: ...

class ListDevicesResponse(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[_batch_pb2.Device]
    def __init__(self, devices: _Optional[_Iterable[_Union[_batch_pb2.Device, _Mapping]]] = ...) -> None: ...

class ListMetricsRequest(_message.Message):
    __slots__ = ("window",)
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    window: Window
    def __init__(self, window: _Optional[_Union[Window, _Mapping]] = ...) -> None: ...

class MetricInfo(_message.Message):
    __slots__ = ("host", "gpu", "metric", "samples", "first_ns", "last_ns", "pid")
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    FIRST_NS_FIELD_NUMBER: _ClassVar[int]
    LAST_NS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    host: str
    gpu: int
    metric: str
    samples: int
    first_ns: int
    last_ns: int
    pid: int
    def __init__(self, host: _Optional[str] = ..., gpu: _Optional[int] = ..., metric: _Optional[str] = ..., samples: _Optional[int] = ..., first_ns: _Optional[int] = ..., last_ns: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class ListMetricsResponse(_message.Message):
    __slots__ = ("metrics",)
    METRICS_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.RepeatedCompositeFieldContainer[MetricInfo]
    def __init__(self, metrics: _Optional[_Iterable[_Union[MetricInfo, _Mapping]]] = ...) -> None: ...

class SeriesRequest(_message.Message):
    __slots__ = ("window", "metrics", "max_points")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    MAX_POINTS_FIELD_NUMBER: _ClassVar[int]
    window: Window
    metrics: _containers.RepeatedScalarFieldContainer[str]
    max_points: int
    def __init__(self, window: _Optional[_Union[Window, _Mapping]] = ..., metrics: _Optional[_Iterable[str]] = ..., max_points: _Optional[int] = ...) -> None: ...

class Series(_message.Message):
    __slots__ = ("host", "gpu", "metric", "bucket_start", "min", "avg", "max", "count", "pid")
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    BUCKET_START_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    AVG_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    host: str
    gpu: int
    metric: str
    bucket_start: _containers.RepeatedScalarFieldContainer[int]
    min: _containers.RepeatedScalarFieldContainer[float]
    avg: _containers.RepeatedScalarFieldContainer[float]
    max: _containers.RepeatedScalarFieldContainer[float]
    count: _containers.RepeatedScalarFieldContainer[int]
    pid: int
    def __init__(self, host: _Optional[str] = ..., gpu: _Optional[int] = ..., metric: _Optional[str] = ..., bucket_start: _Optional[_Iterable[int]] = ..., min: _Optional[_Iterable[float]] = ..., avg: _Optional[_Iterable[float]] = ..., max: _Optional[_Iterable[float]] = ..., count: _Optional[_Iterable[int]] = ..., pid: _Optional[int] = ...) -> None: ...

class SeriesResponse(_message.Message):
    __slots__ = ("bucket_ns", "series")
    BUCKET_NS_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    bucket_ns: int
    series: _containers.RepeatedCompositeFieldContainer[Series]
    def __init__(self, bucket_ns: _Optional[int] = ..., series: _Optional[_Iterable[_Union[Series, _Mapping]]] = ...) -> None: ...

class EventsRequest(_message.Message):
    __slots__ = ("window", "kinds", "names", "page_size", "page_token")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    window: Window
    kinds: _containers.RepeatedScalarFieldContainer[str]
    names: _containers.RepeatedScalarFieldContainer[str]
    page_size: int
    page_token: str
    def __init__(self, window: _Optional[_Union[Window, _Mapping]] = ..., kinds: _Optional[_Iterable[str]] = ..., names: _Optional[_Iterable[str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class EventsResponse(_message.Message):
    __slots__ = ("dictionary", "events", "next_page_token")
    DICTIONARY_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    dictionary: _containers.RepeatedScalarFieldContainer[str]
    events: _batch_pb2.EventColumns
    next_page_token: str
    def __init__(self, dictionary: _Optional[_Iterable[str]] = ..., events: _Optional[_Union[_batch_pb2.EventColumns, _Mapping]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class LanesRequest(_message.Message):
    __slots__ = ("window", "kinds", "buckets")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    window: Window
    kinds: _containers.RepeatedScalarFieldContainer[str]
    buckets: int
    def __init__(self, window: _Optional[_Union[Window, _Mapping]] = ..., kinds: _Optional[_Iterable[str]] = ..., buckets: _Optional[int] = ...) -> None: ...

class LanesResponse(_message.Message):
    __slots__ = ("start_ns", "bucket_ns", "buckets", "lanes", "events")
    START_NS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_NS_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    start_ns: int
    bucket_ns: int
    buckets: int
    lanes: Table
    events: int
    def __init__(self, start_ns: _Optional[int] = ..., bucket_ns: _Optional[int] = ..., buckets: _Optional[int] = ..., lanes: _Optional[_Union[Table, _Mapping]] = ..., events: _Optional[int] = ...) -> None: ...

class SummaryRequest(_message.Message):
    __slots__ = ("window", "kind", "limit")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    window: Window
    kind: str
    limit: int
    def __init__(self, window: _Optional[_Union[Window, _Mapping]] = ..., kind: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class SqlRequest(_message.Message):
    __slots__ = ("sql", "max_rows")
    SQL_FIELD_NUMBER: _ClassVar[int]
    MAX_ROWS_FIELD_NUMBER: _ClassVar[int]
    sql: str
    max_rows: int
    def __init__(self, sql: _Optional[str] = ..., max_rows: _Optional[int] = ...) -> None: ...

class Table(_message.Message):
    __slots__ = ("arrow_ipc", "rows", "truncated")
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    arrow_ipc: bytes
    rows: int
    truncated: bool
    def __init__(self, arrow_ipc: _Optional[bytes] = ..., rows: _Optional[int] = ..., truncated: _Optional[bool] = ...) -> None: ...

class GpuTimeRequest(_message.Message):
    __slots__ = ("window", "min_gap_ns", "max_gaps")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    MIN_GAP_NS_FIELD_NUMBER: _ClassVar[int]
    MAX_GAPS_FIELD_NUMBER: _ClassVar[int]
    window: Window
    min_gap_ns: int
    max_gaps: int
    def __init__(self, window: _Optional[_Union[Window, _Mapping]] = ..., min_gap_ns: _Optional[int] = ..., max_gaps: _Optional[int] = ...) -> None: ...

class GpuTimeResponse(_message.Message):
    __slots__ = ("gpus", "gaps", "gap_count")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GAPS_FIELD_NUMBER: _ClassVar[int]
    GAP_COUNT_FIELD_NUMBER: _ClassVar[int]
    gpus: Table
    gaps: Table
    gap_count: int
    def __init__(self, gpus: _Optional[_Union[Table, _Mapping]] = ..., gaps: _Optional[_Union[Table, _Mapping]] = ..., gap_count: _Optional[int] = ...) -> None: ...

class NvtxGpuRequest(_message.Message):
    __slots__ = ("window", "limit")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    window: Window
    limit: int
    def __init__(self, window: _Optional[_Union[Window, _Mapping]] = ..., limit: _Optional[int] = ...) -> None: ...

class NvtxGpuResponse(_message.Message):
    __slots__ = ("summary", "ranges")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    summary: Table
    ranges: Table
    def __init__(self, summary: _Optional[_Union[Table, _Mapping]] = ..., ranges: _Optional[_Union[Table, _Mapping]] = ...) -> None: ...

class PhasesRequest(_message.Message):
    __slots__ = ("window",)
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    window: Window
    def __init__(self, window: _Optional[_Union[Window, _Mapping]] = ...) -> None: ...

class LaunchRequest(_message.Message):
    __slots__ = ("window", "short_ns")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    SHORT_NS_FIELD_NUMBER: _ClassVar[int]
    window: Window
    short_ns: int
    def __init__(self, window: _Optional[_Union[Window, _Mapping]] = ..., short_ns: _Optional[int] = ...) -> None: ...

class LaunchResponse(_message.Message):
    __slots__ = ("latency", "short_kernels", "idle_after_sync")
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    SHORT_KERNELS_FIELD_NUMBER: _ClassVar[int]
    IDLE_AFTER_SYNC_FIELD_NUMBER: _ClassVar[int]
    latency: Table
    short_kernels: Table
    idle_after_sync: Table
    def __init__(self, latency: _Optional[_Union[Table, _Mapping]] = ..., short_kernels: _Optional[_Union[Table, _Mapping]] = ..., idle_after_sync: _Optional[_Union[Table, _Mapping]] = ...) -> None: ...

class DiffRequest(_message.Message):
    __slots__ = ("run_a", "run_b", "summaries", "limit")
    RUN_A_FIELD_NUMBER: _ClassVar[int]
    RUN_B_FIELD_NUMBER: _ClassVar[int]
    SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    run_a: str
    run_b: str
    summaries: _containers.RepeatedScalarFieldContainer[str]
    limit: int
    def __init__(self, run_a: _Optional[str] = ..., run_b: _Optional[str] = ..., summaries: _Optional[_Iterable[str]] = ..., limit: _Optional[int] = ...) -> None: ...

class CompareRequest(_message.Message):
    __slots__ = ("run_ids", "tags", "top_kernels")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    TOP_KERNELS_FIELD_NUMBER: _ClassVar[int]
    run_ids: _containers.RepeatedScalarFieldContainer[str]
    tags: _containers.ScalarMap[str, str]
    top_kernels: int
    def __init__(self, run_ids: _Optional[_Iterable[str]] = ..., tags: _Optional[_Mapping[str, str]] = ..., top_kernels: _Optional[int] = ...) -> None: ...

class RunGroup(_message.Message):
    __slots__ = ("run_ids", "tags")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    run_ids: _containers.RepeatedScalarFieldContainer[str]
    tags: _containers.ScalarMap[str, str]
    def __init__(self, run_ids: _Optional[_Iterable[str]] = ..., tags: _Optional[_Mapping[str, str]] = ...) -> None: ...

class VerdictRequest(_message.Message):
    __slots__ = ("a", "b", "measures", "skip", "step_pattern", "window_ns", "min_effect")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    MEASURES_FIELD_NUMBER: _ClassVar[int]
    SKIP_FIELD_NUMBER: _ClassVar[int]
    STEP_PATTERN_FIELD_NUMBER: _ClassVar[int]
    WINDOW_NS_FIELD_NUMBER: _ClassVar[int]
    MIN_EFFECT_FIELD_NUMBER: _ClassVar[int]
    a: RunGroup
    b: RunGroup
    measures: _containers.RepeatedScalarFieldContainer[str]
    skip: int
    step_pattern: str
    window_ns: int
    min_effect: float
    def __init__(self, a: _Optional[_Union[RunGroup, _Mapping]] = ..., b: _Optional[_Union[RunGroup, _Mapping]] = ..., measures: _Optional[_Iterable[str]] = ..., skip: _Optional[int] = ..., step_pattern: _Optional[str] = ..., window_ns: _Optional[int] = ..., min_effect: _Optional[float] = ...) -> None: ...

class VerdictResponse(_message.Message):
    __slots__ = ("measures", "parts", "runs", "phases", "notes", "phase_work")
    MEASURES_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    PHASE_WORK_FIELD_NUMBER: _ClassVar[int]
    measures: Table
    parts: Table
    runs: Table
    phases: Table
    notes: _containers.RepeatedScalarFieldContainer[str]
    phase_work: Table
    def __init__(self, measures: _Optional[_Union[Table, _Mapping]] = ..., parts: _Optional[_Union[Table, _Mapping]] = ..., runs: _Optional[_Union[Table, _Mapping]] = ..., phases: _Optional[_Union[Table, _Mapping]] = ..., notes: _Optional[_Iterable[str]] = ..., phase_work: _Optional[_Union[Table, _Mapping]] = ...) -> None: ...

class JobRequest(_message.Message):
    __slots__ = ("job", "step_pattern", "step_rows")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_PATTERN_FIELD_NUMBER: _ClassVar[int]
    STEP_ROWS_FIELD_NUMBER: _ClassVar[int]
    job: str
    step_pattern: str
    step_rows: bool
    def __init__(self, job: _Optional[str] = ..., step_pattern: _Optional[str] = ..., step_rows: _Optional[bool] = ...) -> None: ...

class JobResponse(_message.Message):
    __slots__ = ("ranks", "stragglers", "telemetry", "collectives", "steps", "notes", "generation")
    RANKS_FIELD_NUMBER: _ClassVar[int]
    STRAGGLERS_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ranks: Table
    stragglers: Table
    telemetry: Table
    collectives: Table
    steps: Table
    notes: _containers.RepeatedScalarFieldContainer[str]
    generation: str
    def __init__(self, ranks: _Optional[_Union[Table, _Mapping]] = ..., stragglers: _Optional[_Union[Table, _Mapping]] = ..., telemetry: _Optional[_Union[Table, _Mapping]] = ..., collectives: _Optional[_Union[Table, _Mapping]] = ..., steps: _Optional[_Union[Table, _Mapping]] = ..., notes: _Optional[_Iterable[str]] = ..., generation: _Optional[str] = ...) -> None: ...
