"""Collects the sampler's readings and closes a batch by size or by age.

Batch ids are `RUN_ID/SEQUENCE` (or `PREFIX/SEQUENCE`): fixed when the batch is closed, so
a batch re-sent after any failure, from memory or from the spool, is stored once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.shipping.spool import EncodedBatch
from agent.telemetry.gpu import DeviceInfo, describe_device
from tracehouse.batch import BatchBuilder, encode_request


class Batcher:
    def __init__(
        self,
        run_id: str,
        host: str,
        emit: Callable[[EncodedBatch], None],
        max_values: int = 50_000,
        max_age: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
        batch_prefix: str | None = None,
    ) -> None:
        """batch_prefix: instead of the run id before the sequence number in batch ids, where one
        run id may be used by several producers (each needs ids of its own)."""
        self.run_id = run_id
        self.batch_prefix = batch_prefix or run_id
        self.host = host
        self._emit = emit
        self._max_values = max_values
        self._max_age = max_age
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._sequence = 0
        self._reset()

    def _reset(self) -> None:
        self._ts: list[int] = []
        self._metric: list[str] = []
        self._value: list[float] = []
        self._gpu: list[int] = []
        self._pid: list[int] = []
        self._events: list[dict[str, Any]] = []
        self._event_columns: list[tuple[Any, ...]] = []
        self._runs: list[dict[str, Any]] = []
        self._devices: list[DeviceInfo] = []
        self._opened = self._monotonic()

    def add(self, ts: int, gpu: int, values: Mapping[str, float], pid: int = 0) -> None:
        """Readings of one GPU (or the host: gpu -1) at one instant."""
        with self._lock:
            count = len(values)
            self._ts.extend([ts] * count)
            self._gpu.extend([gpu] * count)
            self._pid.extend([pid] * count)
            self._metric.extend(values)
            self._value.extend(values.values())
            full = len(self._ts) >= self._max_values
        if full:
            self.flush()

    def add_event(self, **event: Any) -> None:
        """kind, start, end, name, and optional event columns or extras."""
        with self._lock:
            self._events.append(event)

    def add_events(
        self,
        kind: str | Sequence[str],
        start: Sequence[int],
        end: Sequence[int],
        name: str | Sequence[str],
        extras: Sequence[Mapping[str, str]] | None = None,
        **optional: int | Sequence[int],
    ) -> None:
        """Many events as columns (BatchBuilder.add_events' arguments): one call per column
        rather than per row, for producers of many small events."""
        with self._lock:
            self._event_columns.append((kind, start, end, name, extras, optional))

    def describe_run(self, **run: Any) -> None:
        with self._lock:
            self._runs.append(run)

    def describe_devices(self, devices: list[DeviceInfo]) -> None:
        with self._lock:
            self._devices.extend(devices)

    def due(self) -> bool:
        return self._monotonic() - self._opened >= self._max_age

    def flush(self) -> EncodedBatch | None:
        """Close the open batch and hand it on; None when it was empty."""
        with self._lock:
            if not (self._ts or self._events or self._event_columns or self._runs or self._devices):
                self._opened = self._monotonic()
                return None
            self._sequence += 1
            builder = BatchBuilder(f"{self.batch_prefix}/{self._sequence:08d}", run_id=self.run_id, host=self.host)
            values = len(self._ts)
            if values:
                builder.add_samples(self._metric, self._ts, self._value, gpu=self._gpu, pid=self._pid)
            for event in self._events:
                extras = event.pop("extras", None)
                builder.add_events(
                    event.pop("kind"),
                    [event.pop("start")],
                    [event.pop("end")],
                    event.pop("name"),
                    extras=[extras] if extras else None,
                    **event,
                )
            for kind, start, end, name, extras, optional in self._event_columns:
                builder.add_events(kind, start, end, name, extras=extras, **optional)
            for run in self._runs:
                builder.add_run(**run)
            for device in self._devices:
                describe_device(builder, self.host, self.run_id, device)
            batch = builder.build()
            self._reset()
        encoded = EncodedBatch(batch.batch_id, encode_request(batch), values)
        self._emit(encoded)
        return encoded
