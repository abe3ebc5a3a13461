"""Slowdowns on hand-built records: S1 late arriver, S2 bottleneck link, S3 both; the ratio P."""

from __future__ import annotations

from analysis_factories import Comm, Probe, batches_by_tick, healthy_steps

from ccld.records import AnomalyKind, Link, VerdictState
from ccld.streams.analysis import AnalyzerSettings, analyze_batches


def opens(recs: list, settings: AnalyzerSettings | None = None) -> list:  # type: ignore[type-arg]
    return [v for v in analyze_batches(batches_by_tick(recs), settings) if v.state == VerdictState.OPEN]


def test_s1_blames_the_late_arriver() -> None:
    probe = Probe()
    tp = Comm(0x51, tuple(range(8)))
    recs = healthy_steps(probe, tp, 40, late={6: 1.2}, from_step=20)
    vs = opens(recs)
    assert len(vs) == 1
    v = vs[0]
    assert v.kind == AnomalyKind.S1 and v.root_cause_ranks == (6,)
    assert v.p is not None and v.p >= 0.6
    assert 6 not in v.affected_ranks and len(v.affected_ranks) == 7
    assert v.detected_time - 41.0 <= 30.0  # onset is step 20 at t = 41 s


def test_s2_blames_the_link_where_backlog_builds() -> None:
    probe = Probe()
    tp = Comm(0x52, tuple(range(8)))
    recs = healthy_steps(probe, tp, 40, slow=5.0, lag_rank=3, from_step=20)
    vs = opens(recs)
    assert len(vs) == 1
    v = vs[0]
    assert v.kind == AnomalyKind.S2
    assert v.link == Link(3, 4)
    assert 3 in v.root_cause_ranks
    assert v.p is not None and v.p <= 0.4


def test_s3_when_late_arrival_and_slow_link_combine() -> None:
    probe = Probe()
    tp = Comm(0x53, tuple(range(8)))
    recs = healthy_steps(probe, tp, 40, slow=4.0, late={3: 0.6}, lag_rank=3, from_step=20)
    vs = opens(recs)
    assert [(v.kind, v.root_cause_ranks[0]) for v in vs] == [(AnomalyKind.S3, 3)]
    assert vs[0].p is not None and 0.4 < vs[0].p < 0.6


def test_a_transient_blip_never_alerts() -> None:
    probe = Probe()
    tp = Comm(0x54, tuple(range(8)))
    recs = healthy_steps(probe, tp, 20)
    recs += healthy_steps(probe, tp, 1, t0=40.0, late={2: 3.0})  # one dataloader hiccup
    recs += healthy_steps(probe, tp, 20, t0=42.0)
    assert opens(recs) == []


def test_two_slow_ops_are_not_enough_by_default_but_the_count_is_configurable() -> None:
    probe = Probe()
    tp = Comm(0x55, tuple(range(8)))
    recs = healthy_steps(probe, tp, 20)
    recs += healthy_steps(probe, tp, 2, t0=40.0, late={2: 1.0})
    recs += healthy_steps(probe, tp, 20, t0=44.0)
    assert opens(recs) == []
    assert [v.root_cause_ranks for v in opens(recs, AnalyzerSettings(slow_min_ops=2))] == [(2,)]


def test_slow_incident_resolves_when_ops_return_to_baseline() -> None:
    probe = Probe()
    tp = Comm(0x56, tuple(range(4)))
    recs = healthy_steps(probe, tp, 20)
    recs += healthy_steps(probe, tp, 10, t0=40.0, late={1: 1.0})
    recs += healthy_steps(probe, tp, 15, t0=60.0)
    vs = analyze_batches(batches_by_tick(recs))
    assert [v.state for v in vs] == [VerdictState.OPEN, VerdictState.RESOLVED]
    assert vs[0].incident_id == vs[1].incident_id


def test_a_victim_that_waited_elsewhere_is_not_blamed() -> None:
    """Rank 1 is slow to compute; rank 0 waits for it in X, then arrives late in Y: only 1 is blamed."""
    probe = Probe()
    x = Comm(0x57, (0, 1))
    y = Comm(0x58, (0, 2))
    recs = []
    for k in range(40):
        base = 1.0 + 2.0 * k
        slow = k >= 20
        ex = [base, base + (0.8 if slow else 0.01)]
        recs += probe.ring_op(x, ex, 0.1)
        done_x = max(ex) + 0.1
        ey = [done_x + 0.05, base + 0.2 + 0.02]
        recs += probe.ring_op(y, ey, 0.1)
    vs = opens(recs)
    assert [(v.kind, v.root_cause_ranks) for v in vs] == [(AnomalyKind.S1, (1,))]
