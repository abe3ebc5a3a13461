"""The live analyzer's wait-for relation: victims are not culprits.

The rank-level graph of the Flight Recorder import (``waitgraph``), from each rank's blocking
op: every rank inside a stalled op waits on the ranks that op waits for. In an H1
communicator those are its missing ranks (the members that have not entered the op); the
roots are the sinks somebody waits on. Rank A waits in communicator X for B; if B itself
waits inside an op of communicator Y for C, and C is in no stalled op at all, C is the root
cause and A and B are affected. Each stalled op is a node between its ranks (``op_node``):
the ranks inside wait on the op, the op on its missing ranks; A reaches B exactly as in the
plain rank graph, with one edge per member instead of one per (waiting, missing) pair.

An H2 or H3 communicator (mismatch, frozen link: everyone entered) is a root by itself: its
op node waits on nobody, and its culprits are the root ranks. Waiting does not pass through
a broken op: if one of its culprits also waits in another communicator for some rank, that
rank is an independent root, and only the culprit (not everyone in the broken op) is its
victim.

One finding per primary communicator. An H1 root belongs to the H1 communicator where it has
been awaited longest (``stall_s``; ties: the lowest id), and so does a set of ranks that wait
on each other with no way out (A waits in X for B while B waits in Y for A: a deadlock); all
of a cycle's ranks are roots of one H1 finding. A cycle with a way out is not a root: it
waits on whatever it leads to. Every rank that (transitively) waits on a finding's roots is
affected, the roots themselves excepted; ``via`` lists the communicators whose waiting ranks
lead there (the primary one included).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ccld.records import AnomalyKind
from ccld.streams.analysis.hangs import CommDiag
from ccld.streams.analysis.waitgraph import terminal_components, victims_by


@dataclass(frozen=True)
class HangRoot:
    """A root cause of a hang: the communicator where it shows, its kind and culprit ranks."""

    kind: AnomalyKind
    cid: int  # primary communicator
    roots: tuple[int, ...]  # global ranks
    affected: tuple[int, ...]
    diag: CommDiag
    via: tuple[int, ...]  # communicators whose waiting ranks lead here


def op_node(cid: int) -> int:
    """The graph node of communicator ``cid``'s stalled op: -2 - cid (ranks are >= 0, -1 means unseen)."""
    return -2 - cid


def op_cid(node: int) -> int:
    """The communicator of an op node (``op_node`` inverted)."""
    return -2 - node


def wait_edges(diags: Mapping[int, CommDiag]) -> dict[int, set[int]]:
    """The wait-for graph of the stalled communicators: each rank inside a stalled op waits on the op
    (``op_node``), an H1 op on its missing ranks, an H2/H3 op on nobody.

    Through the op nodes, rank A reaches rank B exactly when A waits in an op that B has not
    entered: the rank-level relation, with one edge per member instead of one per pair of a
    waiting and a missing rank (half of a 4,096-rank communicator waiting on the other half).
    """
    waits: dict[int, set[int]] = {}
    for cid, d in diags.items():
        node = op_node(cid)
        for r in d.waiting.tolist():
            waits.setdefault(r, set()).add(node)
        missing = d.missing.tolist() if d.kind == AnomalyKind.H1 else []
        waits[node] = {m for m in missing if m >= 0}
    return waits


def resolve(diags: Mapping[int, CommDiag], stall_s: Mapping[int, float]) -> list[HangRoot]:
    """Root findings of the stalled communicators ``diags`` (keyed by communicator id)."""
    waits = wait_edges(diags)
    awaited_in: dict[int, list[int]] = {}  # rank -> H1 communicators where it is missing
    for cid in diags:
        for m in waits[op_node(cid)]:
            awaited_in.setdefault(m, []).append(cid)

    roots: dict[tuple[str, int], set[int]] = {}
    nodes: dict[tuple[str, int], set[int]] = {}  # the root sets' graph nodes, op nodes included
    # every terminal component has somebody waiting on it (ranks wait on ops, ops on ranks) or is a cycle
    for comp in terminal_components(waits):
        ranks = {r for r in comp if r >= 0}
        if ranks:
            # an H1 root (or ranks waiting on each other with no way out) belongs to the H1
            # communicator where it has been awaited longest
            cids = {c for r in ranks for c in awaited_in.get(r, ())}
            cid = min(cids, key=lambda c: (-stall_s.get(c, 0.0), c))
            key = ("H1", cid)
        else:
            cid = op_cid(next(iter(comp)))
            d = diags[cid]
            if d.kind == AnomalyKind.H1:
                continue  # an H1 op whose missing members were never seen: nobody to name
            key, ranks = (d.kind.value, cid), set(d.culprits.tolist())  # H2/H3: its culprits are the roots
        roots.setdefault(key, set()).update(ranks)
        nodes.setdefault(key, set()).update(comp)
    victims = victims_by(waits, nodes)

    out: list[HangRoot] = []
    for key in sorted(roots):
        kind, cid = key
        named = roots[key]
        if not named:
            continue  # a broken op without a culprit named
        reach = nodes[key] | victims[key]
        affected = tuple(sorted(r for r in reach if r >= 0 and r not in named))
        via = tuple(sorted(op_cid(n) for n in reach if n < -1))
        out.append(HangRoot(AnomalyKind(kind), cid, tuple(sorted(named)), affected, diags[cid], via))
    return out
