"""The live analyzer's wait-for relation (``waitfor.resolve``) on hand-built communicator diagnoses.

It is the rank-level wait-for relation of ``waitgraph`` (the one the Flight Recorder import
uses), with each stalled op as a node between the ranks: a rank inside a stalled op waits on
the op, an H1 op on its missing ranks, a broken H2/H3 op on nobody (its culprits are the
roots). The roots are the terminal components somebody waits on.
"""

from __future__ import annotations

import numpy as np

from ccld.records import AnomalyKind
from ccld.streams.analysis.hangs import CommDiag
from ccld.streams.analysis.waitfor import HangRoot, op_node, resolve, wait_edges
from ccld.streams.analysis.waitgraph import terminal_components, victims_by

H1, H2, H3 = AnomalyKind.H1, AnomalyKind.H2, AnomalyKind.H3


def _a(xs: list[int]) -> np.ndarray:
    return np.asarray(xs, dtype=np.int64)


def h1(cid: int, waiting: list[int], missing: list[int]) -> CommDiag:
    return CommDiag(cid, 7, 0, H1, _a(waiting), _a(missing))


def broken(cid: int, kind: AnomalyKind, waiting: list[int], culprits: list[int]) -> CommDiag:
    link = (culprits[0], culprits[1]) if kind == H3 and len(culprits) == 2 else None
    return CommDiag(cid, 7, 0, kind, _a(waiting), _a([]), _a(culprits), link=link)


def run(*diags: CommDiag, stall: dict[int, float] | None = None) -> list[HangRoot]:
    by_cid = {d.cid: d for d in diags}
    return resolve(by_cid, stall if stall is not None else {c: 20.0 for c in by_cid})


def rank_level(waits: dict[int, set[int]]) -> dict[int, set[int]]:
    """The graph without its op nodes: each rank -> the ranks it waits on."""
    return {r: {m for op in ops for m in waits[op]} for r, ops in waits.items() if r >= 0}


def summary(roots: list[HangRoot]) -> list[tuple[AnomalyKind, int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    return [(r.kind, r.cid, r.roots, r.affected, r.via) for r in roots]


def test_chain_across_communicators_names_the_rank_in_no_op() -> None:
    # A=0 waits in X=1 for B=1; B waits in Y=2 for C=2; C is in no stalled op
    out = run(h1(1, [0], [1]), h1(2, [1], [2]))
    assert summary(out) == [(H1, 2, (2,), (0, 1), (1, 2))]
    assert out[0].diag.cid == 2


def test_each_waiting_rank_waits_on_its_op_and_the_op_on_the_ranks_not_in_it() -> None:
    waits = wait_edges({1: h1(1, [0], [1]), 2: h1(2, [1], [2])})
    assert waits == {0: {op_node(1)}, op_node(1): {1}, 1: {op_node(2)}, op_node(2): {2}}
    assert rank_level(waits) == {0: {1}, 1: {2}}


def test_a_rank_waiting_in_another_stalled_communicator_is_a_victim_not_a_root() -> None:
    # ranks 4, 5 wait in X=10 for 6 and 7; 7 is inside Y=11 waiting for 8: only 6 and 8 are roots
    out = run(h1(10, [4, 5], [6, 7]), h1(11, [7, 9], [8]), stall={10: 30.0, 11: 20.0})
    assert summary(out) == [(H1, 10, (6,), (4, 5), (10,)), (H1, 11, (8,), (4, 5, 7, 9), (10, 11))]


def test_two_independent_roots_are_two_findings() -> None:
    out = run(h1(3, [0, 1, 3], [2]), h1(4, [4, 5, 6], [7]))
    assert summary(out) == [(H1, 3, (2,), (0, 1, 3), (3,)), (H1, 4, (7,), (4, 5, 6), (4,))]


def test_root_belongs_to_the_communicator_where_it_is_awaited_longest() -> None:
    # rank 9 is missing in X=1 (stalled 20 s) and W=2 (40 s): one finding, in W; X leads there too
    out = run(h1(1, [0, 1], [9]), h1(2, [2, 3], [9]), stall={1: 20.0, 2: 40.0})
    assert summary(out) == [(H1, 2, (9,), (0, 1, 2, 3), (1, 2))]
    # equal stalls: the lowest communicator id
    out = run(h1(1, [0, 1], [9]), h1(2, [2, 3], [9]))
    assert summary(out) == [(H1, 1, (9,), (0, 1, 2, 3), (1, 2))]
    # several roots with the same primary communicator are one finding
    out = run(h1(5, [0, 1], [2, 3]))
    assert summary(out) == [(H1, 5, (2, 3), (0, 1), (5,))]


def test_h3_communicator_is_the_root_of_h1_victims_waiting_on_its_members() -> None:
    # tensor group Y=20 (ranks 0-3) froze on link 1->2; ranks 4, 5 wait in X=21 for rank 1 (inside Y),
    # rank 6 waits in Z=22 for rank 3 (inside Y too)
    out = run(broken(20, H3, [0, 1, 2, 3], [1, 2]), h1(21, [4, 5], [1]), h1(22, [6], [3]))
    assert summary(out) == [(H3, 20, (1, 2), (0, 3, 4, 5, 6), (20, 21, 22))]
    assert out[0].diag.link == (1, 2)


def test_h2_and_h3_communicators_are_roots_even_with_nobody_else_waiting() -> None:
    # a two-rank send/recv pair where both ends are culprits: no victims, still a root
    out = run(broken(30, H3, [4, 5], [4, 5]), broken(31, H2, [0, 1, 2, 3], [2]))
    assert summary(out) == [(H2, 31, (2,), (0, 1, 3), (31,)), (H3, 30, (4, 5), (), (30,))]
    # a broken op with no culprit named is no finding
    assert run(broken(32, H3, [0, 1], [])) == []


def test_culprit_that_also_waits_elsewhere_keeps_both_findings() -> None:
    # rank 1 is a culprit of H3 group Y=40 and also waits in X=41 (a pipeline pair) for rank 7, in no op:
    # two independent roots; Y's other members wait on the broken op, not on rank 7
    out = run(broken(40, H3, [0, 1, 2, 3], [1, 2]), h1(41, [1], [7]))
    assert summary(out) == [(H1, 41, (7,), (1,), (41,)), (H3, 40, (1, 2), (0, 3), (40,))]


def test_cycle_of_ranks_waiting_on_each_other_is_one_root_set() -> None:
    """A deadlock: rank 0 waits in X=1 for rank 1, rank 1 waits in Y=2 for rank 0.

    Nobody outside the cycle holds it up, so the cycle itself is the root set: both ranks are
    roots of one H1 finding, in the communicator where a cycle member is awaited longest;
    ranks that wait on the cycle (5 in Z=3, where 0 is missing too) are affected.
    """
    diags = (h1(1, [0], [1]), h1(2, [1], [0]), h1(3, [5], [0]))
    out = run(*diags, stall={1: 30.0, 2: 40.0, 3: 10.0})
    assert summary(out) == [(H1, 2, (0, 1), (5,), (1, 2, 3))]
    out = run(*diags, stall={1: 30.0, 2: 20.0, 3: 10.0})
    assert summary(out) == [(H1, 1, (0, 1), (5,), (1, 2, 3))]


def test_cycle_with_a_way_out_is_not_a_root() -> None:
    # 0 and 1 wait on each other, and 0 also waits in Z=3 for rank 9 in no op: 9 is the root, the cycle its victim
    out = run(h1(1, [0], [1]), h1(2, [1], [0]), h1(3, [0, 4], [9]))
    assert summary(out) == [(H1, 3, (9,), (0, 1, 4), (1, 2, 3))]


def test_ranks_waiting_on_members_never_seen_have_no_root() -> None:
    # the missing member was never seen (-1): nothing to name, and the rank waiting on the
    # waiting rank 1 is its victim, not a reason to blame rank 1
    assert run(h1(1, [0, 1], [-1])) == []
    assert run(h1(1, [1], [-1]), h1(2, [3], [1])) == []
    assert summary(run(h1(1, [0], [-1, 2]))) == [(H1, 1, (2,), (0,), (1,))]


def test_broken_op_is_a_sink_of_its_own_below_the_unseen_marker() -> None:
    d = broken(40, H3, [0, 1, 2, 3], [1, 2])
    assert op_node(40) < -1 and op_node(0) < -1
    assert wait_edges({40: d}) == {
        0: {op_node(40)},
        1: {op_node(40)},
        2: {op_node(40)},
        3: {op_node(40)},
        op_node(40): set(),
    }


def test_graph_grows_with_the_members_not_with_waiting_times_missing() -> None:
    # half of a 4,096-rank communicator waits on the other half: 4,096 edges, not 2,048 x 2,048
    d = h1(0, list(range(0, 4096, 2)), list(range(1, 4096, 2)))
    waits = wait_edges({0: d})
    assert sum(len(w) for w in waits.values()) == 4096
    out = run(d)
    assert summary(out) == [(H1, 0, tuple(range(1, 4096, 2)), tuple(range(0, 4096, 2)), (0,))]


def test_terminal_components_and_grouped_victims() -> None:
    waits = {0: [1], 1: [2], 3: [2], 4: [5], 5: [4], 6: [4], 7: [8], 8: [7, 9]}
    assert sorted(map(sorted, terminal_components(waits))) == [[2], [4, 5], [9]]
    assert victims_by(waits, {"a": [2], "b": [4, 5], "ab": [2, 4], "none": [0]}) == {
        "a": frozenset({0, 1, 3}),
        "b": frozenset({6}),
        "ab": frozenset({0, 1, 3, 5, 6}),
        "none": frozenset(),
    }


def test_long_chain_across_many_communicators_without_recursion() -> None:
    n = 5_000
    diags = [h1(c, [c], [c + 1]) for c in range(n)]
    out = run(*diags)
    assert len(out) == 1
    assert out[0].roots == (n,) and out[0].cid == n - 1 and len(out[0].affected) == n and len(out[0].via) == n
