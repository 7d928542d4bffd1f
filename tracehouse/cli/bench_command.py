"""`tracehouse bench`: its options; the benches themselves are in tracehouse/bench/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ingest.admission import DEFAULT_MAX_PENDING_BYTES, DEFAULT_TARGET_MS
from ingest.commitpolicy import DEFAULT_MAX_ROWS
from tracehouse.cli.options import _ack_target_ms, _ack_within_ms, _positive, _seconds, _size, _size_text


def _add_bench(commands: Any) -> None:
    bench = commands.add_parser("bench", help="measure a capability against a baseline; prints JSON")
    sub = bench.add_subparsers(dest="what", required=True, metavar="WHAT")
    ingest = sub.add_parser("ingest", help="rows/s through gRPC into the store vs a direct insert")
    ingest.add_argument("--rows", type=_positive, default=4_000_000, help="sample values per round")
    ingest.add_argument("--batch-rows", type=_positive, default=100_000)
    ingest.add_argument("--rounds", type=_positive, default=3)
    ingest.add_argument("--store", default=None, help="store URL (default: a temporary embedded store)")
    ingest.add_argument(
        "--in-flight", type=_positive, default=None, metavar="N",
        help="calls and direct inserts in flight on each path (default: as many as tracehouse import keeps)",
    )  # fmt: skip
    ingest.add_argument(
        "--ack-once-stored", action="store_true",
        help="the server's --ack-once-stored (default: bulk batches answered once claimed)",
    )  # fmt: skip
    nsys = sub.add_parser(
        "import", help="events/s importing an Nsight Systems export vs a sqlite3 scan (--kineto: a PyTorch trace)"
    )
    nsys.add_argument(
        "--events", type=_positive, default=None, help="size of the synthetic file (default 5 M; with --kineto, 1 M)"
    )
    nsys.add_argument("--file", type=Path, default=None, help="a file to import instead of a synthetic one")
    nsys.add_argument(
        "--kineto", action="store_true", help="a PyTorch-profiler trace (JSON), against a plain json.load of it"
    )
    nsys.add_argument(
        "--rounds", type=_positive, default=3,
        help="imports on stores of their own, each against its own floor: the median round's (default %(default)s)",
    )  # fmt: skip
    query = sub.add_parser("query", help="latency of the analyses on one big synthetic run")
    query.add_argument("--kernels", type=_positive, default=10_000_000, help="kernels (and as many API calls)")
    query.add_argument("--ranges", type=_positive, default=1_000_000, help="NVTX ranges")
    query.add_argument("--samples", type=_positive, default=100_000_000, help="NVML samples")
    agent = sub.add_parser("agent", help="the agent's CPU share of one core, simulated GPUs at 10 Hz")
    agent.add_argument("--gpus", type=_positive, default=8)
    agent.add_argument("--interval", type=_seconds, default=0.1)
    agent.add_argument("--seconds", type=_seconds, default=30.0)
    storage = sub.add_parser("storage", help="bytes on disk per sample value and per event vs Parquet")
    storage.add_argument("--gpus", type=_positive, default=8, help="simulated GPUs (default %(default)s)")
    storage.add_argument("--minutes", type=_seconds, default=60.0, help="of telemetry at 10 Hz (default %(default)s)")
    storage.add_argument("--steps", type=_positive, default=10_000, help="training steps of the synthetic trace")
    export = sub.add_parser("export", help="writing a run as a Perfetto trace and Chrome JSON vs fetching it")
    export.add_argument("--steps", type=_positive, default=2_000, help="of the synthetic trace (default %(default)s)")
    train = sub.add_parser("train", help="ns per step()/phase()/scalar() call of the training API, server up and down")
    train.add_argument(
        "--calls", type=_positive, default=100_000, help="calls per round, at most 262144 (default %(default)s)"
    )
    train.add_argument("--rounds", type=_positive, default=5, help="(default %(default)s)")
    load = sub.add_parser("load", help="many simulated agents against one server: values/s, write latency, memory")
    fleet = load.add_mutually_exclusive_group()
    fleet.add_argument("--agents", type=_positive, default=32, help="real agents in the bench process (default 32)")
    fleet.add_argument(
        "--writers", type=_positive, default=None, help="agents' batches, encoded once and replayed over many channels"
    )
    load.add_argument("--gpus", type=_positive, default=8, help="simulated GPUs per agent or writer")
    load.add_argument(
        "--interval", type=_seconds, default=None, help="--agents: between samples (default 0.1); --writers: between "
        "one writer's batches, each of 10 Hz samples (default 2)",
    )  # fmt: skip
    load.add_argument("--seconds", type=_seconds, default=60.0, help="how long the fleet sends")
    load.add_argument("--channels", type=_positive, default=32, help="--writers: gRPC connections (default 32)")
    load.add_argument(
        "--kill-at", type=_seconds, default=None, metavar="SECONDS",
        help="--writers: kill -9 the server this far into the run, and start it again 5 s later",
    )  # fmt: skip
    load.add_argument(
        "--max-pending-bytes",
        type=_size,
        default=_size_text(DEFAULT_MAX_PENDING_BYTES),
        metavar="SIZE",
        help="the server's bound (default %(default)s)",
    )
    load.add_argument(
        "--ack-target-ms", type=_ack_target_ms, default=DEFAULT_TARGET_MS, metavar="MS",
        help="--writers: the server's --ack-target-ms (default %(default)s)",
    )  # fmt: skip
    load.add_argument(
        "--ack-within-ms", type=_ack_within_ms, default=None, metavar="MS",
        help="--writers: the server's --ack-within-ms (default: the server's)",
    )  # fmt: skip
    load.add_argument(
        "--readers", type=_positive, default=None, metavar="N",
        help="--writers: run them twice, alone and beside N readers asking a filled store for heavy lanes and "
        "event pages; compares the writes' p99",
    )  # fmt: skip
    load.add_argument(
        "--commit-rows", type=_positive, default=DEFAULT_MAX_ROWS, metavar="ROWS",
        help="--writers: the server's --commit-rows (default %(default)s)",
    )  # fmt: skip
    verdict = sub.add_parser("verdict", help="how often verdict is right on runs with a known change, beside baselines")
    verdict.add_argument("--trials", type=_positive, default=200, help="seeded trials per case (default %(default)s)")
    verdict.add_argument(
        "--served-trials", type=_positive, default=100, metavar="N",
        help="trials through a real server, for the parts (default %(default)s)",
    )  # fmt: skip
    job = sub.add_parser("job", help="the job view of 1,024 ranks x 2,000 steps vs the engine's scan of its rows")
    job.add_argument("--ranks", type=_positive, default=1024, help="ranks (default %(default)s)")
    job.add_argument("--steps", type=_positive, default=2000, help="steps of each rank (default %(default)s)")
    job.add_argument("--repeats", type=_positive, default=3, help="timed asks of each (default %(default)s)")
    run = sub.add_parser("run", help="what `tracehouse run` adds to a command: start/end seconds, CPU while it runs")
    run.add_argument(
        "--reps", type=_positive, default=5, help="runs of each kind for the medians (default %(default)s)"
    )
    run.add_argument("--gpus", type=_positive, default=8, help="simulated GPUs its agent samples (default %(default)s)")
    run.add_argument(
        "--seconds", type=_seconds, default=20.0, help="how long the CPU is measured (default %(default)s)"
    )
    run.add_argument(
        "--children", type=_positive, default=16, help="processes in the walked tree (default %(default)s)"
    )
