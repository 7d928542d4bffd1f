"""Numbers for people: the units a person reads, and that nothing is ever shown as a raw ns count."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracehouse import units
from tracehouse.readable import column_kind, headers, readable

SECOND = 1_000_000_000


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0 ns"),
        (812, "812 ns"),
        (1_000, "1 µs"),
        (12_345, "12.3 µs"),
        (999_960, "1 ms"),  # rounds up into the next unit, never "1000 µs"
        (1_940_000, "1.94 ms"),
        (4_800_000_000, "4.8 s"),
        (59_999_000_000, "1 min 00 s"),
        (123 * SECOND, "2 min 03 s"),
        (3_720 * SECOND, "1 h 02 min"),
        ((3 * 86_400 + 4 * 3_600) * SECOND, "3 d 04 h"),
        (-4_800_000_000, "-4.8 s"),
        (None, ""),
        (float("nan"), ""),
        (pd.NA, ""),
    ],
)
def test_durations_read_in_adaptive_units(ns: object, text: str) -> None:
    assert units.duration(ns) == text  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n_bytes", "text"),
    [(0, "0 B"), (512, "512 B"), (1_024, "1 KiB"), (1_536, "1.5 KiB"), (1_048_575, "1 MiB"),
     (72_000_000_000, "67.1 GiB"), (2**40, "1 TiB"), (None, "")],
)  # fmt: skip
def test_sizes_read_in_binary_units(n_bytes: object, text: str) -> None:
    assert units.size(n_bytes) == text  # type: ignore[arg-type]


def test_readings_carry_their_metrics_unit() -> None:
    assert units.metric_value("gpu.mem_used_bytes", 72_300_000_000) == "67.3 GiB"
    assert units.metric_value("gpu.util_pct", 26.117573938885315) == "26.1 %"
    assert units.metric_value("gpu.power_w", 535.03) == "535 W"
    assert units.metric_value("gpu.energy_j", 41_708.8) == "41.71 kJ"
    assert units.metric_value("gpu.pcie_rx_bytes_per_s", 2**30) == "1 GiB/s"
    assert units.metric_value("SMs Active [Throughput %]", 96.0) == "96.0 %"
    assert units.metric_value("host.load1", 2.5) == "2.5"


def test_axis_scales_pick_the_unit_of_the_largest_value() -> None:
    assert units.axis_scale("ns", 3e9) == (1e9, "s")
    assert units.axis_scale("ns", 26_992_216) == (1e6, "ms")
    assert units.axis_scale("B", 8e10) == (2**30, "GiB")
    assert units.axis_scale("%", 100) == (1.0, "%")


def test_instants_and_offsets() -> None:
    assert units.instant(1_796_143_961_128_907_556) == "2026-12-01 16:52:41.128 UTC"
    assert units.offset(539_217_000) == "+539.217 ms"
    assert units.offset(12_345_678_901) == "+12.345679 s"


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_no_duration_shows_a_long_raw_number(ns: int) -> None:
    text = units.duration(ns)
    assert not re.search(r"\d{5,}", text), text
    assert units.size(ns) and not re.search(r"\d{8,}", units.size(ns))


def test_answers_read_for_people_and_stay_exact_for_programs() -> None:
    answer = pd.DataFrame(
        {
            "name": ["void k<int>(int)", "void k<float>(float)"],
            "instances": [1312, 7],
            "total_ns": [26_992_216, 1_940],
            "time_pct": [26.117573938885315, float("nan")],
            "span_start_ns": [1_796_143_961_128_907_556, 1_796_143_961_128_907_557],
            "gpu_mem_peak_bytes": pd.array([72_000_000_000, None], dtype="Int64"),
            "start": pd.to_datetime([1_796_143_961_128_907_556, None], utc=True),
            "id": [14_967_327_384_548_671_488, 1],
        }
    )
    kinds = {c: column_kind(c, answer[c]) for c in answer.columns}
    assert kinds == {"name": "text", "instances": "count", "total_ns": "duration", "time_pct": "percent",
                     "span_start_ns": "instant", "gpu_mem_peak_bytes": "size", "start": "instant",
                     "id": "text"}  # fmt: skip
    shown = readable(answer)
    assert list(shown.columns) == ["name", "instances", "total", "time %", "span start", "GPU mem peak", "start"]
    assert shown.iloc[0].tolist() == ["k<int>(…)", "1,312", "27 ms", "26.1 %", "2026-12-01 16:52:41.128 UTC",
                                      "67.1 GiB", "2026-12-01 16:52:41.128 UTC"]  # fmt: skip
    assert shown.iloc[1].tolist()[3:] == ["", "2026-12-01 16:52:41.128 UTC", "", ""]
    text = shown.to_string()
    assert not re.search(r"\d{10,}", text) and not re.search(r"\b(nan|NaN|<NA>|None|NaT)\b", text)
    from_start = readable(answer, origin_ns=1_796_143_961_128_907_556)
    assert from_start["span start"].tolist() == ["+0 ns", "+1 ns"]
    assert answer["total_ns"].tolist() == [26_992_216, 1_940], "the answer itself is untouched"


def test_headers_stay_distinct() -> None:
    answer = pd.DataFrame({"total_ns": [1], "total": [2], "total_bytes": [3]})
    names = headers(answer)
    assert len(set(names.values())) == 3


def test_a_host_events_missing_gpu_and_stream_read_blank() -> None:
    events = pd.DataFrame({"gpu": [-1, 0], "stream": [-1, 7], "pid": [4242, 4242]})
    assert readable(events).to_dict(orient="list") == {"GPU": ["", "0"], "stream": ["", "7"], "pid": ["4242", "4242"]}


def test_a_run_without_a_wall_clock_does_not_start_in_1970() -> None:
    from tracehouse.readable import NO_WALL_CLOCK, run_starts

    starts = pd.Series(pd.to_datetime([0, 1_796_143_961_128_907_556], utc=True))
    assert run_starts(starts, pd.Series([True, False])) == [NO_WALL_CLOCK, "2026-12-01 16:52:41.128 UTC"]


def test_rates_and_diffs_counts_read_as_people_read_them() -> None:
    from tracehouse.readable import column_kind, header

    assert header("algbw_bytes_per_s", column_kind("algbw_bytes_per_s")) == "algbw"  # "algbw per" before
    answer = readable(pd.DataFrame({"name": ["k"], "instances_a": [4350], "instances_b": [12_000]}))
    assert answer.iloc[0].tolist()[1:] == ["4,350", "12,000"]
