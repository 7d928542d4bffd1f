"""Nsight Systems import: real exports from nsys 2021.2 to 2026.1, synthetic ones in several
versions' shapes, nsys-stats parity of the summaries, idempotence, and bad files."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import shutil
import sqlite3
import statistics
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.shipping.writer import BatchWriter
from agent.traces.importer import import_export
from agent.traces.nsys import MEMCPY_KINDS, NsysError
from agent.traces.nsys_synthetic import PID, SESSION_START_NS, Spec, global_tid, write_export
from ingest.commitpolicy import CommitPolicy
from query.client import Client, QueryFailed
from store.store import Store
from tests.conftest import FIXTURES
from tests.helpers import import_refused
from tracehouse.cli.main import main
from tracehouse.cli.serve import create_server
from tracehouse.model import Limits
from tracehouse.v1 import batch_pb2

NSYS = FIXTURES / "nsys"
REAL = sorted(NSYS.glob("*.sqlite")) if NSYS.is_dir() else []
needs_fixtures = pytest.mark.skipif(not REAL, reason=f"no real exports in {NSYS}")


@pytest.fixture
def writer(address: str) -> Iterator[BatchWriter]:
    opened = BatchWriter(address, patience=10)
    yield opened
    opened.close()


def db(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def tables(path: Path) -> set[str]:
    with db(path) as connection:
        return {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def count(path: Path, sql: str) -> int:
    with db(path) as connection:
        return int(connection.execute(sql).fetchone()[0])


def expected_events(path: Path) -> dict[str, int]:
    """Row counts of the source tables, per event kind. Left out on purpose: RUNTIME rows
    of event classes other than the CUDA runtime and driver (2022.2 repeats 38 calls as
    class 67 "CUDA backtrace" rows), and NVTX rows that are not ranges or marks (domain
    creation, thread naming)."""
    found = tables(path)
    expected: dict[str, int] = {}
    for kind, table, where in (
        ("kernel", "CUPTI_ACTIVITY_KIND_KERNEL", ""),
        ("memcpy", "CUPTI_ACTIVITY_KIND_MEMCPY", ""),
        ("memset", "CUPTI_ACTIVITY_KIND_MEMSET", ""),
        ("cuda_api", "CUPTI_ACTIVITY_KIND_RUNTIME", "WHERE eventClass IN (0, 1)"),
        ("sync", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", ""),
        ("nvtx", "NVTX_EVENTS", "WHERE eventType IN (59, 60, 70, 71)"),
        ("mark", "NVTX_EVENTS", "WHERE eventType IN (34, 65)"),
        ("osrt", "OSRT_API", ""),
        ("cudnn", "CUDNN_EVENTS", ""),
        ("cublas", "CUBLAS_EVENTS", ""),
    ):
        if table in found:
            n = count(path, f"SELECT count(*) FROM {table} {where}")
            if n:
                expected[kind] = n
    return expected


def stored_events(client: Client, run_id: str) -> dict[str, int]:
    frame = client.sql(
        f"SELECT kind, count() AS n FROM events WHERE run_id = '{run_id}' "
        "AND kind NOT IN ('process', 'thread') GROUP BY kind"
    )
    return dict(zip(frame["kind"], (int(n) for n in frame["n"]), strict=True))


# -- nsys-stats semantics, computed independently from the SQLite file -----------------------


def _stats(values_by_name: dict[Any, list[int]], unit: str = "ns") -> dict[Any, dict[str, float]]:
    totals = {name: sum(values) for name, values in values_by_name.items()}
    grand = sum(totals.values())
    return {
        name: {
            "instances": len(values),
            f"total_{unit}": totals[name],
            f"avg_{unit}": statistics.fmean(values),
            f"med_{unit}": statistics.median(values),  # the mean of the two middle values
            f"min_{unit}": min(values),
            f"max_{unit}": max(values),
            f"stddev_{unit}": statistics.stdev(values) if len(values) > 1 else 0.0,
            "time_pct" if unit == "ns" else "pct": 100 * totals[name] / grand,
        }
        for name, values in values_by_name.items()
    }


def nsys_stats(path: Path, report: str) -> dict[Any, dict[str, float]]:
    found = tables(path)
    groups: dict[Any, list[int]] = defaultdict(list)
    with db(path) as connection:
        if report == "kernels" and "CUPTI_ACTIVITY_KIND_KERNEL" in found:
            rows = connection.execute(
                'SELECT s.value, k."end" - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k '
                "JOIN StringIds s ON s.id = k.demangledName"
            )
            for name, duration in rows:
                groups[name].append(duration)
        if report == "api" and "CUPTI_ACTIVITY_KIND_RUNTIME" in found:
            rows = connection.execute(
                'SELECT s.value, r."end" - r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r '
                "JOIN StringIds s ON s.id = r.nameId WHERE r.eventClass IN (0, 1)"
            )
            for name, duration in rows:
                groups[re.sub(r"_v\d+$", "", name)].append(duration)
        if report in ("memops", "memsize"):
            measure = "bytes" if report == "memsize" else '"end" - start'
            if "CUPTI_ACTIVITY_KIND_MEMCPY" in found:
                for kind, value in connection.execute(f"SELECT copyKind, {measure} FROM CUPTI_ACTIVITY_KIND_MEMCPY"):
                    groups[f"[CUDA memcpy {MEMCPY_KINDS[kind]}]"].append(value)
            if "CUPTI_ACTIVITY_KIND_MEMSET" in found:
                for (value,) in connection.execute(f"SELECT {measure} FROM CUPTI_ACTIVITY_KIND_MEMSET"):
                    groups["[CUDA memset]"].append(value)
        if report == "nvtx" and "NVTX_EVENTS" in found:
            latest = connection.execute('SELECT max(max(start), max("end")) FROM NVTX_EVENTS').fetchone()[0]
            domains = {
                (d, (tid >> 24) & 0xFFFFFF): text
                for d, tid, text in connection.execute(
                    "SELECT domainId, globalTid, text FROM NVTX_EVENTS WHERE eventType = 75"
                )
            }
            rows = connection.execute(
                'SELECT n.start, n."end", n.text, s.value, n.domainId, n.globalTid, n.eventType FROM NVTX_EVENTS n '
                "LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType IN (59, 60, 70, 71)"
            )
            for start, end, text, registered, domain, tid, event_type in rows:
                label = registered if registered is not None else text
                prefix = domains.get((domain, (tid >> 24) & 0xFFFFFF))
                name = f"{prefix}:{label}" if prefix else label
                style = "PushPop" if event_type in (59, 70) else "StartEnd"  # nvtx_sum's Style column
                groups[(name, style)].append((latest if end is None else end) - start)
    return _stats(groups, "bytes" if report == "memsize" else "ns")


def assert_same_summary(got: list[dict[str, Any]], expected: dict[Any, dict[str, float]]) -> None:
    """Rows keyed by name, or by (name, style) where the summary has styles."""
    keys = [(row["name"], row["style"]) if "style" in row else row["name"] for row in got]
    assert sorted(keys) == sorted(expected)
    totals = [row[next(k for k in row if k.startswith("total_"))] for row in got]
    assert totals == sorted(totals, reverse=True), "ordered by total"
    for key, row in zip(keys, got, strict=True):
        for column, value in expected[key].items():
            assert row[column] == pytest.approx(value, rel=1e-9, abs=1e-6), (key, column)


# -- real exports ------------------------------------------------------------------------------


@needs_fixtures
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_export_imports_every_row_and_matches_nsys_stats(
    path: Path, writer: BatchWriter, client: Client, address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    result = import_export(path, writer)
    expected = expected_events(path)
    assert result.events == expected
    assert stored_events(client, result.run_id) == expected
    run = client.runs().set_index("run_id").loc[result.run_id]
    has_start_time = "TARGET_INFO_SESSION_START_TIME" in tables(path)
    assert bool(run["relative_time"]) is not has_start_time
    assert run["attrs"]["sha256"] and run["attrs"]["nsys_version"] != "unknown"
    for report in ("kernels", "api", "memops", "memsize", "nvtx"):
        assert main(["query", report, "--run", result.run_id, "--server", address, "--format", "json"]) == 0
        assert_same_summary(json.loads(capsys.readouterr().out), nsys_stats(path, report))
    assert len(client.devices()) == count(path, "SELECT count(*) FROM TARGET_INFO_GPU")


@needs_fixtures
def test_importing_again_changes_nothing(writer: BatchWriter, client: Client) -> None:
    path = NSYS / "nsys-2024.5-pipit-cloverleaf-4xa100.sqlite"
    first = import_export(path, writer)
    before = client.sql("SELECT count() AS n, sum(cityHash64(*)) AS h FROM events").iloc[0].to_dict()
    batches_before = writer.batches
    second = import_export(path, writer)
    assert second.run_id == first.run_id and second.events == first.events
    assert writer.duplicates == writer.batches - batches_before, "every batch was already stored"
    assert client.sql("SELECT count() AS n, sum(cityHash64(*)) AS h FROM events").iloc[0].to_dict() == before
    assert len(client.runs()) == 1


def test_importing_a_finished_file_again_under_a_new_name_renames_the_run(
    tmp_path: Path, address: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.sqlite"
    write_export(path, Spec(steps=2))
    errors = io.StringIO()
    monkeypatch.setattr("sys.stderr", errors)  # not a terminal: no progress bar
    assert main(["import", "--server", address, str(path)]) == 0
    assert main(["import", "--server", address, "--run-name", "renamed", "--tag", "team=perf", str(path)]) == 0, (
        errors.getvalue()
    )
    runs = client.runs()
    assert len(runs) == 1 and runs["name"][0] == "renamed" and runs["tags"][0] == {"team": "perf"}
    assert not client.summary("kernels", run=runs["run_id"][0]).empty, "the run is still visible, not importing"


@needs_fixtures
def test_gpu_work_is_linked_to_the_call_that_launched_it(writer: BatchWriter, client: Client) -> None:
    path = NSYS / "nsys-2026.1-test-cuda.sqlite"
    result = import_export(path, writer)
    kernels = client.events(kinds=["kernel"], run=result.run_id)
    with db(path) as connection:
        start = connection.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
        calls = {
            corr: (call_start, tid & 0xFFFFFF)
            for corr, call_start, tid in connection.execute(
                "SELECT correlationId, start, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME"
            )
        }
        first = connection.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert int(kernels["start"].min().value) == start + first, "absolute UTC ns"
    for row in kernels.itertuples():
        call_start, tid = calls[row.correlation_id]
        assert int(row.launch_start.value) == start + call_start
        assert row.tid == tid and row.pid == tid  # a single-threaded program
    assert kernels["extras"][0]["short_name"] == "add_parallel"
    assert kernels["extras"][0]["mangled_name"].startswith("_Z")


# -- synthetic exports in several versions' shapes --------------------------------------------


@pytest.mark.parametrize("shape", ["2021.2", "2022.4", "2026.1"])
def test_synthetic_exports_of_each_shape(shape: str, tmp_path: Path, writer: BatchWriter, client: Client) -> None:
    path = tmp_path / f"synthetic-{shape}.sqlite"
    write_export(path, Spec(shape=shape, steps=30))
    result = import_export(path, writer, run_name="resnet", host="node-1", tags={"bs": "256"})
    assert result.events == expected_events(path)
    run = client.runs().iloc[0]
    assert (run["name"], run["host"], run["tags"]) == ("resnet", "node-1", {"bs": "256"})
    nvtx = client.events(kinds=["nvtx"], run=result.run_id, limit=5)
    assert list(nvtx["name"][:4]) == ["train_step", "trainer:step", "forward", "backward"]
    assert list(nvtx["depth"][:4]) == [0, 0, 1, 1], "push/pop ranges nest; start/end ranges do not"
    assert nvtx["extras"][0] == {"style": "PushPop", "color": "#FF76B900"}
    marks = client.events(kinds=["mark"], run=result.run_id)
    assert (marks["start"] == marks["end"]).all() and marks["name"][0] == "batch 0"
    if shape == "2021.2":
        assert result.relative_time and int(client.events(run=result.run_id)["start"].min().value) >= 0
    else:
        assert int(nvtx["start"].min().value) > SESSION_START_NS
    metrics = client.metrics(run=result.run_id)
    if shape == "2026.1":
        assert set(metrics["metric"]) == {"SMs Active [Throughput %]", "DRAM Read Bandwidth [Throughput %]"}
        assert set(metrics["samples"]) == {result.samples // 2}
    else:
        assert metrics.empty
    names = client.events(kinds=["process", "thread"], run=result.run_id)
    assert set(zip(names["kind"], names["name"], strict=True)) >= {("thread", "python")}
    if shape != "2021.2":
        assert ("process", "python train.py") in set(zip(names["kind"], names["name"], strict=True))


class FailAfter:
    """A sink that stops after some batches, as an import killed half-way would."""

    def __init__(self, inner: BatchWriter, batches: int) -> None:
        self.inner = inner
        self.left = batches

    def write(self, batch: batch_pb2.Batch) -> None:
        if self.left == 0:
            raise KeyboardInterrupt
        self.left -= 1
        self.inner.write(batch)

    def flush(self) -> None:
        self.inner.flush()


def test_an_interrupted_import_is_invisible_and_finished_by_running_it_again(
    tmp_path: Path, writer: BatchWriter, client: Client
) -> None:
    path = tmp_path / "big.sqlite"
    write_export(path, Spec(steps=4000, kernels_per_step=20))  # several chunks per table
    with pytest.raises(KeyboardInterrupt):
        import_export(path, FailAfter(writer, 3))
    writer.flush()
    assert int(client.sql("SELECT count() AS n FROM events")["n"][0]) > 0, "some chunks were stored"
    assert client.runs().empty
    assert client.events().empty and client.summary("kernels").empty
    result = import_export(path, writer)
    assert stored_events(client, result.run_id) == expected_events(path)
    assert int(client.sql("SELECT count() - uniqExact(id) AS dup FROM events")["dup"][0]) == 0


def test_a_small_exports_batches_are_stored_together_between_its_runs_begin_and_end(
    tmp_path: Path, store: Store, limits: Limits
) -> None:
    """Its batches of rows and names go to the server at once, so one commit interval stores them all:
    three groups in all (the run's begin, its rows, its end), where a writer that kept two calls in
    flight took a group, and an interval, for every two."""
    path = tmp_path / "small.sqlite"
    write_export(path, Spec())
    server = create_server(store, "127.0.0.1:0", limits, commit=CommitPolicy(interval_s=1.0))
    try:
        with contextlib.closing(BatchWriter(f"127.0.0.1:{server.port}", patience=10)) as writer:
            result = import_export(path, writer)
        assert server.commit is not None
        groups = server.commit.groups
    finally:
        server.stop(grace=5)
    assert sum(result.events.values()) == sum(expected_events(path).values())
    assert writer.batches >= 6  # the begin, the end and at least four batches between them
    assert groups == 3, f"{groups} groups for {writer.batches} batches"


# -- bad files ----------------------------------------------------------------------------------


def _corrupt(path: Path, at: int, data: bytes) -> None:
    with path.open("r+b") as file:
        file.seek(at)
        file.write(data)


def _null_start(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.executescript(
            "CREATE TABLE k AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL;"
            "UPDATE k SET start = NULL WHERE rowid = 7;"
            "DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL; ALTER TABLE k RENAME TO CUPTI_ACTIVITY_KIND_KERNEL;"
        )


def _backwards(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute('UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET "end" = start - 10 WHERE rowid = 3')


BAD_FILES = {
    "not a SQLite file": (lambda p: p.write_text("start,end\n1,2\n"), "not a SQLite file"),
    "a report, not an export": (lambda p: p.write_bytes(b"PK\x03\x04report"), "nsys export --type sqlite"),
    "SQLite but not nsys": (
        lambda p: sqlite3.connect(p).execute("CREATE TABLE songs (title TEXT)").connection.commit(),
        "not an Nsight Systems export",
    ),
    "truncated": (
        lambda p: (write_export(p), p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])),
        "corrupt",
    ),
    "zeroed page": (lambda p: (write_export(p), _corrupt(p, 4096, bytes(4096))), "corrupt"),
    "rows without start": (lambda p: (write_export(p), _null_start(p)), "rows without start"),
    "end before start": (lambda p: (write_export(p), _backwards(p)), "end before they start"),
    "still being written": (
        lambda p: (write_export(p), p.with_name(p.name + "-journal").write_bytes(b"")),
        "still being written",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_files_exit_2_with_one_line_and_leave_nothing_visible(
    case: str, tmp_path: Path, address: str, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    make, reason = BAD_FILES[case]
    path = tmp_path / ("report.nsys-rep" if "report" in case else "bad.sqlite")
    make(path)

    def nothing_visible() -> bool:
        return client.runs().empty and client.events().empty

    good = tmp_path / "good.sqlite"
    import_refused(path, reason, address, capsys, nothing_visible, (good, lambda p: write_export(p, Spec(steps=2))))


def test_import_cli_prints_one_json_line_per_file(
    tmp_path: Path, address: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    files = [tmp_path / "a.sqlite", tmp_path / "b.sqlite"]
    for seed, path in enumerate(files):
        write_export(path, Spec(steps=3, seed=seed))
    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a terminal: no progress bar
    code = main(["import", "--server", address, "--tag", "team=perf", "--run-name", "nightly", *map(str, files)])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and [Path(line["file"]).name for line in lines] == ["a.sqlite", "b.sqlite"]
    assert lines[0]["run_id"] != lines[1]["run_id"], "different content, different runs"
    assert lines[0]["events"] == {"kernel": 15, "memcpy": 3, "cuda_api": 21, "sync": 3, "nvtx": 12, "mark": 3,
                                  "osrt": 6}  # fmt: skip


def test_a_run_being_imported_is_not_found(tmp_path: Path, writer: BatchWriter, client: Client) -> None:
    path = tmp_path / "x.sqlite"
    write_export(path, Spec(steps=2))
    with pytest.raises(KeyboardInterrupt):
        import_export(path, FailAfter(writer, 2))
    writer.flush()
    run_id = client.sql("SELECT DISTINCT run_id FROM runs")["run_id"][0]
    with pytest.raises(QueryFailed, match="still being imported"):
        client.summary("kernels", run=run_id)


def test_export_errors_are_one_line(tmp_path: Path) -> None:
    from agent.traces.nsys import Export

    path = tmp_path / "empty.sqlite"
    sqlite3.connect(path).execute("CREATE TABLE StringIds (id INTEGER, value TEXT)").connection.commit()
    with Export(path) as export:  # an nsys export with nothing in it is still an export
        assert export.sources() == [] and export.session.gpus == ()
    with pytest.raises(NsysError) as caught:
        Export(tmp_path / "missing.sqlite")
    assert "\n" not in str(caught.value)


@needs_fixtures
def test_fixtures_are_not_copied_into_the_project() -> None:
    here = Path(__file__).resolve().parents[1]
    names = {p.name for p in REAL}
    assert not [p for p in here.rglob("*.sqlite") if p.name in names and ".venv" not in p.parts]
    assert shutil.which("nsys") is None or True  # nsys itself is never needed


def test_agent_watch_imports_exports_once_they_stop_growing(
    tmp_path: Path, server: Any, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    import time

    from agent.daemon import Agent, AgentConfig
    from agent.telemetry.simulated import SimulatedBackend

    caplog.set_level(logging.INFO, "tracehouse.agent.watch")
    folder = tmp_path / "exports"
    folder.mkdir()
    source = tmp_path / "whole.sqlite"
    write_export(source, Spec(steps=5))
    data = source.read_bytes()
    target = folder / "run1.sqlite"
    (folder / "notes.sqlite").write_text("not an export")
    config = AgentConfig(
        server=f"127.0.0.1:{server.port}", spool=tmp_path / "spool", interval=0.05, slow_interval=0.2,
        flush_interval=0.2, watch=folder, watch_interval=3600, host_metrics=False,
    )  # fmt: skip
    agent = Agent(config, SimulatedBackend(1))
    agent.start()
    assert agent.watcher is not None
    watcher = agent.watcher
    target.write_bytes(data[: len(data) // 3])  # nsys is writing it
    watcher.poll()
    target.write_bytes(data[: len(data) // 2])
    watcher.poll()  # it grew: not yet
    target.write_bytes(data)
    journal = target.with_name(target.name + "-journal")
    journal.write_bytes(b"")
    watcher.poll()
    watcher.poll()  # the same size twice, but a journal says it is still being written
    assert client.runs(source="nsys").empty
    journal.unlink()
    watcher.poll()  # first sight of it finished
    watcher.poll()  # unchanged since: import
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and client.runs(source="nsys").empty:
        time.sleep(0.1)
    agent.stop()
    runs = client.runs(source="nsys")
    assert list(runs["name"]) == ["run1"]
    assert stored_events(client, runs["run_id"][0]) == expected_events(source)
    messages = [r.getMessage() for r in caplog.records]
    assert any("cannot import notes.sqlite" in m for m in messages)
    assert not any("cannot import run1" in m for m in messages), "never read while being written"
    again = Agent(config, SimulatedBackend(1))
    assert again.watcher is not None
    again.watcher.poll()
    again.watcher.poll()
    again.shipper.shutdown(1)
    imported = [m for m in (r.getMessage() for r in caplog.records) if m.startswith("imported run1.sqlite")]
    assert len(imported) == 1, "remembered: a restarted agent does not import it again"


def test_ranges_without_gpu_work_have_no_projected_gpu_time_and_the_driver_reads_as_a_version(
    writer: BatchWriter, client: Client
) -> None:
    """saxpy's MPI ranges launch nothing: their GPU time is empty (not a capped 2**63 - 1), and they
    sort after the range that has work."""
    path = NSYS / "nsys-2022.2-pipit-saxpy-mpi-cuda.sqlite"
    if not path.exists():
        pytest.skip(f"no {path}")
    run = import_export(path, writer).run_id
    summary = client.nvtx_gpu(run=run)["summary"]
    idle = summary[summary["with_gpu_work"] == 0]
    busy = summary[summary["with_gpu_work"] > 0]
    assert len(idle) and len(busy), summary[["name", "with_gpu_work"]]
    assert idle["gpu_total_ns"].isna().all() and idle["gpu_stddev_ns"].isna().all()
    assert (busy["gpu_total_ns"] > 0).all() and busy["gpu_total_ns"].max() < 2**62
    assert list(summary.index[: len(busy)]) == list(busy.index), "the ranges with GPU work come first"
    drivers = set(client.devices()[lambda d: d["run_id"] == run]["driver"])
    assert drivers == {"525.105.17"}, "Nsight's NvDriverVersion 52510517, as NVIDIA writes it"


def test_a_reexport_of_a_profile_changes_none_of_the_first_runs_answers(
    writer: BatchWriter, client: Client, tmp_path: Path
) -> None:
    """The same profile exported again (other file bytes: another run, with the same host, process,
    threads and times) is imported beside the first: each run's ranges meet its own GPU work only."""
    path = NSYS / "nsys-2022.2-pipit-saxpy-mpi-cuda.sqlite"
    if not path.exists():
        pytest.skip(f"no {path}")
    run = import_export(path, writer).run_id
    before = client.nvtx_gpu(run=run, limit=1000)
    copy = tmp_path / "exported-again.sqlite"
    shutil.copy(path, copy)
    with sqlite3.connect(copy) as export:
        export.execute("CREATE TABLE exported_again (note TEXT)")
    again = import_export(copy, writer).run_id
    assert again != run
    after = client.nvtx_gpu(run=run, limit=1000)
    for part in ("summary", "ranges"):
        assert after[part].equals(before[part]), after[part]
    assert client.nvtx_gpu(run=again, limit=1000)["summary"].equals(before["summary"])
    assert before["summary"].set_index("name").loc["saxpy", "kernels"] == 5


def test_start_end_ranges_are_summarized_apart_and_projected_only_when_they_end_where_they_start(
    tmp_path: Path, writer: BatchWriter, client: Client, address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """As Nsight Systems: a name used both as push/pop and as start/end has a row per style (nvtx_sum,
    nvtx_gpu_proj_sum), and a start/end range that ends on another thread than it started on is kept, with
    that thread, but projected onto no GPU work (Nsight projects only ranges that start and end on one thread)."""
    path = tmp_path / "styles.sqlite"
    write_export(path, Spec(steps=4))
    worker = global_tid(PID, PID + 9)
    with sqlite3.connect(path) as export:
        for name, end_thread, like in (
            ("forward", "NULL", "text = 'forward'"),  # the push/pop ranges' name and times, as start/end
            ("handoff", str(worker), "textId IS NOT NULL"),  # over each train_step, ended on another thread
            ("joined", "globalTid", "textId IS NOT NULL"),  # ended on its own thread, said outright
        ):
            export.execute(
                'INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid, endGlobalTid, domainId) '
                f'SELECT start, "end", 60, ?, globalTid, {end_thread}, 0 FROM NVTX_EVENTS '
                f"WHERE eventType = 59 AND {like}",
                (name,),
            )
    run = import_export(path, writer).run_id
    ranges = client.events(kinds=["nvtx"], run=run, limit=1000)
    end_threads = {name: {x.get("end_tid") for x in extras} for name, extras in ranges.groupby("name")["extras"]}
    assert end_threads["handoff"] == {str(PID + 9)}
    assert all(threads == {None} for name, threads in end_threads.items() if name != "handoff"), end_threads

    assert main(["query", "nvtx", "--run", run, "--server", address, "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert_same_summary(summary, nsys_stats(path, "nvtx"))
    assert {row["style"] for row in summary if row["name"] == "forward"} == {"PushPop", "StartEnd"}
    assert main(["query", "nvtx", "--run", run, "--server", address]) == 0
    assert "one row per style: forward\n" in capsys.readouterr().out

    projected = client.nvtx_gpu(run=run, limit=1000)
    by_style = projected["summary"].set_index(["name", "style"])
    assert "handoff" not in set(projected["summary"]["name"]) | set(projected["ranges"]["name"])
    assert by_style.loc[("forward", "StartEnd"), "gpu_ops"] == by_style.loc[("forward", "PushPop"), "gpu_ops"] > 0
    assert by_style.loc[("joined", "StartEnd"), "gpu_ops"] == by_style.loc[("train_step", "PushPop"), "gpu_ops"] > 0
    assert main(["query", "nvtx-gpu", "--run", run, "--server", address]) == 0
    assert "one row per style: forward\n" in capsys.readouterr().out
    assert "handoff" in set(client.phases(run=run)["name"]), "phases take a range's time, whichever thread ends it"
