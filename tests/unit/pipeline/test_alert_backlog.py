"""The alert backlog: offsets are committable only once every receiver took everything before them."""

from __future__ import annotations

import pytest

from ccld.sinks.alert_backlog import Backlog
from ccld.sinks.alert_payloads import Step
from factories import make_verdict


def step(n: int = 0) -> Step:
    return Step(make_verdict(incident_id=f"i{n}"), 0.0, {"alertname": "CCLD_H1"})


def test_nothing_is_committable_until_every_receiver_took_it() -> None:
    b = Backlog(["alertmanager", "webhook"], 10)
    e = b.add(0, 7, step())
    assert b.committable() == {}
    b.taken("alertmanager", e)
    assert b.committable() == {}, "the webhook has not taken it"
    b.taken("webhook", e)
    assert b.committable() == {0: 8} and len(b) == 0


def test_a_receiver_that_is_down_does_not_hold_the_other_back_but_holds_the_offsets() -> None:
    b = Backlog(["alertmanager", "webhook"], 10)
    first, second = b.add(0, 0, step(0)), b.add(0, 1, step(1))
    b.taken("alertmanager", first)
    b.taken("alertmanager", second)
    assert b.head("alertmanager") is None and b.head("webhook") is first
    assert b.committable() == {}
    b.taken("webhook", first)
    assert b.committable() == {0: 1}


def test_entries_without_a_step_hold_their_place() -> None:
    b = Backlog(["webhook"], 10)
    pending = b.add(0, 0, step())
    b.add(0, 1, None)  # a duplicate: nothing to send, but not committable before the verdict it repeats
    assert b.committable() == {}
    b.taken("webhook", pending)
    assert b.committable() == {0: 2}


def test_partitions_commit_independently() -> None:
    b = Backlog(["webhook"], 10)
    stuck = b.add(0, 0, step(0))
    b.add(1, 5, None)
    assert b.committable() == {1: 6}
    b.taken("webhook", stuck)
    assert b.committable() == {0: 1}


def test_a_receiver_takes_only_its_oldest_entry() -> None:
    b = Backlog(["webhook"], 10)
    b.add(0, 0, step(0))
    later = b.add(0, 1, step(1))
    with pytest.raises(ValueError, match="oldest"):
        b.taken("webhook", later)


def test_room_and_dropping_lost_partitions() -> None:
    b = Backlog(["webhook"], 3)
    b.add(0, 0, step(0))
    b.add(1, 0, step(1))
    b.add(1, 1, step(2))
    assert b.room == 0
    gone = b.drop({1})
    assert [(e.partition, e.offset) for e in gone] == [(1, 0), (1, 1)]
    assert len(b) == 1 and b.room == 2 and b.waiting("webhook") == 1
