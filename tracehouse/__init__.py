"""tracehouse: GPU telemetry and Nsight Systems traces on one timeline, in ClickHouse.

This package holds what the agent, ingest and query parts share: the generated wire
protocol (`tracehouse.v1`), the data model's vocabulary and limits, time helpers, the
batch encoder, the server wiring and the CLI; and the API for training code
(`tracehouse.run`, `step`, `phase`, `scalar`: tracehouse.training).
"""

__version__ = "0.1.0"

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracehouse.training import Run, current, phase, run, scalar, step

# The training API (tracehouse.training), imported on first use: `import tracehouse` stays
# light (no grpc, no torch) for training scripts and free of import cycles.
_TRAINING = ("Run", "current", "phase", "run", "scalar", "step")


def __getattr__(name: str) -> Any:
    if name in _TRAINING:
        from tracehouse import training

        value = getattr(training, name)
        globals()[name] = value  # found directly from now on
        return value
    raise AttributeError(f"module 'tracehouse' has no attribute {name!r}")


__all__ = ["Run", "__version__", "current", "phase", "run", "scalar", "step"]
