"""Records from frames: ENTERED / PROGRESS heartbeat / DONE, missed kernels, wrap, rates, clock."""

from __future__ import annotations

import pytest

from ccld.probe import frame
from ccld.probe.frame_tracker import ClockMap, CountOf, FrameTracker, RankBinding, rates_between
from ccld.probe.twin import TwinKernelWriter, alloc_frames, frame_bytes, set_enabled
from ccld.records import DType, KernelRecord, OpType, Status, TraceId

BINDING = RankBinding(job="j", rank=5, comm_rank=1, comm_size=4, world_size=16, host="h5", incarnation=2)


class Rig:
    """One twin frame, its writer and a tracker sharing a fake clock (the per-kernel format, whose
    records follow the frame one to one; ``test_bounded`` covers the bounded format)."""

    def __init__(self, count_of: CountOf | None = None, detail: str = "all") -> None:
        self.now = 1_000
        self.buf = frame_bytes(alloc_frames(1), 0)
        set_enabled(self.buf)
        self.w = TwinKernelWriter(self.buf, clock_ns=lambda: self.now)
        self.t = FrameTracker(BINDING, count_of, detail=detail)

    def poll(self) -> list[KernelRecord]:
        snap = frame.read_consistent(self.buf)
        assert snap is not None
        return self.t.update(snap, self.now)

    def tick(self, ns: int) -> None:
        self.now += ns


def _trace(seq: int, root: int = 0xFFFF, op: OpType = OpType.ALL_REDUCE) -> TraceId:
    return TraceId(-0x1234, seq, op, DType.BFLOAT16, root)


def test_enter_progress_heartbeat_done() -> None:
    r = Rig()
    assert r.poll() == []  # nothing ever begun
    r.w.begin(_trace(0), 2)
    r.tick(10)
    r.w.count_send(0)
    r.w.count_recv(1, 2)
    r.tick(90)
    recs = r.poll()
    assert [x.status for x in recs] == [Status.ENTERED, Status.PROGRESS]
    entered, prog = recs
    assert (entered.t_enter_ns, entered.t_sample_ns, entered.t_exit_ns) == (1000, 1000, -1)
    assert entered.send_counts == (0, 0) and entered.recv_counts == (0, 0)
    assert (prog.t_enter_ns, prog.t_sample_ns, prog.t_exit_ns) == (1000, 1100, -1)
    assert prog.send_counts == (1, 0) and prog.recv_counts == (0, 2)
    # frozen counters still produce a heartbeat with a newer sample time
    r.tick(100)
    (beat,) = r.poll()
    assert beat.status is Status.PROGRESS and beat.t_sample_ns == 1200 and beat.send_counts == (1, 0)
    r.tick(5)
    r.w.count_send(0)
    r.w.end()
    r.tick(50)
    (done,) = r.poll()
    assert done.status is Status.DONE
    assert (done.t_enter_ns, done.t_exit_ns, done.t_sample_ns) == (1000, 1205, 1205)
    assert done.send_counts == (2, 0) and done.recv_counts == (0, 2)
    assert r.poll() == []  # not inside any collective: nothing


def test_identity_fields_come_from_binding_and_trace() -> None:
    r = Rig(count_of=lambda t: 4096 if t.op_seq == 3 else -1)
    r.w.begin(_trace(3, root=2, op=OpType.BROADCAST), 1)
    r.w.end()
    (done,) = r.poll()
    assert (done.job, done.incarnation, done.rank, done.comm_rank, done.comm_size) == ("j", 2, 5, 1, 4)
    assert (done.world_size, done.host, done.comm_hash, done.op_seq) == (16, "h5", -0x1234, 3)
    assert (done.op_type, done.dtype, done.peer, done.count) == (OpType.BROADCAST, DType.BFLOAT16, 2, 4096)
    r.w.begin(_trace(4), 1)
    r.w.end()
    (nxt,) = r.poll()
    assert nxt.peer == -1 and nxt.count == -1


def test_kernels_between_polls_give_done_only() -> None:
    r = Rig()
    r.w.begin(_trace(0), 1)
    r.w.end()
    r.poll()
    for k in range(1, 4):
        r.tick(10)
        r.w.begin(_trace(k), 1)
        r.w.count_send(0, k)
        r.tick(3)
        r.w.end()
    recs = r.poll()
    assert [(x.status, x.op_seq) for x in recs] == [(Status.DONE, 1), (Status.DONE, 2), (Status.DONE, 3)]
    assert [x.send_counts for x in recs] == [(1,), (2,), (3,)]
    # only the latest kernel's times are in the frame; the earlier ones were not observed
    assert (recs[0].t_enter_ns, recs[0].t_exit_ns) == (-1, -1)
    assert (recs[2].t_enter_ns, recs[2].t_exit_ns) == (1036, 1039)


def test_end_seen_after_next_begin_keeps_exit_time() -> None:
    r = Rig()
    r.w.begin(_trace(0), 1)
    r.poll()  # ENTERED + PROGRESS
    r.tick(20)
    r.w.end()
    r.tick(5)
    r.w.begin(_trace(1), 1)
    recs = r.poll()
    assert [(x.status, x.op_seq) for x in recs] == [(Status.DONE, 0), (Status.ENTERED, 1), (Status.PROGRESS, 1)]
    assert (recs[0].t_enter_ns, recs[0].t_exit_ns) == (1000, 1020)


def test_more_than_eight_behind_counts_missed() -> None:
    r = Rig()
    r.w.begin(_trace(0), 1)
    r.w.end()
    r.poll()
    for k in range(1, 13):
        r.w.begin(_trace(k), 1)
        r.w.end()
    recs = r.poll()
    assert [x.op_seq for x in recs] == list(range(5, 13))
    assert r.t.missed == 4


def test_kernel_index_wraps_at_u32() -> None:
    r = Rig()
    r.w.dev_kernel_index = (1 << 32) - 2
    for k in range(4):
        r.w.begin(_trace(k), 1)
        r.w.end()
        recs = r.poll()
        assert [x.op_seq for x in recs] == [k], k
    assert frame.decode(r.buf).kernel_index == 2
    assert r.t.missed == 0


def test_folded_counters_never_step_back() -> None:
    r = Rig()
    r.w.begin(_trace(0), 2)
    r.w.count_send(0, 5)
    r.poll()
    # a late store of a smaller folded total (a GPU race) must not show as progress going back
    off = 32 + 16  # sub-block 0, channel 0, send
    r.buf[off : off + 8] = memoryview((3).to_bytes(8, "little"))
    r.tick(100)
    (prog,) = r.poll()
    assert prog.send_counts == (5, 0)


def test_rates_on_the_local_clock() -> None:
    r = Rig()
    r.w.begin(_trace(0), 2)
    r.poll()
    r.w.count_send(0, 50)
    r.w.count_recv(1, 10)
    r.tick(500_000_000)  # half a second
    r.poll()
    rates = r.t.rates
    assert rates is not None and rates.op_seq == 0 and rates.window_ns == 500_000_000
    assert rates.send == pytest.approx((100.0, 0.0)) and rates.recv == pytest.approx((0.0, 20.0))
    r.w.end()
    r.poll()
    assert r.t.rates is None
    assert rates_between(5, (1,), (1,), 5, (9,), (9,)) == ((0.0,), (0.0,))


def test_marker_pair_has_no_channels() -> None:
    r = Rig()
    r.w.begin(_trace(0), 0)
    recs = r.poll()
    assert [x.status for x in recs] == [Status.ENTERED, Status.PROGRESS]
    assert recs[1].send_counts == ()
    r.w.end()
    (done,) = r.poll()
    assert done.status is Status.DONE and done.recv_counts == ()


def test_clock_map_only_moves_forward_to_cover_gpu_writes() -> None:
    c = ClockMap(0)
    c.observe(gpu_written_ns=900, host_now_ns=1000)
    assert c.to_gpu(1000) == 1000 and c.corrections == 0
    c.observe(gpu_written_ns=1500, host_now_ns=1000)
    assert c.to_gpu(1000) == 1500 and c.corrections == 1
    c.observe(gpu_written_ns=1200, host_now_ns=1000)
    assert c.offset_ns == 500


def test_a_poller_that_saw_the_frame_empty_reports_every_kernel() -> None:
    r = Rig()
    assert r.poll() == []
    for k in range(3):
        r.w.begin(_trace(k), 1)
        r.w.end()
    assert [x.op_seq for x in r.poll()] == [0, 1, 2]


def test_a_late_poller_reports_only_the_latest_kernel() -> None:
    r = Rig()
    for k in range(3):
        r.w.begin(_trace(k), 1)
        r.w.end()
    assert [x.op_seq for x in r.poll()] == [2]
