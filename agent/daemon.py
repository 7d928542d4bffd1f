"""`tracehouse agent`: wire backend, sampler, batcher, shipper and spool; run until told to stop."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from agent.runs.presence import announce
from agent.runs.runspool import replay_spools
from agent.shipping.batcher import Batcher
from agent.shipping.shipper import Shipper
from agent.shipping.spool import Spool
from agent.shipping.stats import Stats
from agent.telemetry.gpu import GpuBackend
from agent.telemetry.host import HostSampler
from agent.telemetry.sampler import CLOCK_STEP_NS, STAMP_NS, Sampler
from agent.telemetry.schedule import run_fixed_rate
from tracehouse import config, metrics
from tracehouse.channel import ClientSecurity
from tracehouse.ids import make_run_id
from tracehouse.model import NO_GPU

log = logging.getLogger("tracehouse.agent")


@dataclass(frozen=True)
class AgentConfig:
    server: str
    spool: Path
    interval: float = 0.1  # seconds between fast ticks
    slow_interval: float = 1.0  # PCIe, GPM, processes, host metrics
    flush_interval: float = 2.0  # a batch closes after this long...
    flush_values: int = 50_000  # ...or with this many values
    spool_max_bytes: int = 1 << 30
    run_name: str = ""
    host: str = ""
    security: ClientSecurity | None = None  # bearer token, TLS
    shutdown_timeout: float = 10.0  # time to ship what is pending when stopping
    max_backoff: float = 30.0  # longest wait between tries while the server is away
    host_metrics: bool = True
    watch: Path | None = None  # a folder of Nsight Systems exports to import as they appear
    watch_interval: float = 2.0
    # the host's agent: says it runs (for `tracehouse run`) and sends what runs left spooled
    host_agent: bool = False
    runs_spool: Path | None = None  # the runs' spools it replays (default $TRACEHOUSE_HOME/spool/runs)
    replay_interval: float = 30.0


class Agent:
    """`wall_ns`: the host's wall clock, that readings are stamped with and the clock offset is of."""

    def __init__(self, config: AgentConfig, backend: GpuBackend, wall_ns: Callable[[], int] = time.time_ns) -> None:
        self.config = config
        self.backend = backend
        self.host = config.host or socket.gethostname()
        self.wall_ns = wall_ns
        self.started_ns = wall_ns()
        self.run_id = make_run_id(config.run_name, self.host, self.started_ns)
        self.stats = Stats()
        self.earlier_dropped = 0
        self.earlier_unknown: list[str] = []  # spool files moved aside whose value counts are unknown
        self.spool = Spool(config.spool, config.spool_max_bytes, on_drop=self._dropped, on_unknown=self._unknown)
        self.shipper = Shipper(
            config.server,
            self.spool,
            on_stored=self._stored,
            on_dropped=self._dropped,
            on_duplicate=self._duplicate,
            security=config.security,
            max_backoff=config.max_backoff,
            wall_ns=wall_ns,
        )
        self.batcher = Batcher(self.run_id, self.host, self.shipper.submit, config.flush_values, config.flush_interval)
        self.sampler = Sampler(
            backend, self.batcher, self.stats, HostSampler() if config.host_metrics else None, wall_ns=wall_ns
        )
        self._offset_stamp = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._cpu_started = 0.0
        self._presence: IO[str] | None = None
        self.watcher = None
        if config.watch is not None:
            from agent.traces.watch import FolderWatcher, ShipperSink

            self.watcher = FolderWatcher(
                config.watch,
                ShipperSink(self.shipper.submit),
                config.spool / "watched.json",
                self.host,
                config.watch_interval,
            )

    def _mine(self, batch_id: str) -> bool:
        return batch_id.startswith(f"{self.run_id}/")

    def _stored(self, batch_id: str, values: int) -> None:
        self.stats.add(**{"stored" if self._mine(batch_id) else "recovered": values})

    def _duplicate(self, batch_id: str, values: int) -> None:
        """The server had this batch before: stored, for one of this session (a retry after an
        answer that was lost), but not recovered again, for one replayed from the spool."""
        self.stats.add(**{"stored" if self._mine(batch_id) else "already_stored": values})

    def _unknown(self, file_name: str) -> None:
        self.earlier_unknown.append(file_name)

    def _dropped(self, batch_id: str, values: int) -> None:
        if self._mine(batch_id):
            self.stats.add(dropped=values)
        else:
            self.earlier_dropped += values

    def _describe_run(self, end: int | None = None) -> None:
        self.batcher.describe_run(
            run_id=self.run_id,
            name=self.config.run_name or f"agent on {self.host}",
            host=self.host,
            source="agent",
            start=self.started_ns,
            end=end,
            attrs={
                "backend": self.backend.name,
                "interval_s": str(self.config.interval),
                "gpus": str(len(self.backend.indices())),
            },
        )

    def start(self) -> None:
        log.info(
            "agent %s: %d GPUs (%s) every %g s -> %s; spool %s",
            self.run_id, len(self.backend.indices()), self.backend.name, self.config.interval,
            self.config.server, self.config.spool,
        )  # fmt: skip
        if self.spool.batches:
            log.info("spool holds %d batches from earlier: replaying them first", self.spool.batches)
        self._cpu_started = time.process_time()
        self._describe_run()
        self.batcher.describe_devices(self.backend.devices())
        for name, interval, tick in (
            ("sampler", self.config.interval, self.sampler.fast_tick),
            ("slow-sampler", self.config.slow_interval, self._slow_tick),
        ):
            thread = threading.Thread(target=run_fixed_rate, args=(interval, self._stop, tick), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        if self.watcher is not None:
            self.watcher.start()
        if self.config.host_agent:
            self._presence = announce(
                self.config.server,
                {"run_id": self.run_id, "backend": self.backend.name, "gpus": self.backend.indices(),
                 "interval_s": self.config.interval, "flush_interval_s": self.config.flush_interval},
            )  # fmt: skip
            replayer = threading.Thread(target=self._replay_runs, name="runs-replay", daemon=True)
            replayer.start()
            self._threads.append(replayer)

    def _slow_tick(self, missed: int = 0) -> None:
        self.sampler.slow_tick(missed)
        self._record_clock_offset()

    def _record_clock_offset(self) -> None:
        """The host's clock offset to the server, once a write measured it since the last record."""
        wall, monotonic = self.wall_ns(), time.monotonic_ns()
        estimate = self.shipper.clock.fresh(monotonic, wall - monotonic)
        if estimate is None:
            return
        stamp = wall // STAMP_NS * STAMP_NS
        if self._offset_stamp - CLOCK_STEP_NS < stamp <= self._offset_stamp:  # one record an instant
            stamp = self._offset_stamp + STAMP_NS
        self._offset_stamp = stamp
        readings = {
            metrics.AGENT_SERVER_OFFSET: float(estimate.offset_ns),
            metrics.AGENT_SERVER_OFFSET_UNCERTAINTY: float(estimate.uncertainty_ns),
        }
        self.batcher.add(stamp, NO_GPU, readings)
        self.stats.add(sampled=len(readings))

    def _replay_runs(self) -> None:
        """Send what runs (`tracehouse run`, the training API) left in their spools for this
        agent's server, now and every replay_interval seconds."""
        root = self.config.runs_spool or config.default_spool() / "runs"
        while True:
            try:
                replay_spools(root, self.config.server, self.config.security, self._stop)
            except Exception:
                log.exception("replaying the runs' spools in %s failed", root)
            if self._stop.wait(self.config.replay_interval):
                return

    def stop(self, shutdown_timeout: float | None = None) -> dict[str, object]:
        """Stop sampling, ship (for up to shutdown_timeout seconds, default the config's) or
        spool everything, and return the counts."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
        if self.watcher is not None:
            self.watcher.stop()
        cpu_seconds = time.process_time() - self._cpu_started
        if self._presence is not None:
            self._presence.close()
        self._describe_run(end=self.wall_ns())
        self.batcher.flush()
        self.shipper.shutdown(self.config.shutdown_timeout if shutdown_timeout is None else shutdown_timeout)
        self.backend.close()
        counts = self.stats.snapshot()
        report: dict[str, object] = {
            "sampled": counts["sampled"],
            "stored": counts["stored"],
            "spooled": self.spool.values_of(f"{self.run_id}/"),
            "dropped": counts["dropped"],
            "invalid": counts["invalid"],
            "missed_ticks": counts["missed_ticks"],
            "recovered": counts["recovered"],
            "already_stored": counts["already_stored"],
            # a spool file whose header failed its checks lost an unknown number of values
            "earlier_dropped": "unknown" if self.earlier_unknown else self.earlier_dropped,
            "run_id": self.run_id,
            "cpu_seconds": round(cpu_seconds, 4),
            "seconds": round((self.wall_ns() - self.started_ns) / 1e9, 3),
        }
        if self.earlier_unknown:
            log.warning(
                "values of earlier sessions lost: %d counted, and an unknown number in %d spool files moved aside (%s)",
                self.earlier_dropped, len(self.earlier_unknown), ", ".join(self.earlier_unknown[:5]),
            )  # fmt: skip
        if report["spooled"]:
            log.warning("%d values wait in the spool %s for the next start", report["spooled"], self.spool.folder)
        return report


def open_backend(simulate: int | None) -> GpuBackend:
    """The simulated backend with `simulate` GPUs, or NVML (BackendUnavailable without a driver)."""
    if simulate:
        from agent.telemetry.simulated import SimulatedBackend

        return SimulatedBackend(simulate)
    from agent.telemetry.nvml import NvmlBackend

    return NvmlBackend()
