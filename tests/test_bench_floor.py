"""`bench import` against the practical floor (issue 44): storing as the engine alone does plus reading
the file as no importer avoids, measured in the same run; the keeper's work reported apart."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tracehouse.bench.imports import GOAL_FLOOR_RATIO, bench_import, bench_import_kineto
from tracehouse.bench.readfloor import read_floor


def _check_against_floor(result: dict[str, Any], counted: int) -> None:
    floor, engine = result["practical_floor"], result["engine_floor"]
    # the very rows imported, stored again at most a batch of the import (65,536 rows) an insert
    assert engine["stored"] == engine["events"] == result["events"] and 0 < engine["batch_rows"] <= 65_536
    assert engine["inserts"] * engine["batch_rows"] >= engine["events"]
    # both parts per event counted as the import counts them (a trace's events in the file)
    assert floor["store_us_per_event"] == pytest.approx(
        engine["store_cpu_us_per_event"] * engine["events"] / counted, rel=0.02, abs=0.01
    )
    rounding = 0.0005 * 1e6 / counted + 0.005  # of read_cpu_s to ms, and of the figure to 0.01
    assert floor["read_us_per_event"] == pytest.approx(floor["read_cpu_s"] * 1e6 / counted, abs=rounding)
    assert floor["read_us_per_event"] > 0 and floor["store_us_per_event"] > 0
    assert floor["us_per_event"] == pytest.approx(floor["store_us_per_event"] + floor["read_us_per_event"], abs=0.02)
    # the keeper measured apart and left out; the merges after the import counted
    assert result["keeper_cpu_s"] > 0
    merges = max(0.0, result["server_cpu_after_import_s"] - result["keeper_cpu_s"])
    assert result["merges_after_import_cpu_s"] == pytest.approx(merges, abs=0.011)
    spent = result["importer_cpu_s"] + result["server_cpu_s"] + result["merges_after_import_cpu_s"]
    assert result["import_cpu_us_per_event"] == pytest.approx(spent * 1e6 / counted, rel=0.02)
    assert result["floor_ratio"] == pytest.approx(result["import_cpu_us_per_event"] / floor["us_per_event"], rel=0.02)
    assert result["floor_goal"] == {"ratio": GOAL_FLOOR_RATIO, "met": result["floor_ratio"] <= GOAL_FLOOR_RATIO}


def test_bench_import_reports_the_ratio_to_the_practical_floor() -> None:
    result = bench_import(events=20_000, path=None, rounds=3)
    assert result["events"] == result["stored_events"] > 19_000
    _check_against_floor(result, result["events"])
    # three rounds, each against its own floor: the figures are the median round's
    ratios = result["floor_ratio_rounds"]
    assert result["rounds"] == len(ratios) == len(result["floor_us_per_event_rounds"]) == 3
    assert result["floor_ratio"] == sorted(ratios)[1]
    median = ratios.index(result["floor_ratio"])
    assert result["import_cpu_us_per_event_rounds"][median] == result["import_cpu_us_per_event"]
    assert result["floor_us_per_event_rounds"][median] == result["practical_floor"]["us_per_event"]


def test_bench_import_kineto_reports_the_ratio_to_the_practical_floor() -> None:
    result = bench_import_kineto(events=20_000, path=None)
    assert result["events"] == result["stored_events"] > 10_000
    _check_against_floor(result, result["json_load_events"])


def test_the_nsys_read_floor_reads_every_row_the_importer_reads(tmp_path: Path) -> None:
    from agent.traces.nsys import Export
    from agent.traces.nsys_synthetic import Spec, write_export

    path = tmp_path / "export.sqlite"
    write_export(path, Spec(steps=40, kernels_per_step=5, gpu_metrics=True))
    with Export(path) as export:
        expected = sum(b.num_rows for s in export.sources() for b in export.chunks(s))
        expected += sum(b.num_rows for b in export.metric_chunks())
    measured = read_floor(path, "nsys")
    assert measured["read"] == expected > 0 and measured["cpu_s"] > 0


def test_the_kineto_read_floor_parses_every_event_of_the_file(tmp_path: Path) -> None:
    import gzip

    events = [{"ph": "X", "name": f"k{i}", "ts": i, "dur": 1, "pid": 1, "tid": 1} for i in range(500)]
    for name, text in {
        "object.json.gz": json.dumps({"schemaVersion": 1, "traceEvents": events, "after": [1, 2]}),
        "array.json.gz": json.dumps(events),
    }.items():
        (tmp_path / name).write_bytes(gzip.compress(text.encode()))
        measured = read_floor(tmp_path / name, "kineto")
        assert measured["read"] == 500, name


def test_the_read_floor_refuses_a_kind_it_does_not_know(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite"
    sqlite3.connect(path).close()
    with pytest.raises(ValueError, match="kind"):
        read_floor(path, "perfetto")
