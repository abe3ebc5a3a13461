"""Overhead of the torch.distributed attachment per source: attached vs not, same script, medians.

One gloo rank (world size 1, in process). Two parts:

- per call: small collectives in alternating blocks, with and without
  ``ccld.producers.attach.attach(source=...)`` for each source (wrap, fr, both), every call
  timed with ``perf_counter_ns``: the added microseconds per call (target: < 20 us) and the ratio.
- per step (``--steps-per-block``, 0 skips it): training-like steps of ``--coll-per-step``
  collectives plus compute (torch matmuls, calibrated so the rank runs ``--rate`` collectives/s,
  default 1,000), half called from Python (``dist.all_reduce``) and half on the process group
  directly, as DDP's C++ reducer does (the wrapper cannot see those). Modes none and the sources
  alternate in blocks after the Flight Recorder ring is full (its steady state; ``SOURCE-gil``, e.g.
  ``auto-gil``, is that source reading the ring through torch's binding, which holds the GIL for each
  dump, rather than its C++ function: the two side by side); prints the
  step time (median over blocks of each block's mean step: a poll's cost lands on the few steps
  it overlaps, which a median step would hide), the added cost per step and per collective
  against the unattached steps, the median, p99 and longest single step, the share of
  collectives each source saw, and the poller's own cost per poll. ``TORCH_FR_BUFFER_SIZE``
  sets the ring's size (default 2,000 entries). Each block attaches and detaches, where a job
  attaches once: the poller's first read of the full ring (30-40 ms) would land in every block, so
  each block first plays ``--warmup-s`` of untimed steps (every mode alike), then, under a source
  that will read the ring, more until that first read has come (``auto`` turns the poller on at
  the end of the first step that computes before its collectives), and the last read, at detach,
  comes after its timing.
- DDP (``--ddp-steps-per-block``, 0 skips it): a real ``DistributedDataParallel`` model (its
  gradient all-reduces come from the C++ reducer only, no collective from Python), steps of
  forward, backward and SGD, with no attachment, ``wrap`` (blind to them), ``auto`` (the
  default: it turns the poller on when it finds collectives the wrapper did not see) and
  ``auto-nost`` (``auto`` without the status reads that time exits between polls), alternating
  blocks after the ring is full: the same columns as the per-step part.

``auto`` in the per-call part is the default on gloo when every collective comes from Python: the
wrapper plus, before each collective, the comparison of Flight Recorder's count with its own.

The records go to a counting sink by default (emission runs on the attachment's own thread,
so the training thread's cost does not depend on the sink) or, with ``--bootstrap``, to a
real broker through ``MetricsProducer``.

    python benchmarks/attach_overhead.py [--calls 20000] [--blocks 10] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

TARGET_US = 20.0
SOURCES = ("wrap", "fr", "both", "auto")
GIL_SUFFIX = "-gil"  # a step-part mode: the source with Flight Recorder read through torch's binding (attach_as)


class CountingSink:
    def __init__(self) -> None:
        self.n = 0

    def submit(self, record: Any) -> None:
        self.n += 1

    def flush(self, timeout_s: float = 0.0) -> int:
        return 0

    def close(self, timeout_s: float = 0.0) -> None:
        pass


def time_calls(fn: Callable[[], Any], n: int) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def time_consumed(fn: Callable[[], Any], n: int, cost: Any) -> tuple[list[int], list[int], int]:
    """``n`` steps under an attachment that measures its cost: each step's wall time and the training
    thread's time inside the attachment's hooks in it; and its threads' CPU time over all of them."""
    from ccld.producers.attach.cost import attachment_cpu_ns

    walls, hooks = [], []
    clock = time.perf_counter_ns
    cpu0 = attachment_cpu_ns()
    for _ in range(n):
        h0, t0 = cost.ns, clock()
        fn()
        walls.append(clock() - t0)
        hooks.append(cost.ns - h0)
    return walls, hooks, attachment_cpu_ns() - cpu0


def warmup_steps(args: argparse.Namespace, step_s: float) -> int:
    """Steps played after each block's attach and before its timing: a job attaches once, so the
    poller's first read of the full ring (30-40 ms, once) is no part of its steady state."""
    return max(1, math.ceil(args.warmup_s / max(step_s, 1e-3))) if args.warmup_s > 0 else 0


def settle(att: Any, fn: Callable[[], Any], step_s: float) -> int:
    """Untimed steps, after the warm-up, until an attachment whose poller will read the ring has read it
    once (``auto`` turns it on only once it sees collectives the wrapper cannot: in a step that computes
    first, at the end of the warm-up step, so that first read of the whole ring, once per attach, would
    land in the timed steps of some blocks and not others); at most 3 s of steps. Returns the steps played."""
    poller = getattr(att, "poller", None)
    played = 0
    if poller is None:
        return 0
    deadline = time.monotonic() + max(3.0, 3 * step_s)
    while poller.stats.polls == 0 and time.monotonic() < deadline:
        fn()
        played += 1
    return played


def attach_as(mode: str, attach: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``mode``'s attachment: a source; ``SOURCE-gil`` is that source reading Flight Recorder's ring through
    torch's binding, which holds the GIL for each dump, instead of its C++ function (``fr_native``)."""
    from ccld.producers.attach.fr_native import ENV_NATIVE

    source = mode.removesuffix(GIL_SUFFIX)
    if source == mode:
        return attach(*args, source=source, **kw)
    prior = os.environ.get(ENV_NATIVE)
    os.environ[ENV_NATIVE] = "0"  # read by the poller when it is made, at attach
    try:
        return attach(*args, source=source, **kw)
    finally:
        if prior is None:
            del os.environ[ENV_NATIVE]
        else:
            os.environ[ENV_NATIVE] = prior


def time_block(fn: Callable[[], Any], n: int, att: Any, hooks: list[int], cpu: list[float],
               off_gil: list[float] | None = None) -> list[int]:  # fmt: skip
    """``n`` steps' wall times; under an attachment that measures its cost (``att``), its per-step hook time
    goes to ``hooks``, its threads' CPU per step to ``cpu``, and the part of that CPU its poller spent in
    Flight Recorder's dump without holding the GIL (``fr_native``) to ``off_gil``."""
    if att is None or att.hooks.cost is None:
        return time_calls(fn, n)
    stats = getattr(getattr(att, "poller", None), "stats", None)
    native0 = stats.native_dump_ns if stats is not None else 0
    walls, in_hooks, cpu_ns = time_consumed(fn, n, att.hooks.cost)
    hooks += in_hooks
    cpu.append(cpu_ns / n)
    if off_gil is not None:
        off_gil.append((stats.native_dump_ns - native0) / n if stats is not None else 0.0)
    return walls


def cost_columns(mode: str, hooks: list[int], cpu: list[float], means: dict[str, list[float]], base: float,
                 off_gil: list[float] | None = None) -> dict[str, float]:  # fmt: skip
    """A mode's consumed columns (``consumed_row``) and its wall-time A/B: each block against the unattached
    block of the same round."""
    row: dict[str, float] = consumed_row(hooks, cpu, base, off_gil) if hooks else {}
    if mode != "none":
        diff, half = paired_ci([(m - n) / 1e6 for m, n in zip(means[mode], means["none"], strict=True)])
        row.update(ab_ms=diff, ab_ci_ms=half, ab_pairs=len(means[mode]))
    return row


def consumed_row(hooks: list[int], cpu_per_step: list[float], base_ms: float,
                 off_gil_per_step: list[float] | None = None) -> dict[str, float]:  # fmt: skip
    """What the attachment consumed per step: the training thread's time in it (median, p99), its
    threads' CPU (median over blocks), and their sum as a share of the unattached step; and the share
    a Python training thread can wait for: the same less the threads' CPU spent without the GIL (Flight
    Recorder's native dump, on a core of its own where the host has one free). Still an upper bound:
    librdkafka's threads and the Python threads' waits for the GIL hold no GIL either, and are counted."""
    ordered = sorted(hooks)
    med_us = statistics.median(ordered) / 1e3
    cpu_us = statistics.median(cpu_per_step) / 1e3 if cpu_per_step else 0.0
    off = off_gil_per_step or [0.0] * len(cpu_per_step)  # one per block, as time_block appends them
    held_us = statistics.median(c - o for c, o in zip(cpu_per_step, off, strict=True)) / 1e3 if cpu_per_step else 0.0
    hook_us = statistics.fmean(hooks) / 1e3
    return {"hook_us_p50": med_us, "hook_us_p99": ordered[int(0.99 * (len(ordered) - 1))] / 1e3,
            "threads_cpu_us": cpu_us, "consumed_pct": 100 * (hook_us + cpu_us) / (base_ms * 1e3),
            "off_gil_us": statistics.median(off) / 1e3 if off else 0.0,
            "gil_pct": 100 * (hook_us + held_us) / (base_ms * 1e3),
            "threads_core_pct": 100 * cpu_us / (base_ms * 1e3)}  # fmt: skip


def paired_ci(diffs: list[float]) -> tuple[float, float]:
    """The mean of paired block differences and the half-width of its 95 % interval (Student's t for the
    usual 5-40 pairs; normal beyond)."""
    n = len(diffs)
    if n < 2:
        return (diffs[0] if diffs else 0.0), float("inf")
    # Student's t at 97.5 % by degrees of freedom (n - 1), the nearest tabled below (conservative)
    t95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 7: 2.36, 9: 2.26, 14: 2.14, 19: 2.09, 29: 2.05, 39: 2.02}
    df = n - 1
    t = t95[max(k for k in t95 if k <= df)] if df < 120 else 1.96
    return statistics.fmean(diffs), t * statistics.stdev(diffs) / n**0.5


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--calls", type=int, default=20_000, help="calls per mode and case")
    p.add_argument("--blocks", type=int, default=10, help="alternating blocks per mode")
    p.add_argument("--bootstrap", default="", help="send records to this broker instead of a counting sink")
    p.add_argument("--sources", default=",".join(SOURCES), help="attach sources to measure, comma-separated")
    p.add_argument("--steps-per-block", type=int, default=300, help="per-step part: steps per mode and block")
    p.add_argument("--step-blocks", type=int, default=5, help="per-step part: alternating blocks per mode")
    p.add_argument("--coll-per-step", type=int, default=10)
    p.add_argument("--rate", type=float, default=1000.0, help="collectives per second per rank in the step part")
    p.add_argument("--fr-poll-ms", type=float, default=100.0)
    p.add_argument("--ddp-steps-per-block", type=int, default=300, help="DDP part: steps per mode and block")
    p.add_argument("--ddp-blocks", type=int, default=5, help="DDP part: alternating blocks per mode")
    p.add_argument("--ddp-step-ms", type=float, default=10.0, help="DDP part: about how long a plain step lasts")
    p.add_argument("--warmup-s", type=float, default=0.5,
                   help="steps of about this long after each attach, not timed (0: none)")
    p.add_argument("--ddp-modes", default="wrap,auto,auto-nost", help="DDP part: modes beside none, comma-separated")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    sources = [x for x in args.sources.split(",") if x]

    import torch
    import torch.distributed as dist

    from ccld.producers.attach import attach, detach
    from ccld.settings import Settings

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    t = torch.ones(256)
    cases: dict[str, Callable[[], Any]] = {
        "all_reduce": lambda: dist.all_reduce(t),
        "all_reduce async+wait": lambda: dist.all_reduce(t, async_op=True).wait(),
        "broadcast": lambda: dist.broadcast(t, src=0),
        "barrier": lambda: dist.barrier(),
    }
    settings = Settings.load({}, bootstrap=args.bootstrap or None, job="attach-overhead")
    per_block = max(1, args.calls // args.blocks)
    results: dict[str, dict[str, float]] = {}
    sink_records = 0
    for source in (s for s in sources if not s.endswith(GIL_SUFFIX)):  # a call alone never reads the ring
        for name, fn in cases.items():
            time_calls(fn, 200)  # warm-up
            plain: list[int] = []
            attached: list[int] = []
            for _ in range(args.blocks):
                plain += time_calls(fn, per_block)
                sink = None if args.bootstrap else CountingSink()
                attach(settings, sink=sink, markers=False, source=source, fr_poll_s=args.fr_poll_ms / 1000)
                attached += time_calls(fn, per_block)
                stats = detach()
                sink_records += int(stats.get("records", 0))
            mp, ma = statistics.median(plain) / 1000, statistics.median(attached) / 1000
            results[f"{source}: {name}"] = {"plain_us": mp, "attached_us": ma, "added_us": ma - mp, "ratio": ma / mp}
    steps = step_part(args, settings, sources) if args.steps_per_block > 0 else {}
    ddp = ddp_part(args, settings) if args.ddp_steps_per_block > 0 else {}
    dist.destroy_process_group()
    worst = max(r["added_us"] for r in results.values())
    if args.json:
        print(json.dumps({"cases": results, "worst_added_us": worst, "records": sink_records, "steps": steps,
                          "ddp": ddp}))  # fmt: skip
    else:
        print(f"{'source: case':<32}{'plain us':>10}{'attached us':>13}{'added us':>10}{'ratio':>8}")
        for name, r in results.items():
            print(f"{name:<32}{r['plain_us']:>10.2f}{r['attached_us']:>13.2f}{r['added_us']:>10.2f}{r['ratio']:>8.3f}")
        print(f"worst added per call: {worst:.2f} us (target < {TARGET_US:.0f} us); records emitted: {sink_records}")
        if steps:
            print_steps(steps)
        if ddp:
            print_ddp(ddp)
    return 0 if worst < TARGET_US else 1


def step_part(args: argparse.Namespace, settings: Any, sources: list[str]) -> dict[str, Any]:
    """Training-like steps at ``args.rate`` collectives/s: median step time per mode, added cost."""
    import torch
    import torch.distributed as dist

    from ccld.producers.attach import attach, detach

    torch.set_num_threads(1)  # no intra-op thread pool: on a shared machine its spin-waits swamp the result
    pg = dist.distributed_c10d._get_default_group()
    t = torch.ones(1024)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    n_py = args.coll_per_step // 2

    def collectives() -> None:
        for _ in range(n_py):
            dist.all_reduce(t)  # from Python: every source sees it
        for _ in range(args.coll_per_step - n_py):
            pg.allreduce([t]).wait()  # as DDP's reducer calls it: Flight Recorder only

    def compute(n: int) -> None:
        for _ in range(n):
            torch.mm(a, b)

    # calibrate the compute so a plain step lasts coll_per_step / rate seconds
    target_ns = args.coll_per_step / args.rate * 1e9
    n_mm = 0

    def step() -> None:
        compute(n_mm)
        collectives()

    for _ in range(3):
        coll_ns = statistics.median(time_calls(collectives, 100))
        # the matmuls timed alone: a step's time less its collectives' is noise-sized for a short step, and
        # a near-zero estimate of a matmul once made a "1-s" step of a billion of them
        mm_ns = max(1.0, statistics.median(time_calls(lambda: compute(1000), 5)) / 1000)
        n_mm = max(0, int((target_ns - coll_ns) / mm_ns))

    time_calls(step, max(20, 2200 // max(1, args.coll_per_step) + 1))  # fills the Flight Recorder ring (2,000)
    modes = ["none", *sources]
    times: dict[str, list[int]] = {m: [] for m in modes}
    means: dict[str, list[float]] = {m: [] for m in modes}  # mean step time of each block
    seen: dict[str, list[float]] = {m: [] for m in modes}
    polls: dict[str, list[float]] = {m: [] for m in modes}
    hooks: dict[str, list[int]] = {m: [] for m in modes}  # per step: the training thread's ns in the attachment
    cpu: dict[str, list[float]] = {m: [] for m in modes}  # per block: its threads' CPU ns per step
    off_gil: dict[str, list[float]] = {m: [] for m in modes}  # ... of which spent in the dump without the GIL
    for block in range(args.step_blocks):
        for mode in modes[block % len(modes) :] + modes[: block % len(modes)]:  # rotate the order
            att = None
            if mode != "none":
                att = attach_as(mode, attach, settings, sink=None if args.bootstrap else CountingSink(), markers=False,
                                fr_poll_s=args.fr_poll_ms / 1000, cost=True)  # fmt: skip
            warm = warmup_steps(args, args.coll_per_step / args.rate)
            time_calls(step, warm)
            warm += settle(att, step, args.coll_per_step / args.rate)
            t0 = time.perf_counter_ns()
            block_times = time_block(step, args.steps_per_block, att, hooks[mode], cpu[mode], off_gil[mode])
            wall_s = (time.perf_counter_ns() - t0) / 1e9
            times[mode] += block_times
            means[mode].append(statistics.fmean(block_times))
            if mode != "none":
                st = detach()
                seen[mode].append(int(st.get("calls", 0)) / ((args.steps_per_block + warm) * args.coll_per_step))
                if st.get("fr_polls"):
                    polls[mode].append(st["fr_poll_ns_total"] / st["fr_polls"] / 1e6)
                    polls[mode].append(st["fr_polls"] / wall_s)  # kept in pairs: (ms per poll, polls per s)
    # a poll holds the GIL for its whole dump, so its cost lands on the few steps it overlaps: the
    # median step hides it; the mean step of a block includes it (the median over blocks is reported)
    base = statistics.median(means["none"]) / 1e6
    out: dict[str, Any] = {"rate_per_s": args.rate, "coll_per_step": args.coll_per_step, "matmuls": n_mm,
                           "fr_poll_ms": args.fr_poll_ms, "modes": {}}  # fmt: skip
    for mode in modes:
        med = statistics.median(means[mode]) / 1e6
        ordered = sorted(times[mode])
        row = {"step_ms": med, "added_ms": med - base, "added_pct": 100 * (med - base) / base,
               "added_us_per_coll": 1000 * (med - base) / args.coll_per_step,
               "median_step_ms": statistics.median(ordered) / 1e6,
               "p99_step_ms": ordered[int(0.99 * (len(ordered) - 1))] / 1e6,
               "max_step_ms": ordered[-1] / 1e6,
               "seen": statistics.median(seen[mode]) if seen[mode] else 0.0}  # fmt: skip
        if polls[mode]:
            row["poll_ms"] = statistics.median(polls[mode][0::2])
            row["polls_per_s"] = statistics.median(polls[mode][1::2])
        row.update(cost_columns(mode, hooks[mode], cpu[mode], means, base, off_gil[mode]))
        out["modes"][mode] = row
    return out


def ddp_part(args: argparse.Namespace, settings: Any) -> dict[str, Any]:
    """A real DDP model's steps with no attachment, ``wrap`` and ``auto``: step times and what was seen."""
    import torch
    import torch.distributed as dist

    from ccld.producers.attach import attach, detach

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(128, 128) for _ in range(4)]
    # a small bucket cap: about one bucket per layer, so a step issues several all-reduces, as a real model does
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=0.07)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    pg = dist.distributed_c10d._get_default_group()
    batch = 8

    def step() -> None:
        model(torch.randn(batch, 128)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    for _ in range(3):  # a batch size for about --ddp-step-ms a step
        per_row = statistics.median(time_calls(step, 30)) / batch
        batch = max(1, int(args.ddp_step_ms * 1e6 / per_row))
    fill = torch.ones(16)
    for _ in range(2100):  # the Flight Recorder ring full (2,000 entries): its steady state
        pg.allreduce([fill]).wait()
    # auto-nost: auto without the status reads between polls (they time exits; see fr_poll)
    modes = ["none", *[m for m in args.ddp_modes.split(",") if m]]
    before = _fr_enqueued()
    time_calls(step, 20)
    per_step = max(1, (_fr_enqueued() - before) // 20)  # DDP's all-reduces per step
    times: dict[str, list[int]] = {m: [] for m in modes}
    means: dict[str, list[float]] = {m: [] for m in modes}
    seen: dict[str, list[float]] = {m: [] for m in modes}
    polls: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}  # the process's CPU time per step: other tenants' load
    hooks: dict[str, list[int]] = {m: [] for m in modes}
    tcpu: dict[str, list[float]] = {m: [] for m in modes}
    off_gil: dict[str, list[float]] = {m: [] for m in modes}
    for block in range(args.ddp_blocks):  # moves wall times far more than it moves this
        for mode in modes[block % len(modes) :] + modes[: block % len(modes)]:
            c0 = time.process_time_ns()
            att = None
            if mode != "none":
                att = attach_as(mode.removesuffix("-nost"), attach, settings,
                                sink=None if args.bootstrap else CountingSink(), markers=False,
                                fr_poll_s=args.fr_poll_ms / 1000, fr_status_s=0.0 if mode.endswith("-nost") else None,
                                cost=True)  # fmt: skip
            warm = warmup_steps(args, args.ddp_step_ms / 1000)
            time_calls(step, warm)
            warm += settle(att, step, args.ddp_step_ms / 1000)
            t0 = time.perf_counter_ns()
            block_times = time_block(step, args.ddp_steps_per_block, att, hooks[mode], tcpu[mode], off_gil[mode])
            wall_s = (time.perf_counter_ns() - t0) / 1e9
            times[mode] += block_times
            means[mode].append(statistics.fmean(block_times))
            st = detach() if mode != "none" else {}
            cpu[mode].append((time.process_time_ns() - c0) / args.ddp_steps_per_block / 1e6)
            if mode != "none":
                seen[mode].append(int(st.get("calls", 0)) / ((args.ddp_steps_per_block + warm) * per_step))
                if st.get("fr_polls"):
                    polls[mode].append(st["fr_poll_ns_total"] / st["fr_polls"] / 1e6)
                    polls[mode].append(st["fr_polls"] / wall_s)
    base = statistics.median(means["none"]) / 1e6
    out: dict[str, Any] = {"batch": batch, "all_reduces_per_step": per_step, "fr_poll_ms": args.fr_poll_ms,
                           "modes": {}}  # fmt: skip
    for mode in modes:
        med = statistics.median(means[mode]) / 1e6
        ordered = sorted(times[mode])
        row = {"step_ms": med, "added_ms": med - base, "added_pct": 100 * (med - base) / base,
               "added_us_per_coll": 1000 * (med - base) / per_step,
               "median_step_ms": statistics.median(ordered) / 1e6,
               "p99_step_ms": ordered[int(0.99 * (len(ordered) - 1))] / 1e6,
               "max_step_ms": ordered[-1] / 1e6,
               "seen": statistics.median(seen[mode]) if seen[mode] else 0.0,
               "cpu_ms": statistics.median(cpu[mode])}  # fmt: skip
        if polls[mode]:
            row["poll_ms"] = statistics.median(polls[mode][0::2])
            row["polls_per_s"] = statistics.median(polls[mode][1::2])
        row.update(cost_columns(mode, hooks[mode], tcpu[mode], means, base, off_gil[mode]))
        out["modes"][mode] = row
    return out


def _fr_enqueued() -> int:
    import torch

    from ccld.producers.attach.fr_poll import enqueued_total

    return enqueued_total(torch._C._distributed_c10d._dump_fr_trace_json(False, True))


def print_ddp(ddp: dict[str, Any]) -> None:
    print(
        f"\nDDP steps ({ddp['all_reduces_per_step']} bucket all-reduces from the C++ reducer each, batch "
        f"{ddp['batch']}; plain step {ddp['modes']['none']['step_ms']:.2f} ms), Flight Recorder polled every "
        f"{ddp['fr_poll_ms']:.0f} ms once on"
    )
    print_rows(ddp["modes"])
    print("CPU ms per step (the whole process, median over blocks): "
          + ", ".join(f"{m} {r['cpu_ms']:.3f}" for m, r in ddp["modes"].items()))  # fmt: skip
    print_consumed(ddp["modes"])


def print_steps(steps: dict[str, Any]) -> None:
    print(
        f"\nsteps of {steps['coll_per_step']} collectives at {steps['rate_per_s']:.0f}/s ({steps['matmuls']} "
        f"matmuls of compute; plain step {steps['modes']['none']['step_ms']:.2f} ms), Flight Recorder polled "
        f"every {steps['fr_poll_ms']:.0f} ms"
    )
    print_rows(steps["modes"])
    print_consumed(steps["modes"])


def print_consumed(modes: dict[str, Any]) -> None:
    """What each mode consumed, per step (the attachment's counters), and the wall-time A/B's interval."""
    print("consumed per step: the training thread's time in the attachment (p50, p99), its threads' CPU, of which "
          "without the GIL (Flight Recorder's native dump); share: hooks and threads against the plain step; GIL: "
          "the same less the part without the GIL; A/B: mean of paired block differences, 95 % interval")  # fmt: skip
    print(f"{'mode':<10}{'hook p50 us':>12}{'hook p99 us':>12}{'threads us':>11}{'no-GIL us':>10}{'share %':>9}"
          f"{'GIL %':>7}{'core %':>8}{'A/B ms':>9}{'+/- ms':>9}{'pairs':>6}")  # fmt: skip
    for mode, r in modes.items():
        if "hook_us_p50" in r:
            gil = r.get("gil_pct", r["consumed_pct"])
            print(f"{mode:<10}{r['hook_us_p50']:>12.1f}{r['hook_us_p99']:>12.1f}{r['threads_cpu_us']:>11.1f}"
                  f"{r.get('off_gil_us', 0.0):>10.1f}{r['consumed_pct']:>9.3f}{gil:>7.3f}{r['threads_core_pct']:>8.2f}"
                  f"{r['ab_ms']:>9.3f}{r['ab_ci_ms']:>9.3f}{r['ab_pairs']:>6}")  # fmt: skip


def print_rows(modes: dict[str, Any]) -> None:
    print("step ms: median over blocks of the mean step; added: against 'none'; p50/p99/max: single steps")
    head = ("mode", "step ms", "added ms", "added %", "us/coll", "p50 ms", "p99 ms", "max ms", "seen", "ms/poll",
            "polls/s")  # fmt: skip
    widths = (9, 10, 9, 9, 8, 8, 8, 7, 9, 9)
    print(f"{head[0]:<8}" + "".join(f"{h:>{w}}" for h, w in zip(head[1:], widths, strict=True)))
    for mode, r in modes.items():
        print(
            f"{mode:<8}{r['step_ms']:>9.3f}{r['added_ms']:>10.3f}{r['added_pct']:>9.2f}{r['added_us_per_coll']:>9.2f}"
            f"{r['median_step_ms']:>8.2f}{r['p99_step_ms']:>8.2f}{r['max_step_ms']:>8.1f}"
            f"{r['seen']:>7.2f}{r.get('poll_ms', 0.0):>9.2f}{r.get('polls_per_s', 0.0):>9.2f}"
        )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
