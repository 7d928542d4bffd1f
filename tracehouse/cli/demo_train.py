"""`tracehouse demo-train`: a real workload. A small PyTorch training loop (on the GPU where
there is one, else the CPU) instrumented with tracehouse's training API and the PyTorch
profiler, which then imports its own profiler trace: a run, its steps, phases and scalars,
and the kernels and operators of a few profiled steps, end to end.

Steps and phases come from tracehouse's API only: the loop uses no `record_function` ranges and
the profiler no schedule (whose `ProfilerStep#N` ranges become steps too), so that each step and
phase is one range on the timeline, beside the operators and kernels the profiler records. When
the server does not answer (the run's records only went to the spool), the trace is not imported.

torch is an optional dependency (`pip install 'tracehouse[torch]'`); without it, this module
still imports, and `train` raises TorchMissing.
"""

from __future__ import annotations

import importlib.util
import socket
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tracehouse
from tracehouse.channel import ClientSecurity

BATCH = 256
FEATURES = 256
HIDDEN = 1024
CLASSES = 10
LOADER_SECONDS = 0.005  # a dataloader that waits on storage a little, so that its phase shows
PROFILED_STEPS = 3  # the profiler records this many steps, after one of warm-up


class TorchMissing(RuntimeError):
    def __init__(self) -> None:
        from tracehouse.cli.up import torch_hint

        super().__init__(f"demo-train needs PyTorch: {torch_hint()}")


def torch_available() -> bool:
    """Whether torch can be imported, without importing it."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def train(
    steps: int = 30,
    server: str | None = None,
    security: ClientSecurity | None = None,
    trace_dir: Path | None = None,
    host: str | None = None,
    batch: int = BATCH,
    tags: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Train for `steps` steps, profile a few of them, import the trace; returns what was
    recorded: the run id, the device, the trace (its path when kept in `trace_dir`, else only its
    file name: the file is gone) and the import's result (or why there is none)."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as error:
        raise TorchMissing() from error

    host = host or socket.gethostname()
    if security is None:
        from tracehouse.channel import client_security

        security = client_security()  # the TRACEHOUSE_* variables, for the run and the import alike
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    teacher = torch.nn.Linear(FEATURES, CLASSES).to(device)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, CLASSES),
    ).to(device)  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    decay = torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, steps // 3), gamma=0.5)
    loss_of = torch.nn.CrossEntropyLoss()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    first = 1 if steps > PROFILED_STEPS else 0  # one step of warm-up
    last = min(steps, first + PROFILED_STEPS) - 1
    profiler = profile(activities=activities)

    with tempfile.TemporaryDirectory(prefix="tracehouse-demo-train-") as scratch:
        folder = trace_dir or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / f"demo-train-{time.time_ns()}.pt.trace.json.gz"
        run_tags = {"demo": "true", "device": device, "model": "mlp", "batch": str(batch), **(tags or {})}
        with tracehouse.run("demo-train", tags=run_tags, server=server, security=security, host=host) as run:
            profiling = False
            try:
                for i in range(steps):
                    if i == first:
                        profiler.start()
                        profiling = True
                    started = time.perf_counter()
                    tracehouse.step(i)
                    with tracehouse.phase("dataloader"):
                        time.sleep(LOADER_SECONDS)
                        x = torch.randn(batch, FEATURES, device=device)
                        y = teacher(x).argmax(dim=1)
                    with tracehouse.phase("forward"):
                        loss = loss_of(model(x), y)
                    with tracehouse.phase("backward"):
                        optimizer.zero_grad(set_to_none=True)
                        loss.backward()
                    with tracehouse.phase("optimizer"):
                        optimizer.step()
                        decay.step()
                    tracehouse.scalar("loss", loss.detach())  # read on tracehouse's thread: no sync here
                    tracehouse.scalar("lr", optimizer.param_groups[0]["lr"])
                    tracehouse.scalar("samples_per_s", batch / (time.perf_counter() - started))
                    if i == last:
                        profiler.stop()
                        profiling = False
            finally:
                if profiling:  # an error ended the loop
                    profiler.stop()
        profiler.export_chrome_trace(str(trace))
        recorded = run.report()
        result: dict[str, Any] = {"run_id": run.run_id, "device": device, "steps": recorded["steps"],
                                  "trace": str(trace) if trace_dir else trace.name, "import": None}  # fmt: skip
        if recorded["spooled_batches"]:
            result["spooled_batches"] = recorded["spooled_batches"]
        if recorded["spooled_batches"] and not recorded["stored_batches"]:
            result["import_error"] = "the server did not answer; the run waits in the spool, the trace was not imported"
            return result
        try:
            result["import"] = import_trace(trace, run.server, security, host, run.run_id)
        except Exception as error:
            result["import_error"] = str(error)
    return result


def import_trace(path: Path, server: str, security: ClientSecurity | None, host: str, run_id: str) -> dict[str, Any]:
    """Import the profiler's trace into its own run (source kineto), named after the run that
    made it and tagged with its id; returns the importer's result."""
    from agent.shipping.writer import BatchWriter
    from agent.traces.importer import import_export

    writer = BatchWriter(server, security)
    try:
        imported = import_export(path, writer, run_name="demo-train profile", host=host,
                                 tags={"demo": "true", "training_run": run_id})  # fmt: skip
    finally:
        writer.close()
    return dict(imported.__dict__)
