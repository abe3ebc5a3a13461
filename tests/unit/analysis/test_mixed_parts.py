"""A rank that computes a little slowly and whose link is slow: its two parts are one incident, S3.

Held-out MoE scenarios (heldout-expert, issue 16) showed three ways the parts came apart: a rank 35 %
slower lifted its ring's learned spread under it within seconds (the ops just under the slow test's
margin were learned as healthy), so its compute part was never found; the slow all_to_all between
that rank and one other, with no counter poll yet to name its link, opened a second incident; and
the compute part ending a few seconds before the link's made the incident an S2 when the link's
finding came back as a "new episode".
"""

from __future__ import annotations

import pytest
from analysis_factories import Comm, Probe, batches_by_tick

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import AnomalyKind, KernelRecord, Link, Status, VerdictState
from ccld.settings import AnalyzerSettings
from ccld.streams.analysis.incidents import LINK_NOT_OBSERVED, Candidate, IncidentBook
from ccld.streams.analysis.replay import analyze_batches


@pytest.mark.parametrize(("factor", "seed"), [(1.2, 7), (1.25, 8), (1.3, 7)])
def test_a_rank_a_fifth_slower_is_not_learned_as_its_rings_normal(factor: float, seed: int) -> None:
    """Rank 5 computes 20-30 % longer from 25 s on: every ring op waits for it, a little more than
    jitter; the ops that pass the slow test's margin by a hair must not lift the margin."""
    sc = Scenario.from_dict({
        "id": "creep", "seed": seed, "ranks": 16, "gpus_per_node": 8, "layout": {"tp": 4, "pp": 1, "dp": 4},
        "channels": 2, "duration_s": 60.0, "clock_skew_s": 1.0, "jitter": 0.05,
        "workload": {"microbatches": 4, "layers": 1, "layer_ms": 4.0},
        "faults": [{"kind": "S1", "rank": 5, "onset_s": 25.0, "factor": factor}],
    })
    got = [(v.kind, v.root_cause_ranks) for v in analyze_batches(list(simulate(sc)))
           if v.state == VerdictState.OPEN]
    assert got == [(AnomalyKind.S1, (5,))]


def test_a_healthy_rank_always_last_keeps_its_rings_margin() -> None:
    """The cap on learning applies to a rank last many times in a row; a healthy one that always is
    (it logs) must not ratchet its ring's learned spread down until its own jitter alerts."""
    sc = Scenario.from_dict({
        "id": "always-last", "seed": 3, "ranks": 16, "gpus_per_node": 8, "layout": {"tp": 4, "pp": 1, "dp": 4},
        "channels": 2, "duration_s": 90.0, "clock_skew_s": 1.0, "jitter": 0.05,
        "workload": {"microbatches": 4, "layers": 1, "layer_ms": 4.0},
        "faults": [{"kind": "S1", "rank": 5, "onset_s": 0.0, "factor": 1.08}],
    })
    assert [v.describe() for v in analyze_batches(list(simulate(sc)))] == []


def _slow(kind: AnomalyKind, comm: str, roots: tuple[int, ...], onset: float, *, link: Link | None = None,
          ends: str = "", unobserved: bool = False) -> Candidate:
    details = {"ends": ends} if ends else {}
    if unobserved:
        details["link"] = LINK_NOT_OBSERVED
    return Candidate(kind=kind, job="j", incarnation=0, communicator=comm, op_seq=10, op_type="all_to_all",
                     root_cause_ranks=roots, affected_ranks=(), confidence=1.0, evidence=kind.value,
                     onset_time=onset, link=link, details=details, resolve_key=("slow", hash(comm) & 0xFFFF))


def test_a_slow_exchange_between_a_slow_rank_and_one_other_is_the_same_incident() -> None:
    book = IncidentBook(100, 10.0, reopen_s=60.0)
    (opened,) = book.report(_slow(AnomalyKind.S1, "tp", (5,), 24.0), 34.0)
    blind = _slow(AnomalyKind.S2, "a2a", (), 24.0, ends="5@n0,37@n4", unobserved=True)
    (guess,) = book.report(blind, 36.0)
    assert guess.incident_id == opened.incident_id and guess.kind == AnomalyKind.S3
    assert guess.details["link"] == LINK_NOT_OBSERVED and guess.root_cause_ranks == (5,)
    assert book.report(blind, 37.0) == []  # the same again: nothing new
    named = _slow(AnomalyKind.S2, "a2a", (5, 37), 24.0, link=Link(5, 37), ends="5@n0,37@n4")
    (upd,) = book.report(named, 38.0)
    assert upd.incident_id == opened.incident_id and upd.kind == AnomalyKind.S3 and upd.link == Link(5, 37)
    assert "link" not in upd.details, "the link is named now"
    # a slow pair of two other ranks is another incident
    other = _slow(AnomalyKind.S2, "a2b", (), 24.0, ends="6@n1,38@n5", unobserved=True)
    (new,) = book.report(other, 39.0)
    assert new.state == VerdictState.OPEN and new.incident_id != opened.incident_id


def test_an_incident_keeps_its_class_when_its_compute_part_ends_first() -> None:
    book = IncidentBook(100, 10.0, reopen_s=60.0)
    s1 = _slow(AnomalyKind.S1, "tp", (5,), 24.0)
    s2 = _slow(AnomalyKind.S2, "a2a", (5, 37), 28.0, link=Link(5, 37), ends="5@n0,37@n4")
    (opened,) = book.report(s1, 34.0)
    (mixed,) = book.report(s2, 38.0)
    assert mixed.kind == AnomalyKind.S3
    assert book.resolve(s1.match_key, 44.0, "ops back at their baseline") == []  # quiet, held
    # the link's finding, on since before the compute part ended: the same episode, not a new one
    assert book.report(s2, 49.0) == []
    (inc,) = {id(i): i for i in book.open.values()}.values()
    assert inc.quiet_since is None and inc.episodes == [] and inc.ending[0] == "a2a"
    # it comes back later as the link alone: another episode, still S3
    assert book.resolve(s2.match_key, 52.0, "ops back at their baseline") == []
    (again,) = book.report(_slow(AnomalyKind.S2, "a2a", (5, 37), 70.0, link=Link(5, 37)), 75.0)
    assert again.incident_id == opened.incident_id and again.kind == AnomalyKind.S3
    assert again.details["episodes"] == "2"


def _one_group(faults: list[dict[str, object]], seed: int = 466454) -> Scenario:
    return Scenario.from_dict({
        "id": "one-group", "seed": seed, "ranks": 8, "gpus_per_node": 8, "layout": {"tp": 8, "pp": 1, "dp": 1},
        "channels": 16, "duration_s": 25.0, "clock_skew_s": 2.0, "jitter": 0.02,
        "workload": {"microbatches": 1, "layers": 2, "layer_ms": 3.6, "hidden": 8192, "seq_parallel": True},
        "faults": faults,
    })


@pytest.mark.parametrize(("fault", "want"), [
    ({"kind": "S2", "rank": 3, "peer": 4, "onset_s": 0.0, "factor": 0.2}, (AnomalyKind.S2, Link(3, 4))),
    ({"kind": "S3", "rank": 3, "peer": 4, "onset_s": 0.0, "link_factor": 0.19, "compute_factor": 2.7},
     (AnomalyKind.S3, Link(3, 4))),
])
def test_a_link_slow_from_the_first_op_in_a_job_of_one_ring_is_slow_against_the_rings_other_links(
        fault: dict[str, object], want: tuple[AnomalyKind, Link]) -> None:
    """One tensor group of 8 on one host, its link 3->4 slow from the job's first op: no history and no
    sibling group to compare with, but the send backlog sits before the same link at every sample
    (from-start-heldout's S3-8-043 came out S1)."""
    got = [(v.kind, v.link) for v in analyze_batches(list(simulate(_one_group([fault]))))
           if v.state == VerdictState.OPEN]
    assert got == [want]


def test_a_healthy_job_of_one_ring_gets_no_verdict() -> None:
    assert [v.describe() for v in analyze_batches(list(simulate(_one_group([], seed=5))))] == []


def test_a_ring_whose_every_link_holds_data_in_flight_is_not_slow_on_one_of_them() -> None:
    """Healthy rings have data in flight on every link: each member's RecvCount runs a little ahead of its
    SendCount at every sample, all alike, so the largest is a tie that the same member wins each time.
    The backlog before one link must be most of all the ring's backlog, not the winner of a tie."""
    probe = Probe()
    ring = Comm(0x71, tuple(range(8)))
    recs: list[tuple[float, KernelRecord]] = []
    for k in range(40):
        t = 1.0 + 0.5 * k
        enters = [t + 0.001 * ((i + k) % 5) for i in range(8)]
        at = max(enters) + 0.01
        for i in range(8):
            recs.append((at, probe.rec(ring, i, ring.seq, Status.PROGRESS, enters[i], at, send=20, recv=24)))
        recs += probe.ring_op(ring, enters, 0.02)
    assert [v.describe() for v in analyze_batches(batches_by_tick(recs))] == []


def test_the_rule_is_off_at_zero_pinned_ops() -> None:
    fault = {"kind": "S2", "rank": 3, "peer": 4, "onset_s": 0.0, "factor": 0.2}
    off = AnalyzerSettings(slow_link_pinned_ops=0)
    assert [v for v in analyze_batches(list(simulate(_one_group([fault]))), off)
            if v.state == VerdictState.OPEN] == []
