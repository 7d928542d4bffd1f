"""Runs, steps, phases and scalars from training code, on the timeline beside the GPUs.

```python
import tracehouse

with tracehouse.run("resnet50-bs256", tags={"lr": "0.1"}):
    for i, batch in enumerate(loader):
        tracehouse.step(i)
        with tracehouse.phase("forward"):
            loss = model(batch)
        tracehouse.scalar("loss", loss)
```

A run is a row of `runs` (source `user`, with host, pid, command line and the caller's tags);
each step is an event of kind `step` (named `step`, its number in the extras, from one
`step()` call to the next, or to the end of `with step(i):`), each phase an event of kind
`phase` (its nesting depth on its thread in `depth`), each scalar a sample of the run's
host (gpu -1, this process's pid) named as given.

The caller's thread only appends a tuple to a bounded deque (a full one drops the record and
counts it) and never raises: a failure is logged once and the call returns. A daemon thread
turns the records into batches (the agent's Batcher) that the agent's Shipper sends, with a
disk Spool of the run's own (`$TRACEHOUSE_HOME/spool/runs/RUN_ID.SESSION`, which also names
the server it is for) while the server is away. Batch ids are `RUN_ID/SESSION/SEQUENCE`, the
session (`STARTHEX.PID`) telling apart processes given one `run_id`. At the end of a run, open
phases and the open step end with it, and what is still pending gets one try of up to
`end_timeout` seconds, which a failed send ends early; what remains stays in the spool: the
next run on this machine aimed at the same server sends it, and so does the host's agent
(`tracehouse agent`, every 30 s).

Times are the run's start on the wall clock plus the monotonic clock since then: a wall
clock set back during a run never makes an event end before it starts.

Importing this package imports neither grpc nor torch; a run imports grpc when it starts, and
torch only for NVTX (`nvtx=True`, or by default when the caller has imported torch and CUDA
is available), so that phases and steps also show up in Nsight Systems profiles.

The package: `recorder` (Run: its start, the caller's side, its end), `worker` (its thread:
batches and shipping), `current_run` (the current run, and `current`/`step`/`phase`/`scalar`
on it), `phases` (the context managers of phase and step), `records` (limits, record tags,
ids, event columns), `torch_support` (tensor values, NVTX).
"""

from agent.training.current_run import current, phase, scalar, step
from agent.training.recorder import Run
from agent.training.records import (
    BATCH_EVENTS,
    BUFFER_RECORDS,
    CALL_TIMEOUT_S,
    DRAIN_INTERVAL_S,
    END_TIMEOUT_S,
    FLUSH_INTERVAL_S,
    MAX_ID_BYTES,
    MAX_NAME_BYTES,
    MAX_TEXT_BYTES,
    STEP_NAME,
    STEP_STARTS_KEPT,
)

run = Run  # `tracehouse.run(...)`: a run is started by creating it

__all__ = [
    "BATCH_EVENTS",
    "BUFFER_RECORDS",
    "CALL_TIMEOUT_S",
    "DRAIN_INTERVAL_S",
    "END_TIMEOUT_S",
    "FLUSH_INTERVAL_S",
    "MAX_ID_BYTES",
    "MAX_NAME_BYTES",
    "MAX_TEXT_BYTES",
    "STEP_NAME",
    "STEP_STARTS_KEPT",
    "Run",
    "current",
    "phase",
    "run",
    "scalar",
    "step",
]
