"""Import Nsight Systems exports that appear in a folder, once they stop growing."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from agent.shipping.spool import EncodedBatch
from agent.traces.importer import import_export
from agent.traces.tracefile import TraceFileError
from tracehouse.batch import encode_request
from tracehouse.regularfile import read_regular
from tracehouse.v1 import batch_pb2

log = logging.getLogger("tracehouse.agent.watch")
MAX_STATE_BYTES = 64 << 20  # what was imported: a line of JSON a file


class ShipperSink:
    """Import batches go out through the agent's shipper (and its spool), in order; the
    final batch, which makes the run visible, leaves last."""

    def __init__(self, submit: object) -> None:
        self._submit = submit

    def write(self, batch: batch_pb2.Batch) -> None:
        self._submit(EncodedBatch(batch.batch_id, encode_request(batch), 0))  # type: ignore[operator]

    def flush(self) -> None:
        """Nothing to wait for: the shipper keeps the order."""


class FolderWatcher:
    """Polls `folder` every `interval` seconds; a `*.sqlite` file is imported when two polls in
    a row see the same size and time and no SQLite journal beside it. What was imported (or
    refused) is remembered in `state`, so a restart does not import it again."""

    def __init__(self, folder: Path, sink: ShipperSink, state: Path, host: str, interval: float = 2.0) -> None:
        self.folder = folder
        self.sink = sink
        self.state = state
        self.host = host
        self.interval = interval
        self._seen: dict[str, tuple[int, int]] = {}
        self._done: dict[str, str] = self._load()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watch", daemon=True)

    def _load(self) -> dict[str, str]:
        try:
            return dict(json.loads(read_regular(self.state, MAX_STATE_BYTES)))
        except (OSError, ValueError):
            return {}

    def _save(self) -> None:
        temporary = self.state.with_suffix(".tmp")
        temporary.write_text(json.dumps(self._done))
        temporary.replace(self.state)

    def start(self) -> None:
        log.info("watching %s for Nsight Systems exports", self.folder)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        for path in sorted(self.folder.glob("*.sqlite")):
            try:
                stat = path.stat()
            except OSError:
                continue
            key = f"{stat.st_size}:{stat.st_mtime_ns}"
            if self._done.get(str(path)) == key:
                continue
            now = (stat.st_size, stat.st_mtime_ns)
            journal = any(path.with_name(path.name + s).exists() for s in ("-journal", "-wal"))
            if self._seen.get(str(path)) != now or journal:
                self._seen[str(path)] = now  # still growing, or just appeared: look again next time
                continue
            self._import(path, key)

    def _import(self, path: Path, key: str) -> None:
        try:
            result = import_export(path, self.sink, host=self.host)
            log.info("imported %s as run %s: %s", path.name, result.run_id, result.events)
        except TraceFileError as error:
            log.error("cannot import %s: %s", path.name, error)
        except Exception as error:  # a defect in a reader: one line, and the watch goes on
            log.error("cannot import %s: %s: %s", path.name, type(error).__name__, str(error).splitlines()[:1])
        self._done[str(path)] = key
        self._save()
