from __future__ import annotations

import pytest

from tracehouse.timefmt import format_ns, parse_duration, parse_time

NOW = 1_790_000_000_123_456_789


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1790000000123456789", 1_790_000_000_123_456_789),
        ("2026-09-21T14:13:20Z", 1_790_000_000_000_000_000),
        ("2026-09-21T14:13:20.123456789Z", 1_790_000_000_123_456_789),
        ("2026-09-21 16:13:20.5+02:00", 1_790_000_000_500_000_000),
        ("2026-09-21T14:13:20", 1_790_000_000_000_000_000),
        ("now", NOW),
        ("now-5m", NOW - 300_000_000_000),
        ("now+1.5s", NOW + 1_500_000_000),
        ("-250ms", NOW - 250_000_000),
    ],
)
def test_parse_time(text: str, expected: int) -> None:
    assert parse_time(text, now=NOW) == expected


@pytest.mark.parametrize(
    "text", ["", "yesterday", "2026-13-01", "now-5 parsecs", "1.5", "2026-09-21T14:13:20.1234567891Z"]
)
def test_parse_time_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_time(text, now=NOW)


def test_format_round_trips_exactly() -> None:
    assert parse_time(format_ns(NOW)) == NOW
    assert format_ns(0) == "1970-01-01T00:00:00.000000000Z"


def test_durations() -> None:
    assert parse_duration("1.5s") == 1_500_000_000
    assert parse_duration("2h") == 7_200_000_000_000
    assert parse_duration("10 us") == 10_000
