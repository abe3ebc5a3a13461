"""Turn Flight Recorder dumps into the kernel records the live attachment would have sent.

Collectives keep the Flight Recorder's per-group ``collective_seq_id`` (minus one, so op
sequences start at 0 like the live ones) on a communicator hashed exactly as the attachment
hashes it (group name and global ranks); p2p entries ("nccl:send 0->1", "nccl:recv 1<-0") go
to the directional channel communicator of the pair, numbered in ``p2p_seq_id`` order.

Completion: an entry is done when its state is "completed", a completion time was
discovered, it is retired, or ``pg_status`` says its group completed that sequence number.
Gloo never fills the state (always "scheduled"), records no completion time and retires
entries lazily (a dump taken right after an op returned can still show it in flight), so a
gloo collective that any member of its group completed counts as completed by every member
that entered it (it cannot complete anywhere unless everyone contributed); a done gloo
entry's exit time is bounded by the rank's next entry (or equals its entry time when it is
the last). An entry not done at dump time becomes an ENTERED record: the rank was
inside that operation when the dump was taken. A rank without a dump sends nothing, exactly
like a rank that never entered: the analyzer treats its silence as evidence.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ccld.producers.attach.fr_load import RankDump
from ccld.producers.attach.identity import (
    P2P_RECEIVER,
    P2P_SENDER,
    comm_hash,
    dtype_code,
    fr_op_type,
    p2p_hash,
)
from ccld.records import DType, KernelBatch, KernelRecord, OpType, Status

_P2P = re.compile(r"^(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+)$")


@dataclass
class Conversion:
    """The records of a dump set plus what the importer learnt on the way."""

    records: list[KernelRecord]
    world_size: int
    ranks_present: tuple[int, ...]
    ranks_missing: tuple[int, ...]
    groups: dict[str, tuple[int, ...]]
    inflight: dict[int, list[str]] = field(default_factory=dict)  # rank -> ops in flight at dump time
    channels: dict[int, tuple[str, int, int]] = field(default_factory=dict)  # p2p comm -> (group, src, dst)
    notes: list[str] = field(default_factory=list)

    def communicators(self) -> dict[int, tuple[str, tuple[int, ...]]]:
        """Every communicator of the dump set: hash -> (description, global ranks in comm order)."""
        out = {comm_hash(ranks, name): (f"group {name}", ranks) for name, ranks in self.groups.items()}
        for chash, (name, src, dst) in self.channels.items():
            out[chash] = (f"p2p {src}->{dst} of group {name}", (src, dst))
        return out


def parse_ranks(value: Any) -> tuple[int, ...]:
    """pg_config "ranks": a list, or its string form "[0, 1, 2]"."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return ()
    if isinstance(value, (list, tuple)):
        try:
            return tuple(int(x) for x in value)
        except (TypeError, ValueError):
            return ()
    return ()


def numel(sizes: Any) -> int:
    """Total elements of a list of shapes ([[1024], [2, 3]] -> 1030)."""
    if not isinstance(sizes, (list, tuple)):
        return 0
    total = 0
    for shape in sizes:
        if isinstance(shape, (list, tuple)):
            total += math.prod(int(d) for d in shape)
    return total


def _pg(entry: dict[str, Any]) -> tuple[str, str]:
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        return str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
    return str(pg), ""


Groups = dict[str, tuple[int, ...]]


def group_members(dumps: Sequence[RankDump], world_size: int | None) -> tuple[Groups, int, list[str]]:
    """Ranks of every process group (from pg_config, else inferred) and the world size."""
    notes: list[str] = []
    configured: dict[str, tuple[int, ...]] = {}
    for d in dumps:
        for key, cfg in d.pg_config.items():
            if not isinstance(cfg, dict):
                continue
            name = str(cfg.get("name") or key)
            ranks = parse_ranks(cfg.get("ranks"))
            if name and ranks:
                configured.setdefault(name, ranks)
    used: dict[str, set[int]] = defaultdict(set)
    descs: dict[str, str] = {}
    for d in dumps:
        for e in d.entries:
            name, desc = _pg(e)
            used[name].add(d.rank)
            descs.setdefault(name, desc)
    known_max = max([d.rank for d in dumps] + [max(r) for r in configured.values() if r], default=-1)
    world = world_size or known_max + 1
    default_names = {n for n, desc in descs.items() if desc == "default_pg"} or ({"0"} & set(used))
    groups: dict[str, tuple[int, ...]] = {}
    for name in used:
        if name in configured:
            groups[name] = configured[name]
        elif name in default_names:
            groups[name] = tuple(range(world))
        else:
            groups[name] = tuple(sorted(used[name]))
            notes.append(
                f"process group {name!r} ({descs.get(name, '')}): members not in the dump; assumed ranks "
                f"{list(groups[name])} (those whose dumps mention it)"
            )
    for name, ranks in configured.items():
        groups.setdefault(name, ranks)
    return groups, world, notes


def _gloo(entry: dict[str, Any]) -> bool:
    return str(entry.get("profiling_name", "")).startswith("gloo:")


def _done(entry: dict[str, Any], status: dict[str, Any], completed_anywhere: dict[str, int]) -> bool:
    if _gloo(entry) and not entry.get("is_p2p"):
        if int(entry.get("collective_seq_id") or 0) <= completed_anywhere.get(_pg(entry)[0], 0):
            return True
    if entry.get("state") == "completed" or entry.get("time_discovered_completed_ns") or entry.get("retired"):
        return True
    if entry.get("is_p2p"):
        return False
    st = status.get(str(entry.get("pg_id")))
    if isinstance(st, dict):
        try:
            return int(entry["collective_seq_id"]) <= int(st.get("last_completed_collective", -1))
        except (TypeError, ValueError):
            return False
    return False


def _exit_ns(entry: dict[str, Any], t_enter: int, next_enter: int | None) -> int:
    t_done = entry.get("time_discovered_completed_ns")
    if t_done:
        return int(t_done)
    dur = entry.get("duration_ms")
    start = entry.get("time_discovered_started_ns") or t_enter
    if isinstance(dur, (int, float)) and dur >= 0:
        return int(start) + int(dur * 1e6)
    return next_enter if next_enter is not None and next_enter >= t_enter else t_enter


def convert(dumps: Sequence[RankDump], *, job: str = "fr-import", world_size: int | None = None) -> Conversion:
    """Kernel records of every entry of every dump."""
    groups, world, notes = group_members(dumps, world_size)
    records: list[KernelRecord] = []
    inflight: dict[int, list[str]] = {}
    channels: dict[int, tuple[str, int, int]] = {}
    completed_anywhere: dict[str, int] = defaultdict(int)  # gloo: group -> highest seq any member completed
    for d in dumps:
        for e in d.entries:
            if _gloo(e) and not e.get("is_p2p") and _done(e, dict(d.pg_status), {}):
                name = _pg(e)[0]
                completed_anywhere[name] = max(completed_anywhere[name], int(e.get("collective_seq_id") or 0))
    for d in dumps:
        entries = sorted(d.entries, key=lambda e: int(e.get("time_created_ns") or 0))
        status = dict(d.pg_status)
        chan_seq: dict[tuple[str, int, int], int] = defaultdict(int)
        p2p_order = sorted(
            (e for e in entries if e.get("is_p2p") or _P2P.match(e["profiling_name"].partition(":")[2])),
            key=lambda e: int(e.get("p2p_seq_id") or 0),
        )
        p2p_seq: dict[int, int] = {}
        for e in p2p_order:
            m = _P2P.match(e["profiling_name"].partition(":")[2])
            if m is None:
                continue
            src, dst = _endpoints(m)
            key = (_pg(e)[0], src, dst)
            p2p_seq[id(e)] = chan_seq[key]
            chan_seq[key] += 1
            ranks = groups.get(key[0], ())
            if max(src, dst) < len(ranks):
                channels[p2p_hash(comm_hash(ranks, key[0]), ranks[src], ranks[dst])] = (key[0], ranks[src], ranks[dst])
        for i, e in enumerate(entries):
            nxt = entries[i + 1] if i + 1 < len(entries) else None
            done = _done(e, status, completed_anywhere)
            rec = _entry_records(d, e, groups, done, p2p_seq, nxt, job, world, notes)
            records.extend(rec)
            if rec and rec[-1].status is not Status.DONE:
                inflight.setdefault(d.rank, []).append(
                    f"{e['profiling_name']} (collective_seq_id {e.get('collective_seq_id')})"
                )
    present = tuple(d.rank for d in dumps)
    missing = tuple(r for r in range(world) if r not in present)
    return Conversion(records, world, present, missing, groups, inflight, channels, notes)


def _endpoints(m: re.Match[str]) -> tuple[int, int]:
    a, arrow, b = int(m.group(2)), m.group(3), int(m.group(4))
    return (a, b) if arrow == "->" else (b, a)


def _entry_records(
    d: RankDump, e: dict[str, Any], groups: dict[str, tuple[int, ...]], done: bool,
    p2p_seq: dict[int, int], nxt: dict[str, Any] | None, job: str, world: int, notes: list[str],
) -> list[KernelRecord]:  # fmt: skip
    name, _desc = _pg(e)
    ranks = groups.get(name, ())
    if d.rank not in ranks:
        notes.append(f"{d.path.name}: rank {d.rank} is not a member of group {name!r}; entry skipped")
        return []
    profiling = str(e["profiling_name"])
    op_name = profiling.partition(":")[2]
    m = _P2P.match(op_name)
    dtypes = e.get("input_dtypes") or e.get("output_dtypes") or []
    dtype = dtype_code(str(dtypes[0])) if dtypes else DType.FLOAT32
    ghash = comm_hash(ranks, name)
    if m is not None:
        src_g, dst_g = _endpoints(m)  # group ranks
        if max(src_g, dst_g) >= len(ranks):
            notes.append(f"{d.path.name}: {profiling} names a rank outside group {name!r}; entry skipped")
            return []
        src, dst = ranks[src_g], ranks[dst_g]
        is_send = m.group(1) == "send"
        chash, seq, size = p2p_hash(ghash, src, dst), p2p_seq.get(id(e), 0), 2
        op_type = OpType.SEND if is_send else OpType.RECV
        comm_rank, peer = (P2P_SENDER, P2P_RECEIVER) if is_send else (P2P_RECEIVER, P2P_SENDER)
        count = numel(e.get("input_sizes") if is_send else e.get("output_sizes")) or numel(e.get("input_sizes"))
    else:
        found = fr_op_type(profiling)
        if found is None:
            notes.append(f"{d.path.name}: unknown operation {profiling!r}; entry skipped")
            return []
        op_type = found
        chash, seq, size = ghash, int(e["collective_seq_id"]) - 1, len(ranks)
        comm_rank, peer = ranks.index(d.rank), -1
        if op_type is OpType.BARRIER:
            dtype, count = DType.FLOAT32, 1  # the attachment's convention for tensor-less barriers
        elif op_type is OpType.REDUCE_SCATTER:
            count = numel(e.get("output_sizes"))
        else:
            count = numel(e.get("input_sizes"))
    t_enter = int(e["time_created_ns"])
    base = dict(
        job=job, incarnation=0, comm_hash=chash, op_seq=seq, op_type=op_type, dtype=dtype, count=count, peer=peer,
        rank=d.rank, comm_rank=comm_rank, comm_size=size, world_size=world, host=d.host,
    )  # fmt: skip
    if done:
        nxt_t = int(nxt["time_created_ns"]) if nxt is not None else None
        t_exit = _exit_ns(e, t_enter, nxt_t)
        return [KernelRecord(**base, status=Status.DONE, t_enter_ns=t_enter, t_exit_ns=t_exit, t_sample_ns=t_exit)]
    return [KernelRecord(**base, status=Status.ENTERED, t_enter_ns=t_enter, t_sample_ns=t_enter)]


def to_batches(records: Iterable[KernelRecord], *, window_s: float = 0.1) -> list[tuple[float, KernelBatch]]:
    """(analyzer time, batch) pairs: records cut into windows of their own sample time, per communicator.

    The analyzer time is the sample time relative to the earliest record; for a dump set
    from several hosts this only orders the batches, it is never compared across ranks.
    """
    recs = sorted(records, key=lambda r: r.t_sample_ns)
    if not recs:
        return []
    t0 = recs[0].t_sample_ns
    window_ns = max(1, int(window_s * 1e9))
    cut: dict[tuple[int, int], list[KernelRecord]] = defaultdict(list)
    for r in recs:
        cut[((r.t_sample_ns - t0) // window_ns, r.comm_hash)].append(r)
    out = []
    for seq, ((w, _comm), rows) in enumerate(sorted(cut.items(), key=lambda kv: kv[0])):
        out.append(((w + 1) * window_ns / 1e9, KernelBatch.from_records(rows, producer="fr-import", batch_seq=seq)))
    return out
