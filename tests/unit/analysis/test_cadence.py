"""The learned cadence (op sequence -> signature pattern) names the H2 culprit without a majority."""

from __future__ import annotations

import json

import numpy as np
import pytest
from analysis_factories import Comm, Probe, batches_by_tick

from ccld.records import AnomalyKind, DType, KernelRecord, OpType, Status, VerdictState
from ccld.streams.analysis.analyzer import Analyzer
from ccld.streams.analysis.cadence import Cadence
from ccld.streams.analysis.replay import analyze_batches

RS, AG = OpType.REDUCE_SCATTER, OpType.ALL_GATHER


def stuck(probe: Probe, comm: Comm, i: int, seq: int, t_enter: float, until: float,
          **kw: object) -> list[tuple[float, KernelRecord]]:
    """A rank that entered op ``seq`` and keeps sending heartbeats with frozen counters."""
    out = [(t_enter, probe.rec(comm, i, seq, Status.ENTERED, t_enter, t_enter, **kw))]
    t = t_enter + 1.0
    while t < until:
        out.append((t, probe.rec(comm, i, seq, Status.PROGRESS, t_enter, t, **kw)))
        t += 1.0
    return out


def dp_steps(probe: Probe, dp: Comm, steps: int, t0: float = 0.0) -> list[tuple[float, KernelRecord]]:
    """``steps`` training steps of a data-parallel group: reduce_scatter then all_gather."""
    recs: list[tuple[float, KernelRecord]] = []
    for k in range(steps):
        base = t0 + 1.0 + 2.0 * k
        recs += probe.ring_op(dp, [base + 0.01 * i for i in range(dp.size)], 0.1, op_type=RS)
        recs += probe.ring_op(dp, [base + 0.2 + 0.01 * i for i in range(dp.size)], 0.1, op_type=AG)
    return recs


def wrong_order(probe: Probe, dp: Comm, culprit: int, t: float, until: float) -> list[tuple[float, KernelRecord]]:
    """Every rank enters the next op; ``culprit`` calls the step's other collective instead."""
    k = dp.seq
    want = RS if k % 2 == 0 else AG
    other = AG if want == RS else RS
    recs: list[tuple[float, KernelRecord]] = []
    for i in range(dp.size):
        recs += stuck(probe, dp, i, k, t + 0.01 * i, until, op_type=other if i == culprit else want)
    return recs


# both culprits and both phases of the step: a tie broken by anything but the cadence fails one
CASES = [(c, extra) for c in (0, 1) for extra in (False, True)]


@pytest.mark.parametrize(("culprit", "mid_step"), CASES)
def test_two_rank_order_mismatch_blames_the_rank_off_the_cadence(culprit: int, mid_step: bool) -> None:
    probe = Probe()
    dp = Comm(0xE1, (5, 9))  # a data-parallel group of two ranks: no majority possible
    recs = dp_steps(probe, dp, 15)
    t = 31.0
    if mid_step:  # the stall hits the step's second op (all_gather expected)
        recs += probe.ring_op(dp, [t, t + 0.01], 0.1, op_type=RS)
        t += 0.3
    recs += wrong_order(probe, dp, culprit, t, t + 40.0)
    opens = [v for v in analyze_batches(batches_by_tick(recs)) if v.state == VerdictState.OPEN]
    assert [(v.kind, v.root_cause_ranks, v.mismatch_field) for v in opens] == [
        (AnomalyKind.H2, (dp.ranks[culprit],), "order")
    ]
    want = "all_gather" if mid_step else "reduce_scatter"
    assert opens[0].op_type == want
    assert f"cadence expects {want} at #{opens[0].op_seq}" in opens[0].evidence


@pytest.mark.parametrize("culprit", [0, 1])
def test_a_restarted_analyzer_keeps_the_learned_cadence(culprit: int) -> None:
    """The pattern travels in state_dict: after a restart no op completes before the stall."""
    probe = Probe()
    dp = Comm(0xE2, (2, 3))
    first = Analyzer()
    for t, b in batches_by_tick(dp_steps(probe, dp, 15)):
        first.ingest(b, t)
        first.evaluate(t)
    state = json.loads(json.dumps(first.state_dict()))
    assert list(state["cadence"].values()) == [[int(x) for x in first.jobs[("job", 0)].cadence.pattern(0) or ()]]
    second = Analyzer.from_state_dict(state)
    out = []
    for t, b in batches_by_tick(wrong_order(probe, dp, culprit, 31.0, 71.0)):
        second.ingest(b, t)
        out += second.evaluate(t)
    out += second.evaluate(75.0)
    opens = [v for v in out if v.state == VerdictState.OPEN]
    assert [(v.kind, v.root_cause_ranks, v.mismatch_field) for v in opens] == [
        (AnomalyKind.H2, (dp.ranks[culprit],), "order")
    ]


def test_period_is_the_shortest_that_recent_ops_follow() -> None:
    c = Cadence(16)
    seq = np.arange(40, dtype=np.int64)
    # comm 0: one op; comm 1: A B; comm 2: A A B (period 3); comm 3: no repetition yet
    c.update(np.zeros(40, dtype=np.int64), seq, np.full(40, 7), 4)
    c.update(np.ones(40, dtype=np.int64), seq, np.where(seq % 2 == 0, 1, 2), 4)
    c.update(np.full(40, 2), seq, np.where(seq % 3 == 2, 5, 4), 4)
    c.update(np.full(3, 3), seq[:3], np.asarray([1, 2, 3]), 4)
    assert c.periods(np.arange(5, dtype=np.int64)).tolist() == [1, 2, 3, 0, 0]
    assert c.pattern(1) == (1, 2)
    assert c.expected(2, 41, "x") == 5 and c.expected(2, 42, "x") == 4
    assert c.expected(3, 3, "x") is None


def test_a_newer_op_wins_its_slot_and_a_broken_pattern_is_forgotten() -> None:
    c = Cadence(8)
    seq = np.arange(20, dtype=np.int64)
    z = np.zeros(20, dtype=np.int64)
    c.update(z, seq[::-1], np.where(seq[::-1] % 2 == 0, 1, 2), 1)  # arrival order does not matter
    assert c.pattern(0) == (1, 2)
    c.update(z[:1], seq[:1], np.asarray([9]), 1)  # an old op arriving late changes nothing
    assert c.pattern(0) == (1, 2)
    c.update(z[:4], np.arange(20, 24), np.asarray([1, 1, 1, 1]), 1)  # the program changed
    assert c.periods(np.zeros(1, dtype=np.int64)).tolist() == [0]
    assert c.sig.shape == (1, 8)  # bounded: one ring buffer per communicator


@pytest.mark.parametrize("culprit", [0, 1])
def test_without_a_learned_cadence_a_new_signature_is_still_the_culprit(culprit: int) -> None:
    """Two ops are too few to learn a pattern: the tie goes to the signature used before."""
    probe = Probe()
    tp = Comm(0xE3, (4, 6))
    recs = probe.ring_op(tp, [1.0, 1.01], 0.1) + probe.ring_op(tp, [3.0, 3.01], 0.1)
    for i in range(2):
        kw = {"dtype": DType.FLOAT32} if i == culprit else {}
        recs += stuck(probe, tp, i, tp.seq, 5.0 + 0.01 * i, 40.0, **kw)
    a = Analyzer()
    out = []
    for t, b in batches_by_tick(recs):
        a.ingest(b, t)
        out += a.evaluate(t)
    out += a.evaluate(45.0)
    assert a.jobs[("job", 0)].cadence.pattern(0) is None
    opens = [v for v in out if v.state == VerdictState.OPEN]
    assert [(v.kind, v.root_cause_ranks, v.mismatch_field) for v in opens] == [
        (AnomalyKind.H2, (tp.ranks[culprit],), "dtype")
    ]


def test_period_is_learned_from_a_sample_of_the_ops() -> None:
    """A source that details one op in K (the bounded format) still shows its step's pattern."""
    rs, ag = 11, 22
    pattern = [rs] * 4 + [ag] * 4  # four gradient buckets reduce-scattered, then all-gathered
    seqs = np.arange(3, 300, 7, dtype=np.int64)  # every 7th op: never two neighbours
    c = Cadence(32)
    c.update(np.zeros(seqs.size, dtype=np.int64), seqs, np.asarray([pattern[s % 8] for s in seqs]), 1)
    assert c.periods(np.asarray([0]))[0] == 8
    assert [c.expected(0, n, "x") for n in (200, 204, 207)] == [rs, ag, ag]


def test_saving_spreads_the_period_search_and_after_a_round_finds_what_items_finds() -> None:
    """The worker saves every second: each save searches a share of the communicators, round robin."""
    from ccld.streams.analysis import cadence as cad

    n = 3 * cad.SPREAD_MIN + 5
    c = Cadence(16)
    seq = np.arange(40, dtype=np.int64)
    for cid in range(n):  # every third communicator repeats A B (saved), the others one op (not saved)
        sig = np.where(seq % 2 == 0, 1, 2) if cid % 3 == 0 else np.full(40, 7)
        c.update(np.full(40, cid, dtype=np.int64), seq, sig, n)
    names = [f"c{i}" for i in range(n)]
    want = c.items(n, names)
    searched: list[int] = []
    periods = c.periods

    def counting(cids: np.ndarray) -> np.ndarray:
        searched.append(int(cids.shape[0]))
        return periods(cids)

    c.periods = counting  # type: ignore[method-assign]
    first = c.items_spread(n, names.__getitem__, calls=30)
    assert searched == [cad.SPREAD_MIN] and 0 < len(first) < len(want)
    for _ in range(3):
        last = c.items_spread(n, names.__getitem__, calls=30)
    assert last == want and len(last) == len(range(0, n, 3))
    assert searched == [cad.SPREAD_MIN] * 4  # never the whole job in one save
    small = Cadence(16)
    small.update(np.zeros(40, dtype=np.int64), seq, np.where(seq % 2 == 0, 1, 2), 1)
    assert small.items_spread(1, ["s"].__getitem__, calls=30) == [("s", [1, 2])]  # a small job: all of it at once
