"""The rank-level wait-for graph: roots are sinks somebody waits on, cycles are root sets, the rest are victims."""

from __future__ import annotations

from ccld.streams.analysis.waitgraph import RootSet, root_sets, strongly_connected, victims_of


def test_chain_has_its_sink_as_the_only_root() -> None:
    # 0 waits on 1 (tensor group), 1 on 2 (pipeline), 2 waits on nobody: 2 is the root
    assert root_sets({0: [1], 1: [2], 2: [], 3: []}) == [RootSet(frozenset({2}), frozenset({0, 1}), False)]


def test_idle_rank_is_not_a_root_and_two_roots_are_two_sets() -> None:
    roots = root_sets({0: [1], 2: [3], 4: [3], 5: []})
    assert [(sorted(r.ranks), sorted(r.victims)) for r in roots] == [([3], [2, 4]), ([1], [0])]


def test_terminal_cycle_is_one_root_set_and_a_cycle_with_an_exit_is_not() -> None:
    [deadlock] = root_sets({0: [1], 1: [0], 2: [0]})
    assert deadlock.ranks == {0, 1} and deadlock.victims == {2} and deadlock.cyclic
    # 0 and 1 wait on each other and on 5: 5 is the root, the cycle its victim
    assert root_sets({0: [1, 5], 1: [0]}) == [RootSet(frozenset({5}), frozenset({0, 1}), False)]
    assert root_sets({7: [7]}) == [RootSet(frozenset({7}), frozenset(), True)]


def test_components_and_victims_on_a_long_chain_without_recursion() -> None:
    n = 20_000
    chain = {r: [r + 1] for r in range(n)}
    assert len(strongly_connected(chain)) == n + 1
    assert victims_of(chain, [n]) == frozenset(range(n))
    [root] = root_sets(chain)
    assert root.ranks == {n} and len(root.victims) == n
