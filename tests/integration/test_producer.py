"""The metrics producer against a real broker and against a dead one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ccld.producers.kafka import MetricsProducer
from ccld.records import Status
from ccld.settings import Settings
from ccld.stack.broker import free_port
from factories import make_kernel_record
from harness import raw_batches

pytestmark = pytest.mark.integration


def test_submitted_records_arrive_batched_per_job_incarnation_with_each_rows_communicator(
        ccld_settings: Settings) -> None:
    """One message per flush holds every communicator of a job incarnation (the worker's cost is per
    message); each row keeps its own communicator, and incarnations never share a batch."""
    s = ccld_settings.replace(producer_linger_ms=50)
    with MetricsProducer(s, producer_id="p-test") as p:
        for i in range(300):
            p.submit(make_kernel_record(op_seq=i, comm_hash=1 + i % 3, incarnation=i % 2))
    batches = raw_batches(s)
    rows = [(b.incarnation, r.comm_hash, r.op_seq) for b in batches for r in b.records()]
    assert sorted(rows) == sorted((i % 2, 1 + i % 3, i) for i in range(300)), "a record lost, repeated or moved"
    assert all(len({r.incarnation for r in b.records()}) == 1 for b in batches), "a batch mixed incarnations"
    assert len(batches) < 300 / 3, "records were not batched across communicators"
    assert {b.producer for b in batches} == {"p-test"}
    assert len({b.batch_seq for b in batches}) == len(batches)


def accounted(stats: dict[str, int]) -> int:
    """Every submitted record is in exactly one of these."""
    return (stats["delivered_records"] + stats["failed_records"] + stats["in_flight_records"] + stats["queued"]
            + stats["spooled_records"] + stats["dropped_progress"] + stats["dropped_critical"])


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
    # Nothing raised, submit never waited on the network, nothing was delivered, and every
    # record is accounted for exactly once.
    assert submit_s < 5, f"submit blocked: {submit_s:.1f} s for 5000 records"
    assert stats["delivered_records"] == 0 and stats["queued"] == 0 and stats["in_flight_records"] == 0
    assert accounted(stats) == 5000, stats
    assert stats["dropped_progress"] > 0 and stats["dropped_critical"] <= stats["dropped_progress"]


def test_every_record_delivered_is_counted(ccld_settings: Settings) -> None:
    with MetricsProducer(ccld_settings.replace(producer_linger_ms=20)) as p:
        for i in range(1234):
            p.submit(make_kernel_record(op_seq=i))
    assert p.stats["delivered_records"] == 1234 and accounted(p.stats) == 1234, p.stats


def test_dead_broker_counts_losses_by_reason() -> None:
    s = Settings.load({}, bootstrap=f"127.0.0.1:{free_port()}", producer_linger_ms=10)
    p = MetricsProducer(s, background=False)
    for i in range(50):
        p.submit(make_kernel_record(op_seq=i))
    p.close(timeout_s=1)
    stats = p.stats
    assert stats["lost_records"] == 50 == stats["refused_records"], p.stats_line()
    assert "0 records delivered, 50 lost (expired 0, refused 50" in p.stats_line()


def test_spool_keeps_what_a_missing_broker_never_took_and_the_next_producer_replays_it(
    ccld_settings: Settings, tmp_path: Path
) -> None:
    spool = str(tmp_path / "spool")
    dead = ccld_settings.replace(bootstrap=f"127.0.0.1:{free_port()}", spool_dir=spool, producer_linger_ms=10)
    first = MetricsProducer(dead, producer_id="p-first")
    for i in range(500):
        first.submit(make_kernel_record(op_seq=i))
    first.close(timeout_s=1.5)
    assert first.stats["lost_records"] == 0 and first.stats["spooled_records"] == 500, first.stats_line()
    assert accounted(first.stats) == 500, first.stats

    second = MetricsProducer(ccld_settings.replace(spool_dir=spool), producer_id="p-second")
    second.close(timeout_s=20)
    assert second.stats["recovered_records"] == 500 and second.stats["replayed_records"] == 500, second.stats_line()
    batches = raw_batches(ccld_settings)
    assert sorted(int(x) for b in batches for x in b.columns["op_seq"]) == list(range(500))
    assert {b.producer for b in batches} == {"p-first"}
