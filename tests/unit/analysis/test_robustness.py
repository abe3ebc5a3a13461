"""Skewed clocks, duplicate delivery, restarts, checkpoints and healthy runs."""

from __future__ import annotations

import json
import random

import pytest
from analysis_factories import Comm, Probe, batches_by_tick, healthy_steps
from test_hangs import stuck

from ccld.records import AnomalyKind, KernelBatch, KernelRecord, OpType, VerdictState
from ccld.settings import AnalyzerSettings
from ccld.streams.analysis.analyzer import Analyzer
from ccld.streams.analysis.replay import analyze_batches


def h1_records(probe: Probe) -> list[tuple[float, KernelRecord]]:
    tp = Comm(0xF1, tuple(range(8)))
    recs = healthy_steps(probe, tp, 20)
    k = tp.seq
    for i in range(8):
        if i != 5:
            recs += stuck(probe, tp, i, k, 41.0 + 0.01 * i, 100.0)
    return recs


def s1_records(probe: Probe) -> list[tuple[float, KernelRecord]]:
    tp = Comm(0xF2, tuple(range(8)))
    return healthy_steps(probe, tp, 40, late={4: 1.0}, from_step=20)


def summary(verdicts: list) -> list[tuple[str, str, tuple[int, ...], str]]:  # type: ignore[type-arg]
    return [(v.state.value, v.kind.value, v.root_cause_ranks, v.incident_id) for v in verdicts]


@pytest.mark.parametrize("make", [h1_records, s1_records])
def test_clock_skew_of_seconds_changes_nothing(make) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(3)
    plain = analyze_batches(batches_by_tick(make(Probe())))
    skewed = analyze_batches(batches_by_tick(make(Probe(skew_s={r: rng.uniform(-30, 30) for r in range(8)}))))
    assert plain and summary(plain) == summary(skewed)
    assert [v.detected_time for v in plain] == [v.detected_time for v in skewed]


def test_duplicated_batches_do_not_duplicate_verdicts() -> None:
    batches = batches_by_tick(h1_records(Probe()) + s1_records(Probe()))
    once = analyze_batches(batches)
    twice: list[tuple[float, KernelBatch]] = []
    for t, b in batches:
        twice += [(t, b), (t, b)]
    a = Analyzer()
    out = []
    tick = 1.0
    for t, b in twice:
        while t >= tick:
            out += a.evaluate(tick)
            tick += 1.0
        a.ingest(b, t)
    out += a.evaluate(tick)
    assert summary(out) == summary(once)
    assert a.stats["duplicates"] == len(batches)


def test_replayed_records_without_batch_ids_are_idempotent() -> None:
    batches = batches_by_tick(h1_records(Probe()))
    a = Analyzer()
    out = []
    tick = 1.0
    for t, b in batches:
        while t >= tick:
            out += a.evaluate(tick)
            tick += 1.0
        anon = KernelBatch(b.job, b.incarnation, b.comm_hash, b.world_size, b.hosts, b.columns, b.send, b.recv)
        a.ingest(anon, t)
        a.ingest(anon, t)  # at-least-once delivery without producer ids: the records themselves dedupe
    out += a.evaluate(tick)
    assert [(v.state, v.kind, v.root_cause_ranks) for v in out] == [(VerdictState.OPEN, AnomalyKind.H1, (5,))]


def test_incident_ids_are_stable_across_replays() -> None:
    batches = batches_by_tick(h1_records(Probe()) + s1_records(Probe()))
    assert summary(analyze_batches(batches)) == summary(analyze_batches(batches))


def test_state_dict_round_trip_keeps_dedupe() -> None:
    batches = batches_by_tick(h1_records(Probe()))
    a = Analyzer()
    out = []
    tick = 1.0
    restarted = False
    for t, b in batches:
        while t >= tick:
            out += a.evaluate(tick)
            tick += 1.0
            if out and not restarted:
                # restart from JSON, then replay the last 10 s of input (at-least-once after a crash)
                state = json.loads(json.dumps(a.state_dict()))
                assert len(json.dumps(state)) < 20_000
                a = Analyzer.from_state_dict(state)
                restarted = True
                for t2, b2 in batches:
                    if t - 10 <= t2 < t:
                        a.ingest(b2, t2)
        a.ingest(b, t)
    out += a.evaluate(tick + 30)
    assert restarted
    assert [(v.state, v.root_cause_ranks) for v in out] == [(VerdictState.OPEN, (5,))]


def test_restart_without_duplicate_ids_redetects_silently() -> None:
    """Even records never seen before the restart do not re-open an incident already emitted."""
    batches = batches_by_tick(h1_records(Probe()))
    first = analyze_batches(batches)
    a = Analyzer()
    tick = 1.0
    for t, b in batches:
        if t >= 70:
            break
        while t >= tick:
            a.evaluate(tick)
            tick += 1.0
        a.ingest(b, t)
    a.evaluate(70.0)
    b_state = a.state_dict()
    assert b_state["incidents"]["emitted"], "the incident was not emitted before the restart: nothing to test"
    a2 = Analyzer.from_state_dict(b_state)
    # a fresh analyzer that sees the whole stream again but keeps the emitted ids
    for t, b in batches:
        a2.ingest(KernelBatch(b.job, b.incarnation, b.comm_hash, b.world_size, b.hosts, b.columns, b.send,
                              b.recv, producer="other", batch_seq=b.batch_seq), t)
    assert [v for v in a2.evaluate(110.0) if v.state == VerdictState.OPEN] == []
    assert first[0].state == VerdictState.OPEN


def test_checkpoint_pause_shorter_than_the_hang_minimum_never_alerts() -> None:
    """Everyone waits at a world barrier while rank 3 writes a checkpoint for 15 s."""
    probe = Probe()
    tp = Comm(0x71, tuple(range(8)))
    world = Comm(0x72, tuple(range(8)))
    recs = healthy_steps(probe, tp, 20)
    k = world.seq
    for i in range(8):
        if i != 3:
            recs += stuck(probe, world, i, k, 41.0, 56.0, op_type=OpType.BARRIER)
    recs += probe.ring_op(world, [41.0] * 3 + [56.0] + [41.0] * 4, 0.01, op_type=OpType.BARRIER)
    recs += healthy_steps(probe, tp, 20, t0=58.0)
    assert analyze_batches(batches_by_tick(recs)) == []


def test_a_recurring_pause_longer_than_the_minimum_alerts_at_most_once() -> None:
    """A 30 s pause repeats every 60 s: the analyzer learns it after the first occurrence."""
    probe = Probe()
    tp = Comm(0x73, tuple(range(4)))
    recs = healthy_steps(probe, tp, 10)
    t = 21.0
    for _ in range(4):
        k = tp.seq
        for i in (0, 1, 2):
            recs += stuck(probe, tp, i, k, t, t + 30.0)
        tp.seq = k
        recs += probe.ring_op(tp, [t, t, t, t + 30.0], 0.2)
        recs += healthy_steps(probe, tp, 15, t0=t + 31.0)
        t += 61.0
    verdicts = analyze_batches(batches_by_tick(recs), AnalyzerSettings(hang_min_s=20.0))
    assert len([v for v in verdicts if v.state == VerdictState.OPEN]) == 1


def test_healthy_run_never_alerts() -> None:
    probe = Probe(skew_s={r: 2.5 * (r % 3) - 2 for r in range(8)})
    tp = Comm(0x74, tuple(range(8)))
    dp = Comm(0x75, (0, 4))
    recs = healthy_steps(probe, tp, 80) + healthy_steps(probe, dp, 80, t0=0.6)
    assert analyze_batches(batches_by_tick(recs)) == []


def test_a_restarted_producer_reusing_sequence_numbers_is_not_dropped() -> None:
    probe = Probe()
    tp = Comm(0x76, tuple(range(4)))
    first = batches_by_tick(healthy_steps(probe, tp, 3), producer="p")
    second = batches_by_tick(healthy_steps(probe, tp, 3, t0=10.0), producer="p")  # seqs restart at 0
    a = Analyzer()
    for t, b in first + second:
        a.ingest(b, t)
    a.evaluate(30.0)
    assert a.stats["duplicates"] == 0
    assert a.stats["ops_completed"] == 6


def test_a_new_incarnation_resolves_the_old_ones_incidents() -> None:
    batches = batches_by_tick(h1_records(Probe()))
    a = Analyzer()
    out = []
    for t, b in batches:
        a.ingest(b, t)
        out += a.evaluate(t)
    assert [v.state for v in out] == [VerdictState.OPEN]
    b0 = batches[0][1]
    restarted = KernelBatch(b0.job, b0.incarnation + 1, b0.comm_hash, b0.world_size, b0.hosts, b0.columns,
                            b0.send, b0.recv)
    a.ingest(restarted, 200.0)
    out = a.evaluate(200.0)
    assert [v.state for v in out] == [VerdictState.RESOLVED]
    assert "incarnation 1" in out[0].evidence
