"""The producer's bounded batcher: one batch per job incarnation and flush, and the drop policy."""

from __future__ import annotations

from ccld.producers.batcher import RecordBatcher
from ccld.records import Status
from factories import make_kernel_record


def batcher(queue_max: int = 10, batch_max: int = 4) -> RecordBatcher:
    return RecordBatcher(producer_id="p", batch_max=batch_max, queue_max=queue_max, linger_s=0.5)


def test_one_batch_holds_every_communicator_of_a_flush_and_is_cut_by_size_or_linger() -> None:
    """A rank is in several communicators: one message per flush, not one per communicator."""
    b = batcher(queue_max=100)
    for i in range(3):
        b.add(make_kernel_record(op_seq=i), 0.0)
    b.add(make_kernel_record(comm_hash=99), 0.0)
    b.add(make_kernel_record(op_seq=3), 0.0)
    full = b.ready(0.1)
    assert [x.n for x in full] == [4] and full[0].comm_hash == make_kernel_record().comm_hash
    assert [r.comm_hash for r in full[0].records()] == [make_kernel_record().comm_hash] * 3 + [99]
    assert not full[0].one_comm
    b.add(make_kernel_record(job="other"), 0.2)  # another job (or incarnation) is never mixed in
    late = b.ready(0.8)
    assert sorted((x.job, x.n) for x in late) == sorted([("other", 1), (make_kernel_record().job, 1)])
    assert len(b) == 0 and [x.batch_seq for x in full + late] == [0, 1, 2]


def test_full_queue_drops_oldest_progress_first_and_keeps_enter_exit() -> None:
    b = batcher(queue_max=4, batch_max=100)
    for i in range(3):
        b.add(make_kernel_record(status=Status.PROGRESS, t_sample_ns=i), 0.0)
    b.add(make_kernel_record(status=Status.ENTERED), 0.0)
    assert b.add(make_kernel_record(status=Status.DONE), 0.0)  # evicts the oldest PROGRESS
    assert b.stats.dropped_progress == 1
    out = b.ready(0.0, force=True)[0].records()
    assert [r.status for r in out] == [Status.PROGRESS, Status.PROGRESS, Status.ENTERED, Status.DONE]
    assert [r.t_sample_ns for r in out[:2]] == [1, 2]


def test_enter_exit_beyond_twice_the_bound_are_counted_not_silent() -> None:
    b = batcher(queue_max=2, batch_max=100)
    kept = [b.add(make_kernel_record(status=Status.ENTERED, op_seq=i), 0.0) for i in range(6)]
    assert kept == [True] * 4 + [False] * 2
    assert b.stats.dropped_critical == 2 and len(b) == 4
    assert not b.add(make_kernel_record(status=Status.PROGRESS), 0.0)
    assert b.stats.dropped_progress == 1


def test_samples_already_sent_are_never_evicted_again() -> None:
    b = batcher(queue_max=3, batch_max=2)
    b.add(make_kernel_record(status=Status.PROGRESS, op_seq=0), 0.0)
    b.add(make_kernel_record(status=Status.PROGRESS, op_seq=1), 0.0)
    assert [x.n for x in b.ready(0.0)] == [2] and len(b) == 0
    for i in range(2, 8):  # the queue fills again; only queued samples may go
        b.add(make_kernel_record(status=Status.PROGRESS, op_seq=i), 0.0)
    assert len(b) == 3 and b.stats.dropped_progress == 3
    out = [r.op_seq for x in b.ready(0.0, force=True) for r in x.records()]
    assert out == [5, 6, 7] and len(b) == 0


def test_eviction_order_does_not_grow_while_traffic_never_pauses() -> None:
    b = batcher(queue_max=10_000, batch_max=10)
    for i in range(20_000):
        b.add(make_kernel_record(status=Status.PROGRESS, op_seq=i, comm_hash=i % 3), 0.0)
        b.add(make_kernel_record(status=Status.ENTERED, op_seq=i, comm_hash=99), 0.0)  # one never drains
        if i % 5 == 0:
            b.ready(0.0)
    assert len(b._progress) <= 2 * len(b._live_progress) + 1024
