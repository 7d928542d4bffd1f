from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Batch(_message.Message):
    __slots__ = ("batch_id", "run_id", "host", "dictionary", "samples", "events", "runs", "devices")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    DICTIONARY_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    run_id: str
    host: str
    dictionary: _containers.RepeatedScalarFieldContainer[str]
    samples: SampleColumns
    events: EventColumns
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    def __init__(self, batch_id: _Optional[str] = ..., run_id: _Optional[str] = ..., host: _Optional[str] = ..., dictionary: _Optional[_Iterable[str]] = ..., samples: _Optional[_Union[SampleColumns, _Mapping]] = ..., events: _Optional[_Union[EventColumns, _Mapping]] = ..., runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ...) -> None: ...

class SampleColumns(_message.Message):
    __slots__ = ("ts", "metric", "value", "gpu", "run", "host", "pid")
    TS_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ts: _containers.RepeatedScalarFieldContainer[int]
    metric: _containers.RepeatedScalarFieldContainer[int]
    value: _containers.RepeatedScalarFieldContainer[float]
    gpu: _containers.RepeatedScalarFieldContainer[int]
    run: _containers.RepeatedScalarFieldContainer[int]
    host: _containers.RepeatedScalarFieldContainer[int]
    pid: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ts: _Optional[_Iterable[int]] = ..., metric: _Optional[_Iterable[int]] = ..., value: _Optional[_Iterable[float]] = ..., gpu: _Optional[_Iterable[int]] = ..., run: _Optional[_Iterable[int]] = ..., host: _Optional[_Iterable[int]] = ..., pid: _Optional[_Iterable[int]] = ...) -> None: ...

class EventColumns(_message.Message):
    __slots__ = ("kind", "start", "end", "name", "gpu", "stream", "pid", "tid", "correlation_id", "bytes", "depth", "run", "host", "extra_row", "extra_key", "extra_value", "id", "launch_start")
    KIND_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    EXTRA_ROW_FIELD_NUMBER: _ClassVar[int]
    EXTRA_KEY_FIELD_NUMBER: _ClassVar[int]
    EXTRA_VALUE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_START_FIELD_NUMBER: _ClassVar[int]
    kind: _containers.RepeatedScalarFieldContainer[int]
    start: _containers.RepeatedScalarFieldContainer[int]
    end: _containers.RepeatedScalarFieldContainer[int]
    name: _containers.RepeatedScalarFieldContainer[int]
    gpu: _containers.RepeatedScalarFieldContainer[int]
    stream: _containers.RepeatedScalarFieldContainer[int]
    pid: _containers.RepeatedScalarFieldContainer[int]
    tid: _containers.RepeatedScalarFieldContainer[int]
    correlation_id: _containers.RepeatedScalarFieldContainer[int]
    bytes: _containers.RepeatedScalarFieldContainer[int]
    depth: _containers.RepeatedScalarFieldContainer[int]
    run: _containers.RepeatedScalarFieldContainer[int]
    host: _containers.RepeatedScalarFieldContainer[int]
    extra_row: _containers.RepeatedScalarFieldContainer[int]
    extra_key: _containers.RepeatedScalarFieldContainer[int]
    extra_value: _containers.RepeatedScalarFieldContainer[int]
    id: _containers.RepeatedScalarFieldContainer[int]
    launch_start: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, kind: _Optional[_Iterable[int]] = ..., start: _Optional[_Iterable[int]] = ..., end: _Optional[_Iterable[int]] = ..., name: _Optional[_Iterable[int]] = ..., gpu: _Optional[_Iterable[int]] = ..., stream: _Optional[_Iterable[int]] = ..., pid: _Optional[_Iterable[int]] = ..., tid: _Optional[_Iterable[int]] = ..., correlation_id: _Optional[_Iterable[int]] = ..., bytes: _Optional[_Iterable[int]] = ..., depth: _Optional[_Iterable[int]] = ..., run: _Optional[_Iterable[int]] = ..., host: _Optional[_Iterable[int]] = ..., extra_row: _Optional[_Iterable[int]] = ..., extra_key: _Optional[_Iterable[int]] = ..., extra_value: _Optional[_Iterable[int]] = ..., id: _Optional[_Iterable[int]] = ..., launch_start: _Optional[_Iterable[int]] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("run_id", "name", "host", "source", "start", "end", "relative_time", "tags", "attrs", "importing")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    RELATIVE_TIME_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    IMPORTING_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    name: str
    host: str
    source: str
    start: int
    end: int
    relative_time: bool
    tags: _containers.ScalarMap[str, str]
    attrs: _containers.ScalarMap[str, str]
    importing: bool
    def __init__(self, run_id: _Optional[str] = ..., name: _Optional[str] = ..., host: _Optional[str] = ..., source: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., relative_time: _Optional[bool] = ..., tags: _Optional[_Mapping[str, str]] = ..., attrs: _Optional[_Mapping[str, str]] = ..., importing: _Optional[bool] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("host", "gpu", "uuid", "name", "memory_total", "sm_count", "driver", "pci_bus_id", "run_id", "attrs")
    class AttrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SM_COUNT_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    host: str
    gpu: int
    uuid: str
    name: str
    memory_total: int
    sm_count: int
    driver: str
    pci_bus_id: str
    run_id: str
    attrs: _containers.ScalarMap[str, str]
    def __init__(self, host: _Optional[str] = ..., gpu: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., memory_total: _Optional[int] = ..., sm_count: _Optional[int] = ..., driver: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., run_id: _Optional[str] = ..., attrs: _Optional[_Mapping[str, str]] = ...) -> None: ...
