"""One slow NIC, seen as slow transfers in both directions and in several communicators: one incident.

The shape of the real namespace job (``tests/integration/test_net_links.py``): four ranks, each its own
host, pipeline pairs 0<->2 and 1<->3, data-parallel groups {0,1} and {2,3}; rank 2's NIC is slow. The
findings arrive one by one: the pair's link 2->0 (named from its sender), its link 0->2, and the group
{2,3}'s all-reduce, slow as a whole (gloo: no counters name its link). Each alone has two hosts at its
ends; node2 is the one they share.
"""

from __future__ import annotations

import numpy as np

from ccld.records import AnomalyKind, DType, Link, OpType, VerdictState
from ccld.streams.analysis.incidents import ENDS, NIC, NIC_LINKS, SLOW_COMMS, Candidate, IncidentBook
from ccld.streams.analysis.settings import AnalyzerSettings
from ccld.streams.analysis.slow import _peer_late, own_work
from ccld.streams.analysis.state import sig_code


def _link(src: int, dst: int, comm: str) -> Candidate:
    return Candidate(kind=AnomalyKind.S2, job="j", incarnation=0, communicator=comm, op_seq=1, op_type="send",
                     root_cause_ranks=(src, dst), root_cause_hosts=(f"n{src}", f"n{dst}"), affected_ranks=(),
                     confidence=1.0, evidence=f"{src}->{dst} slow", onset_time=10.0, link=Link(src, dst),
                     details={NIC: f"n{src}", ENDS: f"{src}@n{src},{dst}@n{dst}"}, resolve_key=("slow", 1))


def _comm(members: tuple[int, ...], comm: str) -> Candidate:
    """A communicator slow as a whole whose link cannot be named (no counters): no root, its members' ends."""
    return Candidate(kind=AnomalyKind.S2, job="j", incarnation=0, communicator=comm, op_seq=1, op_type="all_reduce",
                     root_cause_ranks=(), affected_ranks=members, confidence=1.0, evidence="all_reduce slow",
                     onset_time=10.0, details={ENDS: ",".join(f"{r}@n{r}" for r in members)},
                     resolve_key=("slow", 2))


def test_both_directions_and_the_hosts_data_parallel_group_are_one_incident_naming_its_nic() -> None:
    book = IncidentBook(100, 10.0, 0.0)
    (first,) = book.report(_link(2, 0, "p20"), 1.0)
    assert first.state == VerdictState.OPEN and first.root_cause_ranks == (2, 0)
    # the other direction: the link between n0 and n2 (or either NIC), one incident
    (cable,) = book.report(_link(0, 2, "p02"), 2.0)
    assert cable.incident_id == first.incident_id and cable.state == VerdictState.UPDATE
    assert cable.root_cause_hosts == ("n0", "n2") and NIC not in cable.details
    assert cable.details[NIC_LINKS] == "2>0,0>2"
    # the data-parallel group {2,3} shares only n2 with them: n2's NIC
    (nic,) = book.report(_comm((2, 3), "dp23"), 3.0)
    assert nic.incident_id == first.incident_id
    assert nic.details[NIC] == "n2" and nic.root_cause_hosts == ("n2",) and nic.root_cause_ranks == (2,)
    assert nic.details[SLOW_COMMS] == "p20,p02,dp23" and "network interface of n2" in nic.evidence
    assert book.report(_comm((2, 3), "dp23"), 4.0) == [] and book.report(_link(0, 2, "p02"), 4.0) == []
    assert len({id(i) for i in book.open.values()}) == 1
    # persisted and restored: still one incident under every key
    again = IncidentBook(100, 10.0, 0.0)
    again.load(book.state_dict())
    assert again.report(_link(2, 0, "p20"), 5.0) == [] and again.report(_comm((2, 3), "dp23"), 5.0) == []


def test_a_communicator_slow_first_is_named_by_the_link_found_later() -> None:
    book = IncidentBook(100, 10.0, 0.0)
    (first,) = book.report(_comm((2, 3), "dp23"), 1.0)
    assert first.root_cause_ranks == ()  # cannot be named yet
    (upd,) = book.report(_link(0, 2, "p02"), 2.0)
    assert upd.incident_id == first.incident_id and upd.details[NIC] == "n2" and upd.root_cause_ranks == (2,)
    assert upd.link == Link(0, 2)


def test_findings_that_share_no_host_or_too_many_stay_apart() -> None:
    book = IncidentBook(100, 10.0, 0.0)
    (a,) = book.report(_link(2, 0, "p20"), 1.0)
    (b,) = book.report(_link(1, 3, "p13"), 1.0)  # no host in common: another incident
    assert b.state == VerdictState.OPEN and b.incident_id != a.incident_id
    # the whole world slow shares every host with both: it says nothing about where, and stays its own
    (c,) = book.report(_comm((0, 1, 2, 3), "world"), 2.0)
    assert c.state == VerdictState.OPEN and c.incident_id not in (a.incident_id, b.incident_id)
    # two unnamed communicators alone never make a NIC (no transfer of either has been timed on a link)
    other = IncidentBook(100, 10.0, 0.0)
    (x,) = other.report(_comm((2, 3), "dp23"), 1.0)
    (y,) = other.report(_comm((0, 2), "dp02"), 1.0)
    assert x.incident_id != y.incident_id


def test_an_all_to_all_signature_leaves_out_the_routed_counts() -> None:
    a2a, ar = int(OpType.ALL_TO_ALL), int(OpType.ALL_REDUCE)
    ops = np.array([a2a, a2a, ar, ar])
    sig = sig_code(ops, np.zeros(4, dtype=np.int64), np.array([100, 260, 100, 260]), np.full(4, -1))
    assert sig[0] == sig[1] and sig[2] != sig[3]  # a router's draw is not a different op; an all_reduce's is


def test_a_part_seen_again_never_replaces_the_summary() -> None:
    book = IncidentBook(100, 0.0, 0.0)  # no rate limit on updates: a grown finding would update at once
    book.report(_comm((2, 3), "dp23"), 1.0)
    book.report(_link(0, 2, "p02"), 2.0)
    grown = _comm((2, 3), "dp23")
    assert book.report(grown, 30.0) == [] and book.report(_link(0, 2, "p02"), 30.0) == []
    (more,) = book.report(_link(2, 0, "p20"), 31.0)  # a new link through n2: added
    assert more.details[NIC] == "n2" and more.details[NIC_LINKS] == "0>2,2>0" and more.root_cause_ranks == (2,)


def test_an_all_to_all_late_arriver_is_judged_against_its_peers_only_where_they_did_the_same_work() -> None:
    # the expert the router sent most tokens computes longest and is late at the combine: no fault; at the
    # dispatch (the first of the pair, after the attention every member computed alike) it is one
    a2a, ar = np.array([int(OpType.ALL_TO_ALL)] * 3), np.array([int(OpType.ALL_REDUCE)])
    bf16, none = np.array([int(DType.BFLOAT16)] * 4), np.array([-1] * 4)
    sig = sig_code(np.concatenate([a2a, ar]), bf16, np.array([0, 0, 0, 4096]), none)
    sig[0] |= 1  # the combine (SlowDetector._phased: the second op of a pair)
    sig[2] = sig_code(np.array([int(OpType.SEND)]), bf16[:1], np.array([4096]), none[:1])[0]
    own = own_work(sig)
    assert own.tolist() == [True, False, True, False]
    late = _peer_late(own, np.array([4, 4, 2, 4]), np.full(4, 0.04), np.full(4, 0.02), np.full(4, 0.02),
                      AnalyzerSettings())
    assert late.tolist() == [False, True, False, True]
