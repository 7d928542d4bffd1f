"""Each benchmark runs end to end on a small size and checks what it measured (not how fast)."""

from __future__ import annotations

import pytest

from agent.shipping.writer import LARGE_IN_FLIGHT
from tracehouse.bench.agent import bench_agent
from tracehouse.bench.imports import bench_import
from tracehouse.bench.ingest import bench_ingest
from tracehouse.bench.query import bench_query


@pytest.mark.parametrize(("ack_once_stored", "in_flight"), [(False, LARGE_IN_FLIGHT), (True, 2)])
def test_bench_ingest_runs_and_loses_nothing(ack_once_stored: bool, in_flight: int) -> None:
    result = bench_ingest(50_000, 10_000, 2, None, in_flight, ack_once_stored=ack_once_stored)
    assert result["sent_rows"] == result["stored_rows"] == 2 * (50_000 // 128) * 128
    assert result["stored_rows_direct"] == result["stored_rows_arrow_format"] == result["sent_rows"]
    assert result["stored_rows_direct_2"] == result["sent_rows"]
    # by default every path keeps as many in flight as an import's writer; the goal is against the better direct insert
    assert result["in_flight"] == in_flight
    # every gRPC batch stored by a group commit, a group holding at least one
    assert 1 <= result["grpc_groups"] <= 2 * 5
    assert result["grpc_rows_per_group"] == round(result["sent_rows"] / result["grpc_groups"])
    best = max(result["direct_rows_per_s"], result["direct_2_in_flight_rows_per_s"])
    assert result["ratio_to_best_direct"] == pytest.approx(result["grpc_rows_per_s"] / best, rel=1e-2)
    assert result["ratio_to_best_direct"] <= result["ratio"] + 1e-3
    assert result["stored_rows_direct_rollups"] == result["sent_rows"]
    # the same rows both ways: the gRPC path and its like-for-like baseline roll up every value, the others none
    sums = result["rolled_up_rows"]
    assert sums == {"grpc": result["sent_rows"], "rollups": result["sent_rows"], "direct": 0, "two": 0, "arrow": 0}
    assert result["ratio_same_rows"] == pytest.approx(
        result["grpc_rows_per_s"] / result["direct_rollups_rows_per_s"], rel=1e-2
    )
    assert result["grpc_rows_per_s"] > 0 and result["direct_rows_per_s"] > 0
    assert result["ratio"] == pytest.approx(result["grpc_rows_per_s"] / result["direct_rows_per_s"], rel=1e-2)
    assert result["grpc_cpu_us_per_row"] > 0 and result["direct_cpu_us_per_row"] > 0
    assert result["ack_once_stored"] is ack_once_stored


def test_bench_import_runs_and_stores_every_event() -> None:
    result = bench_import(events=20_000, path=None)
    assert result["events"] == result["stored_events"] > 19_000
    assert result["sqlite3_scan_rows"] >= result["events"]
    assert result["importer_peak_rss_mb"] > 0 and result["ratio"] > 0
    # the importer reads and sends every event, the server validates and stores them: both spend CPU
    assert result["importer_cpu_s"] > 0 and result["server_cpu_s"] > 0
    both = result["importer_cpu_s"] + result["server_cpu_s"]
    assert result["cpu_us_per_event"] == pytest.approx(both * 1e6 / result["events"], rel=0.02)
    # once the importer is done, the server keeps the run's answers (query/keeper.py), then is idle again
    after = result["server_cpu_after_import_s"]
    assert after > 0 and 0 < result["server_idle_after_import_s"] < 120
    assert result["cpu_us_per_event_until_idle"] == pytest.approx((both + after) * 1e6 / result["events"], rel=0.02)
    # the floor: the engine alone stores the very events imported, in the inserts of the import
    floor = result["engine_floor"]
    assert floor["stored"] == floor["events"] == result["events"] and 0 < floor["batch_rows"] <= 65_536
    assert floor["store_cpu_us_per_event"] > 0 and floor["events_per_s_on_all_cores"] > 0


def test_bench_agent_runs_and_stores_every_value() -> None:
    result = bench_agent(gpus=2, interval=0.1, seconds=2.0)
    assert result["sampled_values"] == result["stored_values"] > 0
    assert 0 < result["agent_share_of_one_core"] < 1


def test_bench_query_builds_the_run_it_asks_about() -> None:
    result = bench_query(kernels=8_000, ranges=800, samples=32_000)
    assert result["data"] | {"span_s": 0, "generated_in_s": 0, "kept_in_s": 0} == {
        "kernels": 8_000, "api": 8_000, "ranges": 800, "samples": 32_000, "span_s": 0, "generated_in_s": 0,
        "kept_in_s": 0,
    }  # fmt: skip
    assert set(result["seconds"]) == {
        "baseline_scan_events", "series_2000_points", "events_1s_window", "lanes_1500_buckets", "gpu_time",
        "gpu_time_hour", "nvtx_gpu", "phases", "phases_hour"
    }  # fmt: skip
    assert all(seconds > 0 for seconds in result["seconds"].values())
    assert set(result["made_at_the_question_seconds"]) == {"gpu_time", "gpu_time_hour", "nvtx_gpu", "phases"}


def test_bench_storage_measures_what_it_stored() -> None:
    from tracehouse.bench.storage import bench_storage

    result = bench_storage(gpus=2, minutes=1.0, interval=0.1, steps=40)
    samples, events = result["samples"], result["events"]
    assert samples["rows"] == result["telemetry"]["values"] > 2 * 600 * 13  # 13 fast metrics per GPU tick
    assert samples["on_disk"] >= samples["compressed"] > 0
    assert samples["bytes_per_value"] == pytest.approx(samples["on_disk"] / samples["rows"], rel=1e-2)
    assert events["rows"] >= events["imported"] > 40 * 20
    assert events["compression"] == pytest.approx(events["uncompressed"] / events["compressed"], rel=1e-2)
    rollups = result["rollups"]
    assert list(rollups) == ["samples_10s", "samples_1m"]
    assert 0 < rollups["samples_1m"]["rows"] < rollups["samples_10s"]["rows"] < samples["rows"] / 10
    all_in = samples["on_disk"] + sum(sizes["on_disk"] for sizes in rollups.values())
    assert result["all_in"]["bytes_per_value"] == pytest.approx(all_in / samples["rows"], rel=1e-2)
    assert result["goal"]["met"] == (all_in / samples["rows"] <= 1.0 and events["compression"] >= 8.0)


def test_bench_train_measures_calls_with_the_server_up_and_away() -> None:
    from tracehouse.bench.train import bench_train

    result = bench_train(calls=2_000, rounds=2)
    up, down = result["server_up"], result["server_down"]
    assert up["stored_steps"] == up["recorded_steps"] == 2 * 2_000 and up["dropped_records"] == 0
    assert down["spooled_batches"] > 0 and down["dropped_records"] == 0
    assert all(side[name] > 0 for side in (up, down) for name in ("step_ns", "phase_ns", "scalar_ns"))
    assert result["goal"]["met"] == (max(up["step_ns"], down["step_ns"]) < result["goal"]["step_ns"])


def test_bench_export_writes_every_event_of_the_run() -> None:
    from tracehouse.bench.export import bench_export

    result = bench_export(steps=10)
    assert result["data"]["events"] == result["perfetto_events"] > 400
    assert result["complete"] is True
    for written in result["formats"].values():
        assert written["bytes"] > 0 and written["bytes_per_event"] == round(
            written["bytes"] / result["data"]["events"], 1
        )
