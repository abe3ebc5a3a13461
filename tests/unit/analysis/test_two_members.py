"""A collective of two members names a late arriver only when it leads nearly every slow op.

The false-alarm run's healthy 2-rank data-parallel job (seed 38's ``fa-38-0015-dp``: pauses of 667 ms on
either rank, 1.2 % of its seconds) got an S1 on rank 1: three reduce-scatters slow within a few seconds,
rank 1 last in two of them, rank 0 in the third. With two members, each pausing now and then, leading 2
of 3 is a coin's luck (`culprit_share`, 0.6, is sized for groups where a pause's rank is one of many);
a rank that is slow leads nearly all of them. So such a group asks `pair_culprit_share` (0.8).
"""

from __future__ import annotations

from analysis_factories import Comm, Probe, batches_by_tick, opens

from ccld.records import AnomalyKind, KernelBatch, KernelRecord, OpType
from ccld.settings import AnalyzerSettings


def two_ranks(late: dict[int, tuple[int, float]]) -> list[tuple[float, KernelBatch]]:
    """A 2-rank data-parallel job: one 50-ms reduce-scatter a second; at step k, ``late[k]`` = (rank, seconds)
    makes that rank arrive so much later (a pause of its own, or its slow compute)."""
    probe = Probe(world_size=2)
    dp = Comm(0x7A, (0, 1))
    recs: list[tuple[float, KernelRecord]] = []
    for k in range(120):
        base = 1.0 + k
        enters = [base + 0.003 * (k % 2), base + 0.003 * ((k + 1) % 2)]
        if k in late:
            rank, s = late[k]
            enters[rank] += s
        recs += probe.ring_op(dp, enters, 0.05, op_type=OpType.REDUCE_SCATTER)
    return batches_by_tick(recs)


#: both ranks pause half a second now and then, close together: rank 1 in 6 of 9 of the slow steps
PAUSES = {k: (0 if k in (42, 44, 47) else 1, 0.5) for k in range(40, 49)}


def test_pauses_of_both_members_of_a_pair_are_no_slow_rank() -> None:
    assert opens(two_ranks(PAUSES)) == []
    # at the share groups of many ask, rank 1's lead of 2 of 3 named it
    vs = opens(two_ranks(PAUSES), AnalyzerSettings(pair_culprit_share=0.6))
    assert [(v.kind, v.root_cause_ranks) for v in vs] == [(AnomalyKind.S1, (1,))]


def test_a_slow_member_of_a_pair_is_named_though_its_peer_pauses_once() -> None:
    # rank 1 computes 200 ms longer from step 40 on; rank 0 pauses once among its slow steps
    slow = {k: (1, 0.2) for k in range(40, 120)}
    slow[50] = (0, 0.5)
    vs = opens(two_ranks(slow))
    assert [(v.kind, v.root_cause_ranks) for v in vs] == [(AnomalyKind.S1, (1,))]
