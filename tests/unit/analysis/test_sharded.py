"""One job's communicators over several shards and one job stage: the verdicts do not change.

The scenarios come from the accuracy suites (the standard one and the independently written
heldout-3): Megatron-style jobs with tensor, pipeline and data-parallel communicators, so a hang
in one communicator leaves victims waiting in others, on other shards.
"""

from __future__ import annotations

from collections import Counter
from functools import cache

import numpy as np
import pytest
from analysis_factories import drawn

from ccld.producers.simulator.sim import simulate
from ccld.records import COMM_COLUMN, KernelBatch, Verdict, comm_group
from ccld.streams.analysis.analyzer import Analyzer
from ccld.streams.analysis.replay import analyze_batches
from ccld.streams.analysis.shard import ShardReport, decode_report, encode_report

#: scenarios at 16 ranks: every hang class, a late arriver, a mixed slowdown, a job restart, a p2p pair
#: (the whole suites were compared too: benchmarks/RESULTS.md, "One job over several workers")
STANDARD = ["H1-16-002", "H2-16-061", "H3-16-097", "S1-16-147", "S3-16-236", "restart-16-373", "pair-16-375"]
HELDOUT = ["H1-16-013", "H3-16-057"]


@cache
def _batches(suite: str, sid: str) -> list[tuple[float, KernelBatch]]:
    return list(simulate(drawn(suite, sid)))


def _key(v: Verdict) -> tuple[object, ...]:
    return (v.state, v.kind, v.communicator, v.op_seq, v.root_cause_ranks, v.affected_ranks, v.root_cause_hosts,
            v.link, v.evidence, v.onset_time, v.detected_time, v.incident_id)


@pytest.mark.parametrize(("suite", "sid"), [("standard", s) for s in STANDARD] + [("heldout-3", s) for s in HELDOUT])
def test_spreading_a_job_over_shards_changes_no_verdict(suite: str, sid: str) -> None:
    batches = _batches(suite, sid)
    groups = {int(g) for _, b in batches for g in np.unique(comm_group(b.columns[COMM_COLUMN], 3))}
    assert len(groups) >= 2, "the scenario's communicators all fall into one shard: the test would prove nothing"
    single = [_key(v) for v in analyze_batches(batches, tick_s=1.0)]
    assert single or not drawn(suite, sid).expect, "no verdict for a fault: the comparison would be empty"
    assert [_key(v) for v in analyze_batches(batches, tick_s=1.0, groups=3)] == single


@pytest.mark.parametrize("sid", ["H2-16-061", "H3-16-097", "S2-16-189"])
def test_reports_carried_as_messages_change_no_verdict(sid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the stage behind a topic: every report it decides from has been encoded and decoded
    batches = _batches("standard", sid)
    direct = [_key(v) for v in analyze_batches(batches, tick_s=1.0, groups=3)]
    carried: Counter[str] = Counter()
    reports = Analyzer.reports

    def through_the_wire(self: Analyzer, now: float) -> list[ShardReport]:
        out = [decode_report(encode_report(rep, 0))[1] for rep in reports(self, now)]
        carried.update(slow=sum(len(r.slow) for r in out), stalls=sum(len(r.stalls) for r in out))
        return out

    monkeypatch.setattr(Analyzer, "reports", through_the_wire)
    assert [_key(v) for v in analyze_batches(batches, tick_s=1.0, groups=3)] == direct
    assert carried["stalls" if sid.startswith("H") else "slow"] > 0, carried


def test_shards_deciding_alone_would_name_the_victims() -> None:
    # what the job stage is for: a shard sees ranks missing from its stalled communicators that
    # wait in communicators of other shards, and alone it would call them roots
    batches = _batches("standard", "H1-16-002")
    shards = [Analyzer() for _ in range(3)]
    alone: set[tuple[int, ...]] = set()
    tick = batches[0][0] + 1.0
    for t, b in [*batches, (batches[-1][0] + 1.0, None)]:
        while t >= tick:
            alone |= {v.root_cause_ranks for s in shards for v in s.evaluate(tick) if v.kind.is_hang}
            tick += 1.0
        if b is not None:
            for g, part in b.by_group(3).items():
                shards[g].ingest(part, t)
    staged = {v.root_cause_ranks for v in analyze_batches(batches, tick_s=1.0, groups=3)}
    assert staged == {(2,)}, staged
    # alone, the shards name ranks other than 2 (victims), whether one by one or merged with 2 by host
    assert any(2 in r for r in alone) and any(set(r) - {2} for r in alone), alone


def test_by_group_splits_rows_by_communicator_and_keeps_every_row() -> None:
    # one flush of a host holding several communicators (the simulator sends one per communicator)
    b = KernelBatch.concat([b for _, b in _batches("standard", "H1-16-002")[:40]], producer="host-a", batch_seq=7)
    assert len(np.unique(b.columns[COMM_COLUMN])) > 3
    parts = b.by_group(3)
    assert len(parts) >= 2
    seen: list[int] = []
    for g, p in parts.items():
        assert set(comm_group(p.columns[COMM_COLUMN], 3).tolist()) == {g}
        assert (p.producer, p.batch_seq) == (b.producer, b.batch_seq)
        seen.extend(zip(p.columns["rank"].tolist(), p.columns[COMM_COLUMN].tolist(), p.columns["op_seq"].tolist(),
                        strict=True))
    assert sorted(seen) == sorted(zip(b.columns["rank"].tolist(), b.columns[COMM_COLUMN].tolist(),
                                      b.columns["op_seq"].tolist(), strict=True))
    assert b.by_group(1) == {0: b}
