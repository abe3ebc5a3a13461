"""Name the broken ranks of a Flight Recorder dump set: wait-for edges from each rank's blocking op, roots, verdicts.

Pure: a ``DumpSet`` in, a ``Diagnosis`` out. Each rank with a dump is blocked at its oldest
unfinished op (later ones are queued behind it and say nothing). It waits on the members of
that collective that did not reach it (never enqueued it, or are blocked at an older op),
on the members with no dump, and on the peer of a blocked send or recv (``p2p_seq_id`` is
per rank, so p2p ops are never paired across ranks). Two rank-local signals name a broken
rank: it never enqueued an op its peers are blocked in (or that they finished without it,
which a collective can only do by failing), or it is blocked at op k while a peer of the
same collective completed k (a rank-local stall; Flight Recorder has no per-channel
counters, so no link is named). The roots of the wait-for graph are the broken ranks; every
rank that reaches one is its victim. Where the dumps lack a fact (no clock, no p2p records
in gloo, no members in gloo's ``pg_config``) the verdict says so instead of guessing.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from ccld.fr_dump.model import DumpSet, Group, Op, RankState
from ccld.identity import comm_hash
from ccld.records import AnomalyKind, Verdict, VerdictState, comm_hex
from ccld.streams.analysis.waitgraph import RootSet, root_sets, victims_of

__all__ = ["Diagnosis", "Edge", "diagnose"]

NO_CLOCK = "the dumps carry no dump time, so how long anything has waited is unknown"


@dataclass(frozen=True)
class Edge:
    """Rank ``src`` waits on rank ``dst`` in ``op`` (``src``'s blocking op) for ``why``."""

    src: int
    dst: int
    group: str
    seq: int
    op: str
    why: str  # "not-entered", "behind", "no-dump", "co-blocked", "p2p", "finished-without", "maybe", "unknown"


@dataclass
class Diagnosis:
    """The verdicts (most confident first), the wait-for graph and what the dumps could not show."""

    verdicts: list[Verdict]
    edges: list[Edge]
    roots: list[RootSet]
    live: list[str] = field(default_factory=list)  # evidence that the job was still moving at dump time
    notes: list[str] = field(default_factory=list)


def _ranks(rs: Iterable[int]) -> str:
    return ",".join(map(str, sorted(rs)))


class _Graph:
    """The dump set plus the edges found so far (helper of ``diagnose``)."""

    def __init__(self, dset: DumpSet) -> None:
        self.d = dset
        self.edges: list[Edge] = []
        self.completed_by: dict[int, list[int]] = defaultdict(list)  # rank -> peers that completed its blocking op

    def members(self, group: str) -> tuple[Group | None, tuple[int, ...], tuple[int, ...]]:
        """(group, certain members, possible members without a dump)."""
        g = self.d.groups.get(group)
        if g is None:
            return None, (), self.d.missing
        if not g.inferred:
            return g, g.ranks, ()
        # gloo: the members are the ranks that mention the group; a group of one needs a peer, and
        # only ranks without a dump can be it
        return g, g.ranks, self.d.missing if len(g.ranks) < 2 else ()

    def add(self, src: int, dst: int, op: Op | None, why: str, group: str = "", seq: int = -1) -> None:
        if src == dst:
            return
        if op is not None:
            group, seq = op.group, op.seq
        self.edges.append(Edge(src, dst, group, seq, op.written if op else "", why))

    def waits(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {r: set() for r in self.d.ranks}
        for e in self.edges:
            out.setdefault(e.src, set()).add(e.dst)
        return out


def _gloo_live(dset: DumpSet) -> tuple[DumpSet, list[str]]:
    """Gloo: an op one member finished is finished everywhere; a consistent op all members are in shows a running job.

    Gloo runs a collective on CPU threads and retires it just after it returns (a dump taken
    at that moment still shows it open), so an op one member finished is finished on every
    member that entered it. A consistent collective that every member entered and none
    finished is one gloo is about to finish: a dump taken long after a hang never shows it,
    so it means the dumps caught a job still making progress.
    """
    live: list[str] = []
    # group -> rank -> the highest collective it finished there (ops of a group finish in order)
    top: dict[str, dict[int, int]] = defaultdict(dict)
    for s in dset.ranks.values():
        for o in s.ops:
            if not o.p2p and o.done:
                top[o.group][s.rank] = max(top[o.group].get(s.rank, -1), o.seq)
        for group_name, last in s.completed.items():
            top[group_name][s.rank] = max(top[group_name].get(s.rank, -1), last)
    ranks = {}
    for r, s in dset.ranks.items():
        ops = []
        for o in s.ops:
            finishers = []
            if o.backend == "gloo" and not o.p2p and not o.done:
                finishers = [m for m, k in top.get(o.group, {}).items() if m != r and k >= o.seq]
            if finishers:
                # not evidence of a running job by itself: a rank that dumps from its error handler
                # right after an op returned shows that op open too
                o = dataclasses.replace(o, done=True, done_why=f"finished by rank {min(finishers)} (gloo)")
            ops.append(o)
        first = next((o for o in ops if not o.done), None)
        blocking = [o for o in ops if first is not None and o.key == first.key and not o.done]
        ranks[r] = dataclasses.replace(s, ops=ops, blocking=blocking)
    # a consistent gloo collective that every member entered and none finished is still running
    for (group, seq), blocked in _co_blocked(ranks).items():
        g = dset.groups.get(group)
        certain = g is not None and (not g.inferred or not dset.missing)
        ops = [b for b in blocked.values()]
        if certain and g is not None and set(blocked) == set(g.ranks) and all(o.backend == "gloo" for o in ops):
            if len({o.signature() for o in ops}) == 1:
                live.append(f"ranks {_ranks(blocked)} (every member) are inside the same {ops[0].written} "
                            f"#{seq} of group {group}: gloo finishes such an op unless the network fails")  # fmt: skip
    return dataclasses.replace(dset, ranks=ranks), live


def _co_blocked(ranks: dict[int, RankState]) -> dict[tuple[str, int], dict[int, Op]]:
    out: dict[tuple[str, int], dict[int, Op]] = defaultdict(dict)
    for r, s in ranks.items():
        if s.blocking and not s.blocking[0].p2p:
            out[(s.blocking[0].group, s.blocking[0].seq)][r] = s.blocking[0]
    return out


def _edges_blocked(gr: _Graph, s: RankState) -> None:
    """Edges of a rank blocked at an unfinished op."""
    b = s.blocking[0]
    if b.p2p:
        if b.peer is not None:
            gr.add(s.rank, b.peer, b, "p2p")
        return
    group, certain, possible = gr.members(b.group)
    explained = False
    for m in certain:
        if m == s.rank:
            continue
        ms = gr.d.ranks.get(m)
        if ms is None or not ms.present or ms.empty:
            gr.add(s.rank, m, b, "no-dump")
            explained = True
            continue
        if ms.finished(b.group, b.seq):
            gr.completed_by[s.rank].append(m)
            continue
        entered = ms.entered(b.group, b.seq)
        if entered is None:
            # its dump has pg_status keys that match no group: whether it entered is unknown
            gr.add(s.rank, m, b, "unknown")
            explained = True
        elif not entered:
            gr.add(s.rank, m, b, "not-entered")
            explained = True
        elif ms.blocking and ms.blocking[0].key == b.key:
            gr.add(s.rank, m, b, "co-blocked")
        else:
            gr.add(s.rank, m, b, "behind")
            explained = True
    if gr.completed_by[s.rank]:
        # a member completed the op, so every member (with a dump or not) took part in it: one
        # that still has it open stalled on its own and waits on nobody in it
        gr.edges = [e for e in gr.edges if e.src != s.rank]
    elif not explained:
        for m in possible:
            gr.add(s.rank, m, b, "maybe")


def _edges_idle(gr: _Graph, s: RankState) -> None:
    """Edges of a rank with no unfinished op: in each group, members behind its last op (it finished without them)."""
    for gname, last in s.enqueued.items():
        if not s.finished(gname, last):
            continue
        _g, certain, _possible = gr.members(gname)
        for m in certain:
            ms = gr.d.ranks.get(m)
            if m == s.rank or ms is None or not ms.present or ms.empty:
                continue
            if ms.entered(gname, last) is False:
                op = next((o for o in reversed(s.ops) if o.group == gname and not o.p2p and o.seq == last), None)
                gr.add(s.rank, m, op, "finished-without", gname, last)


def _edges_unseen(gr: _Graph) -> None:
    """Edges of ranks without a dump: where they may be blocked like a peer is, waiting on someone else.

    A rank without a dump is a sink unless something says otherwise. When a rank with a dump is
    blocked in op k of a group that the silent rank belongs to, the silent rank may be blocked
    there too, waiting on the same members that peer waits on (never arrived, or blocked at an
    older op); those are its possible waits unless they themselves (transitively) wait on it. A silent rank that is
    the only member missing from every op its peers are blocked in stays a sink: the root.
    """
    for m, ms in sorted(gr.d.ranks.items()):
        if ms.present and not ms.empty:
            continue
        waits = gr.waits()
        behind_m = victims_of(waits, [m])
        by_src: dict[int, list[Edge]] = defaultdict(list)
        for e in gr.edges:
            by_src[e.src].append(e)
        for w, ws in sorted(gr.d.ranks.items()):
            if w == m or not ws.blocking or ws.blocking[0].p2p:
                continue
            b = ws.blocking[0]
            g = gr.d.groups.get(b.group)
            if g is None or g.inferred or m not in g.ranks:
                continue
            there = [e for e in by_src.get(w, []) if (e.group, e.seq) == (b.group, b.seq)]
            co = {e.dst for e in there if e.why == "co-blocked"} | {w}
            if len({gr.d.ranks[r].blocking[0].signature() for r in co}) > 1:
                # the members that are in the op disagree (an H2): m is in it too, in their cycle
                for p in sorted(co):
                    gr.add(m, p, b, "maybe")
                continue
            # the members w waits on there (never arrived, or blocked at an older op), m excepted
            for p in sorted({e.dst for e in there}):
                ps = gr.d.ranks.get(p)
                # only ranks with a dump: between two silent ranks nothing says who waits on whom
                if ps is None or not ps.present or ps.empty or p in behind_m or p in waits.get(m, set()):
                    continue
                if p != m:
                    gr.add(m, p, b, "maybe")


def _last_op(s: RankState) -> Op | None:
    return s.ops[-1] if s.ops else None


def diagnose(dset: DumpSet, *, job: str = "fr-import") -> Diagnosis:
    """Verdicts for one dump set (see the module docstring)."""
    notes: list[str] = []
    dset, live = _gloo_live(dset)
    gr = _Graph(dset)
    for s in dset.ranks.values():
        if not s.present or s.empty:
            continue
        if s.blocking:
            _edges_blocked(gr, s)
        else:
            _edges_idle(gr, s)
    _edges_unseen(gr)
    roots = root_sets(gr.waits())
    # A gloo rank that waits in no recorded op may wait in a send/recv (gloo records none) or stopped
    # after an op that failed because a rank without a dump left: it is a root only if nothing else is.
    roots, demoted = _demote_unrecorded_waits(gr, roots)
    notes += demoted
    # a gloo rank that waits in an unrecorded send/recv on a stuck peer is a victim, not a root
    roots, demoted = _demote_p2p_waiters(gr, roots)
    notes += demoted
    # a rank stalled inside an op its peers completed is a root even when nobody waits on it yet
    covered = {r for rs in roots for r in rs.ranks}
    for r in sorted(gr.completed_by):
        if gr.completed_by[r] and r not in covered and not any(e.src == r for e in gr.edges):
            roots.append(RootSet(frozenset({r}), frozenset(), cyclic=False))
    if live:
        return Diagnosis([], gr.edges, [], live, notes + [
            "the dumps show operations completing at dump time: a snapshot of a running job, not a hang; no hang "
            "verdict is made" + ("" if dset.timing else "; without start/completion times slowness cannot be judged")
        ])  # fmt: skip
    verdicts = [_verdict(gr, rs, job) for rs in _merge_stalls(gr, roots)]
    verdicts.sort(key=lambda v: (-v.confidence, v.root_cause_ranks))
    return Diagnosis(verdicts, gr.edges, roots, live, notes)


def _merge_stalls(gr: _Graph, roots: list[RootSet]) -> list[RootSet]:
    """Ranks that each stalled inside the same op (a peer completed it) are one root cause: one incident."""
    by_op: dict[tuple[str, str, int], list[RootSet]] = defaultdict(list)
    out: list[RootSet] = []
    for rs in roots:
        r = min(rs.ranks)
        s = gr.d.ranks[r]
        if len(rs.ranks) == 1 and s.blocking and gr.completed_by.get(r):
            by_op[s.blocking[0].key].append(rs)
        else:
            out.append(rs)
    for group in by_op.values():
        ranks = frozenset(r for rs in group for r in rs.ranks)
        victims = frozenset(v for rs in group for v in rs.victims) - ranks
        out.append(RootSet(ranks, victims, cyclic=False))
    out.sort(key=lambda s: (-len(s.victims), min(s.ranks)))
    return out


def _demote_unrecorded_waits(gr: _Graph, roots: list[RootSet]) -> tuple[list[RootSet], list[str]]:
    notes: list[str] = []
    for _ in range(len(roots) + 1):
        idle = [rs for rs in roots if len(rs.ranks) == 1 and _idle_root(gr, next(iter(rs.ranks)))]
        if not idle:
            break
        others = [rs for rs in roots if rs not in idle]
        changed = False
        for rs in idle:
            r = next(iter(rs.ranks))
            s = gr.d.ranks[r]
            last = _last_op(s)
            _g, _certain, possible = gr.members(last.group) if last is not None else (None, (), ())
            # its last op was in a group whose other members wrote no dump: it may have stopped
            # because that op failed when one of them left
            targets = sorted(set(possible) - {r})
            why = f"its last op {last.written} #{last.seq} of group {last.group} may have involved them" \
                if last is not None else ""  # fmt: skip
            if not targets and others and _soft_root(gr, r):
                targets = sorted({m for o in others for m in o.ranks})
                why = "gloo records no send/recv: it may be waiting in one on them"
            if targets:
                for t in targets:
                    gr.add(r, t, last, "maybe")
                notes.append(f"rank {r} waits in no recorded op; taken as waiting on rank {_ranks(targets)} ({why})")
                changed = True
        if not changed:
            break
        roots = root_sets(gr.waits())
    return roots, notes


def _abandoned(gr: _Graph, r: int) -> bool:
    """Did rank ``r`` stop where its peers went on?

    A peer finished an op without it, or a member of the group of its last recorded collective
    waits in a later collective of that group that ``r`` never enqueued: ``r`` stopped right after
    that op while its partners in it went on to the next one.
    """
    s = gr.d.ranks[r]
    last = next((o for o in reversed(s.ops) if not o.p2p), None)
    for e in gr.edges:
        if e.dst != r:
            continue
        if e.why == "finished-without":
            return True
        if last is not None and e.why == "not-entered" and e.group == last.group and e.seq > last.seq:
            return True
    return False


def _demote_p2p_waiters(gr: _Graph, roots: list[RootSet]) -> tuple[list[RootSet], list[str]]:
    """Gloo ranks in no recorded op that may wait in a send/recv on a stuck peer: victims of the stuck ranks.

    Gloo records no send/recv, so a rank waiting in one has no unfinished op and looks like a rank
    that stopped: its peers in later collectives wait on it. What tells them apart: a rank that
    stopped leaves the partners of its last collective waiting in the next one (or a peer finished an
    op without it); a rank waiting in a recv stands where the partners of its last collective stand,
    because they wait for the same stage. When some roots stopped that way, the idle gloo roots that
    did not are taken as waiting on them (directly or through the pipeline), not as root causes.
    """
    idle = [next(iter(rs.ranks)) for rs in roots if len(rs.ranks) == 1 and _soft_root(gr, next(iter(rs.ranks)))]
    waiters = [r for r in idle if not _abandoned(gr, r)]
    stuck = sorted({r for rs in roots for r in rs.ranks} - set(waiters))
    if not waiters or not stuck:
        return roots, []
    for r in waiters:
        last = _last_op(gr.d.ranks[r])
        for t in stuck:
            gr.add(r, t, None, "maybe", last.group if last else "", -1)
    notes = [f"rank {_ranks(waiters)} wait in no recorded op while the partners of their last collective stand "
             f"with them: gloo records no send/recv, so they are taken as waiting in one on the stuck rank "
             f"{_ranks(stuck)} (directly or through their pipeline peers)"]  # fmt: skip
    return root_sets(gr.waits()), notes


def _idle_root(gr: _Graph, r: int) -> bool:
    """A root with a dump and no unfinished op (it stopped between ops, or waits in an unrecorded one)."""
    s = gr.d.ranks[r]
    return s.present and not s.empty and not s.blocking and bool(s.ops) and not any(e.src == r for e in gr.edges)


def _soft_root(gr: _Graph, r: int) -> bool:
    """A gloo rank with a dump, no unfinished op, and no peer that finished an op without it."""
    s = gr.d.ranks[r]
    if not s.present or s.empty or s.blocking or not s.ops or s.ops[-1].backend != "gloo":
        return False
    if any(e.dst == r and e.why == "finished-without" for e in gr.edges):
        return False
    if any(e.src == r for e in gr.edges):
        return False
    return True


# ------------------------------------------------------------------------------------------ verdicts
def _incident(job: str, kind: AnomalyKind, ranks: Iterable[int], group: str, seq: int) -> str:
    return hashlib.blake2b(f"{job}|fr|{kind.value}|{_ranks(ranks)}|{group}|{seq}".encode(), digest_size=8).hexdigest()


def _comm(gr: _Graph, group: str) -> str:
    g = gr.d.groups.get(group)
    return comm_hex(comm_hash(list(g.ranks), g.name)) if g is not None else comm_hex(0)


def _victims_text(gr: _Graph, victims: Iterable[int]) -> str:
    by_op: dict[str, list[int]] = defaultdict(list)
    idle: list[int] = []
    for v in sorted(victims):
        s = gr.d.ranks[v]
        if s.blocking:
            b = s.blocking[0]
            by_op[f"{b.written} #{b.seq} of group {b.group}"].append(v)
        else:
            idle.append(v)
    parts = [f"rank {_ranks(rs)} in {op}" for op, rs in sorted(by_op.items(), key=lambda kv: min(kv[1]))]
    if idle:
        parts.append(f"rank {_ranks(idle)} in no unfinished recorded op")
    return "; ".join(parts)


def _in_edges(gr: _Graph, ranks: frozenset[int]) -> list[Edge]:
    return [e for e in gr.edges if e.dst in ranks and e.src not in ranks]


def _main_op(edges: list[Edge]) -> tuple[str, int, str]:
    if not edges:
        return "", -1, ""
    (group, seq, op), _n = Counter((e.group, e.seq, e.op) for e in edges).most_common(1)[0]
    return group, seq, op


def _timing_text(gr: _Graph) -> str:
    return "" if gr.d.timing else "; the dumps have no start/completion times (timing was off)"


def _verdict(gr: _Graph, rs: RootSet, job: str) -> Verdict:
    victims = set(rs.victims)
    inbound = _in_edges(gr, rs.ranks)
    group, seq, opname = _main_op(inbound)
    hosts: tuple[str, ...] = ()
    mismatch: str | None = None
    details = {"source": "import-fr", "clock": "none"}
    roots: tuple[int, ...] = tuple(sorted(rs.ranks))
    if not rs.cyclic:
        r = roots[0]
        s = gr.d.ranks[r]
        hosts = tuple(h for h in (gr.d.ranks[x].host for x in roots) if h)
        waiters = sorted({e.src for e in inbound})
        if not s.present or s.empty:
            kind, conf = AnomalyKind.H1, 0.7
            why = "wrote no dump" if not s.present else "wrote a dump with no entries and no pg_status"
            evidence = (f"rank {r} {why}; ranks {_ranks(waiters)} wait on it ({opname} #{seq} of group "
                        f"{group}); whether it entered that op is unknown (stopped, killed, or its Python could "
                        f"not run)")  # fmt: skip
        elif s.blocking and gr.completed_by.get(r):
            b = s.blocking[0]
            kind, conf = AnomalyKind.H3, 0.85
            group, seq, opname = b.group, b.seq, b.written
            evidence = (f"rank {_ranks(roots)} has {b.written} #{b.seq} of group {b.group} unfinished (state "
                        f"{b.state}) while rank {_ranks(gr.completed_by[r])} completed it: it stalled inside the op; "
                        f"Flight Recorder has no per-channel counters, so no link is named")  # fmt: skip
        elif s.blocking:
            b = s.blocking[0]
            kind, conf = AnomalyKind.H3, 0.5
            group, seq, opname = b.group, b.seq, b.written
            evidence = f"rank {r} is blocked in {b.describe()} and the dumps show no rank it waits on"
        else:
            without = [e for e in inbound if e.why == "finished-without"]
            entered_not = [e for e in inbound if e.why == "not-entered"]
            kind = AnomalyKind.H1
            if without or entered_not:
                group, seq, opname = _main_op(without or entered_not)
            last = s.enqueued.get(group)
            mine = f"its last there is #{last}" if last is not None else "it enqueued nothing there"
            if without:
                conf = 0.95
                evidence = (f"rank {_ranks({e.src for e in without})} finished or failed {opname} #{seq} of group "
                            f"{group}, which rank {r} never enqueued ({mine}); a collective cannot "
                            f"succeed without every member, so it failed without rank {r}; rank {r} has no "
                            f"unfinished op: it stopped outside communication (crash, exit or compute)")  # fmt: skip
            elif entered_not:
                conf = 0.75 if s.ops and s.ops[-1].backend == "gloo" else 0.9
                evidence = (f"rank {_ranks({e.src for e in entered_not})} wait in {opname} #{seq} of group {group}, "
                            f"which rank {r} never enqueued ({mine}); rank {r} has no unfinished op: it is in "
                            f"compute, data loading or hung outside communication")  # fmt: skip
                if conf < 0.9:
                    evidence += " (gloo records no send/recv, so a wait in one would not show)"
                if not gr.d.timing:
                    # one snapshot without a clock: a rank that is only late every step looks the same
                    evidence += "; without a clock a rank that is merely late every step (S1) looks the same"
            elif any(e.why == "unknown" for e in inbound):
                conf = 0.6
                group, seq, opname = _main_op([e for e in inbound if e.why == "unknown"])
                evidence = (f"rank {_ranks(waiters)} wait on it in {opname} #{seq} of group {group}; rank {r} has "
                            f"no unfinished op, but part of its pg_status matches no process group, so whether "
                            f"it enqueued that op is unknown")  # fmt: skip
            else:
                # only point-to-point (or possible) waits point here: p2p ops cannot be paired across
                # ranks, so nothing says which send or recv it owes, only that it is in none
                conf = 0.7
                evidence = (f"rank {_ranks(waiters)} wait on it ({opname} #{seq} of group {group}); rank {r} has "
                            f"no unfinished op, so it is inside no communication; which send or recv it owes "
                            f"cannot be told (p2p_seq_id is counted per rank)")  # fmt: skip
    else:
        blocked = {r: gr.d.ranks[r].blocking[0] for r in rs.ranks if gr.d.ranks[r].blocking}
        keys = {b.key for b in blocked.values()}
        # ranks without a dump in the cycle were placed there by their peers: they have no op to compare
        silent = all(not gr.d.ranks[r].present or gr.d.ranks[r].empty for r in rs.ranks if r not in blocked)
        if len(keys) == 1 and blocked and silent and not next(iter(blocked.values())).p2p:
            b0 = next(iter(blocked.values()))
            group, seq, opname = b0.group, b0.seq, b0.written
            sigs = Counter(b.signature() for b in blocked.values())
            if len(sigs) > 1:
                (major, _n), *_rest = sigs.most_common()
                minority = tuple(sorted(r for r, b in blocked.items() if b.signature() != major))
                tie = sigs.most_common()[0][1] == sigs.most_common()[1][1]
                kind, conf = AnomalyKind.H2, (0.5 if tie else 0.85)
                mismatch = _field(major, blocked[minority[0]].signature())
                roots = () if tie else minority
                victims |= set(rs.ranks) - set(roots)
                sig = "; ".join(f"rank {r}: {b.written} {b.dtype} x{b.count}" for r, b in sorted(blocked.items()))
                verdict = "no majority: either side may be wrong" if tie else \
                    f"rank {_ranks(roots)} differs in {mismatch}"  # fmt: skip
                evidence = (f"ranks {_ranks(rs.ranks)} are all inside #{seq} of group {group} with different "
                            f"signatures ({sig}); {verdict}")  # fmt: skip
            else:
                kind, conf = AnomalyKind.H3, 0.4
                victims |= set(rs.ranks)
                roots = ()
                evidence = (f"every member (ranks {_ranks(rs.ranks)}) entered {opname} #{seq} of group {group} "
                            f"and none completed it; Flight Recorder has no per-channel counters, so the rank or "
                            f"link that stopped cannot be named")  # fmt: skip
        else:
            p2p = [b for b in blocked.values() if b.p2p]
            same_dir = p2p and len(p2p) == len(blocked) and len({b.op for b in p2p}) == 1
            kind, conf = (AnomalyKind.H2, 0.6) if same_dir else (AnomalyKind.H3, 0.4)
            victims |= set(rs.ranks)
            roots = ()
            first_blocked = next(iter(blocked.values()), None)
            if first_blocked is not None:
                group, seq, opname = first_blocked.group, first_blocked.seq, first_blocked.written
            evidence = (f"ranks {_ranks(rs.ranks)} wait on each other ("
                        + "; ".join(f"rank {r} in {b.describe()}" for r, b in sorted(blocked.items()))
                        + ("): every one of them sends (or every one receives) first" if same_dir else
                           "): the dumps cannot tell which of them stopped"))  # fmt: skip
        details["candidates"] = _ranks(rs.ranks)
    affected = tuple(sorted(victims - set(roots)))
    if affected:
        evidence += f"; victims: {_victims_text(gr, affected)}"
    evidence += f"; {NO_CLOCK}{_timing_text(gr)}"
    # op_seq is Flight Recorder's own number (collective_seq_id, 1-based; p2p_seq_id for a p2p op), the
    # one the evidence quotes; the live attachment counts the same ops from 0
    details["fr_seq_id"] = str(seq)
    g = gr.d.groups.get(group)
    if g is not None and g.inferred:
        # the communicator hash is of the members seen; a rank without a dump may be one more
        details["group_members"] = "inferred: " + _ranks(g.ranks)
    op_type = opname.split(" ", 1)[0].lstrip("_") or "unknown"
    return Verdict(
        incident_id=_incident(job, kind, roots or rs.ranks, group, seq), state=VerdictState.OPEN, kind=kind,
        job=job, communicator=_comm(gr, group), op_seq=seq, op_type=op_type,
        root_cause_ranks=roots, affected_ranks=affected, confidence=conf, evidence=evidence, onset_time=0.0,
        detected_time=0.0, root_cause_hosts=hosts, mismatch_field=mismatch, details={**details, "group": group},
    )  # fmt: skip


def _field(a: tuple[str, str, int | None], b: tuple[str, str, int | None]) -> str:
    for name, x, y in zip(("op_type", "dtype", "count"), a, b, strict=True):
        if x != y:
            return name
    return "signature"
