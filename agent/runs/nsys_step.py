"""The Nsight Systems step of a run under `--nsys`, once its command ended: the report `nsys profile`
wrote, exported to SQLite with `nsys export` and imported into the run (agent.traces.importer).
What happened is told in the run's attributes (`trace`, `nsys.report`, `nsys.export`, `trace.*`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from agent.runs import children
from agent.runs.runargs import nsys_path

if TYPE_CHECKING:
    from agent.shipping.spool import EncodedBatch


def import_trace(
    output: Path,
    attrs: dict[str, str],
    run_id: str,
    host: str,
    submit: Callable[[EncodedBatch], None],
    wait: Callable[[int], int],
) -> None:
    """Export nsys's report (written at `output` + .nsys-rep) to SQLite and import it into the run,
    its batches given to `submit`; `wait` waits for the export's process (its pid) and returns its
    exit status. A file the importer refuses part way leaves what was sent before in the run: its
    `trace` attribute says so."""
    from agent.traces.importer import import_export
    from agent.traces.tracefile import TraceFileError
    from agent.traces.watch import ShipperSink

    written = [Path(f"{output}{suffix}") for suffix in (".nsys-rep", ".qdrep")]
    report = next((path for path in written if path.exists()), None)
    if report is None:
        attrs["trace"] = f"none: nsys wrote no report at {output}.nsys-rep"
        return
    attrs["nsys.report"] = str(report)
    export = Path(f"{output}.sqlite")
    argv = [nsys_path(), "export", "--type=sqlite", f"--output={export}", "--force-overwrite=true", str(report)]
    code = wait(children.spawn(argv, os.environ, stdout_to_stderr=True))
    if code != 0 or not export.exists():
        attrs["trace"] = f"not imported: `nsys export` ended with {children.status_of(code)[0]}"
        return
    try:
        result = import_export(export, ShipperSink(submit), host=host, into_run=run_id)
    except TraceFileError as error:
        attrs["trace"] = f"not imported, or only in part: {error}"[:1024]
        return
    attrs["trace"] = "nsys"
    attrs["nsys.export"] = str(export)
    attrs.update({f"trace.{k}": v for k, v in result.attrs.items() if k not in ("command", "file")})
