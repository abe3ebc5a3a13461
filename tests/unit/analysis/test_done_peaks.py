"""The kernels' own peak backlog on DONE records (probe v2): a us-scale op that no poll caught in
flight still names its slow link, and the healthy peaks every ring rank has (it receives a step or
two ahead of forwarding) never name one nor change a verdict."""

from __future__ import annotations

import dataclasses

import numpy as np
from analysis_factories import Comm, Probe, batches_by_tick, healthy_steps

from ccld.records import AnomalyKind, KernelRecord, Link, Status, VerdictState
from ccld.settings import AnalyzerSettings
from ccld.streams.analysis.replay import analyze_batches

US_OP = 100e-6  # far shorter than the 100-ms poll: no PROGRESS sample ever lands inside
#: the probe reports one all-reduce in 1,000 (one a 2-s step): called every 2 ms, a link that makes it 4x
#: slower costs the job 15 % of its time (slow_min_cost_share)
STRIDE = 1000


def with_peaks(recs: list[tuple[float, KernelRecord]], seed: int, source: int | None = None,
               from_seq: int = 0, depth: int = 8) -> list[tuple[float, KernelRecord]]:
    """Give every DONE healthy peaks (0..2 per channel); from op ``from_seq`` on, comm rank ``source``
    (a slow link's source) reaches the in-flight ``depth`` less 0..2."""
    rng = np.random.default_rng(seed)
    out = []
    for t, r in recs:
        if r.status == Status.DONE:
            ch = len(r.send_counts)
            pk = rng.integers(0, 3, ch)
            if source is not None and r.comm_rank == source and r.op_seq >= from_seq:
                pk = np.maximum(pk, depth - rng.integers(0, 3, ch))
            r = dataclasses.replace(r, peak_lag=tuple(int(x) for x in pk))
        out.append((t, r))
    return out


def verdicts(recs: list[tuple[float, KernelRecord]], settings: AnalyzerSettings | None = None) -> list:  # type: ignore[type-arg]
    return [v for v in analyze_batches(batches_by_tick(recs), settings) if v.state != VerdictState.RESOLVED]


def _slow_link_job(seed: int, source: int | None) -> list[tuple[float, KernelRecord]]:
    probe = Probe(channels=4)
    tp = Comm(0x7A, tuple(range(8)), stride=STRIDE)
    recs = healthy_steps(probe, tp, 40, dur=US_OP, slow=4.0, from_step=20)  # no lag_rank: no PROGRESS sample
    assert not any(r.status == Status.PROGRESS for _, r in recs)
    return with_peaks(recs, seed, source=source, from_seq=20 * STRIDE)


def test_done_peaks_name_the_slow_link_of_a_us_scale_op() -> None:
    vs = verdicts(_slow_link_job(1, source=3))
    assert [(v.kind, v.link) for v in vs] == [(AnomalyKind.S2, Link(3, 4))]
    v = vs[0]
    assert 3 in v.root_cause_ranks and "no counter poll caught" not in v.evidence
    # named as soon as the slow window is confirmed, not after waiting slow_link_wait_s for a sample
    assert v.detected_time - 41.0 < AnalyzerSettings().slow_link_wait_s


def test_healthy_peaks_never_name_a_link() -> None:
    """Same slow ops, but no rank's peak stands out: comm-slow with the link unknown, as before."""
    vs = verdicts(_slow_link_job(2, source=None))
    assert [(v.kind, v.root_cause_ranks, v.link) for v in vs] == [(AnomalyKind.S2, (), None)]
    assert "no counter poll caught" in vs[0].evidence


def test_healthy_peaks_alone_raise_nothing() -> None:
    probe = Probe(channels=8)
    tp = Comm(0x7B, tuple(range(8)))
    recs = with_peaks(healthy_steps(probe, tp, 60, dur=US_OP), 3)
    assert verdicts(recs) == []


def test_healthy_peaks_do_not_change_a_late_arriver_verdict() -> None:
    probe = Probe(channels=4)
    tp = Comm(0x7C, tuple(range(8)))
    recs = healthy_steps(probe, tp, 40, dur=US_OP, late={6: 0.5}, from_step=20)
    plain = [(v.kind, v.root_cause_ranks, v.link) for v in verdicts(recs)]
    noisy = [(v.kind, v.root_cause_ranks, v.link) for v in verdicts(with_peaks(recs, 4))]
    assert plain == noisy == [(AnomalyKind.S1, (6,), None)]


def test_peaks_count_only_after_the_healthy_level_is_learned_and_thresholds_are_settings() -> None:
    recs = _slow_link_job(5, source=3)
    # a communicator that has not learned its healthy peak level yet trusts no peak
    vs = verdicts(recs, AnalyzerSettings(peak_learn_rows=10_000))
    assert [(v.kind, v.link) for v in vs] == [(AnomalyKind.S2, None)]
    # a margin above the in-flight depth: the source's peaks no longer stand out
    vs = verdicts(recs, AnalyzerSettings(peak_margin=9.0))
    assert [(v.kind, v.link) for v in vs] == [(AnomalyKind.S2, None)]


def test_rows_without_a_known_peak_change_nothing() -> None:
    """Older probes and sources without per-kernel peaks (-1) keep the previous behaviour."""
    probe = Probe(channels=4)
    tp = Comm(0x7D, tuple(range(8)), stride=STRIDE)
    recs = healthy_steps(probe, tp, 40, dur=US_OP, slow=4.0, from_step=20)
    unknown = [(t, dataclasses.replace(r, peak_lag=(-1,) * 4) if r.status == Status.DONE else r) for t, r in recs]
    a = [(v.kind, v.link, v.evidence) for v in verdicts(recs)]
    b = [(v.kind, v.link, v.evidence) for v in verdicts(unknown)]
    assert a == b and [k for k, _, _ in a] == [AnomalyKind.S2]


def test_peaks_of_ops_that_do_not_forward_are_ignored() -> None:
    """A pipeline RECV receives everything and forwards nothing: its peak is its whole transfer on
    every healthy op and says nothing about a link."""
    from ccld.records import OpType

    probe = Probe(channels=2)
    pp = Comm(0x7E, (0, 1))
    recs = healthy_steps(probe, pp, 40, dur=US_OP)
    recv = [(t, dataclasses.replace(r, op_type=OpType.RECV, peak_lag=(64, 64) if r.comm_rank == 1 else (0, 0))
             if r.status == Status.DONE else r) for t, r in recs]
    assert verdicts(recv) == []
    # slowed from step 20 on, with the receiver's peak growing too: still no link named from it
    slow = healthy_steps(probe, Comm(0x7F, (0, 1), stride=STRIDE), 40, dur=US_OP, slow=4.0, from_step=20)
    slow = [(t, dataclasses.replace(r, op_type=OpType.RECV, peak_lag=(64 if r.op_seq < 20 * STRIDE else 200,) * 2
                                    if r.comm_rank == 1 else (0, 0)) if r.status == Status.DONE else r)
            for t, r in slow]
    assert [(v.kind, v.link) for v in verdicts(slow)] == [(AnomalyKind.S2, None)]
