"""Hangs on hand-built records: H1 (and its victims), H2 (the differing field), H3 (the link)."""

from __future__ import annotations

import pytest
from analysis_factories import Comm, Probe, batches_by_tick, healthy_steps

from ccld.records import AnomalyKind, DType, KernelRecord, Link, OpType, Status, VerdictState
from ccld.settings import AnalyzerSettings
from ccld.streams.analysis.analyzer import Analyzer
from ccld.streams.analysis.replay import analyze_batches


def stuck(probe: Probe, comm: Comm, i: int, seq: int, t_enter: float, until: float, send: int = 0,
          recv: int = 0, every: float = 1.0, **kw: object) -> list[tuple[float, KernelRecord]]:
    """A rank that entered op ``seq`` and keeps sending heartbeats with frozen counters."""
    out = [(t_enter, probe.rec(comm, i, seq, Status.ENTERED, t_enter, t_enter, **kw))]
    t = t_enter + every
    while t < until:
        out.append((t, probe.rec(comm, i, seq, Status.PROGRESS, t_enter, t, send=send, recv=recv, **kw)))
        t += every
    return out


def test_h1_names_the_rank_that_never_entered() -> None:
    probe = Probe()
    tp = Comm(0xA1, (0, 1, 2, 3))
    recs = healthy_steps(probe, tp, 20)
    k = tp.seq
    for i in (0, 1, 3):
        recs += stuck(probe, tp, i, k, 41.0 + 0.01 * i, 100.0)
    verdicts = analyze_batches(batches_by_tick(recs))
    opens = [v for v in verdicts if v.state == VerdictState.OPEN]
    assert len(opens) == 1
    v = opens[0]
    assert v.kind == AnomalyKind.H1
    assert v.root_cause_ranks == (2,)
    assert set(v.affected_ranks) == {0, 1, 3}
    assert v.op_seq == k and v.op_type == "all_reduce"
    assert v.root_cause_hosts == ("host-0",)
    assert "rank 2 never entered" in v.evidence
    # the default minimum hang time holds, and the verdict comes soon after it
    assert 20.0 <= v.detected_time - 41.1 <= 25.0


def test_h1_victims_in_other_communicators_are_not_blamed() -> None:
    """A waits in X for B, B waits in Y for C, C is in no collective: C is the root cause."""
    probe = Probe()
    x = Comm(0xB1, (0, 1))  # rank 0 (A) waits here for rank 1 (B)
    y = Comm(0xB2, (1, 2))  # rank 1 (B) waits here for rank 2 (C)
    recs = healthy_steps(probe, x, 15) + healthy_steps(probe, y, 15, t0=0.5)
    recs += stuck(probe, y, 0, y.seq, 32.0, 90.0)  # B inside Y
    recs += stuck(probe, x, 0, x.seq, 31.0, 90.0)  # A inside X, B never comes
    verdicts = analyze_batches(batches_by_tick(recs))
    opens = [v for v in verdicts if v.state == VerdictState.OPEN]
    assert [(v.kind, v.root_cause_ranks) for v in opens] == [(AnomalyKind.H1, (2,))]
    assert set(opens[0].affected_ranks) == {0, 1}


@pytest.mark.parametrize(
    ("change", "field"),
    [({"dtype": DType.FLOAT32}, "dtype"), ({"count": 1 << 19}, "count"), ({"op_type": OpType.ALL_GATHER}, "op_type")],
)
def test_h2_names_the_minority_rank_and_the_field(change: dict[str, object], field: str) -> None:
    probe = Probe()
    tp = Comm(0xC1, (0, 1, 2, 3))
    recs = healthy_steps(probe, tp, 20)
    k = tp.seq
    for i in range(4):
        recs += stuck(probe, tp, i, k, 41.0 + 0.01 * i, 80.0, **(change if i == 2 else {}))
    opens = [v for v in analyze_batches(batches_by_tick(recs)) if v.state == VerdictState.OPEN]
    assert len(opens) == 1
    assert opens[0].kind == AnomalyKind.H2
    assert opens[0].root_cause_ranks == (2,)
    assert opens[0].mismatch_field == field


def test_h2_order_when_the_rank_runs_a_known_op_early() -> None:
    probe = Probe()
    dp = Comm(0xC2, (0, 1, 2, 3))
    recs: list[tuple[float, KernelRecord]] = []
    for k in range(15):  # each step: reduce_scatter then all_gather
        base = 1.0 + 2.0 * k
        recs += probe.ring_op(dp, [base + 0.01 * i for i in range(4)], 0.1, op_type=OpType.REDUCE_SCATTER)
        recs += probe.ring_op(dp, [base + 0.2 + 0.01 * i for i in range(4)], 0.1, op_type=OpType.ALL_GATHER)
    k = dp.seq
    for i in range(4):
        op = OpType.ALL_GATHER if i == 1 else OpType.REDUCE_SCATTER
        recs += stuck(probe, dp, i, k, 31.0 + 0.01 * i, 70.0, op_type=op)
    opens = [v for v in analyze_batches(batches_by_tick(recs)) if v.state == VerdictState.OPEN]
    assert [(v.kind, v.root_cause_ranks, v.mismatch_field) for v in opens] == [(AnomalyKind.H2, (1,), "order")]


def test_h3_finds_the_link_and_channel_where_the_counter_chain_breaks() -> None:
    probe = Probe(channels=4)
    tp = Comm(0xD1, tuple(range(8)))
    recs = healthy_steps(probe, tp, 20)
    k = tp.seq
    for i in range(8):
        # behind a dead link 5 -> 6: rank 5 received 8 slots more than it could send, rank 6 lags 8
        s = 20 if i == 5 else 28
        r = 20 if i == 6 else 28
        recs += stuck(probe, tp, i, k, 41.0 + 0.01 * i, 90.0, send=s, recv=r)
    opens = [v for v in analyze_batches(batches_by_tick(recs)) if v.state == VerdictState.OPEN]
    assert len(opens) == 1
    v = opens[0]
    assert v.kind == AnomalyKind.H3
    assert v.link == Link(5, 6)
    assert 5 in v.root_cause_ranks
    assert v.channel is not None and 0 <= v.channel < 4


def test_h3_resolves_when_progress_resumes() -> None:
    probe = Probe()
    tp = Comm(0xD2, (0, 1, 2, 3))
    recs = healthy_steps(probe, tp, 10)
    k = tp.seq
    for i in range(4):
        recs += stuck(probe, tp, i, k, 21.0 + 0.01 * i, 60.0, send=10 if i == 1 else 18, recv=10 if i == 2 else 18)
    recs += [(60.5, probe.rec(tp, i, k, Status.DONE, 21.0 + 0.01 * i, 60.5, 60.5, send=64, recv=64)) for i in range(4)]
    # the clock runs on past incident_reopen_s (60 s): it resolves once the fault has stayed away that long
    verdicts = analyze_batches(batches_by_tick(recs), then=[120.0, 121.5])
    states = [v.state for v in verdicts]
    assert states == [VerdictState.OPEN, VerdictState.RESOLVED]
    assert len({v.incident_id for v in verdicts}) == 1
    assert verdicts[1].detected_time >= 60.5 + 60.0


def test_hang_thresholds_are_configurable() -> None:
    probe = Probe()
    tp = Comm(0xE1, (0, 1, 2, 3))
    recs = healthy_steps(probe, tp, 20)
    for i in (0, 1, 3):
        recs += stuck(probe, tp, i, tp.seq, 41.0, 100.0)
    fast = analyze_batches(batches_by_tick(recs), AnalyzerSettings(hang_min_s=5.0))
    slow = analyze_batches(batches_by_tick(recs), AnalyzerSettings(hang_min_s=40.0))
    assert fast[0].detected_time < slow[0].detected_time - 30


def test_stats_count_batches_and_records() -> None:
    probe = Probe()
    tp = Comm(0xE2, (0, 1, 2, 3))
    batches = batches_by_tick(healthy_steps(probe, tp, 5))
    a = Analyzer()
    for t, b in batches:
        a.ingest(b, t)
    a.evaluate(20.0)
    assert a.stats["batches"] == len(batches)
    assert a.stats["records"] == sum(b.n for _, b in batches)
    assert a.stats["ops_completed"] == 5


def test_h1_names_a_rank_never_seen_in_the_communicator() -> None:
    """A rank dies before its first barrier: it never reported there, yet it is named."""
    probe = Probe()
    tp = Comm(0xE3, tuple(range(8)))
    world = Comm(0xE4, tuple(range(8)))
    recs = healthy_steps(probe, tp, 20)
    for i in range(8):
        if i != 6:
            recs += stuck(probe, world, i, 0, 41.0, 120.0, op_type=OpType.BARRIER)
    opens = [v for v in analyze_batches(batches_by_tick(recs)) if v.state == VerdictState.OPEN]
    assert [(v.kind, v.root_cause_ranks, v.op_type) for v in opens] == [(AnomalyKind.H1, (6,), "barrier")]
    # checkpoints wait at barriers: the barrier minimum applies, not the plain one
    assert opens[0].detected_time - 41.0 >= AnalyzerSettings().barrier_hang_min_s


def test_bad_settings_are_rejected() -> None:
    from ccld.errors import ConfigError

    with pytest.raises(ConfigError):
        AnalyzerSettings(slow_min_ops=6, slow_window_ops=5)
    with pytest.raises(ConfigError):
        AnalyzerSettings(hang_min_s=-1.0)
