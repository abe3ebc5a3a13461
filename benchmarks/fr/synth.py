"""Write NCCL-format Flight Recorder dumps for what gloo cannot show, from a small stream simulation.

Gloo records no send/recv, never fills ``state``, has no start/completion times and no
members in ``pg_config``. NCCL dumps have all of that, so these cases are built from the
documented fields: 16 ranks (tp=2, pp=2, dp=4; an expert group of the 8 ranks of a stage
exchanging uneven ``all_to_all`` token counts; 1F1B pipeline send/recv in group-local ranks;
data-parallel ``_all_gather_base`` / ``coalesced`` parameter gathers and all-reduces). Each rank
enqueues its program asynchronously (at most ``WINDOW`` ops ahead of its stream, and it
waits at the end of every step), its stream runs ops in order, and an op completes when
every member (or the p2p peer) has it at the head of its stream. Faults: ``stop`` (the rank
enqueues nothing from op i on), ``stall`` (the rank's op i never completes on it, though its
peers complete it), ``dtype`` (the rank's op i has another dtype: nobody completes it),
``hw`` (op i never completes on any member: a dead link), ``slowdump``. The dumps are
written with timing on (state scheduled/started/completed, discovered times, durations) or
off (all "scheduled", no times), with every entry (retired ones marked) or only the active
ones, as pickle or JSON, in format versions 2.2 to 2.10 (older versions lose the fields
newer ones added: ``is_p2p`` before 2.3, sizes of all_to_all before 2.4, ``pg_status``
before 2.5). ``truth.json`` names the broken ranks and the class.

    .venv/bin/python benchmarks/fr/synth.py        # writes benchmarks/fr/nccl/
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import pickle
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORLD = 16
WINDOW = 4
STEPS = 2
T0 = 1_764_000_000_000_000_000


@dataclass
class Op:
    name: str  # profiling name after "nccl:"
    group: str
    dtype: str = "BFloat16"
    sizes: tuple[list[list[int]], list[list[int]]] = ([[1024]], [[1024]])
    peer: int | None = None  # p2p: global peer
    sync: bool = False  # the CPU waits for the stream after enqueueing it
    parts: int = 1  # coalesced: entries sharing one collective_seq_id, the last one "coalesced"


@dataclass
class Group:
    name: str
    desc: str
    ranks: list[int]


def topology(megatron: bool = False, hashed: bool = False) -> dict[str, Group]:
    """The job's process groups in creation order (every rank creates every group, torch requires it).

    ``megatron``: as a Megatron-style job spells them: "undefined" descriptions, names that
    count every group created in the job (``hashed``: a hash of the ranks, as torch names groups
    made with local synchronization), and groups that every member creates but never uses
    ("unused", an embedding-like group of the pipeline ends and one of
    stage 0 only): they take a local pg id on their members, yet torch writes them into no
    ``pg_config`` (a group is written there when its communicator is set up) and no ``pg_status``.
    """
    groups = {"0": Group("0", "default_pg", list(range(WORLD)))}
    n = 1

    def add(desc: str, ranks: list[int]) -> None:
        nonlocal n
        name = str(n)
        if hashed:
            name = hashlib.sha1("_".join(map(str, sorted(ranks))).encode()).hexdigest()[:16] + f"_{n}"
        if megatron:
            desc = "unused" if desc == "unused" else "undefined"
        groups[name] = Group(name, desc, sorted(ranks))
        n += 1

    for b in range(0, WORLD, 2):
        add("tp", [b, b + 1])
    if megatron:
        for d in range(4):
            for t in (0, 1):
                add("unused", [d * 2 + t, 8 + d * 2 + t])
    for s in (0, 1):
        for t in (0, 1):
            add("dp", [s * 8 + d * 2 + t for d in range(4)])
    for d in range(4):
        for t in (0, 1):
            add("pp", [d * 2 + t, 8 + d * 2 + t])
    if megatron:
        add("unused", list(range(8)))
    for s in (0, 1):
        add("ep", [s * 8 + i for i in range(8)])
    return groups


def group_of(groups: dict[str, Group], desc: str, rank: int) -> Group:
    return next(g for g in groups.values() if g.desc == desc and rank in g.ranks)


def families(groups: dict[str, Group], rank: int) -> tuple[Group, Group, Group, Group]:
    """The rank's tp, dp, pp and ep groups (by creation position when the descriptions say nothing)."""
    if all(g.desc != "tp" for g in groups.values()):
        mine = [g for g in groups.values() if rank in g.ranks and g.desc != "unused" and g.desc != "default_pg"]
        tp, dp, pp, ep = mine
        return tp, dp, pp, ep
    tp, dp, pp, ep = (group_of(groups, d, rank) for d in ("tp", "dp", "pp", "ep"))
    return tp, dp, pp, ep


def program(groups: dict[str, Group], rank: int) -> list[Op]:
    stage = rank // 8
    tp, dp, pp, ep = families(groups, rank)
    peer = rank + 8 if stage == 0 else rank - 8
    me = ep.ranks.index(rank)
    out: list[Op] = []

    def layer(step: int, mb: int, phase: int) -> None:
        out.append(Op("all_reduce", tp.name))
        send = [1 + (me * 7 + j * 3 + step * 5 + mb * 11 + phase * 13) % 6 for j in range(8)]
        recv = [1 + (i * 7 + me * 3 + step * 5 + mb * 11 + phase * 13) % 6 for i in range(8)]
        out.append(Op("all_to_all", ep.name, sizes=([[sum(send), 512]], [[sum(recv), 512]])))

    def p2p(kind: str) -> None:
        lp, lme = pp.ranks.index(peer), pp.ranks.index(rank)
        name = f"send {lme}->{lp}" if kind == "send" else f"recv {lme}<-{lp}"
        out.append(Op(name, pp.name, sizes=([[4096]], [[4096]]), peer=peer))

    for step in range(STEPS):
        if stage == 0:
            for mb in (0, 1):
                layer(step, mb, 0)
                p2p("send")
            for mb in (0, 1):
                p2p("recv")
                layer(step, mb, 1)
        else:
            for mb in (0, 1):
                p2p("recv")
                layer(step, mb, 0)
                layer(step, mb, 1)
                p2p("send")
        out.append(Op("_reduce_scatter_base", dp.name, dtype="Float", sizes=([[8192]], [[2048]])))
        out.append(Op("_all_gather_base", dp.name, sizes=([[2048]], [[8192]]), parts=3))
        out.append(Op("all_reduce", "0", dtype="Float", sizes=([[1]], [[1]]), sync=True))
    return out


@dataclass
class Fault:
    kind: str  # stop, stall, dtype, hw, unknown
    rank: int
    at: int  # index into the rank's program


@dataclass
class Sim:
    groups: dict[str, Group]
    progs: dict[int, list[Op]]
    faults: list[Fault]
    enq: dict[int, int] = field(default_factory=dict)  # ops enqueued
    done: dict[int, int] = field(default_factory=dict)  # ops completed (stream head index)
    done_at: dict[tuple[int, int], int] = field(default_factory=dict)  # (rank, index) -> completion tick
    enq_at: dict[tuple[int, int], int] = field(default_factory=dict)
    start_at: dict[tuple[int, int], int] = field(default_factory=dict)

    def fault(self, rank: int, kind: str) -> Fault | None:
        return next((f for f in self.faults if f.rank == rank and f.kind == kind), None)

    def key(self, rank: int, i: int) -> tuple[str, int, int]:
        """(group, per-group counter kind, number) of op i on rank: matches the same op on other ranks."""
        op = self.progs[rank][i]
        if op.peer is not None:
            # the n-th op between this pair in this group (programs are written so that this matches)
            n = sum(1 for o in self.progs[rank][:i] if o.peer == op.peer and o.group == op.group)
            return (op.group, min(rank, op.peer) * 1000 + max(rank, op.peer), n)
        n = sum(1 for o in self.progs[rank][:i] if o.group == op.group and o.peer is None)
        return (op.group, -1, n)

    def run(self) -> None:
        for r in self.progs:
            self.enq[r] = self.done[r] = 0
        tick = 0
        changed = True
        while changed:
            changed = False
            tick += 1
            for r, prog in self.progs.items():
                stop = self.fault(r, "stop")
                while self.enq[r] < len(prog) and self.enq[r] - self.done[r] < WINDOW:
                    if stop is not None and self.enq[r] >= stop.at:
                        break
                    prev = self.enq[r] - 1
                    if prev >= 0 and prog[prev].sync and self.done[r] <= prev:
                        break
                    self.enq_at[(r, self.enq[r])] = tick
                    self.enq[r] += 1
                    changed = True
            heads: dict[tuple[str, int, int], list[int]] = {}
            for r in self.progs:
                h = self.done[r]
                if h < self.enq[r]:
                    self.start_at.setdefault((r, h), tick)
                    heads.setdefault(self.key(r, h), []).append(r)
            for rs in heads.values():
                op = self.progs[rs[0]][self.done[rs[0]]]
                need = {op.peer, rs[0]} if op.peer is not None else set(self.groups[op.group].ranks)
                if set(rs) != need:
                    continue
                if any(self.fault(r, "hw") and self.fault(r, "hw").at == self.done[r] for r in rs):  # type: ignore[union-attr]
                    continue
                if any(self.fault(r, "dtype") and self.fault(r, "dtype").at == self.done[r] for r in rs):  # type: ignore[union-attr]
                    continue
                for r in rs:
                    stall = self.fault(r, "stall")
                    if stall is not None and self.done[r] == stall.at:
                        continue  # its peers complete the op; its own stream never does
                    self.done_at[(r, self.done[r])] = tick
                    self.done[r] += 1
                    changed = True


def dumps(
    sim: Sim, *, version: str, timing: bool, active_only: bool, unknown: dict[int, int], lazy_config: bool = False
) -> dict[int, dict[str, Any]]:
    minor = int(version.split(".")[1])
    out = {}
    for r, prog in sim.progs.items():
        local = {g.name: i for i, g in enumerate(g for g in sim.groups.values() if r in g.ranks)}
        coll: dict[str, int] = {}
        p2p: dict[str, int] = {}
        status: dict[str, dict[str, int]] = {}
        entries = []
        rec = 0
        offset = r * 7_000_000_123  # every rank has its own clock
        for i in range(sim.enq[r]):
            op = prog[i]
            g = sim.groups[op.group]
            if op.peer is None:
                coll[g.name] = coll.get(g.name, 0) + 1
                seq, pseq = coll[g.name], p2p.get(g.name, 0)
            else:
                p2p[g.name] = p2p.get(g.name, 0) + 1
                seq, pseq = coll.get(g.name, 0), p2p[g.name]
            completed = (r, i) in sim.done_at
            started = (r, i) in sim.start_at
            dtype = "Float8_e4m3fn" if sim.fault(r, "dtype") and sim.fault(r, "dtype").at == i else op.dtype  # type: ignore[union-attr]
            st = status.setdefault(str(local[g.name]), {"last_enqueued_collective": -1, "last_started_collective": -1,
                                                        "last_completed_collective": -1})  # fmt: skip
            if op.peer is None:
                st["last_enqueued_collective"] = seq
                if completed:
                    st["last_completed_collective"] = seq
                if started and timing:
                    st["last_started_collective"] = seq
            state = "scheduled"
            if timing and completed:
                state = "completed"
            elif timing and started:
                state = "started"
            names = [op.name] * (op.parts - 1) + ["coalesced"] if op.parts > 1 else [op.name]
            if unknown.get(r) == i:
                names = ["my_fused_allreduce"]
            for name in names:
                created = T0 + offset + sim.enq_at[(r, i)] * 1_000_000 + rec * 1000
                e: dict[str, Any] = {
                    "record_id": rec, "pg_id": local[g.name], "process_group": [g.name, g.desc],
                    "collective_seq_id": seq, "p2p_seq_id": pseq, "op_id": rec + 1,
                    "profiling_name": f"nccl:{name}", "time_created_ns": created,
                    "input_sizes": op.sizes[0], "input_dtypes": [dtype], "output_sizes": op.sizes[1],
                    "output_dtypes": [dtype], "state": state,
                    "time_discovered_started_ns": (T0 + offset + sim.start_at[(r, i)] * 1_000_000 + 500_000)
                    if timing and started else None,
                    "time_discovered_completed_ns": (T0 + offset + sim.done_at[(r, i)] * 1_000_000 + 900_000)
                    if timing and completed else None,
                    "retired": completed, "timeout_ms": 600_000, "is_p2p": op.peer is not None,
                    "duration_ms": (sim.done_at[(r, i)] - sim.start_at[(r, i)]) * 1.0 + 0.4
                    if timing and completed else None,
                    "thread_id": "140000000000000", "thread_name": "pt_main_thread", "frames": [],
                }  # fmt: skip
                if minor < 3:
                    e.pop("is_p2p")
                if minor < 4 and op.name == "all_to_all":
                    e["input_sizes"], e["output_sizes"] = [], []
                rec += 1
                if active_only and completed:
                    continue
                entries.append(e)
        # lazy_config: torch writes a group into pg_config when this rank sets up its communicator
        configured = [g for g in sim.groups.values() if g.desc != "unused" and (
            not lazy_config or any(o.group == g.name for o in prog[: sim.enq[r]]))]  # fmt: skip
        d: dict[str, Any] = {
            "version": version, "comm_lib_version": "2.21.5", "nccl_comm_state": {},
            "pg_config": {g.name: {"name": g.name, "desc": g.desc, "ranks": json.dumps(g.ranks)}
                          for g in configured},
            "entries": entries,
        }  # fmt: skip
        if minor >= 5:
            d["pg_status"] = status
        out[r] = d
    return out


CASES: list[dict[str, Any]] = [
    {
        "name": "nccl-stop-r9-active-notiming",
        "faults": [("stop", 9, 20)],
        "version": "2.10",
        "timing": False,
        "active": True,
        "fmt": "pickle",
        "truth": {"roots": [9], "kind": "H1"},
    },
    {
        "name": "nccl-stall-r4-timing",
        "faults": [("stall", 4, 10)],
        "version": "2.8",
        "timing": True,
        "active": False,
        "fmt": "json",
        "truth": {"roots": [4], "kind": "H3"},
    },
    {
        "name": "nccl-stall-r4-active-notiming",
        "faults": [("stall", 4, 10)],
        "version": "2.10",
        "timing": False,
        "active": True,
        "fmt": "pickle",
        "truth": {"roots": [4], "kind": "H3"},
    },
    {
        "name": "nccl-dtype-r6",
        "faults": [("dtype", 6, 12)],
        "version": "2.6",
        "timing": True,
        "active": True,
        "fmt": "json",
        "truth": {"roots": [6], "kind": "H2"},
    },
    {
        "name": "nccl-hw-ep-stage0",
        "faults": [("hw", 2, 16)],
        "version": "2.10",
        "timing": True,
        "active": False,
        "fmt": "pickle",
        "truth": {
            "roots": [],
            "kind": "H3",
            "why": "every member entered and none completed: FR has no counters to name the rank",
        },
    },
    {
        "name": "nccl-two-stop-r3-stall-r5",
        "faults": [("stop", 3, 1), ("stall", 5, 0)],
        "version": "2.10",
        "timing": False,
        "active": True,
        "fmt": "json",
        "truth": {"roots": [3, 5], "kind": "H1+H3"},
    },
    {
        "name": "nccl-stop-r0-missing-r0",
        "faults": [("stop", 0, 18)],
        "version": "2.10",
        "timing": False,
        "active": True,
        "fmt": "pickle",
        "drop": [0],
        "truth": {"roots": [0], "kind": "H1"},
    },
    {
        "name": "nccl-stop-r13-missing-r2",
        "faults": [("stop", 13, 17)],
        "version": "2.9",
        "timing": False,
        "active": True,
        "fmt": "json",
        "drop": [2],
        "truth": {"roots": [13], "kind": "H1"},
    },
    {
        "name": "nccl-stop-r8-before-recv-v2.4",
        "faults": [("stop", 8, 12)],
        "version": "2.4",
        "timing": True,
        "active": False,
        "fmt": "pickle",
        "truth": {"roots": [8], "kind": "H1"},
    },
    {
        "name": "nccl-stop-r5-v2.2",
        "faults": [("stop", 5, 18)],
        "version": "2.2",
        "timing": False,
        "active": False,
        "fmt": "json",
        "truth": {"roots": [5], "kind": "H1"},
    },
    {
        "name": "nccl-stop-r11-unknown-op",
        "faults": [("stop", 11, 19)],
        "version": "2.10",
        "timing": True,
        "active": False,
        "fmt": "json",
        "unknown": {7: 3},
        "truth": {"roots": [11], "kind": "H1"},
    },
    {
        "name": "nccl-stop-r7-coalesced",
        "faults": [("stop", 7, 14)],
        "version": "2.7",
        "timing": True,
        "active": False,
        "fmt": "pickle",
        "truth": {"roots": [7], "kind": "H1"},
    },
    # Megatron-style dumps (hashed group names, unused groups taking local pg ids, pg_config written
    # lazily): pg_status keys are local ids that are not positions in pg_config. Ranks whose Python
    # thread holds the GIL never enqueue the MoE all_to_all their expert group waits in; their
    # watchdog still dumps, and every entry they have is completed.
    {
        "name": "nccl-megatron-gil-r3-a2a-active",
        "megatron": True,
        "faults": [("stop", 3, 4)],
        "version": "2.10",
        "timing": False,
        "active": True,
        "fmt": "json",
        "truth": {"roots": [3], "kind": "H1"},
    },
    {
        "name": "nccl-megatron-gil-r3-r6-a2a-active",
        "megatron": True,
        "faults": [("stop", 3, 4), ("stop", 6, 4)],
        "version": "2.10",
        "timing": True,
        "active": True,
        "fmt": "pickle",
        "truth": {"roots": [3, 6], "kind": "H1"},
    },
    {
        "name": "nccl-megatron-gil-r12-a2a-full-hashed",
        "megatron": True,
        "hashed": True,
        "faults": [("stop", 12, 4)],
        "version": "2.8",
        "timing": False,
        "active": False,
        "fmt": "json",
        "truth": {"roots": [12], "kind": "H1"},
    },
    {
        "name": "nccl-megatron-stall-r10-active",
        "megatron": True,
        "faults": [("stall", 10, 16)],
        "version": "2.10",
        "timing": False,
        "active": True,
        "fmt": "pickle",
        "truth": {"roots": [10], "kind": "H3"},
    },
    {
        "name": "nccl-healthy-active",
        "faults": [],
        "version": "2.10",
        "timing": False,
        "active": True,
        "fmt": "pickle",
        "truth": {"roots": [], "kind": None},
    },
]


def write(case: dict[str, Any], root: Path) -> None:
    groups = topology(megatron=case.get("megatron", False), hashed=case.get("hashed", False))
    progs = {r: program(groups, r) for r in range(WORLD)}
    sim = Sim(groups, progs, [Fault(k, r, i) for k, r, i in case["faults"]])
    sim.run()
    out = root / case["name"]
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ds = dumps(sim, version=case["version"], timing=case["timing"], active_only=case["active"],
               unknown=case.get("unknown", {}), lazy_config=case.get("megatron", False))  # fmt: skip
    for r, d in ds.items():
        if r in case.get("drop", []):
            continue
        raw = json.dumps(d, separators=(",", ":")).encode() if case["fmt"] == "json" else pickle.dumps(d, protocol=4)
        name = f"nccl_trace_rank_{r}" + (".json" if case["fmt"] == "json" else "")
        if case["active"]:
            (out / name).write_bytes(raw)  # small: only the unfinished entries
        else:
            (out / (name + ".gz")).write_bytes(gzip.compress(raw, mtime=0))
    truth = dict(case["truth"], world_size=WORLD, source="synthetic NCCL-format dumps (benchmarks/fr/synth.py)",
                 faults=[list(f) for f in case["faults"]], version=case["version"], timing=case["timing"],
                 active_only=case["active"], format=case["fmt"], dropped_dumps=case.get("drop", []))  # fmt: skip
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")


def random_cases(n: int, seed: int, megatron: bool = False) -> list[dict[str, Any]]:
    """Single-fault cases at random ranks and ops, in random formats, some with a dump dropped (not committed).

    Stalls and dtype changes hit collectives only (a p2p op cannot be paired across ranks, so
    nothing in a dump can single out its stalled side) and dtype changes only groups of three or
    more (two ranks that disagree have no majority).
    """
    rng = random.Random(seed)
    spelling = random.Random(seed + 1)  # its own draws: the faults stay those of the plain run
    groups = topology()
    out = []
    for i in range(n):
        rank = rng.randrange(WORLD)
        prog = program(groups, rank)
        kind = rng.choice(["stop", "stop", "stall", "dtype"])
        ok = [j for j, o in enumerate(prog) if o.peer is None and (kind != "dtype" or len(groups[o.group].ranks) > 2)]
        at = rng.choice(ok if kind != "stop" else list(range(len(prog) - 1)))
        drop = []
        if rng.random() < 0.25:
            drop = [rank] if rng.random() < 0.5 else [rng.choice([r for r in range(WORLD) if r != rank])]
        truth_kind = {"stop": "H1", "stall": "H3", "dtype": "H2"}[kind]
        if rank in drop:
            truth_kind = "H1"  # its own evidence is gone: it is the rank that wrote no dump
        version = rng.choice(["2.2", "2.4", "2.6", "2.8", "2.10"])
        out.append({
            "name": f"rand{i:03d}-{kind}-r{rank}-at{at}" + (f"-drop{drop[0]}" if drop else ""),
            "faults": [(kind, rank, at)], "version": version, "timing": rng.random() < 0.5,
            # only-active dumps come with pg_status (2.5 on here): without it they would say nothing
            "active": int(version.split(".")[1]) >= 5 and rng.random() < 0.5, "fmt": rng.choice(["json", "pickle"]),
            "drop": drop, "truth": {"roots": [rank], "kind": truth_kind},
        })  # fmt: skip
        if megatron:
            # the same faults, spelled as a Megatron-style job (unused groups, lazy pg_config)
            out[-1] |= {"megatron": True, "hashed": spelling.random() < 0.5}
            out[-1]["name"] = out[-1]["name"].replace("rand", "randmeg", 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", type=Path, default=HERE / "nccl")
    p.add_argument("--random", type=int, default=0, help="write this many random single-fault cases instead")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--megatron", action="store_true", help="random cases as Megatron-style dumps")
    args = p.parse_args(argv)
    cases = random_cases(args.random, args.seed, args.megatron) if args.random else CASES
    for case in cases:
        write(case, args.out)
        print(case["name"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
