"""`tracehouse export`: a window of a run as a trace file for ui.perfetto.dev or chrome://tracing."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracehouse.cli.options import (
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    _add_client_security,
    _add_run_and_times,
    _add_server_option,
    _client_security,
    failed_call_exit,
)

if TYPE_CHECKING:
    from query.export import WindowData

FORMATS = ("perfetto", "chrome")
OPEN_AT = "https://ui.perfetto.dev"


def _add_export(commands: Any) -> None:
    export = commands.add_parser(
        "export",
        help="a window of a run as a trace file that ui.perfetto.dev opens",
        description="Write a window of a run (GPU work per device and stream, CUDA calls and NVTX ranges per "
        "thread, steps, phases and the NVML series as counters) as a Perfetto trace or Chrome-trace JSON.",
    )
    _add_server_option(export)
    _add_client_security(export)
    group = export.add_argument_group("window")
    _add_run_and_times(group)
    group.add_argument("--host", default=None, help="only this host")
    export.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="perfetto (TracePacket protobuf) or chrome (trace-event JSON); default from the file name: "
        ".json or .json.gz is chrome, anything else perfetto; a name ending in .gz is compressed",
    )
    export.add_argument("-o", "--output", type=Path, required=True, metavar="FILE", help="the file to write")
    export.add_argument("--timeout", type=float, default=300.0, help="seconds (default %(default)s)")


def format_of(path: Path) -> tuple[str, bool]:
    """(format, gzip) that a file name asks for."""
    name = path.name.lower()
    compressed = name.endswith(".gz")
    return ("chrome" if name.removesuffix(".gz").endswith(".json") else "perfetto"), compressed


def _refuse(message: str, status: int = EXIT_USAGE) -> int:
    print(f"tracehouse: {message}", file=sys.stderr)
    return status


def _fetch(args: argparse.Namespace) -> WindowData | int:
    """The window's contents, or the exit status of a refusal (said on stderr)."""
    from query.client import Client, QueryFailed
    from query.export import fetch

    with Client(args.server, timeout=args.timeout, security=_client_security(args)) as client:
        try:
            data = fetch(client, run=args.run, host=args.host, start=args.start, end=args.end)
        except QueryFailed as error:
            return _refuse(str(error), failed_call_exit(error.code.name))
    if data.empty:
        what = f"run {args.run}" if args.run else "the window"
        return _refuse(f"{what} holds no events and no telemetry there; nothing written", EXIT_UNAVAILABLE)
    return data


def run_export(args: argparse.Namespace) -> int:
    from query.export import encode
    from tracehouse.units import count, size

    if not args.run and (args.start is None or args.end is None):
        return _refuse("export needs --run, or a window: --from and --to")
    fmt, compressed = format_of(args.output)
    fmt = args.format or fmt
    path: Path = args.output
    if path.is_dir():
        return _refuse(f"--output {path}: is a folder; name a file")
    try:  # beside the file, renamed over it once whole: never a half-written trace under its name
        descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    except OSError as error:
        return _refuse(f"--output {path}: cannot write there ({error.strerror or error})")
    temporary = Path(name)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            data = _fetch(args)
            if isinstance(data, int):
                return data
            body = encode(data, fmt)
            handle.write(gzip.compress(body, mtime=0) if compressed else body)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        temporary.chmod(0o666 & ~umask)  # as open() would make it, not mkstemp's 0600
        os.replace(temporary, path)
    except OSError as error:
        return _refuse(f"--output {path}: cannot write it ({error.strerror or error})")
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    series = len(data.counters[["host", "gpu", "pid", "metric"]].drop_duplicates())
    counters = f"{count(len(data.counters))} counter values on {count(series)} tracks" if series else "no telemetry"
    viewers = f"{OPEN_AT} (or chrome://tracing)" if fmt == "chrome" else OPEN_AT
    print(
        f"tracehouse: wrote {path} ({fmt}{', gzip' if compressed else ''}, {size(path.stat().st_size)}): "
        f"{count(len(data.events))} events, {counters}; open it at {viewers}",
        file=sys.stderr,
    )
    return 0
