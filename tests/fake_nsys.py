"""A stand-in for Nsight Systems' `nsys` (this machine has none), for `tracehouse run --nsys`.

`nsys profile [OPTIONS] COMMAND ...` runs COMMAND and writes OUTPUT.nsys-rep (here a small
JSON of what ran: when, which pid, for how long) and exits with COMMAND's status;
`nsys export --type=sqlite --output=FILE REPORT` writes a schema-faithful synthetic export
(agent.traces.nsys_synthetic) of that process, its session starting when COMMAND started.
Unknown options are refused as nsys refuses them. `tests/test_run.py` puts it on PATH.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from agent.traces.nsys_synthetic import Spec, write_export

VALUED = {"-o", "--output", "-t", "--trace", "-s", "--sample", "-d", "--duration", "--force-overwrite", "--type"}
KNOWN = VALUED | {"--stats", "--cuda-memory-usage"}


def _options(args: list[str]) -> tuple[dict[str, str], list[str]]:
    options: dict[str, str] = {}
    while args and args[0].startswith("-"):
        flag, equals, value = args.pop(0).partition("=")
        if flag not in KNOWN:
            print(f"fake nsys: unrecognised option '{flag}'", file=sys.stderr)
            raise SystemExit(1)
        if flag in VALUED and not equals:
            value = args.pop(0)
        options[flag.lstrip("-")] = value
    return options, args


def profile(args: list[str]) -> int:
    options, command = _options(args)
    output = options.get("output") or options.get("o") or "report1"
    started = time.time_ns()
    child = subprocess.Popen(command)
    code = child.wait()
    report = {"pid": child.pid, "start_ns": started, "end_ns": time.time_ns(), "trace": options.get("trace", "")}
    Path(f"{output}.nsys-rep").write_text(json.dumps(report))
    print(f"Generated:\n    {output}.nsys-rep", file=sys.stderr)
    return code


def export(args: list[str]) -> int:
    options, rest = _options(args)
    if options.get("type") != "sqlite" or len(rest) != 1:
        print("fake nsys: export --type=sqlite --output=FILE REPORT", file=sys.stderr)
        return 1
    report = json.loads(Path(rest[0]).read_text())
    span = max(1, report["end_ns"] - report["start_ns"])
    spec = Spec(
        steps=10, start_ns=report["start_ns"], pid=report["pid"], hostname=socket.gethostname(),
        time_scale=max(1, span // 10_000_000),  # ten steps of ~0.4 ms made to fill the run
    )  # fmt: skip
    write_export(Path(options["output"]), spec)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["profile"]:
        return profile(argv[1:])
    if argv[:1] == ["export"]:
        return export(argv[1:])
    print(f"fake nsys: {' '.join(argv[:1])}: not a command this stand-in knows", file=sys.stderr)
    return 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
