"""tracehouse: GPU telemetry and Nsight Systems traces on one timeline, in ClickHouse.

The modules directly in this package are the kernel that every part shares, and they import
none of the parts (agent/, store/, ingest/, query/, ui/): the generated wire protocol (`tracehouse.v1`),
batch encoding, the channel, the data model's vocabulary, metric names and limits, ids, time,
config, tokens and TLS material. `tracehouse.cli` and `tracehouse.bench` are the composition
root: the command line, the server wiring and the benchmarks, the only code that imports every
part. Here too is the face of the API for training code (`tracehouse.run`, `step`, `phase`,
`scalar`), whose implementation (agent.training) is imported on first use.
"""

__version__ = "0.1.0"

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.training import Run, current, phase, run, scalar, step

# The training API (agent.training), imported on first use: `import tracehouse` stays
# light (no grpc, no torch) for training scripts and free of import cycles.
_TRAINING = ("Run", "current", "phase", "run", "scalar", "step")


def __getattr__(name: str) -> Any:
    if name in _TRAINING:
        from agent import training

        value = getattr(training, name)
        globals()[name] = value  # found directly from now on
        return value
    raise AttributeError(f"module 'tracehouse' has no attribute {name!r}")


__all__ = ["Run", "__version__", "current", "phase", "run", "scalar", "step"]
