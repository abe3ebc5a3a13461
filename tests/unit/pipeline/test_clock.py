"""The analyzer clock of a job: message timestamps, checked against the consensus of the job's producers."""

from __future__ import annotations

import math

from ccld.streams.clock import MAX_FUTURE_S, JobClock

WALL = 1_800_000_000.0  # a worker wall time (s); every receive time below is given explicitly


def test_a_single_producer_drives_the_clock_even_with_jumps_and_simulated_time() -> None:
    # The simulator / `bench --through-kafka`: simulated seconds from 0, far faster than the wall clock,
    # with a 600 s jump between scenarios: the only producer is its own consensus.
    c = JobClock(max_skew_s=30.0)
    for i, ts in enumerate([1.0, 2.0, 50.0, 100.0, 700.0, 701.5]):
        assert c.observe("sim", ts, WALL + 0.01 * i)
        assert c.now_s == ts
    assert c.rejected == 0


def test_one_producer_an_hour_ahead_is_clamped_to_the_consensus_and_counted() -> None:
    c = JobClock(max_skew_s=30.0)
    for i in range(5):
        c.observe("a", WALL + i, WALL + i)
        c.observe("b", WALL + i + 0.2, WALL + i + 0.2)
    assert not c.observe("late", WALL + 3605.0, WALL + 5.0)
    assert c.rejected == 1 and c.now_s < WALL + 10.0
    assert c.observe("a", WALL + 6.0, WALL + 6.0) and c.now_s == WALL + 6.0


def test_two_producers_that_disagree_side_with_the_one_nearer_the_worker_clock() -> None:
    c = JobClock(max_skew_s=30.0)
    c.observe("honest", WALL, WALL)
    assert not c.observe("ahead", WALL + 3600.0, WALL + 0.5)
    assert c.now_s <= WALL + 1.0
    c2 = JobClock(max_skew_s=30.0)  # and one an hour behind never drags the clock back
    c2.observe("honest", WALL, WALL)
    assert c2.observe("behind", WALL - 3600.0, WALL + 0.5)
    assert c2.now_s == WALL


def test_a_majority_may_move_the_clock_forward() -> None:
    c = JobClock(max_skew_s=30.0)
    c.observe("a", WALL, WALL)
    c.observe("b", WALL + 600.0, WALL + 0.1)  # rejected: one against one, "a" is nearer the wall clock
    assert c.now_s < WALL + 600.0
    assert c.observe("c", WALL + 600.5, WALL + 0.2)  # now two of three agree: accepted
    assert c.now_s == WALL + 600.5


def test_silent_producers_stop_voting() -> None:
    c = JobClock(max_skew_s=30.0, active_s=10.0)
    c.observe("old", 100.0, WALL)
    c.observe("old2", 100.0, WALL)
    # Sequential producers (a replay of one job after another): the earlier ones fell silent long ago.
    assert c.observe("new", 900.0, WALL + 11.0)
    assert c.now_s == 900.0


def test_missing_or_absurd_timestamps_are_ignored_and_counted() -> None:
    c = JobClock()
    for ts in (None, 0.0, -5.0, math.nan, math.inf, WALL + MAX_FUTURE_S + 1.0):
        assert not c.observe("p", ts, WALL)
    assert c.ignored == 6 and c.now_s == 0.0


def test_extrapolation_and_state_round_trip() -> None:
    c = JobClock()
    assert c.extrapolated(WALL) == 0.0
    c.observe("p", WALL, WALL)
    assert c.extrapolated(WALL + 3.0) == WALL + 3.0 and c.extrapolated(WALL - 1.0) == WALL
    back = JobClock()
    back.load_state_dict(c.state_dict())
    assert back.state_dict() == c.state_dict()
    assert not back.observe("q", WALL + 3600.0, WALL + 1.0), "the restored producer no longer votes"


def test_a_hold_stops_the_timer_where_it_was_and_it_never_goes_back() -> None:
    """The worker behind for a moment, a minute after a job's last message: the job's clock had been judged
    at that minute already, so it stops there and goes on from there (it went back by the whole minute)."""
    c = JobClock()
    c.observe("p", WALL, WALL)
    assert [c.tick(WALL + k) for k in (1.0, 30.0, 60.0)] == [WALL + 1.0, WALL + 30.0, WALL + 60.0]
    c.hold(WALL + 61.0)  # behind: the second between the ticks is not silence
    assert c.tick(WALL + 61.0) == WALL + 60.0
    c.hold(WALL + 62.0)
    assert c.tick(WALL + 62.0) == WALL + 60.0
    assert c.tick(WALL + 65.0) == WALL + 63.0  # caught up: the wall time counts again, from where it stopped
    # data older than the timer's clock moves the data's time, not the timer back
    assert c.observe("p", WALL + 1.0, WALL + 66.0) and c.now_s == WALL + 1.0
    assert c.tick(WALL + 66.0) == WALL + 63.0
    assert c.observe("p", WALL + 70.0, WALL + 67.0) and c.tick(WALL + 67.5) == WALL + 70.5  # newer data leads
    back = JobClock()
    back.load_state_dict(c.state_dict())
    assert back.state_dict() == c.state_dict() and back.tick(WALL + 67.5) == WALL + 70.5
