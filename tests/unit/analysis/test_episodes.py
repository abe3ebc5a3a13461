"""A flapping fault is one incident with episodes, not a page per episode (issue 16, item 6).

A link that is slow for 15 s, fine for 25 s, slow again (three times): before, every on-phase
opened a new incident on the same link. Now the incident stays open while its fault is away for
less than ``incident_reopen_s`` (60 s), each return is an ``update`` counting the episodes, and it
resolves once the fault has stayed away that long.
"""

from __future__ import annotations

import dataclasses

import pytest

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import Verdict
from ccld.settings import AnalyzerSettings
from ccld.streams.analysis.replay import analyze_batches


def flapping(kind: str, rank: int, peer: int | None) -> Scenario:
    fault: dict[str, object] = {"kind": kind, "rank": rank, "onset_s": 20.0, "on_s": 15.0, "off_s": 25.0,
                                "factor": 0.25 if kind == "S2" else 4.0}
    if peer is not None:
        fault["peer"] = peer
    return Scenario.from_dict({
        "id": f"flap-{kind}", "seed": 7, "ranks": 16, "gpus_per_node": 8, "layout": {"tp": 4, "pp": 1, "dp": 4},
        "channels": 2, "duration_s": 135.0, "clock_skew_s": 1.0, "jitter": 0.05,
        "workload": {"microbatches": 4, "layers": 1, "layer_ms": 4.0},
        "faults": [fault], "expect": [{"kind": kind, "rank": rank}],
    })


def run(sc: Scenario, reopen_s: float) -> list[Verdict]:
    s = dataclasses.replace(AnalyzerSettings(), incident_reopen_s=reopen_s)
    return analyze_batches(list(simulate(sc)), s, then=[sc.duration_s + 70.0])


@pytest.mark.slow  # a 135-s job replayed twice a case
@pytest.mark.parametrize(("kind", "rank", "peer"), [("S2", 8, 9), ("S1", 5, None)])
def test_a_flapping_fault_is_one_incident_whose_updates_count_the_episodes(kind: str, rank: int,
                                                                           peer: int | None) -> None:
    sc = flapping(kind, rank, peer)
    before = {v.incident_id for v in run(sc, reopen_s=0.0) if v.state.value == "open"}
    assert len(before) >= 2, "the fault did not flap enough to test anything"
    got = run(sc, reopen_s=60.0)
    assert len({v.incident_id for v in got}) == 1, [v.describe() for v in got]
    assert [v.state.value for v in got][0] == "open" and got[-1].state.value == "resolved"
    episodes = [int(v.details["episodes"]) for v in got if "episodes" in v.details]
    assert episodes and max(episodes) == len(before), (episodes, len(before))
    assert got[-1].details.get("episodes") == str(len(before))
    assert rank in got[0].root_cause_ranks



def test_an_episode_ends_on_its_own_finding_not_the_first_ones() -> None:
    """A hang back on the same rank in another op: the incident's episode now ends when that op moves
    (``Incident.ending``); watching the first op's end, it would never resolve."""
    from ccld.records import AnomalyKind
    from ccld.streams.analysis.incidents import Candidate, IncidentBook

    def hang(comm: str, seq: int, onset: float) -> Candidate:
        return Candidate(kind=AnomalyKind.H1, job="j", incarnation=0, communicator=comm, op_seq=seq,
                         op_type="all_reduce", root_cause_ranks=(5,), affected_ranks=(4, 6), confidence=0.9,
                         evidence="e", onset_time=onset, resolve_key=("hang", seq))

    book = IncidentBook(100, 10.0, reopen_s=60.0)
    first = hang("aaaa", 24, 20.0)
    (opened,) = book.report(first, 41.0)
    (inc,) = book.open.values()
    assert inc.ending == ("aaaa", "hang", 24)
    assert book.resolve(first.match_key, 45.0, "progress resumed") == []  # quiet: held for reopen_s
    (again,) = book.report(hang("bbbb", 61, 70.0), 91.0)
    assert again.state.value == "update" and again.incident_id == opened.incident_id
    assert again.details["episodes"] == "2" and again.op_seq == 24  # the incident keeps its first op
    assert inc.ending == ("bbbb", "hang", 61)
    restored = IncidentBook(100, 10.0, reopen_s=60.0)
    restored.load(book.state_dict())
    assert next(iter(restored.open.values())).ending == ("bbbb", "hang", 61)  # kept in snapshots
    assert book.resolve(first.match_key, 96.0, "progress resumed") == []
    assert book.expire(150.0, "j", 0) == [] and [v.state.value for v in book.expire(156.0, "j", 0)] == ["resolved"]
