from tracehouse.v1 import batch_pb2 as _batch_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WriteRequest(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: _batch_pb2.Batch
    def __init__(self, batch: _Optional[_Union[_batch_pb2.Batch, _Mapping]] = ...) -> None: ...

class WriteResponse(_message.Message):
    __slots__ = ("duplicate", "samples", "events", "runs", "devices", "capture_waiting", "server_received_ns", "server_time_ns")
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_WAITING_FIELD_NUMBER: _ClassVar[int]
    SERVER_RECEIVED_NS_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    samples: int
    events: int
    runs: int
    devices: int
    capture_waiting: bool
    server_received_ns: int
    server_time_ns: int
    def __init__(self, duplicate: _Optional[bool] = ..., samples: _Optional[int] = ..., events: _Optional[int] = ..., runs: _Optional[int] = ..., devices: _Optional[int] = ..., capture_waiting: _Optional[bool] = ..., server_received_ns: _Optional[int] = ..., server_time_ns: _Optional[int] = ...) -> None: ...
