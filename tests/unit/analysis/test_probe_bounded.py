"""The analyzer on what the GPU poller sends (the bounded format from twin frames): a healthy job at
200 collectives/s gives no verdict, and a rank that never enters the next op is named (H1)."""

from __future__ import annotations

from analysis_factories import batches_by_tick

from ccld.probe import frame
from ccld.probe.frame_tracker import FrameTracker, RankBinding
from ccld.probe.twin import TwinKernelWriter, alloc_frames, frame_bytes, set_enabled
from ccld.records import AnomalyKind, DType, KernelRecord, OpType, Status, TraceId, VerdictState
from ccld.streams.analysis.replay import analyze_batches

S = 1_000_000_000
MS = 1_000_000
T0 = 80 * S  # the ranks' GPU clock at analyzer time 0
COMM = 0x0DDC_0FFE_E000_0001
RANKS = 4


def _run(culprit: int | None, healthy_s: float = 12.0, hang_s: float = 45.0) -> list[tuple[float, KernelRecord]]:
    """Ring all-reduces at 200/s on every rank (polled every 100 ms, ranks out of phase); then,
    with a culprit, every other rank enters the next op and waits inside it for ``hang_s``."""
    now = [T0]
    frames = alloc_frames(RANKS)
    bufs = [frame_bytes(frames, r) for r in range(RANKS)]
    for b in bufs:
        set_enabled(b)
    writers = [TwinKernelWriter(b, clock_ns=lambda: now[0]) for b in bufs]
    trackers = [FrameTracker(RankBinding("job", r, r, RANKS, RANKS, f"host-{r}")) for r in range(RANKS)]
    next_poll = [T0 + r * 23 * MS for r in range(RANKS)]
    out: list[tuple[float, KernelRecord]] = []

    def advance(t: int) -> None:
        while min(next_poll) <= t:
            r = next_poll.index(min(next_poll))
            now[0] = next_poll[r]
            snap = frame.read_consistent(bufs[r])
            assert snap is not None
            out.extend(((now[0] - T0) / S, x) for x in trackers[r].update(snap, now[0]))
            next_poll[r] += 100 * MS
        now[0] = t

    period = 5 * MS
    start = T0 + 100 * MS
    n = int(healthy_s * 200)
    for seq in range(n):
        advance(start + seq * period)
        trace = TraceId(COMM, seq, OpType.ALL_REDUCE, DType.BFLOAT16)
        for w in writers:
            w.begin(trace, 2)
            for ch in (0, 1):
                w.count_send(ch, 4)
                w.count_recv(ch, 4)
        advance(start + seq * period + 2 * MS)
        for w in writers:
            w.end()
    t_hang = start + n * period
    advance(t_hang)
    if culprit is not None:
        for r, w in enumerate(writers):
            if r != culprit:
                w.begin(TraceId(COMM, n, OpType.ALL_REDUCE, DType.BFLOAT16), 2)
                w.count_send(0, 1)  # its first chunk goes out; nothing comes back from the culprit
    advance(t_hang + int(hang_s * S))
    return out


def test_a_healthy_job_on_the_probe_gives_no_verdict() -> None:
    recs = _run(None, hang_s=30.0)
    per_s = len(recs) / RANKS / 42.0
    assert per_s < 12  # the bounded format: not 200 records per rank-second
    assert any(r.status is Status.IDLE for _, r in recs)
    assert analyze_batches(batches_by_tick(recs)) == []


def test_h1_on_the_probe_names_the_rank_that_never_entered() -> None:
    recs = _run(culprit=2)
    assert {r.status for _, r in recs if r.op_seq == 2400} >= {Status.ENTERED, Status.PROGRESS}
    opens = [v for v in analyze_batches(batches_by_tick(recs)) if v.state == VerdictState.OPEN]
    assert [(v.kind, v.root_cause_ranks) for v in opens] == [(AnomalyKind.H1, (2,))]
    assert set(opens[0].affected_ranks) == {0, 1, 3} and opens[0].op_seq == 2400
