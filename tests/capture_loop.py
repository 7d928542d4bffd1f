"""A training process for the capture tests: steps of 50 ms under `tracehouse.run` until FILE exists
(at most 120 s), with a recording profiler where torch is not wanted. Prints its run id first.

python -m tests.capture_loop SERVER NAME STOP_FILE [--run-id ID] [--profiler recording|torch|none-installed]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import tracehouse
from agent.training.capture import RecordingProfiler, TorchProfiler
from tracehouse.channel import ClientSecurity, client_security


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("server")
    parser.add_argument("name")
    parser.add_argument("stop", type=Path)
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--spool", type=Path, required=True)
    parser.add_argument("--profiler", choices=("recording", "torch", "none-installed"), default="recording")
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--epoch", type=int, default=0, help="steps are numbered from 0 again every EPOCH steps")
    parser.add_argument("--token-file", default=None)
    args = parser.parse_args()
    if args.profiler == "none-installed":
        sys.modules["torch"] = None  # type: ignore[assignment]  # as in an environment without torch
    make = RecordingProfiler if args.profiler == "recording" else TorchProfiler
    work = _torch_work() if args.profiler == "torch" else (lambda: None)
    security = client_security(args.token_file) if args.token_file else ClientSecurity()
    with tracehouse.run(args.name, server=args.server, run_id=args.run_id, security=security,
                        spool=args.spool, capture_profiler=make) as run:  # fmt: skip
        print(run.run_id, flush=True)
        deadline = time.monotonic() + 120
        i = 0
        while not args.stop.exists() and time.monotonic() < deadline:
            tracehouse.step(i % args.epoch if args.epoch else i)
            with tracehouse.phase("forward"):
                work()
                time.sleep(args.step_ms / 1000)
            i += 1


def _torch_work() -> Callable[[], None]:
    import torch

    a, b = torch.randn(64, 64), torch.randn(64, 64)
    return lambda: (a @ b).relu_().sum().item() and None


if __name__ == "__main__":
    main()
