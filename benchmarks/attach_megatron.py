"""The attachment's cost on a Megatron-style job: the simulator's op mix replayed through the real hooks.

``attach_overhead.py`` times collectives of one kind. A Megatron job issues another mix, all of it
from Python: tensor-parallel all-reduces inside every layer, the pipeline's sends and receives per
micro-batch, the gradient buckets' reduce-scatters during the last backward pass and their
all-gathers at the end of the step, and with experts two all-to-alls per MoE layer. This plays one
rank's operations as the simulator (``producers/simulator/megatron.py``) schedules them for the
layout and workload given, in their order, on real gloo groups through ``torch.distributed``'s
Python functions, with the compute between them (torch matmuls) scaled so a plain step lasts
``ops per step / --rate`` seconds.

Two processes: rank 0 is the measured rank (every collective on a group of its own size 1, one
group per communicator of the simulated rank; tensors of ``--elements``, the hooks' cost does not
depend on the size); rank 1 only answers rank 0's sends and receives, in the same order. Modes
(none and each ``--sources``) alternate in blocks of ``--steps-per-block`` steps, the order rotated;
per mode: the training thread's time in the hooks per step (median, p99), the attachment's threads'
CPU per step, their sum as a share of the plain step, and the wall-time A/B of paired blocks with its
95 % interval (the columns of ``attach_overhead.py``).

    python benchmarks/attach_megatron.py --rate 500 --blocks 20 --steps-per-block 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

from attach_overhead import CountingSink, cost_columns, print_consumed, time_block, time_calls

#: (communicator index, op type name, seconds of compute before it in the simulated step)
Op = tuple[int, str, float]


def megatron_step(layout: dict[str, int], workload: dict[str, Any], *, ranks: int, rank: int = 0,
                  step: int = 2) -> list[Op]:  # fmt: skip
    """Step ``step`` of rank ``rank`` as the simulator plays the job: every op in order (every op
    detailed: no sampling), its communicator numbered by first use, and the compute before it. Steps
    end with the data-parallel all-gathers of the gradient buckets (the only all-gathers without
    sequence parallelism)."""
    import numpy as np

    from ccld.producers.simulator.megatron import MegatronSim
    from ccld.producers.simulator.scenario import Scenario
    from ccld.producers.simulator.topology import Topology
    from ccld.records import COMM_COLUMN, OpType, Status

    wl = {**workload, "seq_parallel": False}
    sc = Scenario.from_dict({"id": "attach-megatron", "ranks": ranks, "layout": layout, "duration_s": 60.0,
                             "clock_skew_s": 0.0, "jitter": 0.0, "workload": wl})  # fmt: skip
    topo = Topology.build(sc)
    sim = MegatronSim(sc, topo, job=sc.id, producer="bench", skew_s=np.zeros(len(topo.hosts)), detail_ops_per_s=1e12)
    rows: list[tuple[int, int, int, int]] = []  # (t_enter, t_exit, comm, op type)
    buckets = int(sc.workload.dp_buckets) if sc.workload is not None else 1
    gathers = 0
    for _t, b in sim.run():
        c = b.columns
        comm = c.get(COMM_COLUMN)
        mine = np.nonzero((c["rank"] == rank) & (c["status"] == int(Status.DONE)))[0]
        for i in mine.tolist():
            op = int(c["op_type"][i])
            rows.append((int(c["t_enter_ns"][i]), int(c["t_exit_ns"][i]),
                         int(comm[i]) if comm is not None else b.comm_hash, op))  # fmt: skip
            gathers += op == int(OpType.ALL_GATHER)
        if gathers >= buckets * (step + 2):
            break
    rows.sort()
    steps: list[list[tuple[int, int, int, int]]] = [[]]
    run = 0
    for r in rows:
        steps[-1].append(r)
        run = run + 1 if r[3] == int(OpType.ALL_GATHER) else 0
        if run == buckets:
            steps.append([])
            run = 0
    if len(steps) <= step + 1:
        raise SystemExit(f"the simulated job made {len(steps) - 1} steps, not {step + 1}")
    comms: dict[int, int] = {}
    out: list[Op] = []
    prev_exit = steps[step][0][0]
    for t_enter, t_exit, comm, op in steps[step]:
        out.append((comms.setdefault(comm, len(comms)), OpType(op).name, max(0, t_enter - prev_exit) / 1e9))
        prev_exit = max(prev_exit, t_exit)
    return out


def _player(ops: list[Op], groups: dict[int, Any], elements: int) -> tuple[Callable[[list[int]], None], int]:
    """A function that plays one step (the matmuls before each op given) on rank 0, and the ops' count."""
    import torch
    import torch.distributed as dist

    t = torch.ones(elements)
    out = torch.empty(elements)
    a, b = torch.randn(64, 64), torch.randn(64, 64)

    def play(matmuls: list[int]) -> None:
        pending = []
        for (gi, op, _gap), n in zip(ops, matmuls, strict=True):
            for _ in range(n):
                torch.mm(a, b)
            g = groups.get(gi)  # (none for a send or a receive: they go to rank 1)
            if op == "ALL_REDUCE":
                dist.all_reduce(t, group=g)
            elif op == "REDUCE_SCATTER":  # Megatron's distributed optimizer: async, waited for at the step's end
                pending.append(dist.reduce_scatter_tensor(out, t, group=g, async_op=True))
            elif op == "ALL_GATHER":
                dist.all_gather_into_tensor(out, t, group=g)
            elif op == "ALL_TO_ALL":
                dist.all_to_all_single(out, t, group=g)
            elif op == "SEND":
                dist.send(t, dst=1)
            elif op == "RECV":
                dist.recv(t, src=1)
            else:  # pragma: no cover - the simulator's Megatron model issues only the ops above
                raise SystemExit(f"no replay for {op}")
        for w in pending:
            w.wait()

    return play, len(ops)


def _collective_groups(ops: list[Op]) -> list[int]:
    """The communicators of the collectives, in the order both ranks make their groups (send and
    receive go over the default group, to rank 1)."""
    return sorted({gi for gi, op, _ in ops if op not in ("SEND", "RECV")})


def _init(rank: int, store_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)


def partner(ops: list[Op], store_path: str, steps: int, elements: int) -> None:
    """Rank 1: answers rank 0's sends and receives, in their order, for ``steps`` steps."""
    import torch
    import torch.distributed as dist

    _init(1, store_path)
    for _ in _collective_groups(ops):
        dist.new_group([0])  # every rank makes every group, in the same order
    t = torch.ones(elements)
    p2p = [op for _gi, op, _ in ops if op in ("SEND", "RECV")]
    for _ in range(steps):
        for op in p2p:
            if op == "SEND":
                dist.recv(t, src=0)
            else:
                dist.send(t, dst=0)
    dist.barrier()
    dist.destroy_process_group()


def measured(ops: list[Op], store_path: str, args: argparse.Namespace, out_path: str) -> None:
    """Rank 0: calibrate the compute, then the modes in alternating blocks; the results as JSON to ``out_path``."""
    import torch.distributed as dist

    from ccld.producers.attach import attach, detach
    from ccld.settings import Settings

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 renames the ops Megatron calls
    _init(0, store_path)
    groups = {gi: dist.new_group([0]) for gi in _collective_groups(ops)}
    play, n_ops = _player(ops, groups, args.elements)
    gaps = [gap for _gi, _op, gap in ops]
    total_gap = sum(gaps) or 1.0
    target_ns = n_ops / args.rate * 1e9

    def matmuls(per_mm_ns: float, comm_ns: float) -> list[int]:
        budget = max(0.0, target_ns - comm_ns) / per_mm_ns  # matmuls a step, spread as the simulator's gaps
        return [int(round(budget * g / total_gap)) for g in gaps]

    none = [0] * n_ops
    comm_ns = statistics.median(time_calls(lambda: play(none), 3))
    per_mm = 20_000.0
    for _ in range(3):
        mm = matmuls(per_mm, comm_ns)
        wall = statistics.median(time_calls(lambda: play(mm), 2))  # noqa: B023 - called at once
        per_mm = max(1.0, (wall - comm_ns) / max(1, sum(mm)))
    mm = matmuls(per_mm, comm_ns)

    def step() -> None:
        play(mm)

    settings = Settings.load({}, job="attach-megatron")
    modes = ["none", *args.sources.split(",")]
    times: dict[str, list[int]] = {m: [] for m in modes}
    means: dict[str, list[float]] = {m: [] for m in modes}
    hooks: dict[str, list[int]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    off_gil: dict[str, list[float]] = {m: [] for m in modes}
    seen: dict[str, list[float]] = {m: [] for m in modes}
    for block in range(args.blocks):
        for mode in modes[block % len(modes) :] + modes[: block % len(modes)]:
            att = None
            if mode != "none":
                att = attach(settings, sink=CountingSink(), markers=False, source=mode, cost=True)
            block_times = time_block(step, args.steps_per_block, att, hooks[mode], cpu[mode], off_gil[mode])
            times[mode] += block_times
            means[mode].append(statistics.fmean(block_times))
            if mode != "none":
                st = detach()
                seen[mode].append(int(st.get("calls", 0)) / (args.steps_per_block * n_ops))
        print(f"block {block + 1}/{args.blocks}", file=sys.stderr, flush=True)
    base = statistics.median(means["none"]) / 1e6
    res: dict[str, Any] = {"ops_per_step": n_ops, "rate_per_s": args.rate, "matmuls": sum(mm),
                           "mix": {op: sum(1 for _g, o, _ in ops if o == op) for op in sorted({o for _g, o, _ in ops})},
                           "communicators": len(groups) + 1, "modes": {}}  # fmt: skip
    for mode in modes:
        med = statistics.median(means[mode]) / 1e6
        ordered = sorted(times[mode])
        row = {"step_ms": med, "added_ms": med - base, "median_step_ms": statistics.median(ordered) / 1e6,
               "p99_step_ms": ordered[int(0.99 * (len(ordered) - 1))] / 1e6,
               "seen": statistics.median(seen[mode]) if seen[mode] else 0.0}  # fmt: skip
        row.update(cost_columns(mode, hooks[mode], cpu[mode], means, base, off_gil[mode]))
        res["modes"][mode] = row
    dist.barrier()
    dist.destroy_process_group()
    with open(out_path, "w") as f:
        json.dump(res, f)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", default='{"tp": 2, "pp": 2, "dp": 4, "ep": 2}', help="the simulated job's layout (JSON)")
    p.add_argument("--workload", default='{"microbatches": 8, "layers": 8, "dp_buckets": 4, "moe_every": 2}',
                   help="the simulated Megatron workload (JSON; scenario format)")
    p.add_argument("--rate", type=float, default=500.0, help="collectives per second of the measured rank")
    p.add_argument("--blocks", type=int, default=20, help="alternating blocks per mode (pairs of the A/B)")
    p.add_argument("--steps-per-block", type=int, default=3)
    p.add_argument("--sources", default="auto", help="attach sources to measure beside none, comma-separated")
    p.add_argument("--elements", type=int, default=1024, help="elements of every tensor")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    layout, workload = json.loads(args.layout), json.loads(args.workload)
    ranks = 1
    for k in ("tp", "pp", "dp"):
        ranks *= int(layout.get(k, 1))
    ops = megatron_step(layout, workload, ranks=ranks)
    # the steps rank 0 plays: 3 + 3 x 2 to calibrate the compute, then every mode's blocks
    steps = 3 + 3 * 2 + args.blocks * (1 + len(args.sources.split(","))) * args.steps_per_block
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="ccld-megatron-") as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out.json")
        peer = ctx.Process(target=partner, args=(ops, store, steps, args.elements), daemon=True)
        peer.start()
        me = ctx.Process(target=measured, args=(ops, store, args, out))
        me.start()
        me.join()
        peer.join(timeout=30)
        if me.exitcode != 0 or not os.path.exists(out):
            print(f"the measured rank failed (exit {me.exitcode})", file=sys.stderr)
            return 1
        with open(out) as f:
            res = json.load(f)
    if args.json:
        print(json.dumps({"layout": layout, "workload": workload, **res}))
        return 0
    plain = res["modes"]["none"]["step_ms"]
    print(f"one rank of a Megatron-style job {layout}: {res['ops_per_step']} ops a step ({res['mix']}), "
          f"{res['communicators']} communicators, {args.rate:.0f} ops/s, plain step {plain:.1f} ms")  # fmt: skip
    print("seen per mode: " + ", ".join(f"{m} {r['seen']:.2f}" for m, r in res["modes"].items() if m != "none"))
    print_consumed(res["modes"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
