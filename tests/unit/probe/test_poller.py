"""The poller over CPU-twin frames: records to the sink, never raising, bounded, threaded."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ccld.probe.frame_tracker import RankBinding
from ccld.probe.poller import FrameSource, OpCounts, ProbePoller
from ccld.probe.ring_plan import RingOp, emulate, expected_counts, fold, frozen_counts
from ccld.probe.twin import TwinKernelWriter, alloc_frames, frame_bytes, set_enabled
from ccld.records import DType, KernelRecord, OpType, Status, TraceId


class Clock:
    def __init__(self) -> None:
        self.ns = 10_000

    def __call__(self) -> int:
        return self.ns


def _ranks(n: int, clock: Clock) -> tuple[list[FrameSource], list[TwinKernelWriter]]:
    frames = alloc_frames(n)
    srcs, writers = [], []
    for r in range(n):
        buf = frame_bytes(frames, r)
        set_enabled(buf)
        srcs.append(FrameSource(buf, RankBinding("job", r, r, n, n, f"host{r}")))
        writers.append(TwinKernelWriter(buf, clock_ns=clock))
    return srcs, writers


def _trace(seq: int) -> TraceId:
    return TraceId(0xC0FFEE, seq, OpType.ALL_REDUCE, DType.FLOAT32)


def test_healthy_ring_on_twins_gives_expected_done_records() -> None:
    R, C, P, S, n = 4, 8, 16, 2, 1000
    clock = Clock()
    srcs, writers = _ranks(R, clock)
    out: list[KernelRecord] = []
    counts = OpCounts()
    poller = ProbePoller(srcs, out.append, clock_ns=clock, count_of=counts)
    ins = [np.full(n, r + 1, np.float32) for r in range(R)]
    for op_seq in range(3):
        counts.register(_trace(op_seq), n)
        for w in writers:
            w.begin(_trace(op_seq), C)

        def hook(rank: int, ch: int, kind: str) -> None:
            (writers[rank].count_send if kind == "send" else writers[rank].count_recv)(ch)

        res = emulate(RingOp.ALL_REDUCE, ins, C, P, S, hook)
        assert all(np.array_equal(x, np.full(n, 10, np.float32)) for x in res)
        clock.ns += 1000
        for w in writers:
            w.end()
        poller.poll_once()
    want = tuple(expected_counts(RingOp.ALL_REDUCE, n, R, C, P))
    assert len(out) == 3 * R and all(x.status is Status.DONE for x in out)
    assert {(x.rank, x.op_seq) for x in out} == {(r, s) for r in range(R) for s in range(3)}
    for x in out:
        assert x.send_counts == want and x.recv_counts == want and x.count == n
        assert x.t_exit_ns - x.t_enter_ns == 1000
    assert poller.stats["records"] == 12 and poller.stats["torn_reads"] == 0


def test_stopped_rank_on_twins_freezes_where_the_plan_says() -> None:
    R, C, P, S, n = 4, 10, 8, 2, 2000  # 10 channels fold onto 8 slots
    stop_rank, stop_step = 1, 9
    clock = Clock()
    srcs, writers = _ranks(R, clock)
    out: list[KernelRecord] = []
    poller = ProbePoller(srcs, out.append, clock_ns=clock, detail="all")  # a heartbeat every poll
    for w in writers:
        w.begin(_trace(0), C)

    def hook(rank: int, ch: int, kind: str) -> None:
        (writers[rank].count_send if kind == "send" else writers[rank].count_recv)(ch)

    emulate(RingOp.ALL_REDUCE, [np.ones(n, np.float32)] * R, C, P, S, hook, stop=(stop_rank, stop_step))
    frozen = frozen_counts(RingOp.ALL_REDUCE, n, R, C, P, S, stop_rank, stop_step)
    for _ in range(3):  # three polls 100 ms apart: heartbeats with frozen counters
        clock.ns += 100_000_000
        poller.poll_once()
    by_rank: dict[int, list[KernelRecord]] = {}
    for x in out:
        by_rank.setdefault(x.rank, []).append(x)
    for r in range(R):
        recs = by_rank[r]
        assert [x.status for x in recs] == [Status.ENTERED] + [Status.PROGRESS] * 3
        want_send = fold([frozen[r][c][0] for c in range(C)])
        want_recv = fold([frozen[r][c][1] for c in range(C)])
        assert all(x.send_counts == want_send and x.recv_counts == want_recv for x in recs[1:]), r
        assert [x.t_sample_ns for x in recs[1:]] == [10_000 + k * 100_000_000 for k in (1, 2, 3)]
    healthy = fold(expected_counts(RingOp.ALL_REDUCE, n, R, C, P))
    assert by_rank[stop_rank][-1].send_counts < healthy


def test_sink_errors_are_counted_not_raised() -> None:
    clock = Clock()
    srcs, writers = _ranks(1, clock)

    def bad_sink(rec: KernelRecord) -> None:
        raise RuntimeError("broker down")

    poller = ProbePoller(srcs, bad_sink, clock_ns=clock)
    writers[0].begin(_trace(0), 1)
    writers[0].end()
    assert poller.poll_once() == 0
    assert poller.stats["sink_errors"] == 1 and poller.stats["errors"] == 0


def test_internal_failures_never_reach_the_caller() -> None:
    clock = Clock()
    srcs, writers = _ranks(1, clock)
    out: list[KernelRecord] = []
    poller = ProbePoller(srcs, out.append, clock_ns=lambda: 1 // 0)  # a clock that blows up
    writers[0].begin(_trace(0), 1)
    assert poller.poll_once() == 0
    assert poller.stats["errors"] == 1


def test_records_beyond_the_cap_are_dropped_and_counted() -> None:
    clock = Clock()
    srcs, writers = _ranks(3, clock)
    out: list[KernelRecord] = []
    poller = ProbePoller(srcs, out.append, clock_ns=clock, max_records_per_poll=4)
    for w in writers:
        w.begin(_trace(0), 1)  # ENTERED + PROGRESS each: 6 records
    assert poller.poll_once() == 4
    assert poller.stats["dropped"] == 2 and len(out) == 4


def test_bad_version_is_counted() -> None:
    clock = Clock()
    srcs, writers = _ranks(1, clock)
    out: list[KernelRecord] = []
    writers[0].begin(_trace(0), 1)
    srcs[0].buffer[4] = 99  # version
    poller = ProbePoller(srcs, out.append, clock_ns=clock)
    poller.poll_once()
    assert out == [] and poller.stats["bad_frames"] == 1


def test_thread_polls_at_the_interval_and_stops_with_a_final_poll() -> None:
    clock = Clock()
    srcs, writers = _ranks(2, clock)
    out: list[KernelRecord] = []
    with ProbePoller(srcs[:1], out.append, interval_s=0.01, clock_ns=clock) as poller:
        idx = poller.add_source(srcs[1])
        assert idx == 1
        writers[0].begin(_trace(0), 1)
        writers[1].begin(_trace(0), 1)
        time.sleep(0.1)
        assert poller.stats["polls"] >= 3
        writers[0].end()
        writers[1].end()
    assert {(x.rank, x.status) for x in out if x.status is Status.DONE} == {(0, Status.DONE), (1, Status.DONE)}
    assert poller.rates(0) is None


def test_bad_sources_are_refused() -> None:
    with pytest.raises(ValueError):
        ProbePoller([FrameSource(np.zeros(10, np.uint8), RankBinding("j", 0, 0, 1, 1, "h"))], print)
    with pytest.raises(ValueError):
        ProbePoller([], print, interval_s=0)


def test_op_counts_are_bounded() -> None:
    c = OpCounts(max_entries=2)
    for s in range(3):
        c.register(_trace(s), 100 + s)
    assert c(_trace(0)) == -1 and c(_trace(2)) == 102
