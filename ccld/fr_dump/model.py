"""What a set of Flight Recorder dumps says about each rank: its operations, how far it got, where it is blocked.

Facts of the format (2.x, NCCL and gloo) this module relies on:

- ``collective_seq_id`` counts collectives per process group and is the same number on every
  member for the same collective; ``p2p_seq_id`` counts point-to-point ops per rank and group
  and matches nothing across ranks. Send/recv names ("send 0->1", "recv 1<-0") use
  group-local ranks.
- ``pg_status`` is keyed by the rank-local process-group id (an entry's ``pg_id``) and holds
  ``last_enqueued_collective``, ``last_started_collective`` and ``last_completed_collective``;
  ``pg_config`` is keyed by the group name (an entry's ``process_group[0]``). Gloo writes
  neither members nor names into ``pg_config`` (one key "" with ranks "[]").
- An entry is finished when its state is "completed", a completion time was discovered, it is
  retired (finished or failed: gloo retires a failed op too) or its group's
  ``last_completed_collective`` covers it. A dump taken with only active entries omits
  finished ones, so a missing entry means completed when its sequence number is at most the
  rank's last completed one, and never entered only when it is above the last enqueued one.
- A rank is blocked at its oldest unfinished entry; later entries are queued behind it.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ccld.fr_dump.load import RankDump

__all__ = ["DumpSet", "Group", "Op", "RankState", "build", "normalise_op"]

#: collective names (after "nccl:" / "gloo:", leading underscores and case dropped) -> canonical name
_COLLECTIVES: dict[str, str] = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "allreduce_coalesced": "all_reduce", "all_reduce_barrier": "barrier",
    "all_gather": "all_gather", "allgather": "all_gather", "all_gather_base": "all_gather",
    "allgather_base": "all_gather", "all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_coalesced": "all_gather", "allgather_coalesced": "all_gather", "all_gather_v": "all_gather_v",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "reduce_scatter_coalesced": "reduce_scatter",
    "reduce_scatter_v": "reduce_scatter_v",
    "broadcast": "broadcast", "broadcast_oop": "broadcast", "reduce": "reduce", "reduce_oop": "reduce",
    "gather": "gather", "scatter": "scatter", "barrier": "barrier", "monitored_barrier": "barrier",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all", "all_to_all_v_single": "all_to_all",
    "coalesced": "coalesced", "split": "split", "new_window": "new_window",
}  # fmt: skip
#: ops whose sizes differ between ranks by design (MoE token exchange, gather/scatter roots, v-variants)
VARIABLE_SIZE = frozenset({"all_to_all", "all_gather_v", "reduce_scatter_v", "gather", "scatter", "coalesced"})
_P2P = {"send": "send", "isend": "send", "recv": "recv", "irecv": "recv", "recv_anysource": "recv"}


def normalise_op(profiling_name: str) -> tuple[str, str, bool]:
    """(canonical op name, the name as written after the backend, known?) of a ``profiling_name``.

    "nccl:_all_gather_base" -> ("all_gather", "_all_gather_base", True); "nccl:send 0->1" ->
    ("send", "send 0->1", True); an unknown name keeps its own text and ``known`` is False.
    """
    _backend, _, rest = profiling_name.partition(":") if ":" in profiling_name else ("", "", profiling_name)
    word = rest.split(" ", 1)[0].strip().lstrip("_").lower()
    if word in _P2P:
        return _P2P[word], rest, True
    if word in _COLLECTIVES:
        return _COLLECTIVES[word], rest, True
    return word or rest, rest, False


def fr_int(value: Any) -> int | None:
    """Integers as FR writes them: int, or a decimal string in JSON dumps; None when absent or not a number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _ranks(value: Any) -> tuple[int, ...]:
    """pg_config "ranks": a list, or its string form "[0, 1, 2]"."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return ()
    if isinstance(value, (list, tuple)):
        out = [fr_int(x) for x in value]
        return tuple(x for x in out if x is not None) if None not in out else ()
    return ()


def numel(sizes: Any) -> int | None:
    """Total elements of a list of shapes ([[1024], [2, 3]] -> 1030); None when the dump has no sizes."""
    if not isinstance(sizes, (list, tuple)):
        return None
    total = 0
    for shape in sizes:
        if isinstance(shape, (list, tuple)):
            dims = [fr_int(d) for d in shape]
            if None in dims:
                return None
            total += math.prod(d for d in dims if d is not None)
    return total


@dataclass(frozen=True)
class Op:
    """One Flight Recorder entry of one rank, normalised."""

    rank: int
    order: int  # position on this rank (record_id, else dump order): older ops first
    backend: str  # "nccl", "gloo", ... (the part of profiling_name before ":")
    group: str
    pg_id: str | None
    op: str  # canonical name ("all_reduce", "send", ...) or the unknown name itself
    written: str  # the name after the backend, as the dump wrote it
    known: bool
    p2p: bool
    seq: int  # collective_seq_id, or p2p_seq_id for point-to-point entries
    peer: int | None  # p2p: the peer's global rank (None when the group's members are unknown)
    dtype: str
    count: int | None  # input elements (reduce_scatter: output); None when the dump has no sizes
    state: str
    created_ns: int | None
    started_ns: int | None
    completed_ns: int | None
    duration_ms: float | None
    done: bool
    done_why: str  # which field said it finished ("" when not finished)

    @property
    def key(self) -> tuple[str, str, int]:
        """The operation this entry belongs to on its rank: (group, "c"/"p", seq)."""
        return (self.group, "p" if self.p2p else "c", self.seq)

    def signature(self) -> tuple[str, str, int | None]:
        """What must agree between members of one collective (sizes only where ranks may not differ)."""
        return (self.op, self.dtype, None if self.op in VARIABLE_SIZE else self.count)

    def describe(self) -> str:
        what = "p2p" if self.p2p else "collective"
        return f"{self.written} ({what} #{self.seq} of group {self.group}, state {self.state})"


@dataclass
class Group:
    """A process group: its name, description and global ranks (in group-rank order)."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    inferred: bool  # members guessed from the dumps that mention it (gloo writes none)


@dataclass
class RankState:
    """One rank as its dump shows it (``present`` False: no dump, nothing is known)."""

    rank: int
    present: bool
    host: str = ""
    ops: list[Op] = field(default_factory=list)
    enqueued: dict[str, int] = field(default_factory=dict)  # group -> last enqueued collective seq
    completed: dict[str, int] = field(default_factory=dict)  # group -> last completed collective seq
    blocking: list[Op] = field(default_factory=list)  # the oldest unfinished op (all entries of it)
    version: str = ""
    empty: bool = False  # a dump with neither entries nor pg_status: it knows nothing
    unmapped: int = 0  # pg_status keys that match no group: its progress in groups without entries is unknown
    # (group, seq) -> done, and group -> highest collective entry: built on first use (a 1,000-rank
    # world collective asks every member about every other one), rebuilt by dataclasses.replace
    _index: tuple[dict[tuple[str, int], bool], dict[str, int]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def _lookup(self) -> tuple[dict[tuple[str, int], bool], dict[str, int]]:
        if self._index is None:
            done: dict[tuple[str, int], bool] = {}
            top: dict[str, int] = {}
            for o in self.ops:
                if not o.p2p:
                    # a coalesced op is finished when all its entries are
                    done[(o.group, o.seq)] = done.get((o.group, o.seq), True) and o.done
                    top[o.group] = max(top.get(o.group, -1), o.seq)
            self._index = (done, top)
        return self._index

    def entered(self, group: str, seq: int) -> bool | None:
        """Did this rank enqueue collective ``seq`` of ``group``? None: the dump cannot say."""
        if not self.present or self.empty:
            return None
        # enqueued holds the highest of pg_status and the entries; no entry and no status for the
        # group: an intact dump never touched it, unless a pg_status key of the dump matched no group
        if group not in self.enqueued and self.unmapped:
            return None
        return self.enqueued.get(group, -1) >= seq

    def finished(self, group: str, seq: int) -> bool | None:
        if not self.present or self.empty:
            return None
        done, top = self._lookup()
        if (group, seq) in done:
            return done[(group, seq)]
        last = self.completed.get(group)
        if last is not None and last >= seq:
            return True
        # no entry for it but entries of the same group beyond it: a group's ops finish in order, and
        # a dump omits finished entries (active-only) or has lost them (ring buffer)
        return top.get(group, -1) > seq


@dataclass
class DumpSet:
    """Every rank of a job as the dumps show it, plus what was learnt on the way."""

    world_size: int
    ranks: dict[int, RankState]
    groups: dict[str, Group]
    unknown_ops: dict[str, int]  # name as written -> entries
    notes: list[str]
    versions: tuple[str, ...]
    timing: bool  # some entry carries a discovered start or completion time

    @property
    def present(self) -> tuple[int, ...]:
        return tuple(r for r, s in sorted(self.ranks.items()) if s.present)

    @property
    def missing(self) -> tuple[int, ...]:
        return tuple(r for r, s in sorted(self.ranks.items()) if not s.present)


def _pg(entry: Mapping[str, Any]) -> tuple[str, str]:
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        return str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
    return str(pg), ""


def _groups(dumps: Sequence[RankDump], world: int, notes: list[str]) -> dict[str, Group]:
    configured: dict[str, Group] = {}
    for d in dumps:
        for key, cfg in d.pg_config.items():
            if not isinstance(cfg, Mapping):
                continue
            name = str(cfg.get("name") or key)
            ranks = _ranks(cfg.get("ranks"))
            if name and ranks and name not in configured:
                configured[name] = Group(name, str(cfg.get("desc", "")), tuple(sorted(ranks)), False)
    used: dict[str, set[int]] = defaultdict(set)
    descs: dict[str, str] = {}
    for d in dumps:
        for e in d.entries:
            name, desc = _pg(e)
            used[name].add(d.rank)
            descs.setdefault(name, desc)
    groups = dict(configured)
    guessed = []
    for name, members in used.items():
        if name in groups:
            continue
        if descs.get(name) == "default_pg":
            groups[name] = Group(name, "default_pg", tuple(range(world)), False)
        else:
            groups[name] = Group(name, descs.get(name, ""), tuple(sorted(members)), True)
            guessed.append(f"{name} {list(groups[name].ranks)}")
    if guessed:
        present = {d.rank for d in dumps}
        maybe = "; ranks without a dump may be members too" if present != set(range(world)) else ""
        notes.append(
            "pg_config names no members (gloo writes none): groups taken as the ranks whose dumps mention them: "
            + ", ".join(sorted(guessed, key=lambda g: (len(g), g)))
            + maybe
        )
    return groups


def _world(dumps: Sequence[RankDump], world_size: int | None, notes: list[str]) -> int:
    if world_size:
        return world_size
    default = [len(_ranks(c.get("ranks"))) for d in dumps for c in d.pg_config.values()
               if isinstance(c, Mapping) and str(c.get("desc", "")) == "default_pg"]  # fmt: skip
    configured = max([r for d in dumps for c in d.pg_config.values() if isinstance(c, Mapping)
                      for r in _ranks(c.get("ranks"))], default=-1)  # fmt: skip
    known = max([d.rank for d in dumps] + [configured], default=-1) + 1
    if default and max(default) >= known:
        return max(default)
    notes.append(f"world size taken as {known} (the highest rank seen + 1; --world-size overrides it)")
    return known


def _status_numbers(st: Any) -> tuple[int | None, int | None]:
    """(last enqueued, last completed) collective of one ``pg_status`` value."""
    if not isinstance(st, Mapping):
        return None, None
    return fr_int(st.get("last_enqueued_collective")), fr_int(st.get("last_completed_collective"))


@dataclass
class _Known:
    """What the entries alone say about a group's members: the facts the pg_status mapping is checked against."""

    enq_exact: dict[int, int] = field(default_factory=dict)  # rank -> last enqueued (its own pg_status, anchored)
    done_at_least: dict[int, int] = field(default_factory=dict)  # rank -> a collective it certainly completed


def _pg_status_maps(
    dumps: Sequence[RankDump], groups: Mapping[str, Group], notes: list[str]
) -> dict[int, dict[str, str]]:
    """Per rank: pg_status key (the rank-local pg id) -> group name.

    Torch keys ``pg_status`` by the process-local pg id (the n-th process group backend this
    process created, counting groups it never used) and ``pg_config`` by the group name, and
    writes a group into ``pg_config`` only once its communicator is set up, so the local id is
    not the position of the group in ``pg_config``. The evidence, strongest first:

    1. the rank's own entries (each carries its ``pg_id`` and its group);
    2. a key that is not a number but a group name (or the one description of a group of the rank);
       local id 0 is the default group (the first group a process creates);
    3. the other members: a group whose other members' entries carry the same local id (ranks
       create their groups in the same order, so a group usually has the same local id on all
       its members), among the rank's configured groups not mapped yet;
    4. the creation order, when group names are creation counters ("0", "1", ...): local ids grow
       with it, so a key lies between the groups of the ids around it;
    5. the progress: a rank cannot have completed a collective another member never enqueued, nor
       have enqueued less than another member completed;
    6. the i-th configured group of the rank in creation order, only when that agrees with every
       group mapped so far and no key lies beyond the configured groups (no unused or
       unconfigured groups in between).

    A key left with no single candidate is reported with its candidates, never guessed.
    """
    own: dict[int, dict[str, str]] = {}
    used: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))  # key -> group -> ranks
    known: dict[str, _Known] = defaultdict(_Known)
    for d in dumps:
        mine: dict[str, str] = {}
        for e in d.entries:
            name = _pg(e)[0]
            pid = e.get("pg_id")
            if pid is not None:
                mine[str(pid)] = name
                used[str(pid)][name].add(d.rank)
            seq = fr_int(e.get("collective_seq_id"))
            p2p = bool(e.get("is_p2p")) or normalise_op(str(e.get("profiling_name", "")))[0] in ("send", "recv")
            finished = e.get("state") == "completed" or fr_int(e.get("time_discovered_completed_ns"))
            if seq is not None and not p2p and finished:
                k = known[name]
                k.done_at_least[d.rank] = max(k.done_at_least.get(d.rank, -1), seq)
        for key, name in mine.items():
            enq, comp = _status_numbers(d.pg_status.get(key))
            if enq is not None:
                known[name].enq_exact[d.rank] = enq
            if comp is not None:
                known[name].done_at_least[d.rank] = max(known[name].done_at_least.get(d.rank, -1), comp)
        own[d.rank] = mine
    return {d.rank: _map_rank(d, own[d.rank], groups, used, known, notes) for d in dumps}


def _fits(rank: int, st: Any, k: _Known) -> bool:
    """Can this pg_status value be the rank's status in the group ``k`` describes?"""
    enq, comp = _status_numbers(st)
    if comp is not None and any(comp > e for m, e in k.enq_exact.items() if m != rank):
        return False  # it completed a collective another member never enqueued
    if enq is not None and any(enq < c for m, c in k.done_at_least.items() if m != rank):
        return False  # another member completed a collective it never enqueued
    return True


def _map_rank(d: RankDump, own: dict[str, str], groups: Mapping[str, Group], used: Mapping[str, Mapping[str, set[int]]],
              known: Mapping[str, _Known], notes: list[str]) -> dict[str, str]:  # fmt: skip
    out = dict(own)
    left = [k for k in d.pg_status if k not in out]
    if not left:
        return out
    mine = [g for g in groups.values() if d.rank in g.ranks and not g.inferred]
    names = {g.name for g in mine}
    for k in list(left):
        if fr_int(k) is None:
            by_desc = [g.name for g in mine if g.desc == k]
            if k in groups:
                out[k] = k
            elif len(by_desc) == 1:
                out[k] = by_desc[0]
    left = [k for k in left if k not in out]
    # the default group is the first one a process creates: local id 0
    default = [g.name for g in mine if g.desc == "default_pg"]
    if "0" in left and len(default) == 1 and default[0] not in out.values():
        out["0"] = default[0]
        left.remove("0")
    counters = bool(mine) and all(g.name.isdigit() for g in mine)
    order = {g.name: int(g.name) for g in mine} if counters else {}
    anchors = [(fr_int(k), order[n]) for k, n in out.items() if fr_int(k) is not None and n in order]
    cands: dict[str, list[str]] = {}
    for k in left:
        c = sorted(names - set(out.values()), key=lambda n: order.get(n, 0))
        i = fr_int(k)
        if order and i is not None:
            c = [n for n in c if all((i < a) == (order[n] < o) for a, o in anchors if a is not None and a != i)]
        c = [n for n in c if _fits(d.rank, d.pg_status[k], known.get(n, _Known()))]
        # of those, the groups whose other members use this local id, if any
        others = [n for n in c if any(r != d.rank for r in used.get(k, {}).get(n, ()))]
        cands[k] = others or c
    changed = True
    while changed:
        changed = False
        for k in left:
            if k in out:
                continue
            c = [n for n in cands[k] if n not in out.values()]
            if len(c) == 1:
                out[k] = c[0]
                changed = True
    # the i-th configured group in creation order, where that agrees with every group mapped so far
    if order and any(k not in out for k in left):
        by_order = sorted(mine, key=lambda g: int(g.name))
        index = {g.name: i for i, g in enumerate(by_order)}
        ids = [i for i in map(fr_int, d.pg_status) if i is not None]
        # a key beyond the configured groups means groups in between that are not configured
        if all(fr_int(k) == index.get(n) for k, n in out.items()) and max(ids, default=-1) < len(by_order):
            for k in left:
                i = fr_int(k)
                if k not in out and i is not None and 0 <= i < len(by_order) and by_order[i].name in cands[k]:
                    out[k] = by_order[i].name
    for k in d.pg_status:
        if k not in out:
            c = [n for n in cands.get(k, []) if n not in out.values()]
            maybe = f" (it is one of groups {', '.join(c)})" if 1 < len(c) <= 6 else ""
            notes.append(
                f"{d.path.name}: pg_status key {k!r} (local pg id) matches no process group{maybe}; its progress "
                f"is not used, and what rank {d.rank} did in its groups without entries is unknown"
            )
    return out


def _done(e: Mapping[str, Any], seq: int, p2p: bool, completed: int | None) -> str:
    if e.get("state") == "completed":
        return "state completed"
    if fr_int(e.get("time_discovered_completed_ns")):
        return "completion time discovered"
    if e.get("retired") is True:
        return "retired"
    if not p2p and completed is not None and seq <= completed:
        return "pg_status last_completed_collective"
    return ""


def _op(d: RankDump, i: int, e: Mapping[str, Any], group: Group | None, completed: int | None,
        unknown: dict[str, int], notes: list[str]) -> Op:  # fmt: skip
    pg_name, _desc = _pg(e)
    op, written, known = normalise_op(str(e.get("profiling_name", "")))
    if not known:
        unknown[str(e.get("profiling_name"))] = unknown.get(str(e.get("profiling_name")), 0) + 1
    p2p = bool(e.get("is_p2p")) or op in ("send", "recv")
    seq = fr_int(e.get("p2p_seq_id") if p2p else e.get("collective_seq_id"))
    if seq is None:
        seq = -1
    peer = None
    if p2p:
        local = _p2p_peer(written, op)
        if local is not None and group is not None and not group.inferred and local < len(group.ranks):
            peer = group.ranks[local]
        elif local is not None and group is not None and group.name and group.desc == "default_pg":
            peer = local
        elif local is not None:
            notes.append(f"{d.path.name}: {written!r} of group {pg_name}: members unknown, its peer is not named")
    dtypes = e.get("input_dtypes") or e.get("output_dtypes") or []
    sizes = e.get("output_sizes") if op == "reduce_scatter" else e.get("input_sizes")
    dur = e.get("duration_ms")
    why = _done(e, seq, p2p, completed)
    order = fr_int(e.get("record_id"))
    return Op(
        rank=d.rank, order=order if order is not None else i, group=pg_name,
        backend=str(e.get("profiling_name", "")).partition(":")[0] if ":" in str(e.get("profiling_name", "")) else "",
        pg_id=None if e.get("pg_id") is None else str(e.get("pg_id")), op=op, written=written, known=known,
        p2p=p2p, seq=seq, peer=peer, dtype=str(dtypes[0]) if isinstance(dtypes, list) and dtypes else "",
        count=numel(sizes), state=str(e.get("state", "")), created_ns=fr_int(e.get("time_created_ns")),
        started_ns=fr_int(e.get("time_discovered_started_ns")) or None,
        completed_ns=fr_int(e.get("time_discovered_completed_ns")) or None,
        duration_ms=float(dur) if isinstance(dur, (int, float)) and not isinstance(dur, bool) else None,
        done=bool(why), done_why=why,
    )  # fmt: skip


def _p2p_peer(written: str, op: str) -> int | None:
    """The group-local peer of "send 0->1" (1) or "recv 1<-0" (0)."""
    parts = written.split(" ", 1)
    if len(parts) < 2:
        return None
    meta = parts[1].replace(" ", "")
    try:
        if op == "send" and "->" in meta:
            return int(meta.split("->")[1])
        if op == "recv" and "<-" in meta:
            return int(meta.split("<-")[1])
    except ValueError:
        return None
    return None


def build(dumps: Sequence[RankDump], *, world_size: int | None = None) -> DumpSet:
    """Normalise a dump set: ranks (present or not), groups, ops, progress and blocking ops."""
    notes: list[str] = []
    world = _world(dumps, world_size, notes)
    groups = _groups(dumps, world, notes)
    unknown: dict[str, int] = {}
    ranks: dict[int, RankState] = {r: RankState(r, False) for r in range(world)}
    status_maps = _pg_status_maps(dumps, groups, notes)
    for d in dumps:
        if d.rank >= world:
            notes.append(f"{d.path.name}: rank {d.rank} is outside world size {world}; read anyway")
        state = RankState(d.rank, True, host=d.host, version=d.version)
        names = status_maps[d.rank]
        state.unmapped = sum(1 for k in d.pg_status if k not in names)
        for key, st in d.pg_status.items():
            if key not in names or not isinstance(st, Mapping):
                continue
            enq, comp = fr_int(st.get("last_enqueued_collective")), fr_int(st.get("last_completed_collective"))
            if enq is not None:
                state.enqueued[names[key]] = enq
            if comp is not None:
                state.completed[names[key]] = comp
        for i, e in enumerate(d.entries):
            name = _pg(e)[0]
            state.ops.append(_op(d, i, e, groups.get(name), state.completed.get(name), unknown, notes))
        state.ops.sort(key=lambda o: o.order)
        for o in state.ops:
            if not o.p2p:
                state.enqueued[o.group] = max(state.enqueued.get(o.group, -1), o.seq)
        state.empty = not d.entries and not d.pg_status
        if state.empty:
            notes.append(f"{d.path.name}: the dump has no entries and no pg_status: nothing is known of rank {d.rank}")
        first = next((o for o in state.ops if not o.done), None)
        if first is not None:
            state.blocking = [o for o in state.ops if o.key == first.key and not o.done]
        ranks[d.rank] = state
    timing = any(o.started_ns or o.completed_ns or o.duration_ms is not None for s in ranks.values() for o in s.ops)
    versions = tuple(sorted({d.version for d in dumps}))
    return DumpSet(world, ranks, groups, unknown, notes, versions, timing)
