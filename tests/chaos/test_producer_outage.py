"""Broker outages in the middle of a run: with the spool nothing is lost; without it every loss is counted.

Real Tansu brokers (one per test, so they can be frozen and killed), the real producer, records
read back from the broker. Faults: SIGSTOP/SIGCONT (a frozen broker: connections stay open,
nothing answers) and kill -9 with a restart on the same port.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from ccld.producers.kafka import MetricsProducer
from ccld.settings import Settings
from ccld.stack.broker import EmbeddedBroker
from ccld.topics import ensure_topics
from factories import make_kernel_record
from harness import raw_batches

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RECORDS = 4000
RUN_S = 9.0
OUTAGE_AT_S = 2.0
OUTAGE_S = 5.0


def settings_for(broker: EmbeddedBroker, **changes: object) -> Settings:
    s = Settings.load({}, bootstrap=broker.bootstrap, topic_prefix=f"c{uuid.uuid4().hex[:8]}.",
                      metrics_partitions=1, producer_linger_ms=20, producer_message_timeout_ms=2000, **changes)
    ensure_topics(s)
    return s


def run(producer: MetricsProducer, fault_start: Callable[[], None], fault_end: Callable[[], None]) -> float:
    """Submit RECORDS records evenly over RUN_S seconds with a fault in the middle; the slowest submit."""
    t0 = time.monotonic()
    slowest = 0.0
    faulted = ended = False
    for i in range(RECORDS):
        target = t0 + RUN_S * i / RECORDS
        now = time.monotonic()
        if now < target:
            time.sleep(target - now)
        if not faulted and now - t0 >= OUTAGE_AT_S:
            fault_start()
            faulted = True
        if faulted and not ended and now - t0 >= OUTAGE_AT_S + OUTAGE_S:
            fault_end()
            ended = True
        a = time.perf_counter()
        producer.submit(make_kernel_record(op_seq=i))
        slowest = max(slowest, time.perf_counter() - a)
    assert faulted and ended
    return slowest


def op_seqs(settings: Settings) -> list[int]:
    return [int(x) for b in raw_batches(settings, idle_s=3.0) for x in b.columns["op_seq"]]


def freeze(broker: EmbeddedBroker) -> None:
    assert broker.pid is not None
    os.kill(broker.pid, signal.SIGSTOP)


def thaw(broker: EmbeddedBroker) -> None:
    assert broker.pid is not None
    os.kill(broker.pid, signal.SIGCONT)


def test_frozen_broker_with_spool_loses_nothing(broker: EmbeddedBroker, tmp_path: Path) -> None:
    s = settings_for(broker, spool_dir=str(tmp_path / "spool"))
    p = MetricsProducer(s, producer_id="chaos-spool")
    slowest = run(p, lambda: freeze(broker), lambda: thaw(broker))
    p.close(timeout_s=40)
    stats = p.stats
    assert stats["lost_records"] == 0, p.stats_line()
    assert stats["spooled_in_records"] > 0 and stats["replayed_records"] > 0, "the outage never reached the spool"
    assert stats["spooled_records"] == 0 and stats["in_flight_records"] == 0, p.stats_line()
    assert stats["delivered_records"] == RECORDS, p.stats_line()
    got = op_seqs(s)
    assert set(got) == set(range(RECORDS)), f"missing on the broker: {len(set(range(RECORDS)) - set(got))}"
    # Not asserted: produce order across the outage. The spool replays in order (tests/unit/core/
    # test_spool.py, test_spool_replay.py), but a message librdkafka was already sending when the
    # outage began can reach the broker at the thaw before the spooled ones (seen once in CI: 1 of
    # 2,000); the analyzer takes records in any order.
    assert slowest < 1.0, f"submit blocked the caller for {slowest:.2f} s"


def test_frozen_broker_without_spool_counts_every_loss(broker: EmbeddedBroker) -> None:
    s = settings_for(broker)
    p = MetricsProducer(s, producer_id="chaos-nospool")
    run(p, lambda: freeze(broker), lambda: thaw(broker))
    p.close(timeout_s=20)
    stats = p.stats
    assert stats["lost_records"] > 0, "a 5 s freeze with a 2 s message timeout lost nothing: no fault injected?"
    assert stats["delivered_records"] + stats["lost_records"] == RECORDS, p.stats_line()
    assert stats["expired_records"] > 0 and stats["expired_records"] <= stats["lost_records"]
    got = set(op_seqs(s))
    # A request the frozen broker had already buffered can still be written after it thaws, so
    # what arrived is at least what was reported delivered (a counted loss is an upper bound).
    assert stats["delivered_records"] <= len(got) < RECORDS


def test_killed_broker_restarted_on_its_port_with_spool_loses_nothing(broker: EmbeddedBroker,
                                                                       tmp_path: Path) -> None:
    s = settings_for(broker, spool_dir=str(tmp_path / "spool"))
    p = MetricsProducer(s, producer_id="chaos-kill")
    delivered_before: list[int] = []

    def kill() -> None:
        assert broker.pid is not None
        os.kill(broker.pid, signal.SIGKILL)
        time.sleep(0.2)
        delivered_before.append(p.stats["delivered_records"])

    def restart() -> None:
        broker.start()  # same port at once: SO_REUSEADDR in the busy-port check
        ensure_topics(s)

    run(p, kill, restart)
    p.close(timeout_s=40)
    stats = p.stats
    assert stats["lost_records"] == 0 and stats["spooled_records"] == 0, p.stats_line()
    assert stats["replayed_records"] > 0, p.stats_line()
    # The memory broker lost what it had; everything not delivered before the kill is on the new one.
    got = set(op_seqs(s))
    assert len(got) >= RECORDS - delivered_before[0] and max(got) == RECORDS - 1, (len(got), delivered_before)
