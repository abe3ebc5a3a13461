"""The metrics producer against a real broker and against a dead one."""

from __future__ import annotations

import time

import pytest

from ccld.broker import free_port
from ccld.producers.kafka import MetricsProducer
from ccld.records import Status
from ccld.settings import Settings
from factories import make_kernel_record
from harness import raw_batches

pytestmark = pytest.mark.integration


def test_submitted_records_arrive_batched_per_communicator(ccld_settings: Settings) -> None:
    s = ccld_settings.replace(producer_linger_ms=50)
    with MetricsProducer(s, producer_id="p-test") as p:
        for i in range(300):
            p.submit(make_kernel_record(op_seq=i, comm_hash=1 + i % 3))
    batches = raw_batches(s)
    assert sum(b.n for b in batches) == 300
    assert all(len(set(b.columns["op_seq"] % 3)) == 1 for b in batches), "a batch mixed communicators"
    assert {b.producer for b in batches} == {"p-test"}
    assert len({b.batch_seq for b in batches}) == len(batches)


def test_dead_broker_costs_only_counted_drops() -> None:
    s = Settings.load({}, bootstrap=f"127.0.0.1:{free_port()}", producer_queue_max=1000, producer_batch_max=100,
                      producer_linger_ms=10)
    p = MetricsProducer(s)
    t0 = time.perf_counter()
    for i in range(5000):
        p.submit(make_kernel_record(op_seq=i, status=Status.PROGRESS if i % 2 else Status.DONE))
    submit_s = time.perf_counter() - t0
    p.close(timeout_s=2)
    stats = p.stats
    # Nothing raised, nothing blocked for long, and every record is accounted for.
    assert submit_s < 5, f"submit blocked: {submit_s:.1f} s for 5000 records"
    lost = stats["dropped_progress"] + stats["dropped_critical"] + stats["produce_errors"] + \
        stats["delivery_failures"]
    assert lost > 0 and stats["accepted"] + stats["dropped_progress"] >= 5000 - stats["dropped_critical"]
