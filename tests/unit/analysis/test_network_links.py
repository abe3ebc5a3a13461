"""Slow and dead links on the network: a data-parallel ring's link, a pipeline pair, a host's NIC.

Each rule on a small simulated job (16 ranks, 4 GPUs per node, so the data-parallel rings and the
pipeline pairs cross nodes): the verdict names the link (its source rank first), a slow or dead NIC
is one incident naming the host and listing its links, and one fault is one incident.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from analysis_factories import drawn

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import AnomalyKind, Link, Verdict, VerdictState
from ccld.streams.analysis.incidents import NIC, NIC_LINKS, Candidate, IncidentBook
from ccld.streams.analysis.replay import analyze_batches


def run(faults: list[dict[str, Any]], duration_s: float = 80.0, gpus_per_node: int = 4) -> list[Verdict]:
    sc = Scenario.from_dict({
        "id": "net", "seed": 11, "ranks": 16, "gpus_per_node": gpus_per_node, "layout": {"tp": 4, "pp": 2, "dp": 2},
        "channels": 4, "duration_s": duration_s, "jitter": 0.03,
        "workload": {"microbatches": 4, "layers": 2, "layer_ms": 4.0, "dp_buckets": 4}, "faults": faults,
    })
    return list(analyze_batches(simulate(sc), tick_s=1.0))


def incidents(vs: list[Verdict]) -> dict[str, Verdict]:
    """Each incident's newest verdict."""
    return {v.incident_id: v for v in vs}


def test_a_slow_data_parallel_network_link_is_named() -> None:
    inc = incidents(run([{"kind": "S2", "comm": "dp", "rank": 5, "onset_s": 30, "factor": 0.3}]))
    (v,) = inc.values()
    assert v.kind == AnomalyKind.S2 and v.link == Link(5, 13) and v.root_cause_ranks[0] == 5
    assert v.details[NIC] == "node-0001"  # a network link: it leaves node 1


def test_a_slow_pipeline_link_is_named_from_its_sender() -> None:
    # the receiver's RecvCount runs ahead of its SendCount (zero) whatever the link does: the sender is the source
    for src, dst in ((2, 6), (6, 2)):  # forward activations, backward gradients
        inc = incidents(run([{"kind": "S2", "comm": "pp", "rank": src, "peer": dst, "onset_s": 30, "factor": 0.3}]))
        (v,) = inc.values()
        assert v.kind == AnomalyKind.S2 and v.link == Link(src, dst) and v.root_cause_ranks[0] == src, v


def test_a_slow_nic_is_one_incident_naming_the_host_and_its_links() -> None:
    vs = run([{"kind": "S2", "nic": 1, "onset_s": 30, "factor": 0.3}])
    inc = incidents(vs)
    assert len(inc) == 1, [(v.kind, v.link, v.root_cause_ranks) for v in vs]
    (v,) = inc.values()
    assert v.kind == AnomalyKind.S2 and v.root_cause_hosts == ("node-0001",)
    assert "network interface of node-0001" in v.evidence
    links = {tuple(map(int, x.split(">"))) for x in v.details[NIC_LINKS].split(",")}
    assert {(r, r + 8) for r in range(4, 8)} <= links  # the four dp rings through node 1
    assert set(v.root_cause_ranks) <= {4, 5, 6, 7} and 4 in v.root_cause_ranks


def test_a_dead_network_link_is_an_h3_on_that_link() -> None:
    vs = run([{"kind": "H3", "comm": "dp", "rank": 2, "onset_s": 30}], duration_s=70)
    opened = [v for v in vs if v.state == VerdictState.OPEN]
    assert [(v.kind, v.link) for v in opened] == [(AnomalyKind.H3, Link(2, 10))]


def test_a_dead_nic_is_one_h3_incident_naming_the_host() -> None:
    vs = run([{"kind": "H3", "nic": 2, "onset_s": 30}], duration_s=70)
    inc = incidents(vs)
    assert len(inc) == 1, [(v.kind, v.link, v.root_cause_ranks) for v in vs]
    (v,) = inc.values()
    assert v.kind == AnomalyKind.H3 and v.root_cause_hosts == ("node-0002",) and v.details["host"] == "node-0002"
    assert set(v.root_cause_ranks) <= set(range(8, 12)) and len(v.root_cause_ranks) >= 2


def test_a_rank_that_computes_slowly_and_whose_network_link_is_slow_is_s3() -> None:
    # the late arrival shows in its tensor ring, the slow link in its data-parallel ring: one S3 incident
    inc = incidents(run([{"kind": "S3", "comm": "dp", "rank": 5, "onset_s": 30, "compute_factor": 1.3,
                          "link_factor": 0.3}]))
    (v,) = inc.values()
    assert v.kind == AnomalyKind.S3 and v.root_cause_ranks[0] == 5 and v.link == Link(5, 13)


def _s2(src: int, dst: int, nic: str, comm: str) -> Candidate:
    return Candidate(kind=AnomalyKind.S2, job="j", incarnation=0, communicator=comm, op_seq=1, op_type="all_gather",
                     root_cause_ranks=(src, dst), affected_ranks=(), confidence=1.0, evidence=f"{src}->{dst} slow",
                     onset_time=10.0, link=Link(src, dst), details={NIC: nic}, resolve_key=("slow", 1))


def test_links_of_one_nic_found_one_by_one_fold_into_the_incident_of_the_first() -> None:
    book = IncidentBook(100, 10.0, 0.0)
    (first,) = book.report(_s2(4, 12, "node-0001", "c1"), 1.0)
    (upd,) = book.report(_s2(5, 13, "node-0001", "c2"), 2.0)
    assert upd.state == VerdictState.UPDATE and upd.incident_id == first.incident_id
    assert upd.root_cause_ranks == (4, 5) and upd.details[NIC_LINKS] == "4>12,5>13"
    assert book.report(_s2(5, 13, "node-0001", "c2"), 3.0) == []  # that link again: nothing new
    other = book.report(_s2(8, 0, "node-0002", "c3"), 3.0)  # another host's link: its own incident
    assert [v.state for v in other] == [VerdictState.OPEN] and other[0].incident_id != first.incident_id
    # persisted and restored, the NIC's incident keeps both keys; resolving it ends it under both
    again = IncidentBook(100, 10.0, 0.0)
    again.load(book.state_dict())
    assert again.report(_s2(5, 13, "node-0001", "c2"), 4.0) == []
    (more,) = again.report(_s2(6, 14, "node-0001", "c4"), 4.0)  # a third link after the restart: folded in
    assert more.incident_id == first.incident_id and more.details[NIC_LINKS] == "4>12,5>13,6>14"
    (res,) = again.resolve(_s2(5, 13, "node-0001", "c2").match_key, 5.0, "back to baseline")
    assert res.state == VerdictState.RESOLVED and res.incident_id == first.incident_id
    assert len(again.open) == 1  # node-0002's


def test_one_link_found_in_two_findings_is_a_link_not_a_nic_and_joins_its_rank_s1_as_s3() -> None:
    # a data-parallel ring's reduce-scatter and all-gather are two baselines: both name the slow link
    from ccld.streams.analysis.job_stage import best_slow, merge_nic

    rs, ag = _s2(329, 361, "node-0041", "dp"), replace(_s2(329, 361, "node-0041", "dp"), op_seq=7)
    merged = merge_nic([rs, ag])
    assert all(NIC_LINKS not in c.details for c in merged)
    s1 = replace(rs, kind=AnomalyKind.S1, communicator="tp", root_cause_ranks=(329,), link=None, details={})
    (s3,) = best_slow([s1, *merged])
    assert s3.kind == AnomalyKind.S3 and s3.link == Link(329, 361) and s3.root_cause_ranks[0] == 329


def test_a_pipeline_link_slow_from_the_first_step_is_named_against_the_other_network_pairs() -> None:
    # no healthy history: its own baseline learns the slow link; the other pairs between two nodes
    # (same bytes, same kind of link) are its siblings, as the tensor groups are for a ring
    inc = incidents(run([{"kind": "S2", "comm": "pp", "rank": 2, "peer": 6, "onset_s": 0, "factor": 0.3}], 40.0))
    (v,) = inc.values()
    assert v.kind == AnomalyKind.S2 and v.link == Link(2, 6) and v.root_cause_ranks[0] == 2, v


def test_a_pipeline_link_inside_a_node_slow_from_the_first_step_is_named_against_the_pairs_inside_nodes() -> None:
    # 8 GPUs a node: the pipeline pairs stay inside their node (NVLink), and are compared with each other,
    # not with the network's; before, a slow one had no sibling and no history: no verdict
    inc = incidents(run([{"kind": "S2", "comm": "pp", "rank": 2, "peer": 6, "onset_s": 0, "factor": 0.5}], 40.0,
                        gpus_per_node=8))
    (v,) = inc.values()
    assert v.kind == AnomalyKind.S2 and v.link == Link(2, 6) and v.root_cause_ranks[0] == 2, v
    assert incidents(run([], 40.0, gpus_per_node=8)) == {}


def test_a_late_rank_on_a_host_whose_nic_is_named_slow_is_part_of_that_incident() -> None:
    """A rank of node 1 late after the NIC of node 1 was named slow waited for its transfers through it: no
    page of its own. A late rank of another host, or one found before the NIC's incident, is its own."""
    book = IncidentBook(100, 10.0, 0.0)
    (nic,) = book.report(_s2(4, 12, "node-0001", "c1"), 1.0)
    book.report(_s2(5, 13, "node-0001", "c2"), 2.0)

    def s1(rank: int, host: str, onset: float) -> Candidate:
        return replace(_s2(rank, rank, host, "pp"), kind=AnomalyKind.S1, root_cause_ranks=(rank,), link=None,
                       root_cause_hosts=(host,), details={}, onset_time=onset)

    assert book.report(s1(6, "node-0001", 12.0), 3.0) == []  # behind the NIC, found after it
    assert [v.state for v in book.report(s1(9, "node-0002", 12.0), 3.0)] == [VerdictState.OPEN]
    assert [v.state for v in book.report(s1(7, "node-0001", 5.0), 3.0)] == [VerdictState.OPEN]  # late before it
    # the NIC of one link only is a link, not a host: the late rank at its end stays its own (S3 by the job stage)
    book = IncidentBook(100, 10.0, 0.0)
    book.report(_s2(4, 12, "node-0001", "c1"), 1.0)
    assert [v.state for v in book.report(s1(6, "node-0001", 12.0), 3.0)] == [VerdictState.OPEN]
    assert nic.state == VerdictState.OPEN


def test_pipeline_stages_behind_a_slow_nic_are_not_named_apart_from_it() -> None:
    """Ten stages of two replicas on 8-GPU nodes, node 0's NIC at 33 % from 17 s: its links (the pipeline's
    send to node 1, the data-parallel pairs) are one S2 naming node 0; two stages on node 0 arrived late at
    their receives after waiting through it, and were each an S1 of their own (heldout-any-6's draw)."""
    sc = drawn("heldout-any-6", "any-pp-S2-20-159")
    got = incidents(list(analyze_batches(simulate(sc), tick_s=1.0)))
    assert [(v.kind, v.root_cause_hosts) for v in got.values()] == [(AnomalyKind.S2, ("node-0000",))], \
        [v.describe() for v in got.values()]


def test_a_dead_nic_under_an_all_to_all_names_its_host_not_one_of_its_links() -> None:
    """A 16-rank MoE job with no tensor ring (ep 4 over 2-GPU nodes), node 5's NIC dead from the first op: both
    of its ranks (10, 11) hold data they cannot pass on in the expert group's first all_to_all, their two peers
    on node 4 are behind. The exchanges are pairwise, not a ring: the largest backlog step between ring
    neighbours named one link, 11 -> 8 (heldout-any-6's draw); the H3 names the host's two ranks."""
    sc = drawn("heldout-any-6", "any-moe-H3-16-100")
    (v,) = incidents(list(analyze_batches(simulate(sc), tick_s=1.0))).values()
    assert (v.kind, v.root_cause_ranks) == (AnomalyKind.H3, (10, 11)), v.describe()
    assert "node-0005" in v.evidence and v.link is None


def test_a_dead_nic_under_two_expert_groups_is_one_incident_naming_the_host() -> None:
    """8-GPU nodes, tp 2, ep 8: node 1's ranks sit in two expert groups (the even and the odd tensor ranks), and
    its dead NIC freezes both groups' all_to_alls; each names its four ranks of node 1, and the two are one
    incident, the host's (two incidents of four ranks each before the host was given)."""
    sc = drawn("any-shape", "any-moe-H3-32-017")
    (v,) = incidents(list(analyze_batches(simulate(sc), tick_s=1.0))).values()
    assert (v.kind, v.root_cause_ranks) == (AnomalyKind.H3, tuple(range(8, 16))), v.describe()
    assert v.details["host"] == "node-0001"
