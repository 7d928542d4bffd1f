"""The data model's vocabulary and the limits every batch and query is held to."""

from __future__ import annotations

from dataclasses import dataclass

# Kinds of events. A kind not listed here is refused at ingest, so a typo cannot
# create a lane that no query looks at.
EVENT_KINDS: tuple[str, ...] = (
    "kernel",  # GPU kernel execution
    "memcpy",  # GPU memory copy
    "memset",  # GPU memory set
    "cuda_api",  # CUDA runtime or driver API call (host side)
    "sync",  # CUDA synchronization (stream, event, context)
    "nvtx",  # NVTX push/pop or start/end range; marks are instants
    "osrt",  # OS runtime call (pthread, poll, ioctl, ...)
    "cudnn",  # cuDNN API call
    "cublas",  # cuBLAS API call
    "cpu_op",  # framework operator on the CPU (PyTorch profiler)
    "gpu_annotation",  # user annotation projected on a GPU (PyTorch profiler)
    "python",  # Python function (PyTorch profiler with stack)
    "phase",  # a phase of a training script (tracehouse's own API)
    "step",  # a training step
    "mark",  # an instant marker
    "process",  # a process: named, or seen on a GPU (an instant when it appears and when it is gone)
    "thread",  # a thread's name (an instant)
)

RUN_SOURCES: tuple[str, ...] = ("agent", "nsys", "kineto", "user")

NO_GPU = -1  # gpu column value for rows not tied to one GPU
NO_STREAM = -1


@dataclass(frozen=True)
class Limits:
    """Bounds on what one request may carry or ask for; every one is checked at the edge."""

    max_batch_bytes: int = 64 << 20  # encoded size of one WriteRequest
    max_rows_per_table: int = 1 << 20  # rows of samples or events in one batch
    max_runs_per_batch: int = 10_000
    max_devices_per_batch: int = 10_000
    max_dictionary_entries: int = 1 << 20
    max_string_bytes: int = 64 << 10  # one string (a demangled kernel name can be long)
    max_name_bytes: int = 256  # host, metric, kind, map keys
    max_id_bytes: int = 128  # batch_id, run_id
    max_map_entries: int = 256  # tags or attrs of one run or device
    max_gpu_index: int = 4095
    max_points: int = 100_000  # buckets per series
    default_points: int = 1000
    max_page_size: int = 100_000  # events per page
    default_page_size: int = 1000
    max_list_rows: int = 100_000  # runs, devices, metrics per answer
    sql_max_rows: int = 1_000_000
    sql_max_bytes: int = 128 << 20  # uncompressed result of one SQL query
    max_months_per_batch: int = 100  # the store partitions samples and events by month
    sql_max_seconds: float = 30.0
    sql_max_memory_bytes: int = 4 << 30


DEFAULT_LIMITS = Limits()
