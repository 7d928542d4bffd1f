"""The clock offset estimate of agent/shipping/clockoffset.py: pure, with known delays and offsets."""

from __future__ import annotations

import itertools

from agent.shipping.clockoffset import ClockOffset, Measurement, best, carried, measure

MS = 1_000_000
S = 1_000_000_000
WALL = 1_790_000_000_000_000_000  # the host's wall clock less its monotonic clock, unless set


def _write(offset: int, there: int, held: int, back: int, started: int = 5 * S) -> Measurement | None:
    """A write sent at `started` on the host's monotonic clock that took `there` to reach a server whose
    clock is `offset` ahead of the host's wall clock, was held `held` there, and took `back` to come back."""
    sent = started + WALL
    server_received = sent + there + offset
    return measure(sent, started, started + there + held + back, server_received, server_received + held)


def test_the_offset_is_within_its_uncertainty_whatever_the_two_ways_took() -> None:
    for offset, there, back, held in itertools.product(
        (-50 * MS, -1, 0, 7, 123_456_789), (0, 1, 300_000, 9 * MS), (0, 1, 300_001, 9 * MS), (0, 3, 200 * MS)
    ):
        found = _write(offset, there, held, back)
        assert found is not None
        # the time the server held the call is no uncertainty: only the time on the wire is
        assert found.uncertainty_ns == -(-(there + back) // 2)
        assert abs(found.offset_ns - offset) <= found.uncertainty_ns, (offset, there, back, held)
    symmetric = _write(-50 * MS, 400_000, 200 * MS, 400_000)
    assert symmetric == Measurement(-50 * MS, 400_000, 5 * S + 200 * MS + 800_000, WALL)


def test_a_server_that_does_not_say_or_a_clock_set_mid_call_gives_no_measurement() -> None:
    assert measure(WALL, 0, 1 * MS, 0, 0) is None  # an older server
    assert measure(WALL, 0, 1 * MS, WALL, WALL - 1) is None  # the server answered before it received
    assert measure(WALL, 0, 1 * MS, WALL, WALL + 2 * MS) is None  # held longer than the round trip


def test_a_measurement_carried_on_follows_a_step_of_the_wall_clock_and_grows_uncertain() -> None:
    then = Measurement(-50 * MS, 400_000, 5 * S, WALL)
    assert carried(then, 5 * S, WALL) == then
    # 10 s later the host's wall clock was set 1 s forward: the server is 1 s less ahead; 15 ppm of 10 s more
    assert carried(then, 15 * S, WALL + S) == Measurement(-50 * MS - S, 400_000 + 150_000, 15 * S, WALL + S)


def test_the_estimate_is_the_least_uncertain_of_the_window_now_and_fresh_once_per_write() -> None:
    assert best([], 0, WALL) is None
    clock = ClockOffset(window_ns=60 * S, writes=3)
    assert clock.fresh(0, WALL) is None
    clock.add(Measurement(10, 5_000, at_ns=0, wall_minus_monotonic_ns=WALL))
    clock.add(None)  # a write that measured nothing
    assert clock.fresh(S // 10, WALL) == Measurement(10, 5_000 + 1_500, S // 10, WALL)  # 15 ppm of 0.1 s
    assert clock.fresh(S // 10, WALL) is None, "no new write: nothing to record"
    clock.add(Measurement(20, 9_000, at_ns=1 * S, wall_minus_monotonic_ns=WALL))
    # 9 µs now beats 5 µs and 15 ppm of 1 s
    assert clock.fresh(1 * S, WALL) == Measurement(20, 9_000, 1 * S, WALL)
    assert clock.estimate(1 * S, WALL + 7) == Measurement(13, 9_000, 1 * S, WALL + 7), "the wall clock set 7 ns on"
    # the first measurement ages out of the window
    assert clock.estimate(61 * S, WALL) == Measurement(20, 9_000 + 900_000, 61 * S, WALL)
    clock.add(Measurement(30, 9_000, at_ns=1 * S, wall_minus_monotonic_ns=WALL))  # of equals, the latest
    assert clock.estimate(2 * S, WALL).offset_ns == 30  # type: ignore[union-attr]
    for at in range(3):  # at most `writes` kept
        clock.add(Measurement(40, 50_000, at_ns=3 * S + at, wall_minus_monotonic_ns=WALL))
    assert clock.estimate(3 * S + 2, WALL) == Measurement(40, 50_000, 3 * S + 2, WALL)
    assert clock.estimate(100 * S, WALL) is None
