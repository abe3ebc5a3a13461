"""The cross-communicator wait-for relation: victims are not culprits.

Rank A waits in communicator X for B (B has not entered X's op); if B itself waits inside an op
of communicator Y for C, and C is in no collective at all, C is the root cause and A and B are
affected. Communicators whose stall has no missing rank (H2 mismatch, H3 frozen counters) are
roots themselves. One root finding per primary communicator, with every rank that (transitively)
waits for it as affected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ccld.records import AnomalyKind
from ccld.streams.analysis.hangs import CommDiag


@dataclass(frozen=True)
class HangRoot:
    """A root cause of a hang: the communicator where it shows, its kind and culprit ranks."""

    kind: AnomalyKind
    cid: int  # primary communicator
    roots: tuple[int, ...]  # global ranks
    affected: tuple[int, ...]
    diag: CommDiag
    via: tuple[int, ...]  # communicators whose waiting ranks lead here


def resolve(diags: Mapping[int, CommDiag], stall_s: Mapping[int, float]) -> list[HangRoot]:
    """Root findings of the stalled communicators ``diags`` (keyed by communicator id)."""
    waiting_in: dict[int, list[int]] = {}
    for cid, d in diags.items():
        for r in d.waiting.tolist():
            waiting_in.setdefault(r, []).append(cid)
    edges: dict[int, set[int]] = {}
    root_comms: dict[int, list[int]] = {}  # root rank -> communicators where it is missing
    for cid, d in diags.items():
        if d.kind != AnomalyKind.H1:
            continue
        targets = edges.setdefault(cid, set())
        for m in d.missing.tolist():
            if m < 0:
                continue
            ys = [y for y in waiting_in.get(m, ()) if y != cid]
            if ys:
                targets.update(ys)
            elif m not in waiting_in:
                root_comms.setdefault(m, []).append(cid)
    # each H1 root rank belongs to the communicator where it has been awaited longest
    primary_of: dict[int, int] = {}
    for m, cids in root_comms.items():
        primary_of[m] = min(cids, key=lambda c: (-stall_s.get(c, 0.0), c))
    h1_roots: dict[int, list[int]] = {}
    for m, c in primary_of.items():
        h1_roots.setdefault(c, []).append(m)

    memo: dict[int, frozenset[tuple[str, int]]] = {}

    def reach(c: int, stack: set[int]) -> frozenset[tuple[str, int]]:
        if c in memo:
            return memo[c]
        if c in stack:
            return frozenset()
        stack.add(c)
        d = diags[c]
        found: set[tuple[str, int]] = set()
        if d.kind != AnomalyKind.H1:
            found.add((d.kind.value, c))
        else:
            for m in d.missing.tolist():
                if m in primary_of:
                    found.add(("H1", primary_of[m]))
            for y in edges.get(c, ()):
                found |= reach(y, stack)
        stack.discard(c)
        memo[c] = frozenset(found)
        return memo[c]

    affected: dict[tuple[str, int], set[int]] = {}
    via: dict[tuple[str, int], set[int]] = {}
    for c in diags:
        for key in reach(c, set()):
            affected.setdefault(key, set()).update(diags[c].waiting.tolist())
            via.setdefault(key, set()).add(c)
    out: list[HangRoot] = []
    for key in sorted(affected):
        kind, c = key
        d = diags[c]
        if kind == "H1":
            roots = tuple(sorted(h1_roots.get(c, ())))
        else:
            roots = tuple(sorted(set(d.culprits.tolist())))
        if not roots:
            continue
        aff = tuple(sorted(affected[key] - set(roots)))
        out.append(HangRoot(AnomalyKind(kind), c, roots, aff, d, tuple(sorted(via[key]))))
    return out
