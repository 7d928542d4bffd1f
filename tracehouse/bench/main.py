"""`tracehouse bench WHAT`: runs the benchmark named and prints its JSON."""

from __future__ import annotations

import argparse
import json
import signal
import sys

from agent.runs.children import Stopped, stop_on_signals
from agent.shipping.writer import LARGE_IN_FLIGHT
from tracehouse.bench.agent import bench_agent
from tracehouse.bench.imports import bench_import, bench_import_kineto
from tracehouse.bench.ingest import bench_ingest
from tracehouse.bench.load import bench_fleet, bench_load
from tracehouse.bench.query import bench_query


def main(args: argparse.Namespace) -> int:
    """A benchmark; SIGTERM, SIGINT or SIGHUP stop it, and the processes it started with it."""
    try:
        with stop_on_signals():
            return _main(args)
    except Stopped as stopped:
        print(f"tracehouse: bench stopped by {signal.Signals(stopped.signal).name}", file=sys.stderr)
        return 128 + stopped.signal


def _main(args: argparse.Namespace) -> int:
    if args.what == "ingest":
        result = bench_ingest(
            args.rows,
            args.batch_rows,
            args.rounds,
            args.store,
            args.in_flight or LARGE_IN_FLIGHT,
            ack_once_stored=args.ack_once_stored,
        )
        print(json.dumps(result, indent=2))
        return 0 if result["sent_rows"] == result["stored_rows"] else 1
    if args.what == "import":
        if args.kineto:
            result = bench_import_kineto(args.events or 1_000_000, args.file, args.rounds)
        else:
            result = bench_import(args.events or 5_000_000, args.file, args.rounds)
        print(json.dumps(result, indent=2))
        return 0 if result["events"] == result["stored_events"] else 1
    if args.what == "query":
        result = bench_query(args.kernels, args.ranges, args.samples)
        print(json.dumps(result, indent=2))
        return 0
    if args.what == "agent":
        result = bench_agent(args.gpus, args.interval, args.seconds)
        print(json.dumps(result, indent=2))
        return 0 if result["sampled_values"] == result["stored_values"] else 1
    if args.what == "storage":
        from tracehouse.bench.storage import bench_storage

        result = bench_storage(args.gpus, args.minutes, 0.1, args.steps)
        print(json.dumps(result, indent=2))
        return 0 if result["goal"]["met"] else 1
    if args.what == "load" and args.writers:
        try:
            result = bench_fleet(
                args.writers, args.gpus, args.interval or 2.0, args.seconds, channels=args.channels,
                max_pending_bytes=args.max_pending_bytes, ack_target_ms=args.ack_target_ms,
                ack_within_ms=args.ack_within_ms, commit_rows=args.commit_rows, kill_at=args.kill_at,
                readers=args.readers or 0,
            )  # fmt: skip
        except ValueError as refused:
            print(f"tracehouse: {refused}", file=sys.stderr)
            return 2
        print(json.dumps(result, indent=2))
        return 0 if result["goal"]["met"] else 1
    if args.what == "load":
        for given, option in ((args.kill_at, "--kill-at"), (args.readers, "--readers")):
            if given is not None:
                print(f"tracehouse: {option}: only with --writers", file=sys.stderr)
                return 2
        result = bench_load(args.agents, args.gpus, args.interval or 0.1, args.seconds, args.max_pending_bytes)
        print(json.dumps(result, indent=2))
        return 0 if result["goal"]["met"] else 1
    if args.what == "export":
        from tracehouse.bench.export import bench_export

        result = bench_export(args.steps)
        print(json.dumps(result, indent=2))
        return 0 if result["complete"] else 1
    if args.what == "train":
        from tracehouse.bench.train import bench_train

        result = bench_train(args.calls, args.rounds)
        print(json.dumps(result, indent=2))
        up, down = result["server_up"], result["server_down"]
        kept = up["stored_steps"] == up["recorded_steps"] and up["dropped_records"] == down["dropped_records"] == 0
        return 0 if kept else 1
    if args.what == "verdict":
        from tracehouse.bench.verdict import bench_verdict

        result = bench_verdict(args.trials, args.served_trials)
        print(json.dumps(result, indent=2))
        return 0 if result["goal"]["met"] else 1
    if args.what == "job":
        from tracehouse.bench.job import bench_job

        result = bench_job(args.ranks, args.steps, args.repeats)
        print(json.dumps(result, indent=2))
        return 0 if result["goal"]["met"] else 1
    if args.what == "run":
        from tracehouse.bench.run import bench_run

        result = bench_run(args.reps, args.gpus, args.seconds, args.children)
        print(json.dumps(result, indent=2))
        return 0 if result["process_tree"]["found_all"] else 1
    raise AssertionError(args.what)
