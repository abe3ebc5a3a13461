"""`ccld up`'s restart policy (pure: the clock is passed in)."""

from __future__ import annotations

from ccld.stack.supervise import Backoff


def test_crashes_soon_after_start_double_the_wait_up_to_the_cap() -> None:
    b = Backoff(initial_s=1, max_s=8, stable_s=60)
    b.started(0.0)
    delays = []
    now = 0.0
    for _ in range(6):
        now += 0.5
        delays.append(b.crashed(now))
        assert not b.due(now) and b.due(now + delays[-1])
        now += delays[-1]
        b.restarted(now)
    assert delays == [1, 2, 4, 8, 8, 8] and b.restarts == 6


def test_a_stable_run_resets_the_backoff() -> None:
    b = Backoff(initial_s=1, max_s=30, stable_s=60)
    b.started(0.0)
    b.crashed(1.0)
    b.restarted(2.0)
    assert b.crashed(3.0) == 2
    b.restarted(5.0)
    assert b.crashed(5.0 + 61) == 1, "a crash after a long healthy run waited like a crash loop"
