"""The poller's bounded record format on twin frames: records per interval independent of the
collective rate, DONE only for the ops ``detail_sampled`` picks at the attachment's stride (the
same ops on every rank and from either source), counters and peaks on them, heartbeats of a hung
kernel, IDLE states, and the ``detail="all"`` escape hatch."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ccld.bounded import op_sampled
from ccld.probe import frame
from ccld.probe.frame_tracker import FrameTracker, RankBinding
from ccld.probe.poller import FrameSource, ProbePoller
from ccld.probe.twin import TwinKernelWriter, alloc_frames, frame_bytes, set_enabled
from ccld.producers.attach.op_tracker import Identity, Tracker
from ccld.producers.attach.outlets import ListSink
from ccld.records import DType, KernelBatch, KernelRecord, OpType, Status, TraceId, detail_sampled

S = 1_000_000_000
MS = 1_000_000
COMM = 0x5EED_0000_1234_ABCD
T0 = 50 * S  # the GPU clock when the job starts


def _trace(seq: int) -> TraceId:
    return TraceId(COMM, seq, OpType.ALL_REDUCE, DType.BFLOAT16)


class Job:
    """Ranks of one communicator on twin frames sharing a fake GPU clock; each rank's tracker polls
    every ``poll_ns`` from its own phase (polls of different ranks never line up)."""

    def __init__(self, ranks: int = 1, poll_ns: int = 100 * MS, phases_ns: tuple[int, ...] = (),
                 detail: str = "sampled") -> None:  # fmt: skip
        self.now = T0
        frames = alloc_frames(ranks)
        self.bufs = [frame_bytes(frames, r) for r in range(ranks)]
        for b in self.bufs:
            set_enabled(b)
        self.writers = [TwinKernelWriter(b, clock_ns=lambda: self.now) for b in self.bufs]
        self.trackers = [
            FrameTracker(RankBinding("job", r, r, ranks, ranks, f"h{r}"), detail=detail) for r in range(ranks)
        ]
        self.poll_ns = poll_ns
        self.next_poll = [T0 + (phases_ns[r] if r < len(phases_ns) else 0) for r in range(ranks)]
        self.out: list[list[tuple[int, KernelRecord]]] = [[] for _ in range(ranks)]  # (poll time, record)
        self.entries: list[tuple[int, int]] = []  # (op_seq, begin) of every op

    def advance(self, t: int) -> None:
        """Run every poll due up to ``t`` in time order, then stand at ``t``."""
        while True:
            r = int(np.argmin(self.next_poll))
            if self.next_poll[r] > t:
                break
            self.now = self.next_poll[r]
            snap = frame.read_consistent(self.bufs[r])
            assert snap is not None
            self.out[r].extend((self.now, x) for x in self.trackers[r].update(snap, self.now))
            self.next_poll[r] += self.poll_ns
        self.now = t

    def op(self, seq: int, begin: int, dur: int) -> None:
        """One all-reduce on every rank: channel 0 receives ``n`` ahead of forwarding (peak n),
        channel 1 sends first (peak 0)."""
        self.advance(begin)
        self.entries.append((seq, begin))
        n = seq % 5 + 1
        for w in self.writers:
            w.begin(_trace(seq), 2)
            w.count_recv(0, n)
            w.count_send(0, n)
            w.count_send(1, n)
            w.count_recv(1, n)
        self.advance(begin + dur)
        for w in self.writers:
            w.end()

    def run(self, rate_hz: float, seconds: float, duty: float = 0.4, jitter: float = 0.0, seed: int = 0) -> int:
        """Ops at ``rate_hz`` for ``seconds``, each busy ``duty`` of its period; returns how many.
        Every rank polls its empty frame first, so all see the job from op 0."""
        rng = np.random.default_rng(seed)
        period = int(S / rate_hz)
        n = int(seconds * rate_hz)
        start = max(self.next_poll) + 1 + int(jitter * period)
        for seq in range(n):
            shift = int(jitter * period * rng.uniform(-1, 1)) if jitter else 0
            self.op(seq, start + seq * period + shift, max(1, int(period * duty)))
        self.advance(T0 + int(seconds * S) + S)
        return n

    def records(self, rank: int = 0) -> list[KernelRecord]:
        return [x for _, x in self.out[rank]]

    def done_seqs(self, rank: int = 0) -> list[int]:
        return [x.op_seq for x in self.records(rank) if x.status is Status.DONE]

    def per_interval(self, rank: int = 0) -> Counter[int]:
        """Records per 1-s interval of the job (by the poll that produced them)."""
        return Counter((t - T0) // S for t, _ in self.out[rank])


def test_records_per_interval_do_not_grow_with_the_collective_rate() -> None:
    # one DONE per kernel made this 1 record per collective (8 per poll once kernels scroll out)
    mean: dict[tuple[int, int], float] = {}
    for rate in (200, 1000, 4000):
        for poll_ms in (1, 100):
            job = Job(poll_ns=poll_ms * MS + 12_345)  # the odd part: polls do not alias with the ops
            ops = job.run(rate, 5.0, jitter=0.3)
            counts = job.per_interval()
            steady = [counts.get(i, 0) for i in range(1, 5)]
            # per interval and communicator: 1 state + 1 look (ENTERED + PROGRESS) + the details,
            # about 8 (10 at most) on average: which ops the hash picks varies from second to second
            assert max(steady) <= 18, (rate, poll_ms, counts)
            assert counts.get(0, 0) <= 50, (rate, poll_ms, counts)  # the first second: K rising (1 -> 8 -> 64 -> 512)
            assert sum(counts.values()) < ops / 10 or rate == 200, (rate, poll_ms, counts)
            mean[rate, poll_ms] = sum(steady) / len(steady)
            t = job.trackers[0]
            assert t.details + t.unsampled + t.missed == ops
    assert max(mean.values()) <= 13, mean
    # not bounded by sending nothing: polls fast enough to see every kernel get the details
    assert min(mean[rate, 1] for rate in (200, 1000, 4000)) >= 6, mean
    # and twenty times the collective rate costs no more records
    assert mean[4000, 1] <= mean[200, 1] + 4 and mean[4000, 100] <= mean[200, 100] + 4, mean


def test_done_only_for_sampled_ops_with_their_counters_and_peaks() -> None:
    job = Job(poll_ns=2 * MS)  # about 2 kernels per poll: no kernel scrolls out unseen
    ops = job.run(1000, 3.0)
    t = job.trackers[0]
    assert t.missed == 0 and t.details + t.unsampled == ops
    done = [x for x in job.records() if x.status is Status.DONE]
    k = t.strides()[COMM]
    assert k == 128  # detail_one_in of 1,000 ops/s, as the attachment decides
    late = [x for x in done if x.op_seq >= 1024]  # after the first windows
    assert late and all(op_sampled(COMM, x.op_seq, k) for x in late)
    assert bool(detail_sampled(COMM, [x.op_seq for x in late], k).all())
    assert {x.op_seq for x in late} == {s for s in range(1024, ops) if op_sampled(COMM, s, k)}
    for x in done:
        n = x.op_seq % 5 + 1
        assert x.send_counts == (n, n) and x.recv_counts == (n, n), x
        assert x.peak_lag == (n, 0), x
        if x.t_enter_ns >= 0:
            assert x.t_exit_ns - x.t_enter_ns == 400_000
    # a kernel seen inside or as the latest one has its times, and t_prev_exit_ns is the end of an
    # earlier kernel a poll saw (its predecessor's, 0.6 ms before, when a poll saw that one end)
    timed = [x for x in done if x.t_enter_ns >= 0 and x.op_seq >= 2]
    gaps = [x.t_enter_ns - getattr(x, "t_prev_exit_ns", -1) for x in timed]
    assert timed and all(g > 0 and g % MS == 600_000 for g in gaps), gaps


def test_the_probe_details_the_ops_the_attachment_details() -> None:
    """Same rule, same stride decision at the same ops: fed the same ops, the GPU poller and the
    PyTorch attachment's tracker send the DONE records of the same op sequence numbers."""
    job = Job(poll_ns=3 * MS)
    job.run(700, 4.0)
    assert job.trackers[0].missed == 0
    sink = ListSink()
    tr = Tracker(sink=sink, identity=Identity("job", 0, 0, 1, "h0"))
    for seq, begin in job.entries:
        call = tr.enter(COMM, seq, OpType.ALL_REDUCE, DType.BFLOAT16, 1, -1, 0, 1, t_ns=begin)
        tr.exit(call, begin + 1)
        if seq % 16 == 15:
            tr.pump(begin + 2)
    tr.pump(job.entries[-1][1] + 2)
    attach_done = [r.op_seq for r in sink.records if r.status is Status.DONE]
    assert len(attach_done) > 20
    assert job.done_seqs() == attach_done
    assert job.trackers[0].strides() == tr.strides()


def test_two_ranks_of_a_communicator_detail_exactly_the_same_ops() -> None:
    # polls out of phase, ops jittered: each rank estimates the entry times at its own polls
    job = Job(ranks=2, poll_ns=4 * MS, phases_ns=(0, 1_700_000))
    ops = job.run(900, 5.0, jitter=0.2, seed=3)
    assert all(t.missed == 0 for t in job.trackers)
    a, b = job.done_seqs(0), job.done_seqs(1)
    assert a == b
    assert 20 < len(a) < ops / 20
    assert job.trackers[0].strides() == job.trackers[1].strides() == {COMM: 128}


def test_a_hung_kernel_yields_entered_and_progress_heartbeats() -> None:
    job = Job(poll_ns=100 * MS)
    job.run(50, 1.0)  # some healthy ops first
    job.out[0].clear()
    seq = 50
    start = job.now + MS
    job.advance(start)
    w = job.writers[0]
    w.begin(_trace(seq), 2)
    w.count_send(0, 3)
    w.count_recv(1, 2)  # then it stops moving
    job.advance(start + int(3.5 * S))
    recs = job.records()
    assert [x.status for x in recs[:2]] == [Status.ENTERED, Status.PROGRESS]
    entered = recs[0]
    assert (entered.op_seq, entered.t_enter_ns, entered.t_sample_ns) == (seq, start, start)
    assert entered.send_counts == (0, 0)
    prog = [x for x in recs if x.status is Status.PROGRESS]
    assert all(x.op_seq == seq and x.send_counts == (3, 0) and x.recv_counts == (0, 2) for x in prog)
    assert all(x.status in (Status.ENTERED, Status.PROGRESS) for x in recs)  # no DONE, no IDLE
    samples = [x.t_sample_ns for x in prog]
    assert len(prog) == 4 and samples == sorted(set(samples))  # the look, then one state per interval
    assert samples[-1] - samples[0] >= 3 * S - 100 * MS
    w.end()
    job.advance(job.now + 100 * MS)
    assert [x.status for x in job.records()][-1] is Status.DONE  # stride 1 at 50 ops/s: every op


def test_an_idle_communicator_sends_one_idle_state_per_interval() -> None:
    job = Job(poll_ns=100 * MS)
    job.run(20, 1.0)  # 20 ops, the last at about T0 + 0.95 s
    job.out[0].clear()
    job.advance(job.now + 3 * S)
    recs = job.records()
    assert [x.status for x in recs] == [Status.IDLE] * 3
    assert all(x.op_seq == 19 and x.t_exit_ns - x.t_enter_ns == 20_000_000 for x in recs)
    assert all(x.send_counts == (5, 5) for x in recs)  # op 19: n = 19 % 5 + 1


def _poller_job(detail: str, batch: bool = False) -> tuple[ProbePoller, list[KernelRecord], list[KernelBatch], int]:
    now = [T0]
    buf = frame_bytes(alloc_frames(1), 0)
    set_enabled(buf)
    w = TwinKernelWriter(buf, clock_ns=lambda: now[0])
    out: list[KernelRecord] = []
    batches: list[KernelBatch] = []
    poller = ProbePoller([FrameSource(buf, RankBinding("job", 0, 0, 1, 1, "h0"))], out.append, clock_ns=lambda: now[0],
                         detail=detail, batch_sink=batches.append if batch else None)  # fmt: skip
    ops = 2000
    poller.poll_once()  # sees the frame empty: every kernel from here on is reported
    for seq in range(ops):  # 1,000 ops/s, a poll every 4 ms
        now[0] = T0 + seq * MS
        w.begin(_trace(seq), 1)
        w.count_send(0, 1)
        now[0] += 300_000
        w.end()
        if seq % 4 == 3:
            poller.poll_once()
    poller.stop()
    return poller, out, batches, ops


def test_detail_all_is_the_per_kernel_escape_hatch() -> None:
    poller, out, _, ops = _poller_job("all")
    done = [x.op_seq for x in out if x.status is Status.DONE]
    assert done == list(range(ops)) and poller.stats["details"] == ops and poller.stats["unsampled"] == 0
    poller, out, _, ops = _poller_job("sampled")
    done = [x.op_seq for x in out if x.status is Status.DONE]
    assert poller.stats["details"] == len(done) < 60 and poller.stats["unsampled"] == ops - len(done)
    assert poller.stats["records"] == len(out) < 80


def test_batch_sink_gets_one_batch_per_communicator_with_t_prev_exit() -> None:
    poller, out, batches, _ = _poller_job("sampled", batch=True)
    assert out == [] and batches and poller.stats["records"] == sum(b.n for b in batches)
    assert all(b.comm_hash == COMM for b in batches)
    cols = KernelBatch.concat(batches)
    done = cols.col("status") == int(Status.DONE)
    prev, enter = cols.col("t_prev_exit_ns")[done], cols.col("t_enter_ns")[done]
    known = (enter >= 0) & (cols.col("op_seq")[done] >= 8)  # the first poll saw no earlier end
    assert known.any() and bool(((prev >= 0) & (prev < enter))[known].all())
