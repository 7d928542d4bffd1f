"""`tracehouse up --demo`: two small Nsight-style runs of a training loop, imported through
the real importer, and the simulated telemetry of the host's GPUs during them, so that every
page of the UI has something to show on a machine without a GPU. Each run's trace profiles
the host's simulated GPU 0 (the same UUID and name as its telemetry): one GPU per run, and
the host's GPUs are those it samples."""

from __future__ import annotations

import tempfile
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from agent.shipping.writer import BatchWriter
from agent.telemetry.simulated import SimulatedBackend
from agent.traces.importer import ImportResult, import_export
from agent.traces.nsys_synthetic import Gpu, Spec, write_export
from tracehouse.batch import BatchBuilder
from tracehouse.channel import ClientSecurity
from tracehouse.timefmt import NS_PER_S
from tracehouse.v1 import batch_pb2

STEPS = 60  # about 0.6 s each once dilated: a run of about 40 s
TIME_SCALE = 1000
RUNS = (  # name, spec, seconds before now that the run ends
    ("demo baseline", Spec(steps=STEPS, kernels_per_step=8, seed=7, time_scale=TIME_SCALE), 55),
    ("demo tuned", Spec(steps=STEPS, kernels_per_step=6, seed=8, time_scale=TIME_SCALE), 5),
)
RUN_SPAN_S = 45
TELEMETRY_HZ = 10


def load_demo(
    server: str, host: str, now_ns: int, gpus: int = 2, security: ClientSecurity | None = None
) -> list[ImportResult]:
    """Import the demo runs ending before `now_ns`, and telemetry from their start to now."""
    writer = BatchWriter(server, security)
    results = []
    profiled = traced_gpu(gpus)
    try:
        with tempfile.TemporaryDirectory(prefix="tracehouse-demo-") as folder:
            for name, spec, ends_before_s in RUNS:
                start = now_ns - (ends_before_s + RUN_SPAN_S) * NS_PER_S
                path = Path(folder) / f"{name.replace(' ', '-')}.sqlite"
                write_export(path, replace(spec, start_ns=start, gpu=profiled))
                results.append(import_export(path, writer, run_name=name, host=host, tags={"demo": "true"}))
        first = now_ns - (max(before for *_, before in RUNS) + RUN_SPAN_S + 5) * NS_PER_S
        writer.write(telemetry(host, first, now_ns, gpus))
        writer.flush()
    finally:
        writer.close()
    return results


def traced_gpu(gpus: int) -> Gpu:
    """The simulated GPU 0 as a trace describes it."""
    device = SimulatedBackend(max(1, gpus)).devices()[0]
    return Gpu(
        name=device.name, uuid=device.uuid, bus=device.pci_bus_id, memory=device.memory_total,
        sm_count=device.sm_count, chip="GH100", compute=(9, 0),
    )  # fmt: skip


def telemetry(host: str, start_ns: int, end_ns: int, gpus: int) -> batch_pb2.Batch:
    """The simulated GPUs' fast readings over [start, end) at TELEMETRY_HZ, as one batch."""
    instants = np.arange(start_ns, end_ns, NS_PER_S // TELEMETRY_HZ, dtype=np.int64)
    now = [0.0]
    backend = SimulatedBackend(gpus, clock=lambda: now[0], started=start_ns / NS_PER_S)
    builder = BatchBuilder(f"demo-telemetry/{host}/{start_ns}", run_id=f"demo-telemetry-{start_ns}", host=host)
    for gpu in range(gpus):
        values: dict[str, list[float]] = defaultdict(list)
        for instant in instants:
            now[0] = instant / NS_PER_S
            for metric, value in backend.read_fast(gpu).items():
                values[metric].append(value)
        for metric, series in values.items():
            builder.add_samples(metric, instants, series, gpu=gpu)
    return builder.build()
