"""The import of a capture's trace into its run, in a process of its own, so that the training process
pays for the profiler and not for reading its trace (a 700 KB trace takes 90 ms of CPU to import
against 10 ms to export). Started by agent/training/capture.py, at a lower priority:

    python -m agent.training.capture_import TRACE --run-id ID --host H --prefix P --server ADDR

The token, if any, comes on stdin (never on the command line); TLS from the TRACEHOUSE_TLS_* variables.
Prints one JSON line: {"events": N} or {"error": "..."} (exit status 3)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class Prefixed:
    """The importer's batches under `prefix` instead of the run id: each capture's ids are its own."""

    def __init__(self, sink: Any, run_id: str, prefix: str) -> None:
        self._sink, self._run_id, self._prefix = sink, run_id, prefix

    def write(self, batch: Any) -> None:
        batch.batch_id = self._prefix + batch.batch_id[len(self._run_id) :]
        self._sink.write(batch)

    def flush(self) -> None:
        self._sink.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="capture_import")
    parser.add_argument("trace", type=Path)
    for option in ("--run-id", "--host", "--prefix", "--server"):
        parser.add_argument(option, required=True)
    args = parser.parse_args(argv)
    with contextlib.suppress(OSError):
        os.nice(10)  # the training loop first
    from agent.shipping.writer import BatchWriter, WriteFailed
    from agent.traces.importer import import_export
    from agent.traces.tracefile import TraceFileError
    from tracehouse.channel import client_security
    from tracehouse.security import SecurityError

    try:
        security = client_security()
        token = sys.stdin.readline().strip()
        if token:
            security = dataclasses.replace(security, token=token)
        writer = BatchWriter(args.server, security)
    except SecurityError as error:
        print(json.dumps({"error": str(error)}))
        return 3
    try:
        result = import_export(args.trace, Prefixed(writer, args.run_id, args.prefix), host=args.host,
                               into_run=args.run_id)  # fmt: skip
    except (TraceFileError, WriteFailed, OSError) as error:
        print(json.dumps({"error": str(error)[:1000]}))
        return 3
    finally:
        writer.close()
    print(json.dumps({"events": sum(result.events.values())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
