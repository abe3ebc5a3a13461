"""An MoE layer on hand-built records: dispatch and combine all_to_all, then a dense all-reduce.

Each expert computes on what the router sent it, so the most loaded expert is last at the combine in
every healthy step (a different one each step). A straggling expert is last at every combine and at no
dispatch: judged with the dispatches in one baseline its slow ops alternate with healthy ones and
never fill the repeated counting, so the combine has a baseline of its own (``SlowDetector``)."""

from __future__ import annotations

import random

from analysis_factories import Comm, Probe, batches_by_tick

from ccld.bounded import RunSample, op_sampled
from ccld.records import AnomalyKind, KernelRecord, OpType, VerdictState
from ccld.streams.analysis.replay import analyze_batches

COMPUTE_S = 0.02  # attention and the router, on every rank
A2A_S = 0.002  # an all_to_all's own time once every rank is in it
JITTER_S = 0.002  # each rank's arrival, uniform up to this


def moe_job(steps: int, *, slow_rank: int | None = None, factor: float = 6.0, from_step: int = 0,
            seed: int = 5) -> list[tuple[float, KernelRecord]]:
    """``steps`` MoE layers of 4 ranks on one communicator; from ``from_step`` on ``slow_rank``'s expert
    computes ``factor`` times longer."""
    probe = Probe(world_size=4)
    world = Comm(0xE0, (0, 1, 2, 3))
    rng = random.Random(seed)
    out: list[tuple[float, KernelRecord]] = []
    t = 1.0
    for k in range(steps):
        enters = [t + COMPUTE_S + rng.uniform(0, JITTER_S) for i in range(4)]
        out += probe.ring_op(world, enters, A2A_S, op_type=OpType.ALL_TO_ALL, count=512)  # dispatch
        done = max(enters) + A2A_S
        load = [rng.uniform(0.4, 1.6) for _ in range(4)]  # what the router sent each expert, per token share
        experts = [COMPUTE_S * load[i] * (factor if i == slow_rank and k >= from_step else 1.0) for i in range(4)]
        enters = [done + experts[i] + rng.uniform(0, JITTER_S) for i in range(4)]
        out += probe.ring_op(world, enters, A2A_S, op_type=OpType.ALL_TO_ALL, count=512)  # combine
        done = max(enters) + A2A_S
        enters = [done + 0.001 + rng.uniform(0, JITTER_S) for i in range(4)]
        out += probe.ring_op(world, enters, 0.003, op_type=OpType.ALL_REDUCE, count=4096)  # dense
        t = max(enters) + 0.003
    return out


def opens(recs: list[tuple[float, KernelRecord]]) -> list:  # type: ignore[type-arg]
    return [v for v in analyze_batches(batches_by_tick(recs)) if v.state == VerdictState.OPEN]


def test_a_healthy_moe_layer_gives_no_verdict() -> None:
    assert opens(moe_job(400)) == []


def test_a_straggling_expert_is_named_at_the_combine() -> None:
    vs = opens(moe_job(400, slow_rank=2, from_step=200))
    assert [(v.kind, v.root_cause_ranks) for v in vs] == [(AnomalyKind.S1, (2,))], vs


def detailed(recs: list[tuple[float, KernelRecord]], one_in: int, *, pairs: bool) -> list[tuple[float, KernelRecord]]:
    """The DONE records a source at detail stride ``one_in`` sends: all_to_all back to back in pairs
    (``RunSample``, what the sources do) or, with ``pairs`` off, each op on its own (before)."""
    runs: dict[tuple[int, int], RunSample] = {}
    out = []
    for t, r in sorted(recs, key=lambda x: (x[1].rank, x[1].comm_hash, x[1].op_seq)):
        run = runs.setdefault((r.rank, r.comm_hash), RunSample())
        seq, k = run.key(r.op_seq, int(r.op_type), one_in) if pairs else (r.op_seq, one_in)
        if op_sampled(r.comm_hash, seq, k):
            out.append((t, r))
    return sorted(out, key=lambda x: x[0])


def test_a_straggling_expert_is_named_from_the_details_a_source_sends_at_stride_8() -> None:
    # the MoE layer runs 60 ops a second: a source details about one in 8 (K = 8). Sent in pairs, a
    # dispatch comes with its combine and the combine's baseline stays apart; sent one by one (the real
    # gloo job before RunSample), no verdict named it from the combines' history. Now the ops that land
    # in the dispatch's baseline are judged against the peers (the dispatch follows the same work on
    # every rank), and the combines among them name the straggler: 6x its peers' compute, op after op
    recs = moe_job(400, slow_rank=2, from_step=200)
    for pairs in (True, False):
        vs = opens(detailed(recs, 8, pairs=pairs))
        assert [(v.kind, v.root_cause_ranks) for v in vs] == [(AnomalyKind.S1, (2,))], (pairs, vs)
    # and healthy: nothing, however they are sent (the most loaded expert, last at a combine, changes each step)
    assert opens(detailed(moe_job(400), 8, pairs=True)) == []
    assert opens(detailed(moe_job(400), 8, pairs=False)) == []
