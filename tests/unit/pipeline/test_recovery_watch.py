"""The worker's watch on Faust's table recovery: a wait on changelog offsets nothing delivers is re-armed, then
checked against the log itself (streams/recovery_watch.py).

CI saw the recovery after a broker restarted empty wait for ever on one changelog message its high watermark
named. These drive the watch over a stand-in for Faust's recovery and consumer (the offsets, the events'
times, the calls the watch makes); the read of the log by another path is a function given to it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, NamedTuple

import pytest

from ccld.streams import recovery_watch
from ccld.streams.recovery_watch import RecoveryWatch, waiting_on


class TP(NamedTuple):
    topic: str
    partition: int


LOG = TP("app-analyzer-state-changelog", 0)


class Recovery:
    """What the watch reads of Faust's Recovery."""

    def __init__(self, goal: int, read: int, started_at: float) -> None:
        self.in_recovery = True
        self.active_highwaters: Counter[TP] = Counter({LOG: goal})
        self.active_offsets: Counter[TP] = Counter({LOG: read})
        self._active_events_received_at: dict[TP, float] = {}
        self._recovery_started_at = started_at


class Consumer:
    def __init__(self) -> None:
        self.flow_active = False
        self.calls: list[tuple[str, Any]] = []

    def resume_partitions(self, tps: list[TP]) -> None:
        self.calls.append(("resume", tuple(tps)))

    def resume_flow(self) -> None:
        self.flow_active = True

    async def seek(self, tp: TP, offset: int) -> None:
        self.calls.append(("seek", (tp, offset)))


class App:
    def __init__(self, recovery: Recovery) -> None:
        self.tables = type("Tables", (), {"recovery": recovery})()
        self.consumer = Consumer()
        self.flow_control = type("Flow", (), {"resume": lambda self: None})()


def test_only_a_partition_still_short_of_its_goal_and_silent_that_long_is_stuck() -> None:
    hw = {TP("a", 0): 0, TP("a", 1): 5, TP("a", 2): 9, TP("a", 3): 9}
    read = {TP("a", 0): -1, TP("a", 1): 5, TP("a", 2): 3, TP("a", 3): 3}
    seen = {TP("a", 3): 95.0}  # an event 5 s ago: reading, however slowly
    got = waiting_on(hw, read, seen, started_at=70.0, now=100.0, stuck_s=20.0)
    assert [(a.tp, a.offset, a.goal) for a in got] == [(TP("a", 0), 0, 0), (TP("a", 2), 4, 9)]
    assert waiting_on(hw, read, seen, started_at=90.0, now=100.0, stuck_s=20.0) == []  # started 10 s ago
    assert waiting_on(hw, read, seen, started_at=None, now=100.0, stuck_s=20.0) == []


def run_checks(watch: RecoveryWatch, times: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> None:
        for t in times:
            monkeypatch.setattr(recovery_watch.time, "monotonic", lambda t=t: t)
            await watch.check()
            await asyncio.sleep(0)  # the seek it scheduled

    asyncio.run(go())


def test_a_watermark_naming_an_offset_the_log_lacks_is_rearmed_then_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recovery(goal=0, read=-1, started_at=0.0)  # CI's case: a high watermark of 1, offset 0 awaited
    app = App(rec)
    asked: list[tuple[str, int, int, int]] = []
    watch = RecoveryWatch(app, lambda *a: asked.append(a) or [], stuck_s=20.0)
    run_checks(watch, [10.0, 21.0], monkeypatch)
    assert app.consumer.calls == [("resume", (LOG,)), ("seek", (LOG, 0))] and app.consumer.flow_active
    assert asked == [] and watch.counts["rearms"] == 1
    run_checks(watch, [30.0], monkeypatch)  # re-armed 9 s ago: not yet
    assert asked == []
    run_checks(watch, [41.0], monkeypatch)
    assert asked == [(LOG.topic, 0, 0, 1)]
    assert rec.active_highwaters[LOG] == -1  # nothing left to wait for: Faust ends the recovery
    assert watch.counts == {"rearms": 1, "phantom_offsets": 1, "undelivered": 0}


def test_messages_the_consumer_never_delivered_are_not_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recovery(goal=4, read=1, started_at=0.0)
    app = App(rec)
    watch = RecoveryWatch(app, lambda topic, partition, start, upto: list(range(start, upto)), stuck_s=20.0)
    run_checks(watch, [21.0, 41.0], monkeypatch)
    assert rec.active_highwaters[LOG] == 4  # still the goal: the recovery must read them
    assert watch.counts == {"rearms": 2, "phantom_offsets": 0, "undelivered": 1}
    assert app.consumer.calls.count(("seek", (LOG, 2))) == 2


def test_a_recovery_that_moves_or_ends_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recovery(goal=4, read=1, started_at=0.0)
    app = App(rec)
    watch = RecoveryWatch(app, lambda *a: [], stuck_s=20.0)
    run_checks(watch, [21.0], monkeypatch)
    rec.active_offsets[LOG] = 2  # a message came after the re-arm: another offset awaited, re-armed anew
    rec._active_events_received_at[LOG] = 22.0
    run_checks(watch, [41.0], monkeypatch)
    assert watch.counts["phantom_offsets"] == 0 and rec.active_highwaters[LOG] == 4
    rec.in_recovery = False
    run_checks(watch, [100.0], monkeypatch)
    assert watch.counts == {"rearms": 1, "phantom_offsets": 0, "undelivered": 0}


def test_the_fetch_state_line_never_fails_on_an_unknown_consumer() -> None:
    line = recovery_watch.fetch_state(object(), LOG)
    assert line.startswith("flow stopped") and "fetch state unknown" in line
