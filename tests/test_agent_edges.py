"""The agent's and the importer's edges: what comes from outside (trace files, the spool folder,
matrix and config files, signals, numeric options) is bounded, refused in one line, or counted."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.shipping.spool import CHECK, FIELDS, HEAD, MAGIC, EncodedBatch, Spool, encode
from agent.traces.importer import import_export, prefetched
from agent.traces.kineto_synthetic import KinetoSpec, write_trace
from agent.traces.nsys_strings import cut
from agent.traces.nsys_synthetic import KERNELS, Spec, write_export
from agent.traces.watch import FolderWatcher
from query.client import Client
from store.group import ALONE_ROWS
from store.store import Store
from tests.agent_helpers import Fates
from tests.fuzz_worker import Sink
from tests.helpers import signal_another_thread, telemetry, wait_until
from tracehouse.batch import encode_request
from tracehouse.cli.main import main
from tracehouse.cli.options import command_name

ROOT = Path(__file__).resolve().parents[1]
MAX_STRING = 64 << 10
MEASURED = (
    "import sys; from tracehouse.cli.main import main; code = main(sys.argv[1:]); "
    "print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0], file=sys.stderr); sys.exit(code)"
)


def run_child(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -c CODE ARGS...` from this checkout, its output captured."""
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip


def import_measured(path: Path, address: str, host: str) -> tuple[int, str, int]:
    """`tracehouse import PATH` in a child process: its exit status, stderr, and peak RSS in bytes."""
    done = run_child(MEASURED, "import", "--server", address, "--host", host, str(path), timeout=300)
    *said, peak = done.stderr.strip().splitlines()  # VmHWM, in KiB: ru_maxrss would count the parent's
    return done.returncode, "\n".join(said), int(peak) << 10


def test_an_import_run_in_process_gives_the_collector_back(tmp_path: Path, address: str) -> None:
    """`tracehouse import` holds the cycle collector off while it imports (agent/traces/tracefile.py
    no_collection): run in a process that goes on (as these tests run it), the collector is on again
    with its threshold as before, after a file refused as after one imported."""
    before = gc.get_threshold()
    trace = tmp_path / "small.pt.trace.json.gz"
    write_trace(trace, KinetoSpec(steps=2))
    assert main(["import", "--server", address, "--host", "threshold", str(trace)]) == 0
    assert gc.isenabled() and gc.get_threshold() == before
    (tmp_path / "bad.json").write_text("[1, 2")
    assert main(["import", "--server", address, str(tmp_path / "bad.json")]) == 2
    assert gc.isenabled() and gc.get_threshold() == before


PANDAS_AT_EXIT = (
    "import sys; from tracehouse.cli.main import main; code = main(sys.argv[1:]); "
    "print('pandas' in sys.modules, file=sys.stderr); sys.exit(code)"
)
PANDAS_STILL_WORKS = """
import pyarrow as pa
from tracehouse.arrowonly import arrow_without_pandas
arrow_without_pandas()
assert pa.array([1, None]).to_pylist() == [1, None]
import pandas
assert pa.table({"a": [1, 2]}).to_pandas()["a"].tolist() == [1, 2]
assert pa.array(pandas.Series(["x", "y", "x"], dtype="category")).type == pa.dictionary(pa.int8(), pa.large_string())
"""


def test_an_import_leaves_pandas_unloaded_and_pandas_still_works_after(
    tmp_path: Path, address: str, client: Client
) -> None:
    """pyarrow imports pandas at its first conversion, a fifth of a second of an importer's start,
    unless it finds it absent first (tracehouse/arrowonly.py): `tracehouse import` of either kind
    of trace stores every event without it, the agent its samples and the exports it watches for;
    in a process that imports pandas later, pyarrow's pandas conversions still work."""
    kineto, nsys = tmp_path / "small.pt.trace.json.gz", tmp_path / "small.sqlite"
    write_trace(kineto, KinetoSpec(steps=3))
    write_export(nsys, Spec(steps=3))
    for path in (kineto, nsys):
        done = run_child(PANDAS_AT_EXIT, "import", "--server", address, "--host", "no-pandas", str(path))
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stderr.strip().splitlines()[-1] == "False", f"{path.name}: pandas was imported"
        result = json.loads(done.stdout.strip().splitlines()[-1])
        stored = client.sql(
            f"SELECT count() AS n FROM events WHERE run_id = '{result['run_id']}' AND kind NOT IN ('process', 'thread')"
        )
        assert int(stored["n"][0]) == sum(result["events"].values()) > 0
    watched = tmp_path / "watched"
    watched.mkdir()
    write_export(watched / "watched.sqlite", Spec(steps=3, seed=11))  # imported once two polls 2 s apart see it
    agent = ["agent", "--simulate", "1", "--duration", "6", "--interval", "0.1", "--server", address,
             "--spool", str(tmp_path / "spool"), "--host", "no-pandas-agent", "--watch", str(watched)]  # fmt: skip
    done = run_child(PANDAS_AT_EXIT, *agent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == "False", "the agent imported pandas"
    stored = client.sql("SELECT count() AS n FROM samples WHERE host = 'no-pandas-agent'")
    assert int(stored["n"][0]) > 0
    imported = client.sql("SELECT count() AS n FROM events WHERE host = 'no-pandas-agent' AND kind = 'kernel'")
    assert int(imported["n"][0]) > 0, "the watched export was imported"
    done = run_child(PANDAS_STILL_WORKS)
    assert done.returncode == 0, done.stderr[-2000:]


THREADS_AFTER = """
import os, sys
{start}
import pyarrow as pa
pa.array([0])
print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))
"""


def test_an_importer_starts_numpy_with_one_blas_thread_and_leaves_the_environment_as_it_was() -> None:
    """OpenBLAS's pool spins for a tenth of a second of CPU at numpy's import, for nothing in an importer
    (tracehouse/arrowonly.py): after arrow_without_pandas the process holds the threads of one started
    with OPENBLAS_NUM_THREADS=1, and its environment (what a job it starts inherits) is as it was; a
    user's own setting is kept."""
    lean = "from tracehouse.arrowonly import arrow_without_pandas; arrow_without_pandas()"
    done = run_child(THREADS_AFTER.format(start=lean))
    assert done.returncode == 0, done.stderr[-2000:]
    threads, setting = done.stdout.split()
    assert setting == "None"
    done = run_child(f"import os; os.environ['OPENBLAS_NUM_THREADS'] = '1'\n{THREADS_AFTER.format(start='')}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert threads == done.stdout.split()[0]
    done = run_child(f"import os; os.environ['OPENBLAS_NUM_THREADS'] = '2'\n{THREADS_AFTER.format(start=lean)}")
    assert done.stdout.split()[1] == "2"


def test_huge_strings_of_an_export_are_cut_while_read(tmp_path: Path, address: str, client: Client) -> None:
    """Five kernel names of 40 MB each: SQLite hands over no more than the bound of each, so the
    importer's peak memory does not grow with them, and the stored names are cut to 64 KiB on a
    character boundary."""
    plain, huge = tmp_path / "plain.sqlite", tmp_path / "huge.sqlite"
    write_export(plain)
    write_export(huge)
    long_names = {name: f"{name} " + "€" * ((40 << 20) // 3) for name in KERNELS}  # 3-byte chars: cuts split them
    with sqlite3.connect(huge) as connection:
        for name, long in long_names.items():
            connection.execute("UPDATE StringIds SET value = ? WHERE value = ?", (long, name))
    total = sum(len(long.encode()) for long in long_names.values())
    expected = {cut(long, MAX_STRING) for long in long_names.values()}
    del long_names

    status, stderr, baseline = import_measured(plain, address, "plain")
    assert status == 0, stderr[-2000:]
    status, stderr, peak = import_measured(huge, address, "huge")
    assert status == 0, stderr[-2000:]
    print(f"peak RSS: {baseline >> 20} MiB plain, {peak >> 20} MiB with {total >> 20} MiB of names")
    assert peak - baseline < total // 2, f"peak RSS grew {(peak - baseline) >> 20} MiB for {total >> 20} MiB of names"

    names = client.sql("SELECT DISTINCT name FROM events WHERE kind = 'kernel' AND host = 'huge'")["name"]
    assert set(names) == expected
    assert all(MAX_STRING - 3 < len(name.encode()) <= MAX_STRING for name in names)


# -- the spool folder: special files, forged counts ------------------------------------------------


def earlier(n: int, values: int = 400) -> EncodedBatch:
    """A batch of an earlier agent session: 400 sample values (or as many as `values` claims)."""
    batch_id = f"earlier.host/{n:08d}"
    return EncodedBatch(batch_id, encode_request(telemetry(batch_id).build()), values)


def opened_within(seconds: float, open_it: Callable[[], Spool]) -> Spool:
    """The spool `open_it` opens, which must be done within `seconds` (a FIFO would block it forever:
    then the FIFOs of the folder are opened for writing, which lets the test's thread go)."""
    found: list[Spool] = []
    opening = threading.Thread(target=lambda: found.append(open_it()), daemon=True)
    opening.start()
    opening.join(seconds)
    return found[0] if found else None  # type: ignore[return-value]


def test_a_fifo_in_the_spool_folder_is_left_alone_and_the_rest_replayed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path, 1 << 20, lambda *_: None)
    for n in range(2):
        assert spool.put(earlier(n))
    fifo = tmp_path / "00000000000000000000.batch"  # sorts first
    os.mkfifo(fifo)
    fates = Fates()
    with caplog.at_level(logging.ERROR, "tracehouse.agent.spool"):
        reopened = opened_within(5, lambda: Spool(tmp_path, 1 << 20, fates.drop, fates.unknown.append))
    if reopened is None:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert reopened is not None, "opening the spool blocked on the FIFO"
    assert reopened.batches == 2 and reopened.values_of() == 800
    assert f"{fifo}: not a regular file (a FIFO); left alone" in caplog.text
    assert fates.dropped == [] and fates.unknown == [], "a FIFO is no batch lost"
    assert reopened.oldest() == earlier(0)
    reopened.remove("earlier.host/00000000")
    assert reopened.oldest() == earlier(1)
    assert fifo.exists()


def test_a_forged_value_count_is_not_believed_though_its_checksum_holds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A header's checksum can be computed by anyone: a count more than the payload can hold, or
    a payload length that is not the file's, is reported and not believed."""
    (tmp_path / "00000000000000000001.batch").write_bytes(encode(earlier(1, values=10**18)))
    longer = bytearray(encode(earlier(2)))  # a header that says its payload is longer than the file's
    fields = FIELDS.pack(
        zlib.crc32(earlier(2).payload), 400, len(earlier(2).payload) + 4096, len(b"earlier.host/00000002")
    )
    ident = b"earlier.host/00000002"
    longer[:HEAD] = MAGIC + CHECK.pack(zlib.crc32(fields + ident)) + fields
    (tmp_path / "00000000000000000002.batch").write_bytes(bytes(longer))
    (tmp_path / "00000000000000000003.batch").write_bytes(encode(earlier(3)))
    fates = Fates()
    with caplog.at_level(logging.ERROR, "tracehouse.agent.spool"):
        spool = Spool(tmp_path, 1 << 20, fates.drop, fates.unknown.append)
    assert spool.batches == 1 and spool.values_of() == 400, "only the honest file's count"
    assert fates.unknown == ["00000000000000000001.batch", "00000000000000000002.batch"] and fates.dropped == []
    payload = len(earlier(1).payload)
    assert f"the header claims 1,000,000,000,000,000,000 sample values, more than its {payload:,}-byte" in caplog.text
    assert "the header says" in caplog.text and "values lost: unknown" in caplog.text
    assert spool.oldest() == earlier(3)


def _shipping_agent_stopped(
    tmp_path: Path, address: str, client: Client, spool: Path, host: str, stop: Callable[[int], None]
) -> tuple[int, str, str]:
    """`tracehouse agent` without --duration, simulating one GPU as `host`: once its samples are
    stored, `stop(pid)`; its exit status, stdout and stderr (fails if it does not stop within 15 s)."""
    agent = subprocess.Popen(
        [sys.executable, "-m", "tracehouse.cli", "agent", "--server", address, "--simulate", "1", "--spool",
         str(spool), "--host", host, "--flush-interval", "0.2", "--no-host-metrics"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TRACEHOUSE_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    try:
        shipped = f"SELECT count() AS n FROM samples WHERE host = '{host}'"
        wait_until(lambda: int(client.sql(shipped)["n"][0]) > 0, 30, "the agent shipped samples")
        stop(agent.pid)
        out, err = agent.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("the agent did not stop within 15 s of its signal")
    finally:
        agent.kill()
    return agent.returncode, out, err


def test_an_agent_whose_spool_holds_a_fifo_ships_and_stops_on_sigterm(
    tmp_path: Path, address: str, client: Client
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    os.mkfifo(spool / "00000000000000000001.batch")
    code, out, err = _shipping_agent_stopped(
        tmp_path, address, client, spool, "edge-agent", lambda pid: os.kill(pid, signal.SIGTERM)
    )
    assert code == 0, err[-2000:]
    assert "not a regular file (a FIFO); left alone" in err
    assert json.loads(out)["stored"] > 0


def test_an_agent_without_a_duration_stops_on_a_sigterm_that_another_thread_takes(
    tmp_path: Path, address: str, client: Client
) -> None:
    """Without --duration the agent waits for a signal alone; one that the kernel hands to a thread
    other than the main one (the sampler's, gRPC's) stops it as one sent to the process does."""
    code, out, err = _shipping_agent_stopped(
        tmp_path, address, client, tmp_path / "spool", "edge-other-thread",
        lambda pid: signal_another_thread(pid, signal.SIGTERM),
    )  # fmt: skip
    assert code == 0, err[-2000:]
    assert json.loads(out)["stored"] > 0


def tracehouse(*args: str, seconds: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tracehouse.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=seconds,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def test_a_fifo_or_a_device_named_as_a_matrix_or_token_file_is_one_line_not_a_hang(tmp_path: Path) -> None:
    fifo, zero = tmp_path / "matrix.yaml", tmp_path / "zero.yaml"
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    token = tmp_path / "token"
    os.mkfifo(token)
    trace = tmp_path / "trace.json"
    trace.write_text("{}")
    for args, said in (
        (["run", "--matrix", str(fifo)], "matrix.yaml: cannot read: not a regular file (a FIFO)"),
        (["run", "--matrix", str(zero)], "zero.yaml: cannot read: not a regular file (a character device)"),
        (["import", "--server", "127.0.0.1:1", "--token-file", str(token), str(trace)],
         f"--token-file {token}: cannot read it: not a regular file (a FIFO)"),
    ):  # fmt: skip
        try:
            done = tracehouse(*args, seconds=20)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"tracehouse {' '.join(args)} blocked") from None
        assert done.returncode == 2 and done.stderr == f"tracehouse: {said}\n", done.stderr[-2000:]


# -- the CLI's edges -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--skip", "99999999999"], "argument --skip: 99999999999 steps: from 0 to 4,294,967,295"),
        (["--skip", "-1"], "argument --skip: -1 steps: from 0 to 4,294,967,295"),
        (["--window", "99999999999d"], "argument --window: 99999999999d: a window lasts from 1ms to 366d"),
        (["--timeout", "nan"], "argument --timeout: nan must be a positive number of seconds"),
        (["--timeout", "1e300"], "argument --timeout: 1e300 s: at most 86400 s (a day)"),
    ],
)
def test_verdict_numbers_out_of_range_are_one_line_not_a_traceback(
    option: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["verdict", *option, "--server", "127.0.0.1:1", "arm=a", "arm=b"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"tracehouse verdict: error: {said}" and "Traceback" not in err


def test_ctrl_c_during_an_import_ends_it_in_one_line_and_running_it_again_finishes_it(
    tmp_path: Path, store: Store, address: str, client: Client, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    path = tmp_path / "big.sqlite"
    write_export(path, Spec(steps=2000, kernels_per_step=100))  # 600 k rows: ten chunks
    # the server holds the answer to the first chunks it stored until Ctrl-C is sent: mid-import, whatever
    # the machine's pace (four chunks are stored at a time, and under a full run the import was done first)
    first_stored, go_on = threading.Event(), threading.Event()
    store_claimed = store.store_claimed

    def held(claim: Any) -> Any:
        outcomes = store_claimed(claim)
        if any(batch.events is not None and batch.events.num_rows >= ALONE_ROWS for batch in claim.batches):
            first_stored.set()
            go_on.wait(60)
        return outcomes

    monkeypatch.setattr(store, "store_claimed", held)
    command = ["import", "--server", address, "--host", "edge-import", str(path)]
    importing = subprocess.Popen(
        [sys.executable, "-m", "tracehouse.cli", *command], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        wait_until(lambda: first_stored.is_set() or importing.poll() is not None, 60, "a batch stored")
        importing.send_signal(signal.SIGINT)
        go_on.set()
        out, err = importing.communicate(timeout=30)
    finally:
        go_on.set()
        importing.kill()
    assert importing.returncode == 130, err[-2000:]
    assert out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracehouse: big.sqlite: interrupted after "), err[-2000:]
    again = lines[0].rpartition(": ")[2]
    ran_as = command_name("-m")  # as `python -m tracehouse.cli` names itself: `tracehouse` where that is on PATH
    assert again == f"{ran_as} {shlex.join(command)}", "the hint runs the same import, as it can be run here"
    assert client.sql("SELECT count() AS n FROM runs WHERE host = 'edge-import' AND NOT importing")["n"][0] == 0

    assert main(command) == 0, "the hint, run: it finishes the import"
    shipped = sum(json.loads(capsys.readouterr().out)["events"].values())
    counts = client.sql(
        "SELECT count() AS n, uniqExact(id) AS ids FROM events WHERE host = 'edge-import' "
        "AND kind NOT IN ('process', 'thread')"  # named by the import, not counted in its events
    ).iloc[0]
    assert int(counts["n"]) == int(counts["ids"]) == shipped, "every event once: nothing stored twice"


def test_a_prefetch_stopped_after_its_reader_read_everything_ends() -> None:
    """Ctrl-C while the reader waits to hand over its end: the reader must not wait for good (the
    import's interrupt hung in the join, 1 run in 3)."""
    read_all = threading.Event()

    def chunks() -> Iterator[int]:
        yield from (1, 2, 3)
        read_all.set()

    ahead = prefetched(chunks(), depth=2)
    assert next(ahead) == 1
    assert read_all.wait(10), "the reader read every chunk (2 and 3 wait in the queue)"
    closing = threading.Thread(target=ahead.close, daemon=True)
    closing.start()
    closing.join(10)
    assert not closing.is_alive(), "the consumer's stop ended the reader"


# -- Kineto ids out of range -------------------------------------------------------------------------


def test_kineto_ids_out_of_range_are_skipped_and_counted_not_filed_as_0(tmp_path: Path) -> None:
    t0 = 1_790_000_000_000_000  # µs
    cpu = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 8, "ts": t0, "dur": 5}
    gpu = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": t0, "dur": 5,
           "args": {"device": 0, "stream": 7}}  # fmt: skip
    events = [
        cpu, gpu,
        {**cpu, "pid": 1e30}, {**cpu, "pid": -(2**40)}, {**cpu, "pid": 2**32}, {**cpu, "pid": 1.5},
        {**cpu, "tid": 2**64}, {**cpu, "tid": -(2**31) - 1},
        {**cpu, "tid": -247463936},  # a thread id past 2^31 as Kineto writes it (int32): kept, as `track`
        {**gpu, "args": {"device": 99999, "stream": 7}}, {**gpu, "args": {"device": -2, "stream": 7}},
        {**gpu, "args": {"device": 1e30, "stream": 7}},
        {**cpu, "pid": "Spans", "tid": "PyTorch Profiler"},  # names of tracks, not ids: kept, as `track`
    ]  # fmt: skip
    path = tmp_path / "ids.json"
    path.write_text(json.dumps({"traceEvents": events}))
    sink = Sink()
    result = import_export(path, sink, host="h")
    assert result.events == {"cpu_op": 3, "kernel": 1}
    assert result.skipped == {"pid out of range": 4, "tid out of range": 2, "device out of range": 3}
    gpus = {int(g) for b in sink.batches for g in b.events.gpu}
    assert gpus <= {0, -1} and 0 in gpus, "no kernel filed under no GPU"


def test_a_fifo_as_the_watch_state_is_taken_as_no_state_not_waited_on(tmp_path: Path) -> None:
    state = tmp_path / "watch-state.json"
    os.mkfifo(state)
    made: list[FolderWatcher] = []
    making = threading.Thread(
        target=lambda: made.append(FolderWatcher(tmp_path, Sink(), state, host="h")),  # type: ignore[arg-type]
        daemon=True,
    )
    making.start()
    making.join(5)
    if not made:
        with contextlib.suppress(OSError):  # let the thread go: a writer opens the FIFO, then closes it
            os.close(os.open(state, os.O_WRONLY | os.O_NONBLOCK))
    assert made, "the watch waited on its state file, a FIFO"
