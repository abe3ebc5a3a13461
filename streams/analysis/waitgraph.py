"""Rank-level wait-for graph: which ranks wait on which, and which ranks are the roots.

Pure functions over plain data, shared by the Flight Recorder import and the live analyzer
(``waitfor``). The input maps a rank to the ranks it waits on (from its blocking operation:
the members of the collective that have not reached it, the peer of a blocked send or recv).
The roots are the sinks of the graph: a rank that waits on nobody and that somebody waits on.
Waiting is transitive, so several ranks can form a cycle (two ranks each blocked on the
other, or every member of a collective that everyone entered and nobody finishes); a cycle
with no way out is a root *set*: a terminal strongly connected component. Every other rank
that reaches a root is its victim. Nodes are plain ints: the live analyzer puts each stalled
op between its ranks as a node of its own (a negative id), which keeps a communicator's edges
to one per member and leaves which rank reaches which unchanged.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K", bound=Hashable)

__all__ = ["RootSet", "root_sets", "strongly_connected", "terminal_components", "victims_by", "victims_of"]


@dataclass(frozen=True)
class RootSet:
    """One root cause of the graph: its ranks and every rank that (transitively) waits on it."""

    ranks: frozenset[int]
    victims: frozenset[int]
    cyclic: bool  # more than one rank (or a self-loop): they wait on each other


def _normalise(waits: Mapping[int, Iterable[int]]) -> dict[int, frozenset[int]]:
    edges = {r: frozenset(w) for r, w in waits.items()}
    none: frozenset[int] = frozenset()
    for t in frozenset().union(*edges.values()).difference(edges):
        edges[t] = none
    return edges


def strongly_connected(waits: Mapping[int, Iterable[int]]) -> list[frozenset[int]]:
    """Strongly connected components (Tarjan, iterative: a 10,000-rank chain must not hit the recursion limit)."""
    return _components(_normalise(waits))


def _components(edges: Mapping[int, frozenset[int]]) -> list[frozenset[int]]:
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[frozenset[int]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[int, list[int]]] = [(start, sorted(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(edges[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp: set[int] = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.add(top)
                    if top == node:
                        break
                out.append(frozenset(comp))
    return out


def _reverse(edges: Mapping[int, frozenset[int]]) -> dict[int, set[int]]:
    reverse: dict[int, set[int]] = {r: set() for r in edges}
    for r, ws in edges.items():
        for w in ws:
            reverse[w].add(r)
    return reverse


def victims_of(waits: Mapping[int, Iterable[int]], targets: Iterable[int]) -> frozenset[int]:
    """Every rank that reaches one of ``targets`` through wait-for edges (the targets excluded)."""
    return _victims(_reverse(_normalise(waits)), targets)


def victims_by(waits: Mapping[int, Iterable[int]], groups: Mapping[K, Iterable[int]]) -> dict[K, frozenset[int]]:
    """``victims_of`` each group of targets, with the reverse graph built once."""
    reverse = _reverse(_normalise(waits))
    return {k: _victims(reverse, targets) for k, targets in groups.items()}


def _victims(reverse: Mapping[int, set[int]], targets: Iterable[int]) -> frozenset[int]:
    goal = set(targets)
    seen: set[int] = set()
    todo = [t for t in goal if t in reverse]
    while todo:
        node = todo.pop()
        for prev in reverse[node]:
            if prev not in seen and prev not in goal:
                seen.add(prev)
                todo.append(prev)
    return frozenset(seen)


def terminal_components(waits: Mapping[int, Iterable[int]]) -> list[frozenset[int]]:
    """The strongly connected components that wait on nothing outside themselves: sinks and closed cycles.

    Cheaper than ``root_sets`` where many sinks share their victims (a communicator with
    hundreds of missing ranks): it computes no victims; ``victims_of`` a group of them does.
    """
    return _terminal(_normalise(waits))


def _terminal(edges: Mapping[int, frozenset[int]]) -> list[frozenset[int]]:
    comp_of: dict[int, frozenset[int]] = {}
    comps = _components(edges)
    for comp in comps:
        for r in comp:
            comp_of[r] = comp
    return [comp for comp in comps if all(comp_of[w] is comp for r in comp for w in edges[r])]


def root_sets(waits: Mapping[int, Iterable[int]]) -> list[RootSet]:
    """The roots of a wait-for graph, most victims first (ties: lowest rank first).

    A root set is a strongly connected component that waits on nothing outside itself and
    either is waited on by some other rank or is a cycle (ranks blocked on each other). A
    rank that waits on nobody and that nobody waits on is idle, not a root.
    """
    edges = _normalise(waits)
    reverse = _reverse(edges)  # once: a job with many sinks must not rebuild it per sink
    out = []
    for comp in _terminal(edges):
        cyclic = len(comp) > 1 or any(r in edges[r] for r in comp)
        victims = _victims(reverse, comp)
        if victims or cyclic:
            out.append(RootSet(comp, victims, cyclic))
    out.sort(key=lambda s: (-len(s.victims), min(s.ranks)))
    return out
