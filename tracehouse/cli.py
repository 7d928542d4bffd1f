"""The `tracehouse` command."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingest.admission import DEFAULT_MAX_PENDING_BYTES
from tracehouse import __version__, config
from tracehouse.model import DEFAULT_LIMITS, EVENT_KINDS, RUN_SOURCES
from tracehouse.timefmt import parse_time

if TYPE_CHECKING:
    from tracehouse.channel import ClientSecurity
    from tracehouse.children import Signals

EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2

SUMMARY_KINDS = {
    "kernels": "cuda_gpu_kern_sum",
    "api": "cuda_api_sum",
    "memops": "cuda_gpu_mem_time_sum",
    "memsize": "cuda_gpu_mem_size_sum",
    "nvtx": "nvtx_sum",
}


def _time(text: str) -> int:
    try:
        return parse_time(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


def _tick(text: str) -> float:
    value = _seconds(text)
    if value < 0.001:
        raise argparse.ArgumentTypeError(
            f"{text} s: readings are stamped to the millisecond; sample at most every 0.001 s"
        )
    return value


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(text: str) -> int:
    unit = text[-1:].upper() if text[-1:].isalpha() else ""
    number = text[:-1] if unit else text
    if unit not in _SIZE_UNITS or not number.isdigit() or int(number) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or a number with K, M, G or T)")
    return int(number) * _SIZE_UNITS[unit]


def _size_text(size: int) -> str:
    """`size` as `_size` reads it, in the largest unit that divides it: 268435456 is 256M."""
    unit = next((unit for unit in ("T", "G", "M", "K") if size % _SIZE_UNITS[unit] == 0), "")
    return f"{size // _SIZE_UNITS[unit]}{unit}"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be above 0")
    return value


def _port(text: str) -> int:
    value = _positive(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (1..65535)")
    return value


def _gpu(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU index") from None
    if not -1 <= value <= DEFAULT_LIMITS.max_gpu_index:
        raise argparse.ArgumentTypeError(f"{value} is not a GPU index (-1 or 0..{DEFAULT_LIMITS.max_gpu_index})")
    return value


def _add_server_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=None,
        help=f"address of tracehouse serve (default ${config.ENV_SERVER} or {config.DEFAULT_SERVER})",
    )


def _add_paths(group: Any, options: tuple[tuple[str, str, str], ...]) -> None:
    for flag, metavar, text in options:
        group.add_argument(flag, type=Path, default=None, metavar=metavar, help=text)


def _add_client_security(parser: argparse.ArgumentParser) -> None:
    _add_paths(
        parser.add_argument_group("security (TLS is on with --tls-ca)"),
        (
            ("--token-file", "FILE", f"file holding a bearer token for the server (default ${config.ENV_TOKEN_FILE})"),
            ("--tls-ca", "PEM", f"use TLS, trusting server certificates this CA signed (default ${config.ENV_TLS_CA})"),
            (
                "--tls-cert",
                "PEM",
                f"this client's certificate, for a server that wants one (default ${config.ENV_TLS_CERT})",
            ),
            ("--tls-key", "PEM", f"the private key of --tls-cert (default ${config.ENV_TLS_KEY})"),
        ),
    )


def _add_server_security(parser: argparse.ArgumentParser) -> None:
    _add_paths(
        parser.add_argument_group("security"),
        (
            ("--tokens", "FILE", "bearer tokens, a 'SCOPE TOKEN' line each (SCOPE read, write or admin; see "
             "`tracehouse token`); required to listen beyond loopback"),
            ("--tls-cert", "PEM", "serve TLS with this certificate"),
            ("--tls-key", "PEM", "the private key of --tls-cert"),
            ("--tls-client-ca", "PEM", "require client certificates signed by this CA (mTLS)"),
        ),
    )  # fmt: skip


def _add_layout(parser: argparse.ArgumentParser) -> None:
    from ingest.migrations import RETENTION_NAMES

    group = parser.add_argument_group("schema layout")
    group.add_argument(
        "--cluster",
        default="",
        metavar="NAME",
        help="a ClickHouse cluster: Replicated tables on each node, Distributed tables over them",
    )
    group.add_argument(
        "--shards-by",
        choices=("host", "run_id"),
        default="host",
        help="what spreads samples and events over shards (default %(default)s)",
    )
    group.add_argument(
        "--retention",
        action="append",
        default=[],
        metavar="TABLE=DURATION",
        help=f"keep rows this long, e.g. samples=30d, rollups=1y, events=forever; TABLE: {', '.join(RETENTION_NAMES)}",
    )


def _add_schema(commands: Any) -> None:
    schema = commands.add_parser("schema", help="print the DDL of the store's tables, for clickhouse-client")
    schema.add_argument("--database", default="tracehouse", help="(default %(default)s)")
    _add_layout(schema)


def _add_serve(commands: Any) -> None:
    serve = commands.add_parser("serve", help="run the Ingest and Query services")
    serve.add_argument("--listen", default=config.DEFAULT_LISTEN, help="host:port (default %(default)s)")
    serve.add_argument(
        "--store",
        default=None,
        help="chdb://PATH (embedded, the default: $TRACEHOUSE_HOME/store) or http(s)://user:password@host:port/db",
    )
    serve.add_argument(
        "--store-password-file",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"the ClickHouse password for an http(s) store (or ${config.ENV_STORE_PASSWORD})",
    )
    serve.add_argument("--grace", type=float, default=30.0, help="seconds calls in flight get to finish on stop")
    _add_layout(serve)
    up = commands.add_parser("up", help="run everything on this machine with the embedded store")
    up.add_argument("--listen", default=config.DEFAULT_LISTEN, help="host:port (default %(default)s)")
    up.add_argument("--ui-port", type=_port, default=8501, help="port of the UI on 127.0.0.1 (default %(default)s)")
    up.add_argument("--no-ui", action="store_true", help="run the server and the agent only")
    up.add_argument("--demo", action="store_true", help="also import two generated Nsight-style runs")
    for parser in (serve, up):
        parser.add_argument(
            "--max-pending-bytes",
            type=_size,
            default=_size_text(DEFAULT_MAX_PENDING_BYTES),
            metavar="SIZE",
            help="bytes of writes accepted but not yet stored; past it writers are told to retry later "
            "(default %(default)s)",
        )
    for parser in (serve, up):
        _add_server_security(parser)
    ui = commands.add_parser("ui", help="run the Streamlit explorer against a server")
    _add_server_option(ui)
    _add_client_security(ui)
    ui.add_argument("--port", type=_port, default=8501, help="port to serve the UI on (default %(default)s)")
    ui.add_argument("--address", default="127.0.0.1", help="address to bind (default %(default)s: this machine only)")


def _add_agent(commands: Any) -> None:
    agent = commands.add_parser("agent", help="sample GPUs and ship the samples to tracehouse serve")
    _add_server_option(agent)
    agent.add_argument("--interval", type=_tick, default=0.1, help="seconds between samples (default %(default)s)")
    agent.add_argument(
        "--slow-interval",
        type=_tick,
        default=1.0,
        help="seconds between slow readings: PCIe, GPM, processes, host (default %(default)s)",
    )
    agent.add_argument("--simulate", type=_positive, metavar="N", help="sample N simulated GPUs instead of NVML")
    agent.add_argument("--run", default="", metavar="NAME", help="name the run these samples belong to")
    agent.add_argument("--host", default="", help="host name to record (default: this machine's)")
    agent.add_argument(
        "--spool",
        type=Path,
        default=None,
        help="folder for batches the server could not take yet (default $TRACEHOUSE_HOME/spool)",
    )
    agent.add_argument(
        "--spool-max-bytes",
        type=_size,
        default=1 << 30,
        metavar="SIZE",
        help="bound on the spool, e.g. 512M (default 1G); the oldest batches go first",
    )
    agent.add_argument(
        "--flush-interval",
        type=_seconds,
        default=2.0,
        help="seconds a batch stays open (default %(default)s)",
    )
    agent.add_argument("--duration", type=_seconds, default=None, metavar="S", help="stop after S seconds")
    _add_client_security(agent)
    agent.add_argument("--no-host-metrics", action="store_true", help="do not sample host CPU and memory")
    agent.add_argument(
        "--watch",
        type=Path,
        default=None,
        metavar="DIR",
        help="import Nsight Systems exports (*.sqlite) that appear in DIR, once they stop growing",
    )


def _tag(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


def _add_import(commands: Any) -> None:
    imports = commands.add_parser(
        "import", help="import Nsight Systems SQLite exports and PyTorch-profiler (Kineto) traces"
    )
    imports.add_argument(
        "files", nargs="+", type=Path, metavar="FILE",
        help="nsys export --type sqlite output, or a PyTorch-profiler trace (.json or .json.gz)",
    )  # fmt: skip
    _add_server_option(imports)
    imports.add_argument("--run-name", default="", help="name of the run (default: the file name)")
    imports.add_argument(
        "--host", default="", help="host to file it under (default: the one the file names, else this machine)"
    )
    imports.add_argument(
        "--tag", action="append", type=_tag, default=[], metavar="KEY=VALUE", help="repeat for several"
    )
    _add_client_security(imports)


def _add_demo_train(commands: Any) -> None:
    demo = commands.add_parser(
        "demo-train", help="train a small PyTorch model, recorded and profiled, then import its trace (needs torch)"
    )
    demo.add_argument("--steps", type=_positive, default=30, help="training steps (default %(default)s)")
    _add_server_option(demo)
    demo.add_argument(
        "--trace-dir", type=Path, default=None, metavar="DIR", help="keep the profiler's trace here (default: removed)"
    )
    _add_client_security(demo)


def _add_window(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("window")
    group.add_argument("--run", default="", help="a run id: its events and its host's telemetry during it")
    group.add_argument("--from", dest="start", type=_time, help="ISO-8601, ns since the epoch, or now-15m")
    group.add_argument("--to", dest="end", type=_time, help="exclusive; same forms as --from")
    group.add_argument("--host", action="append", default=[], help="repeat for several")
    group.add_argument("--gpu", action="append", type=_gpu, default=[], help="repeat for several")
    group.add_argument("--range", default=None, metavar="NAME", help="the span of one instance of this NVTX range")
    group.add_argument("--instance", type=_positive, default=None, metavar="I",
                       help="which instance of --range, from 1 in start order (default 1)")  # fmt: skip


def _duration(text: str) -> int:
    from tracehouse.timefmt import parse_duration

    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _add_query(commands: Any) -> None:
    query = commands.add_parser("query", help="ask the Query service")
    common = argparse.ArgumentParser(add_help=False)
    _add_server_option(common)
    _add_client_security(common)
    common.add_argument("--format", choices=("table", "json", "csv"), default="table")
    common.add_argument("--timeout", type=float, default=60.0, help="seconds (default %(default)s)")
    sub = query.add_subparsers(dest="what", required=True, metavar="WHAT")

    runs = sub.add_parser("runs", parents=[common], help="runs, newest first")
    runs.add_argument("--host", default="")
    runs.add_argument("--source", choices=RUN_SOURCES)
    runs.add_argument("--name", default="", help="part of the name or run id, any case")
    runs.add_argument("--limit", type=_positive, default=1000)
    runs.add_argument(
        "--tag", action="append", type=_tag, default=[], metavar="KEY=VALUE", help="runs with every such tag"
    )

    devices = sub.add_parser("devices", parents=[common], help="GPUs per host")
    devices.add_argument("--host", default="")

    metrics = sub.add_parser("metrics", parents=[common], help="series in the window")
    _add_window(metrics)

    series = sub.add_parser("series", parents=[common], help="a downsampled series: min/avg/max/count per bucket")
    _add_window(series)
    series.add_argument("--metric", action="append", required=True, help="repeat for several")
    series.add_argument(
        "--max-points",
        type=_positive,
        default=DEFAULT_LIMITS.default_points,
        help=f"buckets per series (default %(default)s, at most {DEFAULT_LIMITS.max_points})",
    )

    events = sub.add_parser("events", parents=[common], help="events overlapping the window")
    _add_window(events)
    events.add_argument("--kind", action="append", default=[], choices=EVENT_KINDS, metavar="KIND")
    events.add_argument("--name", action="append", default=[], help="exact name; repeat for several")
    events.add_argument("--limit", type=_positive, default=1000, help="rows (default %(default)s)")

    for kind, report in SUMMARY_KINDS.items():
        summary = sub.add_parser(kind, parents=[common], help=f"per name, like nsys stats {report}")
        _add_window(summary)
        summary.add_argument("--limit", type=_positive, default=None, help="the top N names by total")

    gpu_time = sub.add_parser("gpu-time", parents=[common], help="busy and idle time per GPU, and idle gaps")
    _add_window(gpu_time)
    gpu_time.add_argument(
        "--min-gap",
        type=_duration,
        default=1_000_000,
        metavar="DURATION",
        help="idle gaps longer than this (default 1ms)",
    )
    gpu_time.add_argument("--max-gaps", type=_positive, default=1000, help="the longest N gaps (default %(default)s)")
    nvtx_gpu = sub.add_parser("nvtx-gpu", parents=[common], help="NVTX ranges projected onto the GPU work they launch")
    _add_window(nvtx_gpu)
    nvtx_gpu.add_argument("--ranges", type=_positive, default=None, metavar="N",
                          help="also list the first N ranges, each with its projection")  # fmt: skip
    phases = sub.add_parser("phases", parents=[common], help="GPU busy %% and telemetry inside each phase")
    _add_window(phases)
    launch = sub.add_parser("launch", parents=[common], help="launch latency, short kernels, idle after syncs")
    _add_window(launch)
    launch.add_argument(
        "--short",
        type=_duration,
        default=10_000,
        metavar="DURATION",
        help="kernels shorter than this are short (default 10us)",
    )
    diff = sub.add_parser("diff", parents=[common], help="two runs side by side, the biggest changes first")
    diff.add_argument(
        "--run", dest="runs", action="append", default=[], required=True, metavar="RUN", help="twice: --run A --run B"
    )
    diff.add_argument(
        "--summary",
        action="append",
        default=[],
        choices=("kernels", "api", "memops"),
        help="which summaries (default all three)",
    )
    diff.add_argument("--limit", type=_positive, default=None, help="the top N changes")

    compare = sub.add_parser("compare", parents=[common], help="runs side by side, one row each")
    compare.add_argument("runs", nargs="*", metavar="RUN", help="run ids, in the order wanted")
    compare.add_argument(
        "--tag", action="append", type=_tag, default=[], metavar="KEY=VALUE",
        help="and the runs with every such tag, newest first",
    )  # fmt: skip
    compare.add_argument("--top-kernels", type=_positive, default=3, metavar="N", help="(default %(default)s)")

    sql = sub.add_parser("sql", parents=[common], help="read-only SQL, limited in time and size")
    sql.add_argument("sql", help="the query; - reads it from stdin")
    sql.add_argument("--max-rows", type=_positive, default=None)


def _add_bench(commands: Any) -> None:
    bench = commands.add_parser("bench", help="measure a capability against a baseline; prints JSON")
    sub = bench.add_subparsers(dest="what", required=True, metavar="WHAT")
    ingest = sub.add_parser("ingest", help="rows/s through gRPC into the store vs a direct insert")
    ingest.add_argument("--rows", type=_positive, default=4_000_000, help="sample values per round")
    ingest.add_argument("--batch-rows", type=_positive, default=100_000)
    ingest.add_argument("--rounds", type=_positive, default=3)
    ingest.add_argument("--store", default=None, help="store URL (default: a temporary embedded store)")
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
    train = sub.add_parser("train", help="ns per step()/phase()/scalar() call of the training API, server up and down")
    train.add_argument(
        "--calls", type=_positive, default=100_000, help="calls per round, at most 262144 (default %(default)s)"
    )
    train.add_argument("--rounds", type=_positive, default=5, help="(default %(default)s)")
    load = sub.add_parser("load", help="many simulated agents against one server: values/s, write latency, memory")
    load.add_argument("--agents", type=_positive, default=32)
    load.add_argument("--gpus", type=_positive, default=8, help="simulated GPUs per agent")
    load.add_argument("--interval", type=_seconds, default=0.1)
    load.add_argument("--seconds", type=_seconds, default=60.0, help="how long the agents sample")
    load.add_argument(
        "--max-pending-bytes",
        type=_size,
        default=_size_text(DEFAULT_MAX_PENDING_BYTES),
        metavar="SIZE",
        help="the server's bound (default %(default)s)",
    )
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


def _add_run(commands: Any) -> None:
    run = commands.add_parser(
        "run",
        help="run a command (or a matrix of them) as a run: telemetry, its processes, exit status",
        description="Run COMMAND as a run: its GPU telemetry (the host's agent, or one started for it), its "
        "process tree (per-process GPU memory and utilisation are attributed to it), exit status, tags. "
        "The exit status is the command's; SIGINT/SIGTERM/SIGHUP are passed on to it.",
    )
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="what to run")
    run.add_argument("--name", default="", help="the run's name (default: the command's file name)")
    run.add_argument("--tag", action="append", type=_tag, default=[], metavar="KEY=VALUE", help="repeat for several")
    run.add_argument("--gpus", default=None, metavar="0,1", help="GPUs for the command: sets CUDA_VISIBLE_DEVICES")
    run.add_argument("--nsys", action="store_true", help="profile it under Nsight Systems and import the trace")
    run.add_argument("--nsys-args", default="", metavar="ARGS", help="more options for `nsys profile`, quoted")
    run.add_argument(
        "--nsys-output", type=Path, default=None, metavar="DIR",
        help="where reports and exports are kept (default $TRACEHOUSE_HOME/nsys)",
    )  # fmt: skip
    run.add_argument("--matrix", type=Path, default=None, metavar="FILE",
                     help="run the experiments of a YAML or CSV file one after another")  # fmt: skip
    run.add_argument("--format", choices=("table", "json", "csv"), default="table", help="the matrix's summary")
    _add_server_option(run)
    run.add_argument(
        "--agent", choices=("auto", "start", "none"), default="auto",
        help="telemetry: the host's agent if one runs for this server, else one started for the run (auto); "
        "always start one; none",
    )  # fmt: skip
    run.add_argument("--simulate", type=_positive, metavar="N", help="the started agent samples N simulated GPUs")
    run.add_argument("--interval", type=_tick, default=0.1, help="the started agent's seconds between samples")
    run.add_argument("--env", action="append", default=[], metavar="NAME",
                     help="also record this environment variable (CUDA_VISIBLE_DEVICES, NCCL_*, ... are)")  # fmt: skip
    run.add_argument("--host", default="", help="host name to record (default: this machine's)")
    run.add_argument(
        "--spool", type=Path, default=None, metavar="DIR",
        help="folder of the runs' spools (default $TRACEHOUSE_HOME/spool/runs)",
    )  # fmt: skip
    _add_client_security(run)


def _add_token(commands: Any) -> None:
    token = commands.add_parser("token", help="print a fresh 'SCOPE TOKEN' line to append to a --tokens file")
    token.add_argument(
        "--scope",
        choices=("read", "write", "admin"),
        default="read",
        help="read: queries (UI, CLI); write: agents and imports; admin: both (default %(default)s)",
    )
    token.add_argument(
        "--hosts", action="append", default=[], metavar="GLOB[,GLOB]",
        help="write/admin: the token writes only rows and runs of hosts matching one of these globs",
    )  # fmt: skip
    token.add_argument(
        "--runs", action="append", default=[], metavar="PREFIX[,PREFIX]",
        help="write/admin: the token writes only rows and runs whose run id starts with one of these",
    )  # fmt: skip


def run_token(args: argparse.Namespace) -> int:
    from tracehouse.security import SecurityError, new_token_line

    hosts = [glob for option in args.hosts for glob in option.split(",")]
    runs = [prefix for option in args.runs for prefix in option.split(",")]
    try:
        print(new_token_line(args.scope, hosts, runs))
    except SecurityError as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tracehouse", description="GPU telemetry and Nsight Systems traces on one timeline."
    )
    parser.add_argument("--version", action="version", version=f"tracehouse {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(commands)
    _add_agent(commands)
    _add_run(commands)
    _add_import(commands)
    _add_demo_train(commands)
    _add_query(commands)
    _add_bench(commands)
    _add_token(commands)
    _add_schema(commands)
    return parser


def _window(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "run": args.run, "host": args.host, "gpu": args.gpu, "start": args.start, "end": args.end,
        "range": args.range, "instance": args.instance,
    }  # fmt: skip


def run_query(args: argparse.Namespace) -> int:
    import pandas as pd

    from query.client import Client, QueryFailed
    from tracehouse.output import render, render_many

    client = Client(args.server, timeout=args.timeout, security=_client_security(args))
    frame: pd.DataFrame | dict[str, pd.DataFrame]
    try:
        if args.what == "runs":
            frame = client.runs(args.host, args.source or "", args.name, args.limit, dict(args.tag))
        elif args.what == "devices":
            frame = client.devices(args.host)
        elif args.what == "metrics":
            frame = client.metrics(**_window(args))
        elif args.what == "series":
            frame = client.series(args.metric, args.max_points, **_window(args))
        elif args.what == "events":
            frame = client.events(args.kind, args.name, limit=args.limit, **_window(args))
        elif args.what in SUMMARY_KINDS:
            frame = client.summary(args.what, args.limit or 0, **_window(args))
        elif args.what == "gpu-time":
            frame = client.gpu_time(args.min_gap, args.max_gaps, **_window(args))
        elif args.what == "nvtx-gpu":
            frame = client.nvtx_gpu(args.ranges or 0, **_window(args))
        elif args.what == "phases":
            frame = client.phases(**_window(args))
        elif args.what == "launch":
            frame = client.launch(args.short, **_window(args))
        elif args.what == "diff":
            if len(args.runs) != 2:
                print("tracehouse: diff compares two runs: --run A --run B", file=sys.stderr)
                return EXIT_USAGE
            frame = client.diff(args.runs[0], args.runs[1], args.summary, args.limit or 0)
        elif args.what == "compare":
            if not args.runs and not args.tag:
                print("tracehouse: compare needs run ids, --tag KEY=VALUE, or both", file=sys.stderr)
                return EXIT_USAGE
            frame = client.compare(args.runs, dict(args.tag), args.top_kernels)
            if frame.attrs.get("truncated"):
                print(f"tracehouse: more runs matched; the first {len(frame)} are shown", file=sys.stderr)
        else:
            text = sys.stdin.read() if args.sql == "-" else args.sql
            frame = client.sql(text, args.max_rows or 0)
            if frame.attrs.get("truncated"):
                print(f"tracehouse: result truncated to {len(frame)} rows", file=sys.stderr)
    except QueryFailed as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE if error.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED") else EXIT_USAGE
    finally:
        client.close()
    if isinstance(frame, dict):
        render_many(frame, args.format)
    else:
        render(frame, args.format)
    return 0


def _client_security(args: argparse.Namespace) -> ClientSecurity:
    """--token-file, --tls-ca, --tls-cert, --tls-key, else their TRACEHOUSE_* variables;
    a file that cannot be used ends the command (status 2) naming the option."""
    from tracehouse.channel import client_security
    from tracehouse.security import SecurityError

    try:
        return client_security(args.token_file, args.tls_ca, args.tls_cert, args.tls_key)
    except SecurityError as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def run_agent(args: argparse.Namespace) -> int:
    import json
    import signal
    import threading

    from agent.daemon import Agent, AgentConfig, open_backend
    from agent.gpu import BackendUnavailable

    agent_config = AgentConfig(
        server=args.server or config.default_server(),
        spool=args.spool or config.default_spool(),
        interval=args.interval,
        slow_interval=args.slow_interval,
        flush_interval=args.flush_interval,
        spool_max_bytes=args.spool_max_bytes,
        run_name=args.run,
        host=args.host,
        security=_client_security(args),
        host_metrics=not args.no_host_metrics,
        watch=args.watch,
        host_agent=True,
    )
    if args.watch is not None and not args.watch.is_dir():
        print(f"tracehouse: --watch {args.watch}: not a folder", file=sys.stderr)
        return EXIT_USAGE
    try:
        backend = open_backend(args.simulate)
    except BackendUnavailable as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # each ships what it holds, then stops
        signal.signal(sig, lambda *_: stop.set())
    agent = Agent(agent_config, backend)
    agent.start()
    stop.wait(args.duration)
    print(json.dumps(agent.stop()), flush=True)
    return 0


def run_run(args: argparse.Namespace) -> int:
    from tracehouse.children import Signals

    with Signals() as signals:  # before anything starts a thread (grpc does): see tracehouse.children
        status = _run_run(args, signals)
    return 128 + signals.late if signals.late else status


def _run_run(args: argparse.Namespace, signals: Signals) -> int:
    import dataclasses
    import shlex
    import socket

    from tracehouse import experiments, launcher
    from tracehouse.matrix import MatrixError, load_matrix

    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not args.verbose:  # the command's output is what matters on this terminal
        for chatty in ("tracehouse.agent", "tracehouse.runspool"):
            logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        if bool(command) == (args.matrix is not None):
            raise launcher.LaunchError("give a COMMAND (after --) or --matrix FILE, not both" if command
                                       else "nothing to run: give a COMMAND after --, or --matrix FILE")  # fmt: skip
        try:
            nsys_args = shlex.split(args.nsys_args)
        except ValueError as error:
            raise launcher.LaunchError(f"--nsys-args {args.nsys_args!r}: {error}") from None
        if nsys_args and not args.nsys:
            raise launcher.LaunchError("--nsys-args: only with --nsys")
        tags = launcher.check_tags(dict(args.tag), "--tag")
        launcher.check_text(args.name, "--name")
        launcher.check_text(args.host, "--host")
        settings = launcher.Settings(
            server=args.server or config.default_server(), server_given=args.server is not None,
            host=args.host or socket.gethostname(), spool_root=args.spool or config.default_spool() / "runs",
            nsys_dir=args.nsys_output or config.home() / "nsys", security=_client_security(args), agent=args.agent,
            simulate=args.simulate, interval=args.interval, record_env=launcher.check_env_names(args.env),
        )  # fmt: skip
        if args.matrix is not None:
            if args.name or args.gpus or args.nsys:
                raise launcher.LaunchError("--matrix: set name, gpus and nsys for each experiment in the file")
            matrix = load_matrix(args.matrix)
            slots = [
                tuple(dataclasses.replace(spec, tags=launcher.check_tags(
                    {**tags, **spec.tags}, f"{args.matrix.name} line {spec.line}: tags")) for spec in slot)
                for slot in matrix.slots
            ]  # fmt: skip
            if any(spec.nsys for slot in slots for spec in slot):
                launcher.nsys_path()
            return experiments.run_matrix(settings, slots, args.matrix.name, args.format, signals)
        gpus = launcher.gpu_list(args.gpus) if args.gpus is not None else None
        if args.nsys:
            launcher.nsys_path()
        spec = launcher.single_spec(command, args.name, tags, gpus, args.nsys, nsys_args)
        return experiments.run_one(settings, spec, signals)
    except (launcher.LaunchError, MatrixError) as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return error.status if isinstance(error, launcher.LaunchError) else EXIT_USAGE


def run_demo_train(args: argparse.Namespace) -> int:
    import json

    from tracehouse.demo_train import TorchMissing, train

    try:
        result = train(args.steps, args.server or config.default_server(), _client_security(args), args.trace_dir)
    except TorchMissing as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(result), flush=True)
    if "import_error" in result:
        print(f"tracehouse: the profiler's trace was not imported: {result['import_error']}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return 0


def run_import(args: argparse.Namespace) -> int:
    import socket

    from agent.importer import import_export
    from agent.tracefile import TraceFileError
    from agent.writer import BatchWriter, WriteFailed

    writer = BatchWriter(args.server or config.default_server(), _client_security(args))
    status = 0
    try:
        for path in args.files:
            progress = _Progress(path.name) if sys.stderr.isatty() else None
            try:
                result = import_export(
                    path, writer, args.run_name, args.host, dict(args.tag), progress, default_host=socket.gethostname()
                )
            except TraceFileError as error:
                print(f"tracehouse: {error}", file=sys.stderr)
                status = max(status, EXIT_USAGE)
                continue
            except WriteFailed as error:
                print(f"tracehouse: {path.name}: the server did not take it: {error}", file=sys.stderr)
                return EXIT_UNAVAILABLE if error.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED") else EXIT_USAGE
            except Exception as error:  # a reader's defect: still one line, never a traceback
                reason = (str(error).strip().splitlines() or [""])[0][:200]
                print(f"tracehouse: {path.name}: cannot import it ({type(error).__name__}: {reason})", file=sys.stderr)
                status = max(status, EXIT_USAGE)
                continue
            finally:
                if progress:
                    progress.done()
            if not args.host and result.host == socket.gethostname():
                print(f"tracehouse: {path.name}: filed under this machine, {result.host} (--host to choose another)",
                      file=sys.stderr)  # fmt: skip
            print(result.json(), flush=True)
    finally:
        writer.close()
    return status


class _Progress:
    """One line on a terminal: source, rows so far of about how many."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.shown = 0.0

    def __call__(self, source: str, done: int, expected: int) -> None:
        import time

        now = time.monotonic()
        if now - self.shown > 0.2:
            self.shown = now
            share = done / expected if expected else 1.0
            bar = "#" * int(30 * share)
            print(
                f"\r{self.label} {source:<9} [{bar:<30}] {done:>11,} rows",
                end="",
                file=sys.stderr,
                flush=True,
            )

    def done(self) -> None:
        print("\r\033[K", end="", file=sys.stderr, flush=True)


def _store_url(args: argparse.Namespace) -> str:
    """--store (or the environment's), with a password from a file or the environment."""
    import os

    from ingest.store import with_password

    url = getattr(args, "store", None) or config.default_store_url()
    path = getattr(args, "store_password_file", None)
    if path is not None:
        try:
            return with_password(url, path.read_text().rstrip("\r\n"))
        except OSError as error:
            raise ValueError(f"--store-password-file {path}: {error.strerror}") from None
        except UnicodeDecodeError:
            raise ValueError(f"--store-password-file {path}: not UTF-8 text") from None
    password = os.environ.get(config.ENV_STORE_PASSWORD)
    return with_password(url, password) if password and not url.startswith("chdb://") else url


def _layout(args: argparse.Namespace) -> dict[str, Any]:
    from ingest.migrations import retention

    return {"cluster": args.cluster, "shards_by": args.shards_by, "retention": retention(args.retention)}


def run_schema(args: argparse.Namespace) -> int:
    from ingest.migrations import script
    from ingest.schema import Layout

    try:
        layout = Layout(args.database, **_layout(args))
    except ValueError as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(f"-- tracehouse {__version__} schema; run with: clickhouse-client --multiquery < this-file")
    for statement in script(layout):
        print(f"{statement.strip()};\n")
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from ingest.store import StoreUnavailable
    from tracehouse.security import SecurityError, load_server_security
    from tracehouse.serve import serve
    from tracehouse.up import Up

    try:
        store = _store_url(args)
        layout = _layout(args) if args.command == "serve" else {}
    except ValueError as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_USAGE
    up = Up(None if args.no_ui else args.ui_port, args.demo) if args.command == "up" else None
    try:
        security = load_server_security(args.tokens, args.tls_cert, args.tls_key, args.tls_client_ca)
        if up is not None:
            security = up.secure(security)
        return serve(
            store,
            args.listen,
            DEFAULT_LIMITS,
            getattr(args, "grace", 30.0),
            on_ready=up.start if up else None,
            on_stop=up.stop if up else None,
            max_pending_bytes=args.max_pending_bytes,
            security=security,
            layout=layout,
        )
    except SecurityError as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (StoreUnavailable, OSError, ValueError, RuntimeError) as error:
        print(f"tracehouse: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE


def run_ui(args: argparse.Namespace) -> int:
    from tracehouse.children import stop_on_signals
    from tracehouse.serve import is_loopback
    from tracehouse.up import start_ui, stop_process

    server = args.server or config.default_server()
    if not is_loopback(f"{args.address}:{args.port}"):
        print(
            f"tracehouse: the UI on {args.address} has no login: anyone who can reach it can read the store",
            file=sys.stderr,
        )
    security = _client_security(args)
    with stop_on_signals():  # SIGTERM, SIGINT, SIGHUP: the UI's process is stopped too
        try:
            process = start_ui(server, args.port, args.address, security)
        except RuntimeError as error:
            print(f"tracehouse: {error}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        except KeyboardInterrupt:
            return 0  # start_ui stopped it
        print(f"tracehouse UI: http://{args.address}:{args.port} (server {server}); Ctrl-C stops it.", flush=True)
        try:
            return process.wait()
        except KeyboardInterrupt:
            stop_process(process)
            return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for chatty in ("urllib3", "clickhouse_connect"):  # their retries are reported by us, once
        logging.getLogger(chatty).setLevel(logging.ERROR)
    if args.command == "query":
        return run_query(args)
    if args.command in ("serve", "up"):
        return run_serve(args)
    if args.command == "ui":
        return run_ui(args)
    if args.command == "token":
        return run_token(args)
    if args.command == "agent":
        return run_agent(args)
    if args.command == "import":
        return run_import(args)
    if args.command == "schema":
        return run_schema(args)
    if args.command == "demo-train":
        return run_demo_train(args)
    if args.command == "run":
        return run_run(args)
    if args.command == "bench":
        from tracehouse import bench

        return bench.main(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
