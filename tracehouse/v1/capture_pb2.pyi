from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CaptureStateRequest(_message.Message):
    __slots__ = ("request_id", "run_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    run_id: str
    def __init__(self, request_id: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class CaptureRequest(_message.Message):
    __slots__ = ("run_id", "steps", "seconds", "ranks", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    steps: int
    seconds: float
    ranks: _containers.RepeatedScalarFieldContainer[int]
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., steps: _Optional[int] = ..., seconds: _Optional[float] = ..., ranks: _Optional[_Iterable[int]] = ..., reason: _Optional[str] = ...) -> None: ...

class CapturePoll(_message.Message):
    __slots__ = ("run_id", "session", "rank", "step")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    session: str
    rank: int
    step: int
    def __init__(self, run_id: _Optional[str] = ..., session: _Optional[str] = ..., rank: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class CaptureOrder(_message.Message):
    __slots__ = ("request_id", "first_step", "steps", "seconds")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    first_step: int
    steps: int
    seconds: float
    def __init__(self, request_id: _Optional[str] = ..., first_step: _Optional[int] = ..., steps: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class CaptureOrders(_message.Message):
    __slots__ = ("orders",)
    ORDERS_FIELD_NUMBER: _ClassVar[int]
    orders: _containers.RepeatedCompositeFieldContainer[CaptureOrder]
    def __init__(self, orders: _Optional[_Iterable[_Union[CaptureOrder, _Mapping]]] = ...) -> None: ...

class CaptureReport(_message.Message):
    __slots__ = ("request_id", "run_id", "session", "rank", "host", "state", "first_step", "last_step", "trace_bytes", "events", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_FIELD_NUMBER: _ClassVar[int]
    TRACE_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    run_id: str
    session: str
    rank: int
    host: str
    state: str
    first_step: int
    last_step: int
    trace_bytes: int
    events: int
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., run_id: _Optional[str] = ..., session: _Optional[str] = ..., rank: _Optional[int] = ..., host: _Optional[str] = ..., state: _Optional[str] = ..., first_step: _Optional[int] = ..., last_step: _Optional[int] = ..., trace_bytes: _Optional[int] = ..., events: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class CaptureReportResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CaptureListRequest(_message.Message):
    __slots__ = ("run_id", "limit")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    limit: int
    def __init__(self, run_id: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class CaptureOutcome(_message.Message):
    __slots__ = ("session", "rank", "host", "state", "at_ns", "first_step", "last_step", "trace_bytes", "events", "reason", "comparison")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    AT_NS_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_FIELD_NUMBER: _ClassVar[int]
    TRACE_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COMPARISON_FIELD_NUMBER: _ClassVar[int]
    session: str
    rank: int
    host: str
    state: str
    at_ns: int
    first_step: int
    last_step: int
    trace_bytes: int
    events: int
    reason: str
    comparison: str
    def __init__(self, session: _Optional[str] = ..., rank: _Optional[int] = ..., host: _Optional[str] = ..., state: _Optional[str] = ..., at_ns: _Optional[int] = ..., first_step: _Optional[int] = ..., last_step: _Optional[int] = ..., trace_bytes: _Optional[int] = ..., events: _Optional[int] = ..., reason: _Optional[str] = ..., comparison: _Optional[str] = ...) -> None: ...

class CaptureState(_message.Message):
    __slots__ = ("request_id", "run_id", "requested_ns", "requested_by", "reason", "first_step", "steps", "seconds", "ranks", "state", "outcomes")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_NS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    run_id: str
    requested_ns: int
    requested_by: str
    reason: str
    first_step: int
    steps: int
    seconds: float
    ranks: _containers.RepeatedScalarFieldContainer[int]
    state: str
    outcomes: _containers.RepeatedCompositeFieldContainer[CaptureOutcome]
    def __init__(self, request_id: _Optional[str] = ..., run_id: _Optional[str] = ..., requested_ns: _Optional[int] = ..., requested_by: _Optional[str] = ..., reason: _Optional[str] = ..., first_step: _Optional[int] = ..., steps: _Optional[int] = ..., seconds: _Optional[float] = ..., ranks: _Optional[_Iterable[int]] = ..., state: _Optional[str] = ..., outcomes: _Optional[_Iterable[_Union[CaptureOutcome, _Mapping]]] = ...) -> None: ...

class CaptureList(_message.Message):
    __slots__ = ("captures",)
    CAPTURES_FIELD_NUMBER: _ClassVar[int]
    captures: _containers.RepeatedCompositeFieldContainer[CaptureState]
    def __init__(self, captures: _Optional[_Iterable[_Union[CaptureState, _Mapping]]] = ...) -> None: ...
