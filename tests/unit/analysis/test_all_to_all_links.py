"""A dead link inside an all_to_all: its two ends stay in the op, every other member leaves.

An all_to_all is pairwise exchanges, so a member leaves once its own are done: a dead link ``a -> b``
holds exactly ``a`` and ``b`` inside (``a`` has taken in data it cannot pass on: RecvCount ahead of
SendCount; ``b``'s RecvCount is behind) while the others go on and wait for them in the next op.
That is an H3 on the link, not an H1 of two ranks "that never entered" the next op. Hand-built
records here; ``test_expert_parallel.py`` has the simulated MoE job.
"""

from __future__ import annotations

import pytest
from analysis_factories import Comm, Probe, batches_by_tick, healthy_steps
from test_hangs import stuck

from ccld.records import AnomalyKind, KernelRecord, Link, OpType, Status, Verdict, VerdictState
from ccld.streams.analysis.replay import analyze_batches

A2A = OpType.ALL_TO_ALL


def left_inside(op: OpType, left: tuple[int, ...], heartbeat: bool = True) -> list[Verdict]:
    """20 healthy ops on a 4-rank communicator, then op k: ``left`` stay inside it with frozen counters
    (the first of them with its RecvCount 8 ahead, the second 8 behind); the others finish it and wait
    inside op k + 1. ``heartbeat`` False: the left ranks report once and fall silent (a stopped process)."""
    probe = Probe()
    comm = Comm(0xE1, (0, 1, 2, 3))
    recs: list[tuple[float, KernelRecord]] = healthy_steps(probe, comm, 20, op_type=op)
    k = comm.seq
    t = 41.0
    for i in range(comm.size):
        if i in left:
            send, recv = (10, 18) if i == left[0] else (18, 10) if i == left[1] else (14, 14)
            recs += stuck(probe, comm, i, k, t, 100.0 if heartbeat else t + 0.5, send=send, recv=recv, op_type=op)
        else:
            recs.append((t + 0.3, probe.rec(comm, i, k, Status.DONE, t, t + 0.3, t + 0.3, send=64, recv=64,
                                            op_type=op)))
            recs += stuck(probe, comm, i, k + 1, t + 0.5, 100.0, op_type=op)
    return [v for v in analyze_batches(batches_by_tick(recs)) if v.state == VerdictState.OPEN]


def test_two_ranks_left_in_an_all_to_all_are_an_h3_on_their_link() -> None:
    (v,) = left_inside(A2A, (1, 2))
    assert v.kind == AnomalyKind.H3 and v.link == Link(1, 2) and set(v.root_cause_ranks) == {1, 2}
    assert v.op_type == "all_to_all" and set(v.affected_ranks) == {0, 3}
    assert "left inside all_to_all" in v.evidence


def test_the_link_points_from_the_rank_whose_data_piled_up() -> None:
    (v,) = left_inside(A2A, (3, 0))
    assert v.kind == AnomalyKind.H3 and v.link == Link(3, 0)


@pytest.mark.parametrize(("op", "left", "heartbeat"), [
    (OpType.ALL_REDUCE, (1, 2), True),  # a ring holds every member: two left behind are not a link
    (A2A, (0, 1, 2), True),  # three left: not one link
    (A2A, (1, 2), False),  # left and silent: stopped processes, not a dead link
])
def test_other_ranks_left_behind_stay_h1(op: OpType, left: tuple[int, ...], heartbeat: bool) -> None:
    vs = left_inside(op, left, heartbeat)
    assert vs and all(v.kind == AnomalyKind.H1 for v in vs), [(v.kind, v.root_cause_ranks) for v in vs]
    assert set().union(*(v.root_cause_ranks for v in vs)) == set(left)
