"""The tracker: the bounded record format (states, looks, sampled DONE details), async completion,
drops and errors counted, the per-call mode."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import numpy as np
import pytest

from ccld.bounded import EXITS_KEPT, op_sampled
from ccld.producers.attach.op_tracker import Identity, OpCall, Tracker
from ccld.producers.attach.outlets import ListSink
from ccld.records import (
    DETAIL_OPS_PER_S,
    DType,
    KernelRecord,
    OpType,
    Status,
    detail_one_in,
    detail_sampled,
    to_signed64,
)

MS = 1_000_000
US = 1_000
T0 = 1_000 * MS
COMM = 0xDEAD_BEEF_1234_5678  # above 2**63 as an unsigned hash: the wire has it signed
OTHER = 0x0123_4567_89AB_CDEF


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> int:
        return self.t


def make(heartbeat_s: float = 0.2, queue_max: int = 1000, **kw: Any) -> tuple[Tracker, ListSink, Clock]:
    sink, clock = ListSink(), Clock()
    tr = Tracker(sink=sink, heartbeat_s=heartbeat_s, clock=clock, queue_max=queue_max, **kw)
    tr.identity = Identity(job="j", incarnation=2, rank=3, world_size=4, host="h")
    return tr, sink, clock


def enter(tr: Tracker, seq: int = 0, comm: int = 11, **kw: Any) -> OpCall:
    args: dict[str, Any] = {"op_type": OpType.ALL_REDUCE, "dtype": DType.FLOAT32, "count": 1024, "peer": -1,
                            "comm_rank": 3, "comm_size": 4} | kw  # fmt: skip
    return tr.enter(comm, seq, args["op_type"], args["dtype"], args["count"], args["peer"], args["comm_rank"],
                    args["comm_size"])  # fmt: skip


def run_ops(tr: Tracker, clock: Clock, *, rate: float, seconds: float, comm: int = COMM, inside_s: float = 0.0005,
            tick_s: float = 0.05, first_seq: int = 0) -> dict[int, OpCall]:  # fmt: skip
    """``rate`` back-to-back ops per second for ``seconds`` on one communicator, the emitter
    pumping every ``tick_s`` as its thread does; returns the ops by sequence number."""
    ops: dict[int, OpCall] = {}
    period = int(1e9 / rate)
    inside = min(int(inside_s * 1e9), period - 1)
    end = clock.t + int(seconds * 1e9)
    next_pump = clock.t
    seq = first_seq
    while clock.t < end:
        call = enter(tr, seq, comm)
        ops[seq] = call
        clock.t += inside
        tr.exit(call)
        clock.t += period - inside
        seq += 1
        while clock.t >= next_pump:
            tr.pump(min(next_pump, clock.t))
            next_pump += int(tick_s * 1e9)
    return ops


def second_of(r: KernelRecord) -> int:
    return (r.t_sample_ns - T0) // (1000 * MS)


# ---------------------------------------------------------------- the sampling rule
def test_op_sampled_is_detail_sampled_for_one_op() -> None:
    rnd = random.Random(7)
    hashes = [COMM, OTHER, 0, 1, (1 << 64) - 1, 1 << 63] + [rnd.getrandbits(64) for _ in range(20)]
    seqs = np.arange(0, 3000, dtype=np.int64)
    for h in hashes:
        for k in (1, 2, 8, 64, 128, 1024):
            want = detail_sampled(to_signed64(h), seqs, k)
            got = np.fromiter((op_sampled(h, int(s), k) for s in seqs), dtype=bool, count=seqs.size)
            assert np.array_equal(got, want), (hex(h), k)


# ---------------------------------------------------------------- the bounded format
def test_at_1000_ops_per_s_records_per_second_stay_bounded_and_follow_detail_sampled() -> None:
    tr, sink, clock = make()
    ops = run_ops(tr, clock, rate=1000, seconds=3)
    tr.pump()
    assert len(ops) == 3000 and tr.stats.calls == 3000
    k = tr.strides()[COMM]
    assert k == detail_one_in(1000.0) == 128
    per_s = Counter(second_of(r) for r in sink.records)
    # the first interval learns the op rate (K = 1 for ops 0-7, 16 from op 8, 128 from op 128: about
    # 24 records once); after it, 1 state + 1 look (none here: ops last 0.5 ms) + about 8 details
    # (1000 / 128) per second
    assert per_s[0] <= 3 * (1 + 1 + DETAIL_OPS_PER_S), per_s
    assert per_s[1] + per_s[2] <= 2 * (1 + 1 + DETAIL_OPS_PER_S) + 2, per_s
    assert len(sink.records) <= 5 * (1 + 1 + DETAIL_OPS_PER_S), per_s  # the old format: 3,000+
    assert tr.stats.unsampled + tr.stats.details == 3000
    done = [r for r in sink.records if r.status is Status.DONE]
    # the details are exactly the ops detail_sampled picks at the stride in force; once the stride
    # is learned (second 2 on) that is the communicator's stride for every rank at this rate
    late = [s for s, c in ops.items() if c.t_exit_ns >= T0 + 1200 * MS]
    want = set(np.asarray(late)[detail_sampled(to_signed64(COMM), np.asarray(late), k)].tolist())
    assert {r.op_seq for r in done if r.t_exit_ns >= T0 + 1200 * MS} == want
    assert all(op_sampled(COMM, r.op_seq, 1) for r in done)
    # every detail knows where the rank's previous op ended (the previous op was not sent)
    for r in done:
        prev = ops.get(r.op_seq - 1)
        assert r.t_prev_exit_ns == (prev.t_exit_ns if prev is not None else -1), r
        assert (r.t_exit_ns - r.t_enter_ns, r.t_sample_ns) == (500 * US, r.t_exit_ns)
    # one state per interval boundary (2 s, 3 s, 4 s on this clock), the newest op's
    states = [r for r in sink.records if r.status in (Status.IDLE, Status.PROGRESS)]
    assert [r.t_sample_ns for r in states] == [2000 * MS, 3000 * MS, 4000 * MS]
    for r in states:
        newest = max(s for s, c in ops.items() if c.t_enter_ns < r.t_sample_ns)
        assert r.op_seq == newest
        if r.status is Status.IDLE:
            assert r.t_exit_ns == ops[newest].t_exit_ns


def test_a_slow_communicator_sends_every_op_in_full() -> None:
    tr, sink, clock = make()
    ops = run_ops(tr, clock, rate=DETAIL_OPS_PER_S, seconds=5, inside_s=0.01)
    tr.pump()
    assert tr.strides()[COMM] == 1
    assert sorted(r.op_seq for r in sink.records if r.status is Status.DONE) == sorted(ops)


def test_the_stride_follows_the_rate_down_and_up_again() -> None:
    tr, _sink, clock = make()
    ops = run_ops(tr, clock, rate=1000, seconds=2)
    assert tr.strides()[COMM] == 128
    ops = run_ops(tr, clock, rate=20, seconds=3, first_seq=max(ops) + 1)
    assert tr.strides()[COMM] == detail_one_in(20.0) == 4
    run_ops(tr, clock, rate=500, seconds=2, first_seq=max(ops) + 1)
    assert tr.strides()[COMM] == detail_one_in(500.0)


def test_ranks_with_their_own_clocks_and_arrival_jitter_detail_the_same_ops() -> None:
    # one communicator, two ranks: the op rate changes (1000/s, 64/s at a stride boundary, 300/s),
    # each rank has its own clock offset, arrival jitter and emitter phase; K is decided at op
    # sequence numbers from the ops' own entry times, so both send the details of the same ops
    sched: list[tuple[int, int]] = []  # (enter, exit) in ns, job time
    t = 0
    for rate, n in ((1000, 2500), (64, 200), (300, 900)):
        for _ in range(n):
            sched.append((t, t + 300 * US))
            t += int(1e9 / rate)
    sent = []
    for offset_ms, seed, phase_ms in ((0, 1, 0), (123_456, 2, 37)):
        tr, sink, clock = make()
        rnd = random.Random(seed)
        base = T0 + offset_ms * MS
        next_pump = base + phase_ms * MS
        for seq, (t_in, t_out) in enumerate(sched):
            jitter = int(rnd.uniform(0, 200) * US)
            while next_pump <= base + t_in + jitter:
                tr.pump(next_pump)
                next_pump += 50 * MS
            clock.t = base + t_in + jitter
            call = enter(tr, seq, COMM)
            clock.t = base + t_out
            tr.exit(call)
        clock.t = next_pump
        tr.pump()
        sent.append([r.op_seq for r in sink.records if r.status is Status.DONE])
    assert sent[0] == sent[1] and 40 <= len(sent[0]) <= 120, (len(sent[0]), len(sent[1]))


def moe_details(pattern: list[OpType], seconds: int = 8) -> list[dict[int, OpType]]:
    """The DONE details two ranks send for ``pattern`` repeated 75 times a second (K = 8 or 16), each rank
    with its own clock offset and arrival jitter."""
    sent = []
    for offset_ms, seed in ((0, 1), (777, 2)):
        tr, sink, clock = make()
        rnd = random.Random(seed)
        base = clock.t = T0 + offset_ms * MS
        next_pump = base
        for seq in range(75 * seconds):
            clock.t = base + seq * (40 * MS // 3) + int(rnd.uniform(0, 2000) * US)
            while next_pump <= clock.t:
                tr.pump(next_pump)
                next_pump += 50 * MS
            call = enter(tr, seq, COMM, op_type=pattern[seq % len(pattern)], count=rnd.randrange(1, 4096))
            clock.t += 500 * US
            tr.exit(call)
        tr.pump()
        assert tr.strides()[COMM] >= 8
        sent.append({r.op_seq: r.op_type for r in sink.records if r.status is Status.DONE})
    assert sent[0] == sent[1]  # every rank details the same ops
    return sent


def test_an_moe_layers_dispatch_and_combine_are_detailed_together_on_every_rank() -> None:
    # dispatch and combine all_to_all back to back, then a dense all-reduce; the analyzer tells dispatch
    # from combine by their place in the run, so a dispatch is detailed with its combine, never alone
    done = moe_details([OpType.ALL_TO_ALL, OpType.ALL_TO_ALL, OpType.ALL_REDUCE])[0]
    a2a = sorted(q for q, t in done.items() if t is OpType.ALL_TO_ALL and q >= 75)
    assert len(a2a) >= 10, done
    assert all((q + 1 in done) if q % 3 == 0 else (q - 1 in done) for q in a2a), a2a
    # ... and the budget still holds: about 8 details a second in all, not twice that
    assert len([q for q in done if q >= 75]) <= 7 * 2 * DETAIL_OPS_PER_S, len(done)


def test_an_expert_parallel_group_of_only_all_to_all_is_detailed_in_pairs_within_its_budget() -> None:
    # a communicator that runs nothing but all_to_all is one run from its first op: detailed in pairs
    # from the start (dispatch at even places, combine at odd), about one pair in K, never all or none
    done = moe_details([OpType.ALL_TO_ALL])[0]
    late = sorted(q for q in done if q >= 75)
    assert 2 * DETAIL_OPS_PER_S <= len(late) <= 7 * 2 * DETAIL_OPS_PER_S, len(late)
    assert all((q + 1 in done) if q % 2 == 0 else (q - 1 in done) for q in late), late


def test_a_rank_blocked_inside_a_collective_sends_progress_every_interval() -> None:
    tr, sink, clock = make(heartbeat_s=0.2)
    run_ops(tr, clock, rate=1000, seconds=1.5, comm=OTHER)  # another communicator: idle from then on
    stuck = enter(tr, 41, COMM)
    t_in = clock.t
    for _ in range(100):  # 5 s inside, the emitter ticking every 50 ms
        clock.t += 50 * MS
        tr.pump()
    mine = [r for r in sink.records if r.comm_hash == COMM]
    assert mine and all(r.status is Status.PROGRESS and r.op_seq == 41 and r.t_exit_ns == -1 for r in mine)
    assert all(r.t_enter_ns == t_in for r in mine)
    # shipped once it has been inside for the heartbeat (a look), then as the state of every interval
    assert mine[0].t_sample_ns == t_in + 200 * MS
    assert [r.t_sample_ns for r in mine[1:]] == [t * 1000 * MS for t in range(3, 8)]
    assert tr.stats.details == len([r for r in sink.records if r.status is Status.DONE])
    idle = [r for r in sink.records if r.comm_hash == OTHER and r.t_sample_ns > t_in]
    assert [r.status for r in idle] == [Status.IDLE] * 5  # the other communicator: alive and idle
    assert len({r.op_seq for r in idle}) == 1
    tr.exit(stuck)
    tr.pump()
    assert [r.op_seq for r in sink.records if r.status is Status.DONE and r.comm_hash == COMM] == [41]


def test_a_rank_that_never_enters_op_k_reports_idle_after_k_minus_1() -> None:
    tr, sink, clock = make()
    ops = run_ops(tr, clock, rate=200, seconds=1.0)
    last = max(ops)
    for _ in range(60):  # the rank computes (or hangs) outside any collective for 3 s
        clock.t += 50 * MS
        tr.pump()
    states = [r for r in sink.records if r.status is not Status.DONE and r.t_sample_ns > ops[last].t_exit_ns]
    assert [r.t_sample_ns for r in states] == [t * 1000 * MS for t in (2, 3, 4, 5)]
    assert {(r.status, r.op_seq, r.t_enter_ns, r.t_exit_ns) for r in states} == {
        (Status.IDLE, last, ops[last].t_enter_ns, ops[last].t_exit_ns)}  # fmt: skip


def test_a_stuck_p2p_op_and_its_signature_are_in_its_state() -> None:
    # H2 needs the signature of the op each rank is stuck in; p2p ops are their own 2-rank channel
    tr, sink, clock = make()
    enter(tr, 7, OTHER, op_type=OpType.SEND, dtype=DType.BFLOAT16, count=33, peer=1, comm_rank=0, comm_size=2)
    clock.t += 250 * MS
    tr.pump()
    [r] = sink.records
    assert (r.status, r.op_type, r.dtype, r.count, r.peer, r.comm_rank, r.comm_size, r.op_seq) == (
        Status.PROGRESS, OpType.SEND, DType.BFLOAT16, 33, 1, 0, 2, 7)  # fmt: skip


def test_a_look_ships_each_new_long_op_at_most_once_per_interval() -> None:
    tr, sink, clock = make(heartbeat_s=0.1)
    for seq in range(4):  # 4 ops of 300 ms in one interval: only the first is looked at
        call = enter(tr, seq, COMM)
        for _ in range(6):
            clock.t += 50 * MS
            tr.pump()
        tr.exit(call)
    clock.t = T0 + 1_500 * MS
    tr.pump()
    looks = [r for r in sink.records if r.status is Status.PROGRESS]
    # op 0 looked at 100 ms in; ops 1 and 2 not (that interval had its look); op 3 is in flight at the
    # 2 s boundary, so the interval's state ships it and no look repeats it
    assert [(r.op_seq, r.t_sample_ns) for r in looks] == [(0, T0 + 100 * MS), (3, T0 + 1_000 * MS)]


def test_state_and_detail_tables_are_bounded() -> None:
    tr, sink, clock = make(comms_max=16)
    for i in range(100):
        tr.exit(enter(tr, 0, 1000 + i))
        clock.t += 1 * MS
        tr.pump()
    assert len(tr.strides()) <= 16 and tr.stats.comms_forgotten == 100 - 16
    assert len(tr._exits) <= EXITS_KEPT
    clock.t += 1000 * MS
    tr.pump()
    assert sum(r.status is Status.IDLE for r in sink.records) == 16  # states of the remembered ones


def test_the_training_thread_side_never_touches_the_emitters_tables() -> None:
    tr, sink, _clock = make()
    for seq in range(50):
        tr.exit(enter(tr, seq))
    assert tr.strides() == {} and len(tr._exits) == 0 and sink.records == []
    assert len(tr._events) == 100  # two O(1) appends per call, nothing else


def test_detail_all_sends_every_op_and_heartbeats_every_op_in_flight() -> None:
    tr, sink, clock = make(heartbeat_s=0.2, detail="all")
    ops = run_ops(tr, clock, rate=1000, seconds=1.5)
    assert sorted(r.op_seq for r in sink.records if r.status is Status.DONE) == sorted(ops)
    call = enter(tr, 5000)
    for _ in range(20):
        clock.t += 50 * MS
        tr.pump()
    beats = [r for r in sink.records if r.status is Status.PROGRESS and r.op_seq == 5000]
    assert len(beats) >= 4  # one every heartbeat, as long as it stays inside
    tr.exit(call)
    with pytest.raises(ValueError):
        Tracker(sink=sink, detail="some")


# ---------------------------------------------------------------- basics
def test_call_at_a_low_rate_is_a_single_done_row_with_both_times() -> None:
    tr, sink, clock = make()
    first = enter(tr)
    clock.t += 2 * MS
    tr.exit(first)
    clock.t += 3 * MS
    call = enter(tr, 1)
    clock.t += 2 * MS
    tr.exit(call)
    tr.pump()
    a, rec = sink.records
    assert (a.status, rec.status) == (Status.DONE, Status.DONE)
    assert rec.t_exit_ns - rec.t_enter_ns == 2 * MS
    assert rec.t_sample_ns == rec.t_exit_ns
    assert (a.t_prev_exit_ns, rec.t_prev_exit_ns) == (-1, a.t_exit_ns)  # the compute gap before it: 3 ms
    assert rec.to_dict()["t_prev_exit_ns"] == a.t_exit_ns
    assert (rec.job, rec.incarnation, rec.rank, rec.comm_rank, rec.comm_size, rec.world_size) == ("j", 2, 3, 3, 4, 4)
    assert rec.trace_id.op_type is OpType.ALL_REDUCE
    assert (a.t_exit_err_ns, rec.t_exit_err_ns) == (0, 0)  # timed here: exact


def test_an_exit_known_only_to_plus_minus_says_so_in_its_done_and_idle_rows() -> None:
    tr, sink, clock = make()
    call = enter(tr)
    tr.exit(call, clock.t + 2 * MS, err_ns=40 * MS)  # the Flight Recorder poller: a poll midpoint
    tr.pump(final=True)
    assert [(r.status, r.t_exit_err_ns) for r in sink.records] == [(Status.DONE, 40 * MS), (Status.IDLE, 40 * MS)]


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
    assert sink.records == [] and len(tr.inflight()) == 2
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
    assert len(sink.records) == 2 and tr.inflight() == []


def test_full_queue_drops_are_counted_never_raised() -> None:
    tr, sink, _ = make(queue_max=3)
    for i in range(5):
        tr.exit(enter(tr, i))
    assert tr.stats.dropped == 7
    tr.pump()
    # op 1's exit was dropped, but it had left when its entry was drained: still one DONE row
    assert [r.op_seq for r in sink.records] == [0, 1]


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


def test_background_thread_ships_and_stop_flushes_with_the_last_state() -> None:
    tr, sink, _ = make()
    tr.tick_s = 0.01
    tr.clock = __import__("time").monotonic_ns
    tr.start()
    tr.exit(enter(tr))
    tr.stop(1.0)
    assert [r.status for r in sink.records] == [Status.DONE, Status.IDLE]


def test_after_fork_the_child_forgets_the_parents_queue() -> None:
    tr, sink, _ = make()
    enter(tr)
    tr.pump()
    tr.detach_after_fork()
    tr.pump()
    assert sink.records == [] and tr.inflight() == [] and tr.strides() == {}


class BatchSink(ListSink):
    """A sink that takes whole batches (as the Kafka one does): t_prev_exit_ns travels as a column."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[Any] = []

    def submit_batch(self, batch: Any) -> None:
        self.batches.append(batch)


def test_a_batch_sink_gets_one_batch_per_pump_of_every_communicator_with_the_previous_exit_column() -> None:
    from ccld.records import COMM_COLUMN, KernelBatch

    sink, clock = BatchSink(), Clock()
    tr = Tracker(sink=sink, clock=clock)
    tr.identity = Identity("j", 0, 1, 4, "h")
    a = enter(tr, 0, COMM)
    clock.t += 2 * MS
    tr.exit(a)
    clock.t += 5 * MS
    b = enter(tr, 0, OTHER)
    clock.t += 2 * MS
    tr.exit(b)
    tr.pump()
    assert sink.records == [] and tr.stats.records == 2
    [batch] = sink.batches  # one message, not one per communicator
    assert isinstance(batch, KernelBatch) and batch.n == 2 and not batch.one_comm
    assert batch.col(COMM_COLUMN).tolist() == [to_signed64(COMM), to_signed64(OTHER)]
    assert batch.col("t_prev_exit_ns").tolist() == [-1, a.t_exit_ns]
    assert [r.t_prev_exit_ns for r in batch.records()] == [-1, a.t_exit_ns]


def test_an_async_work_wakes_the_emitter_from_its_idle_tick() -> None:
    """With no async work to ask, the emitter sleeps IDLE_TICK_FACTOR ticks (each wake takes the GIL
    from the training thread); a work registered meanwhile is asked at once, not after that sleep."""
    import time

    from ccld.producers.attach import op_tracker

    tr, sink, _ = make()
    tr.tick_s = 0.5  # an idle sleep of 2 s: far beyond what the test waits
    tr.clock = time.monotonic_ns
    tr.start()
    try:
        deadline = time.monotonic() + 2.0
        while not tr._idle and time.monotonic() < deadline:
            time.sleep(0.005)
        assert tr._idle and op_tracker.IDLE_TICK_FACTOR * tr.tick_s >= 2.0
        time.sleep(0.05)  # asleep for its idle tick now
        work = FakeWork()
        work.done = True
        t0 = time.monotonic()
        tr.register_work(work, [enter(tr)])
        while tr._works and time.monotonic() - t0 < 1.5:
            time.sleep(0.005)
        assert not tr._works, "the finished work was not asked before the idle tick ran out"
    finally:
        tr.stop(1.0)
    assert [r.status for r in sink.records][:1] == [Status.DONE]
