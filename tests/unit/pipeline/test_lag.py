"""LagWatch: the worker is behind when a partition stays unread, or its messages come in late."""

from __future__ import annotations

import logging

import pytest

from ccld.streams.lag import LagWatch


def test_a_stream_that_drains_between_ticks_is_caught_up() -> None:
    w = LagWatch(5.0)
    for t in range(20):
        # a few messages arrive between ticks and are read before the next: unread goes back to 0
        assert w.update(float(t), {0: 3 if t % 2 else 0, 1: 0}, {0: 0.2, 1: 0.0})


def test_a_partition_unread_for_longer_than_the_bound_is_behind_until_it_drains(
        caplog: pytest.LogCaptureFixture) -> None:
    w = LagWatch(5.0)
    assert w.update(0.0, {0: 0}, {})
    with caplog.at_level(logging.WARNING, logger="ccld.streams.lag"):
        got = [w.update(float(t), {0: 1000 + t}, {}) for t in range(1, 9)]
        assert got == [True, True, True, True, False, False, False, False]
        assert w.update(9.0, {0: 0}, {})
    assert [r.message.split(":")[0] for r in caplog.records] == ["behind", "caught up after 4 s behind"]


def test_late_messages_alone_make_the_worker_behind() -> None:
    w = LagWatch(5.0)
    assert w.update(0.0, {0: 0}, {0: 4.9})
    assert not w.update(1.0, {0: 0}, {0: 5.0})
    assert w.update(2.0, {0: None}, {0: 0.1})  # an unknown high watermark is not "behind"


def test_a_revoked_partition_is_no_longer_waited_for() -> None:
    w = LagWatch(5.0)
    w.update(0.0, {0: 0, 1: 0}, {})
    assert not w.update(6.0, {0: 0, 1: 50}, {})
    assert w.update(7.0, {0: 0}, {})  # partition 1 went to another worker
