"""The data model's vocabulary and the limits every batch and query is held to."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

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

# Work that occupies a GPU: what busy time, projections and the GPU lanes count.
GPU_WORK: tuple[str, ...] = ("kernel", "memcpy", "memset")

# A timeline lane, as the Query service answers it and the explorer draws it: GPU work per GPU and
# stream; everything else per kind, process, thread and nesting depth.
LANE_COLUMNS = ("lane", "host", "gpu", "stream", "pid", "tid", "depth")


def lane_of(kind: str) -> str:
    """The lane family of an event kind: `gpu` for GPU work, else the kind itself."""
    return "gpu" if kind in GPU_WORK else kind


# Rollups of `samples`, by the seconds one row sums up.
ROLLUP_SECONDS = {"samples_10s": 10, "samples_1m": 60}

NO_GPU = -1  # gpu column value for rows not tied to one GPU
NO_STREAM = -1

# Times are ns since the Unix epoch, from 1970 (a trace with relative time only starts at 0) to
# 2200-01-01: well inside what the store's DateTime64(9) holds (1900 to 2262).
MAX_TIME_NS = 7_258_118_400 * 10**9
MAX_EVENT_NS = 366 * 86_400 * 10**9  # the longest event: a year (a long training phase)
MAX_EVENT_BYTES = 1 << 50  # the most bytes one event may move (1 PiB)
# Sums of durations are taken exactly (Int128 in the engine) and answered in Int64, saturated here (292 years):
# an answer at it says so.
SUM_CAP_NS = 2**63 - 1
# Below the engine's max_insert_block_size: an insert of at most this many rows is one block, one part. The
# store's group commit joins batches up to it; the commit policy's default row count is it.
INSERT_BLOCK_ROWS = 1_000_000


def half_the_memory() -> int:
    """Half of this machine's physical memory, in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


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
    capture_burst: int = 3  # capture requests one caller may make of one run at once ...
    capture_per_minute: float = 6.0  # ... and then this many a minute
    max_points: int = 100_000  # buckets per series
    default_points: int = 1000
    max_page_size: int = 100_000  # events per page
    default_page_size: int = 1000
    max_list_rows: int = 100_000  # runs, devices, metrics per answer
    max_answer_bytes: int = 32 << 20  # one answer of the Query service, well under the transport's 256 MiB
    # a name a summary or lane answers: longer ones are cut, marked with …; as long as a stored string by default,
    # since real templated kernel names pass 4 KiB and programs need them whole (the answer's bytes stay bounded)
    max_shown_bytes: int = 64 << 10
    sql_max_rows: int = 1_000_000
    sql_max_bytes: int = 128 << 20  # uncompressed result of one SQL query
    max_months_per_batch: int = 100  # the store partitions samples and events by month
    sql_max_seconds: float = 30.0
    sql_max_memory_bytes: int = 4 << 30  # all user SQL together: each query at once gets its share
    sql_max_concurrent: int = 2  # user SQL queries running at once, every caller together
    sql_queue_seconds: float = 2.0  # a further query waits this long for a place, then is refused
    # tracehouse's own reads (the Query service, the keeper, capture rules); writes have clients of their own
    query_max_concurrent: int = 4  # at once, every caller together
    query_queue_seconds: float = 0.5  # a further read waits this long for a place, then is refused
    query_max_seconds: float = 60.0  # one read
    # all of them together, each read at once its share: half this machine's memory (12 GiB of 24: 3 GiB a read),
    # as an NVTX projection of 10 M kernels made from the events, before the run is kept, needs more than 1 GiB
    query_max_memory_bytes: int = field(default_factory=half_the_memory)
    query_max_threads: int = 0  # engine threads one read may use; 0: half this machine's cores


DEFAULT_LIMITS = Limits()
