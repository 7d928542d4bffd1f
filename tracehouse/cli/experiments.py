"""`tracehouse run` from the command line: one command, or a matrix's slots one after another,
what is said on stderr as they end, and the matrix's summary table."""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from typing import Any

from agent.runs.children import Signals
from agent.runs.launcher import Finished, Launcher, launching
from agent.runs.matrix_model import RunSpec
from agent.runs.runargs import Settings

COMPARE_BATCH = 1000  # runs per Compare call (the service's bound)
SUMMARY_COLUMNS = ("name", "status", "exit_code", "duration_s", "sm_util_pct", "gpu_busy_pct", "energy_j",
                   "gpu_mem_peak_bytes", "run_id")  # fmt: skip


def run_one(settings: Settings, spec: RunSpec, signals: Signals) -> int:
    """Run one command as a run; returns its exit status (128+N when killed by signal N)."""
    with launching(settings, spec.name, [spec]) as launcher:
        done = launcher.run_slot([spec], signals)
        for finished in done:
            _say_finished(finished, launcher)
    _say_shipping(launcher)
    return done[0].exit_code if done else 128 + (launcher.signal or signal.SIGINT)


def run_matrix(
    settings: Settings, slots: Sequence[Sequence[RunSpec]], label: str, output_format: str, signals: Signals
) -> int:
    """Run the slots one after another (the specs of a slot together); a failed run is
    recorded and the matrix goes on; an interrupt stops it after the slot in progress. Prints
    the summary table; returns 0 when every run ended well, else 1 (130 when interrupted)."""
    specs = [spec for slot in slots for spec in slot]
    with launching(settings, label, specs) as launcher:
        for number, slot in enumerate(slots, 1):
            if launcher.interrupted:
                left = len(slots) - number + 1
                print(f"tracehouse: interrupted: {left} slots of the matrix not run", file=sys.stderr)
                break
            names = ", ".join(spec.name for spec in slot)
            print(f"tracehouse: [{number}/{len(slots)}] {names}", file=sys.stderr, flush=True)
            for finished in launcher.run_slot(slot, signals):
                _say_finished(finished, launcher)
    _say_shipping(launcher)
    _print_summary(launcher, output_format, signals)
    if launcher.interrupted:
        return 128 + (launcher.signal or signal.SIGINT)
    return 0 if all(f.exit_code == 0 for f in launcher.finished) else 1


def _say_finished(finished: Finished, launcher: Launcher) -> None:
    print(f"tracehouse: run {finished.spec.name} ({finished.run_id}): {finished.status} after {finished.seconds:g} s,"
          f" {finished.processes} processes; telemetry: {launcher.telemetry}", file=sys.stderr, flush=True)  # fmt: skip


def _say_shipping(launcher: Launcher) -> None:
    shipping = launcher.shipping
    if shipping.get("spooled_batches"):
        print(f"tracehouse: the server at {launcher.settings.server} did not answer: {shipping['spooled_batches']}"
              f" batches wait in {shipping['spool']}; the next `tracehouse run` or training run sends them once it"
              " answers (and the host's agent, where it shares $TRACEHOUSE_HOME)", file=sys.stderr)  # fmt: skip
    if shipping.get("dropped_batches"):
        print(f"tracehouse: {shipping['dropped_batches']} batches were lost: refused by the server, or pushed out of"
              " a full spool (the log above says which)", file=sys.stderr)  # fmt: skip


def _print_summary(launcher: Launcher, output_format: str, signals: Signals) -> None:
    """The matrix's table: from the Query service when the runs are stored, else what this
    process knows (telemetry figures need the store; an interrupt skips them). The host's
    agent ships its last samples within its flush interval: they are waited for."""
    import pandas as pd

    from query.client import Client, QueryFailed
    from tracehouse.cli.output import render

    finished = launcher.finished
    if not finished:
        return
    frame = pd.DataFrame(
        [{"name": f.spec.name, "status": f.status, "exit_code": f.exit_code, "duration_s": f.seconds,
          "run_id": f.run_id, **{f"tag.{k}": v for k, v in f.spec.tags.items()}} for f in finished]
    )  # fmt: skip
    if launcher.host_agent is not None and not launcher.interrupted:
        number = signals.take(min(30.0, float(launcher.host_agent.get("flush_interval_s", 2.0)) + 1.0))
        if number is not None:
            launcher.interrupted, launcher.signal = True, number
    if not launcher.shipping.get("spooled_batches") and not launcher.interrupted:
        settings = launcher.settings
        client = Client(settings.server, timeout=60.0, security=settings.security)
        try:
            ids = [f.run_id for f in finished]
            parts = [client.compare(ids[i : i + COMPARE_BATCH]) for i in range(0, len(ids), COMPARE_BATCH)]
            frame = summary_of(pd.concat(parts, ignore_index=True))
        except QueryFailed as error:
            print(f"tracehouse: telemetry figures unavailable ({error}); the runs as this process saw them:",
                  file=sys.stderr)  # fmt: skip
        finally:
            client.close()
    render(frame, output_format)


def summary_of(figures: Any) -> Any:
    """The matrix's summary from Compare's figures: SM utilisation is the run's own (its
    processes' NVML SM %), GPU busy % the traced busy time where traced, else NVML's
    utilisation (the share of time a kernel ran)."""
    frame = figures.copy()
    frame["sm_util_pct"] = frame["proc_sm_util_mean"]
    frame["gpu_busy_pct"] = frame["busy_pct"].where(frame["busy_pct"].notna(), frame["gpu_util_mean"])
    tags = sorted(c for c in frame.columns if str(c).startswith("tag."))
    return frame[[*SUMMARY_COLUMNS, *tags]]
