"""The tracker: ENTERED/PROGRESS/DONE records, async completion, drops and errors counted."""

from __future__ import annotations

from typing import Any

from ccld.producers.attach.sinks import ListSink
from ccld.producers.attach.tracker import Identity, Tracker
from ccld.records import DType, KernelRecord, OpType, Status

MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.t = 1_000 * MS

    def __call__(self) -> int:
        return self.t


def make(heartbeat_s: float = 0.2, queue_max: int = 1000) -> tuple[Tracker, ListSink, Clock]:
    sink, clock = ListSink(), Clock()
    tr = Tracker(sink=sink, heartbeat_s=heartbeat_s, clock=clock, queue_max=queue_max)
    tr.identity = Identity(job="j", incarnation=2, rank=3, world_size=4, host="h")
    return tr, sink, clock


def enter(tr: Tracker, seq: int = 0) -> Any:
    return tr.enter(11, seq, OpType.ALL_REDUCE, DType.FLOAT32, 1024, -1, 3, 4)


def test_call_within_one_tick_is_a_single_done_row_with_both_times() -> None:
    tr, sink, clock = make()
    call = enter(tr)
    clock.t += 2 * MS
    tr.exit(call)
    tr.pump()
    [rec] = sink.records
    assert rec.status is Status.DONE
    assert rec.t_exit_ns - rec.t_enter_ns == 2 * MS
    assert rec.t_sample_ns == rec.t_exit_ns
    assert (rec.job, rec.incarnation, rec.rank, rec.comm_rank, rec.comm_size, rec.world_size) == ("j", 2, 3, 3, 4, 4)
    assert rec.trace_id.op_type is OpType.ALL_REDUCE


def test_a_rank_waiting_inside_an_op_sends_heartbeats_until_it_leaves() -> None:
    tr, sink, clock = make(heartbeat_s=0.2)
    call = enter(tr, seq=5)
    tr.pump()
    for _ in range(4):
        clock.t += 100 * MS
        tr.pump()
    clock.t += 10 * MS
    tr.exit(call)
    tr.pump()
    statuses = [r.status for r in sink.records]
    assert statuses[0] is Status.ENTERED and statuses[-1] is Status.DONE
    progress = [r for r in sink.records if r.status is Status.PROGRESS]
    assert 2 <= len(progress) <= 3
    assert all(r.t_exit_ns == -1 and r.t_sample_ns > r.t_enter_ns for r in progress)
    assert all(r.op_seq == 5 for r in sink.records)
    assert tr.inflight() == []


class FakeWork:
    def __init__(self) -> None:
        self.done = False

    def is_completed(self) -> bool:
        return self.done


def test_async_work_completes_when_seen_completed_or_waited() -> None:
    tr, sink, clock = make()
    a, b = enter(tr, 0), enter(tr, 1)
    wa, wb = FakeWork(), FakeWork()
    tr.register_work(wa, [a])
    tr.register_work(wb, [b])
    tr.pump()
    assert [r.status for r in sink.records] == [Status.ENTERED, Status.ENTERED]
    clock.t += 5 * MS
    wa.done = True  # nobody waits: the emitter's poll notices
    tr.pump()
    clock.t += 5 * MS
    tr.complete_work(wb)  # Work.wait() returned
    tr.complete_work(wb)  # twice is harmless
    tr.pump()
    done = {r.op_seq: r for r in sink.records if r.status is Status.DONE}
    assert set(done) == {0, 1}
    assert done[0].t_exit_ns - done[0].t_enter_ns == 5 * MS
    assert done[1].t_exit_ns - done[1].t_enter_ns == 10 * MS
    assert len(sink.records) == 4


def test_full_queue_drops_are_counted_never_raised() -> None:
    tr, sink, _ = make(queue_max=3)
    for i in range(5):
        enter(tr, i)
    assert tr.stats.dropped == 2
    tr.pump()
    assert len(sink.records) == 3


class BrokenSink(ListSink):
    def submit(self, record: KernelRecord) -> None:
        raise RuntimeError("broker gone")


def test_a_failing_sink_is_counted() -> None:
    sink = BrokenSink()
    tr = Tracker(sink=sink, clock=Clock())
    tr.identity = Identity("j", 0, 0, 1, "h")
    tr.exit(enter(tr))
    tr.pump()
    assert tr.stats.sink_errors == 1 and tr.stats.records == 0


def test_records_before_identity_is_known_are_counted_as_unobserved() -> None:
    tr, sink, _ = make()
    tr.identity = None
    tr.exit(enter(tr))
    tr.pump()
    assert sink.records == [] and tr.stats.unobserved == 1


def test_background_thread_ships_and_stop_flushes() -> None:
    tr, sink, _ = make()
    tr.tick_s = 0.01
    tr.clock = __import__("time").monotonic_ns
    tr.start()
    tr.exit(enter(tr))
    tr.stop(1.0)
    assert [r.status for r in sink.records] == [Status.DONE]


def test_after_fork_the_child_forgets_the_parents_queue() -> None:
    tr, sink, _ = make()
    enter(tr)
    tr.detach_after_fork()
    tr.pump()
    assert sink.records == [] and tr.inflight() == []
