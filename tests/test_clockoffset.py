"""The clock offset estimate of agent/shipping/clockoffset.py: pure, with known delays and offsets."""

from __future__ import annotations

import itertools

from agent.shipping.clockoffset import ClockOffset, Measurement, best, measure

MS = 1_000_000


def _write(offset: int, sent: int, there: int, held: int, back: int) -> Measurement | None:
    """A write sent at `sent` on the host's clock that took `there` to reach a server whose clock is
    `offset` ahead, was held `held` there, and took `back` to come back."""
    server_received = sent + there + offset
    return measure(sent, there + held + back, server_received, server_received + held, at_ns=0)


def test_the_offset_is_within_its_uncertainty_whatever_the_two_ways_took() -> None:
    for offset, there, back, held in itertools.product(
        (-50 * MS, -1, 0, 7, 123_456_789), (0, 1, 300_000, 9 * MS), (0, 1, 300_001, 9 * MS), (0, 3, 200 * MS)
    ):
        found = _write(offset, 1_790_000_000_000_000_000, there, held, back)
        assert found is not None
        # the time the server held the call is no uncertainty: only the time on the wire is
        assert found.uncertainty_ns == -(-(there + back) // 2)
        assert abs(found.offset_ns - offset) <= found.uncertainty_ns, (offset, there, back, held)
    symmetric = _write(-50 * MS, 10**18, 400_000, 200 * MS, 400_000)
    assert symmetric == Measurement(-50 * MS, 400_000, 0)


def test_a_server_that_does_not_say_or_a_clock_set_mid_call_gives_no_measurement() -> None:
    assert measure(10**18, 1 * MS, 0, 0, 0) is None  # an older server
    assert measure(10**18, 1 * MS, 10**18, 10**18 - 1, 0) is None  # the server answered before it received
    assert measure(10**18, 1 * MS, 10**18, 10**18 + 2 * MS, 0) is None  # held longer than the round trip


def test_the_estimate_is_the_least_uncertain_of_the_window_and_fresh_once_per_write() -> None:
    assert best([]) is None
    clock = ClockOffset(window_ns=60_000, writes=3)
    assert clock.fresh(0) is None
    clock.add(Measurement(10, 5, at_ns=0))
    clock.add(Measurement(20, 9, at_ns=1_000))
    clock.add(None)  # a write that measured nothing
    assert clock.fresh(1_000) == Measurement(10, 5, 0)
    assert clock.fresh(1_000) is None, "no new write: nothing to record"
    assert clock.estimate(1_000) == Measurement(10, 5, 0)
    # the least uncertain measurement ages out of the window: the next best
    assert clock.estimate(60_500) == Measurement(20, 9, 1_000)
    clock.add(Measurement(30, 9, at_ns=2_000))  # of equals, the latest
    assert clock.fresh(60_500) == Measurement(30, 9, 2_000)
    for at in range(3):  # at most `writes` kept
        clock.add(Measurement(40, 50, at_ns=3_000 + at))
    assert clock.estimate(4_000) == Measurement(40, 50, 3_002)
    assert clock.estimate(10**9) is None
