"""Sources without per-channel counters (torch.distributed, Flight Recorder) still get comm-slow alerts."""

from __future__ import annotations

import dataclasses

import numpy as np

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import AnomalyKind, KernelBatch, VerdictState
from ccld.streams.analysis.replay import analyze_batches
from ccld.streams.analysis.settings import AnalyzerSettings

S2 = Scenario.from_dict({
    "id": "s2-nocounters", "seed": 21, "ranks": 16, "layout": {"tp": 8, "pp": 1, "dp": 2}, "channels": 4,
    "step_time_s": 1.0, "duration_s": 150.0, "clock_skew_s": 2.0,
    "faults": [{"kind": "S2", "rank": 3, "peer": 4, "onset_s": 70.0, "factor": 0.2}],
})


def without_counters(b: KernelBatch) -> KernelBatch:
    empty = np.zeros((b.n, 0), dtype=np.int64)
    return dataclasses.replace(b, send=empty, recv=empty)


def test_comm_slow_without_counters_is_reported_without_guessing_a_link() -> None:
    verdicts = analyze_batches((t, without_counters(b)) for t, b in simulate(S2))
    slow = [v for v in verdicts if v.kind is AnomalyKind.S2]
    assert slow, [v.describe() for v in verdicts]
    v = slow[0]
    assert v.root_cause_ranks == () and v.link is None and v.channel is None
    assert v.p is not None and v.p <= 0.4 and "cannot be named" in v.evidence
    assert not [x for x in verdicts if x.kind is not AnomalyKind.S2], "no other class may appear"


def test_with_counters_the_link_is_named_as_before() -> None:
    verdicts = analyze_batches(simulate(S2))
    slow = [v for v in verdicts if v.kind is AnomalyKind.S2]
    assert slow and slow[0].link is not None and 3 in slow[0].root_cause_ranks


def test_two_communicators_slow_with_no_link_to_name_are_two_incidents() -> None:
    """A source without counters cannot name a slow link: each slow communicator is its own incident,
    never one incident whose evidence switches between them (a 30-minute gloo job showed it)."""
    from ccld.records import Link
    from ccld.streams.analysis.incidents import Candidate, IncidentBook

    book = IncidentBook(64, 10.0)
    seen = []
    for comm, op in (("00000000000000a1", "send"), ("00000000000000b2", "all_reduce")):
        c = Candidate(kind=AnomalyKind.S2, job="j", incarnation=0, communicator=comm, op_seq=5, op_type=op,
                      root_cause_ranks=(), affected_ranks=(0, 1), confidence=0.5, evidence=op, onset_time=1.0,
                      resolve_key=("slow", 1))
        seen += book.report(c, 2.0)
    assert [(x.state, x.communicator, x.op_type) for x in seen] == [
        (VerdictState.OPEN, "00000000000000a1", "send"), (VerdictState.OPEN, "00000000000000b2", "all_reduce")]
    assert seen[0].incident_id != seen[1].incident_id
    # and a link named later in the first one still takes over its blind incident
    named = Candidate(kind=AnomalyKind.S2, job=seen[0].job, incarnation=0, communicator="00000000000000a1",
                      op_seq=5, op_type="send", root_cause_ranks=(3, 4), affected_ranks=(0,), confidence=0.9,
                      evidence="x", onset_time=1.0, link=Link(3, 4), resolve_key=("slow", 1))
    (upd,) = book.report(named, 3.0)
    assert upd.state == VerdictState.UPDATE and upd.incident_id == seen[0].incident_id


def test_a_few_seconds_of_slow_communication_with_no_link_to_name_is_not_reported() -> None:
    """With no counters the slowdown alone is the evidence: it must stay alarmed ``slow_link_wait_s``
    (a ms-scale gloo all-reduce on a busy host is slow on every rank for seconds at a time). The same
    episode with counters names its link; a lasting one without them is reported, that long after."""
    wait_s = AnalyzerSettings().slow_link_wait_s
    brief = dataclasses.replace(S2, faults=(dataclasses.replace(S2.faults[0], on_s=wait_s - 4.0, off_s=1000.0),))
    assert not [v for v in analyze_batches((t, without_counters(b)) for t, b in simulate(brief))]
    named = [v for v in analyze_batches(simulate(brief)) if v.kind is AnomalyKind.S2]
    assert named and named[0].link is not None, "with counters the same episode is a named link"
    lasting = [v for v in analyze_batches((t, without_counters(b)) for t, b in simulate(S2))
               if v.kind is AnomalyKind.S2]
    assert lasting and lasting[0].detected_time - S2.faults[0].onset_s >= wait_s, lasting[0].describe()


def test_a_slowdown_with_healthy_ops_between_and_no_link_to_name_is_not_reported() -> None:
    """Unnamed, the slowdown must also be steady: the communication slow in every op judged during
    ``slow_link_wait_s``. A busy host makes a ms-scale gloo all-reduce slow in 3 or 4 of 5 ops for a
    minute on end with healthy ops between (CI: an S2 on the healthy job of test_long_real_job); a slow
    link slows every op. Here the link is slow 4 s of every 5 for 80 s: with counters it is named, without
    them nothing is reported (before the rule: an S2 "cannot be named", 15 s after the onset)."""
    flap = dataclasses.replace(S2, faults=(dataclasses.replace(S2.faults[0], on_s=4.0, off_s=1.0),))
    assert not [v for v in analyze_batches((t, without_counters(b)) for t, b in simulate(flap))]
    named = [v for v in analyze_batches(simulate(flap)) if v.kind is AnomalyKind.S2]
    assert named and named[0].link is not None, "with counters the same link is named"
