"""An expert-parallel (MoE) job, simulated: all_to_all dispatch and combine over expert groups.

32 ranks, 4 GPUs per node, tensor groups of 4, expert groups of 4 data-parallel replicas (one per
node, so every exchange of an expert group crosses the network). Each rule on a fault of the expert
groups' links or ranks: a dead link is an H3 on that link (its two ends stay inside the all_to_all,
the others leave), a slow link an S2 naming it, a rank that computes slowly and whose expert link is
slow an S3 naming both, a stopped rank an H1; the healthy job, whose experts get different loads
every step, gets nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from ccld.errors import ScenarioError
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import AnomalyKind, Link, OpType, Verdict, VerdictState
from ccld.streams.analysis.replay import analyze_batches

JOB: dict[str, Any] = {
    "id": "moe", "seed": 21, "ranks": 32, "gpus_per_node": 4, "layout": {"tp": 4, "pp": 1, "dp": 8, "ep": 4},
    "channels": 4, "jitter": 0.03, "workload": {"microbatches": 2, "layers": 2, "layer_ms": 4.0, "topk": 2},
}


def scenario(faults: list[dict[str, Any]], duration_s: float = 60.0, **over: Any) -> Scenario:
    return Scenario.from_dict({**JOB, "duration_s": duration_s, "faults": faults, **over})


def opened(faults: list[dict[str, Any]], duration_s: float = 60.0) -> list[Verdict]:
    """Each incident's newest verdict (an S2 found first becomes S3 once the late arrival shows)."""
    vs = analyze_batches(simulate(scenario(faults, duration_s)), tick_s=1.0)
    return list({v.incident_id: v for v in vs}.values())


def test_the_healthy_moe_job_sends_all_to_all_of_routed_sizes_and_gets_no_verdict() -> None:
    sc = scenario([], duration_s=40.0)
    counts: dict[int, set[int]] = {}
    verdicts = []
    batches = list(simulate(sc))
    for _, b in batches:
        a2a = b.columns["op_type"] == int(OpType.ALL_TO_ALL)
        for r, c in zip(b.columns["rank"][a2a].tolist(), b.columns["count"][a2a].tolist(), strict=True):
            counts.setdefault(r, set()).add(c)
        assert (b.columns["comm_size"][a2a] == 4).all()  # a batch is one host's: several communicators
    assert sorted(counts) == list(range(32))  # every rank is in an expert group
    assert all(len(c) >= 4 for c in counts.values())  # what the router sends a rank differs from op to op
    verdicts = [v for v in analyze_batches(batches, tick_s=1.0) if v.state == VerdictState.OPEN]
    assert verdicts == []


@pytest.mark.parametrize(("over", "src", "dst", "others"), [
    ({}, 5, 13, {1, 9}),
    # two stages (ep-H3-32-032 of the expert suite): the two ends are first diagnosed before they reported
    # frozen counters for a second, and the ranks of the next stage wait for them in send/recv; the
    # provisional H1 must give way to the H3 in the job's wait-for roots too
    ({"seed": 324893, "gpus_per_node": 8, "layout": {"tp": 4, "pp": 2, "dp": 4, "ep": 4}, "channels": 8,
      "clock_skew_s": 3.09, "jitter": 0.013, "clock_drift_ppm": 20.9,
      "workload": {"microbatches": 4, "layers": 2, "layer_ms": 6.56, "dp_buckets": 2, "pause_rate": 0.02}},
     24, 16, {0, 8}),
])
def test_a_dead_expert_link_is_an_h3_on_that_link_not_an_h1(over: dict[str, Any], src: int, dst: int,
                                                               others: set[int]) -> None:
    sc = scenario([{"kind": "H3", "comm": "ep", "rank": src, "peer": dst, "onset_s": 23.7}], **over)
    (v,) = list({v.incident_id: v for v in analyze_batches(simulate(sc), tick_s=1.0)}.values())
    assert v.kind == AnomalyKind.H3 and v.link == Link(src, dst) and set(v.root_cause_ranks) == {src, dst}
    assert v.op_type == "all_to_all" and "left inside all_to_all" in v.evidence
    assert others <= set(v.affected_ranks)  # the group's other members wait for them


def test_a_slow_expert_link_is_named() -> None:
    (v,) = opened([{"kind": "S2", "comm": "ep", "rank": 14, "peer": 2, "onset_s": 25, "factor": 0.3}])
    assert v.kind == AnomalyKind.S2 and v.link == Link(14, 2) and v.root_cause_ranks[0] == 14
    assert v.op_type == "all_to_all"


def test_a_slow_rank_whose_expert_link_is_slow_is_s3() -> None:
    vs = opened([{"kind": "S3", "comm": "ep", "rank": 14, "peer": 6, "onset_s": 25, "compute_factor": 2.5,
                  "link_factor": 0.3}])
    (v,) = vs
    assert v.kind == AnomalyKind.S3 and v.root_cause_ranks[0] == 14 and v.link == Link(14, 6)


def test_a_stopped_rank_in_an_moe_job_is_h1() -> None:
    (v,) = opened([{"kind": "H1", "rank": 22, "onset_s": 25}])
    assert v.kind == AnomalyKind.H1 and v.root_cause_ranks == (22,)


def test_expert_groups_are_consecutive_replicas_of_one_stage_and_tensor_index() -> None:
    sc = scenario([])
    assert sc.ep_members(5) == (9, 13, 1, 5)  # replicas 0..3 of tensor index 1 (stride tp*pp = 4), from the next
    assert sc.ep_members(21) == (25, 29, 17, 21)  # replicas 4..7
    assert sc.link_peers("ep", 13) == (1, 5, 9)
    assert all(sc.node_of(a) != sc.node_of(b) for _, a, b in sc.nic_links(1))
    assert {("ep", 4, 0), ("ep", 4, 8), ("ep", 4, 12)} <= set(sc.nic_links(1))


@pytest.mark.parametrize(("over", "message"), [
    ({"layout": {"tp": 4, "pp": 1, "dp": 8, "ep": 3}}, "must divide the data-parallel size 8"),
    ({"workload": None}, "needs the Megatron-style workload"),
    ({"workload": {"layers": 1, "moe_every": 2}}, "no layer would be a mixture of experts"),
    ({"faults": [{"kind": "S2", "comm": "ep", "rank": 5, "peer": 6}]}, "link 5->6 does not exist"),
])
def test_bad_expert_layouts_are_rejected_with_a_clear_message(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        Scenario.from_dict({**JOB, **over})


def test_experts_taking_turns_last_are_not_named_while_a_link_slows_the_job() -> None:
    # heldout-expert's ep-S2-128-004, which named rank 63 (S1) beside the slow link: in an expert group
    # of two, the more loaded expert is last at the combine, each about half the time; 2 of 3 slow ops,
    # one of them late for no compute of its own, is no straggler
    sc = Scenario.from_dict({
        "id": "ep-S2-128-004", "seed": 22145, "ranks": 128, "gpus_per_node": 8,
        "layout": {"tp": 8, "pp": 4, "dp": 4, "ep": 2}, "channels": 32, "duration_s": 49.1, "clock_skew_s": 0.82,
        "jitter": 0.053, "clock_drift_ppm": 120.9,
        "workload": {"microbatches": 1, "layers": 2, "layer_ms": 7.31, "hidden": 2048, "seq_parallel": True,
                     "dp_buckets": 2, "eval_every": 25, "moe_every": 1, "topk": 2},
        "faults": [{"kind": "S2", "rank": 71, "onset_s": 24.1, "peer": 103, "factor": 0.182, "comm": "ep"}],
    })
    vs = list({v.incident_id: v for v in analyze_batches(simulate(sc), tick_s=1.0)}.values())
    got = [(v.kind, v.link) for v in vs]
    assert got == [(AnomalyKind.S2, Link(71, 103))], [(v.kind, v.root_cause_ranks) for v in vs]
