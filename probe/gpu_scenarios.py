"""GPU checks of the probe end to end: healthy, stopped-rank and slowed-link runs of the reference
all-reduce, decoded by the real poller and compared with what ``ring_plan`` says they must show.

Used by ``benchmarks/gpu_probe.py`` and ``tests/gpu``; every function needs CuPy and a device.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ccld.probe.frame_tracker import RankBinding
from ccld.probe.poller import ProbePoller
from ccld.probe.ring import RingGroup
from ccld.probe.ring_plan import Faults, RingOp, expected_counts, fold, frozen_counts
from ccld.records import DType, KernelRecord, OpType, Status, TraceId

log = logging.getLogger(__name__)

COMM_HASH = 0x5EED_CC1D_0000_0001


@dataclass(frozen=True)
class Check:
    """One scenario's verdict: passed?, what was seen, how long it took."""

    name: str
    ok: bool
    detail: str
    seconds: float
    records: int = 0


def trace(op_seq: int) -> TraceId:
    return TraceId(COMM_HASH, op_seq, OpType.ALL_REDUCE, DType.FLOAT32)


def bindings(nranks: int) -> list[RankBinding]:
    return [RankBinding("gpu-probe", r, r, nranks, nranks, "gpu0") for r in range(nranks)]


def _poller(group: RingGroup, out: list[KernelRecord], interval_s: float) -> ProbePoller:
    if group.frames is None:
        raise ValueError("the group was built without probe frames")
    srcs = group.frames.sources(bindings(group.nranks), group.clock_offset_ns)
    # the per-kernel format: these checks compare every kernel's DONE and every poll's heartbeat
    # with the plan, not the bounded format a job sends
    return ProbePoller(srcs, out.append, interval_s=interval_s, detail="all")


def _inputs(cp: Any, nranks: int, n: int, seed: int) -> tuple[list[Any], np.ndarray]:
    rng = np.random.default_rng(seed)
    host = [rng.integers(-64, 64, n).astype(np.float32) for _ in range(nranks)]  # exact sums
    return [cp.asarray(h) for h in host], np.sum(np.stack(host), axis=0)


def check_healthy(
    module: Any, nranks: int = 4, channels: int = 8, n: int = 1 << 20, ops: int = 3, slot_elems: int = 1 << 14
) -> Check:
    """Reduction equals numpy; every rank has one DONE per op with the planned counters."""
    t0 = time.monotonic()
    group = RingGroup(nranks, channels, slot_elems=slot_elems, module=module)
    out: list[KernelRecord] = []
    problems: list[str] = []
    try:
        poller = _poller(group, out, 0.01).start()
        for op in range(ops):
            bufs, want = _inputs(group.cp, nranks, n, seed=op)
            group.launch(RingOp.ALL_REDUCE, bufs, trace(op))
            if not group.synchronize(timeout_s=30):
                problems.append(f"op {op} did not finish in 30 s")
                group.release()
                break
            for r, b in enumerate(bufs):
                if not np.array_equal(group.cp.asnumpy(b), want):
                    problems.append(f"op {op}: rank {r}'s reduction differs from numpy")
        poller.stop()
    finally:
        group.close()
    want_counts = fold(expected_counts(RingOp.ALL_REDUCE, n, nranks, channels, slot_elems))
    for r in range(nranks):
        for op in range(ops):
            done = [x for x in out if x.rank == r and x.op_seq == op and x.status is Status.DONE]
            if len(done) != 1:
                problems.append(f"rank {r} op {op}: {len(done)} DONE records")
            elif done[0].send_counts != want_counts or done[0].recv_counts != want_counts:
                problems.append(f"rank {r} op {op}: counters {done[0].send_counts} != {want_counts}")
    detail = "; ".join(problems) or f"{ops} ops x {nranks} ranks reduced exactly; DONE counters {want_counts}"
    return Check("healthy", not problems, detail, time.monotonic() - t0, len(out))


def check_stopped(
    module: Any,
    nranks: int = 4,
    channels: int = 8,
    n: int = 1 << 20,
    stop_rank: int = 2,
    stop_step: int = 5,
    slot_elems: int = 1 << 14,
    nslots: int = 4,
    watch_s: float = 0.5,
) -> Check:
    """A rank stopped at a step: everyone stays inside, heartbeats continue, counters freeze where
    the plan's fixpoint says, and no DONE appears until the host releases the kernels."""
    t0 = time.monotonic()
    group = RingGroup(nranks, channels, nslots=nslots, slot_elems=slot_elems, module=module)
    out: list[KernelRecord] = []
    problems: list[str] = []
    try:
        group.set_faults(Faults(stop_rank=stop_rank, stop_step=stop_step))
        poller = _poller(group, out, 0.05).start()
        bufs, _ = _inputs(group.cp, nranks, n, seed=7)
        group.launch(RingOp.ALL_REDUCE, bufs, trace(0))
        if group.synchronize(timeout_s=watch_s):
            problems.append("the op finished although a rank was stopped")
        poller.stop()
        group.release()
    finally:
        group.close()
    frozen = frozen_counts(RingOp.ALL_REDUCE, n, nranks, channels, slot_elems, nslots, stop_rank, stop_step)
    for r in range(nranks):
        mine = [x for x in out if x.rank == r]
        if any(x.status is Status.DONE for x in mine):
            problems.append(f"rank {r} reported DONE")
        prog = [x for x in mine if x.status is Status.PROGRESS]
        if len(prog) < 3:
            problems.append(f"rank {r}: {len(prog)} PROGRESS heartbeats in {watch_s} s")
            continue
        want_send = fold([frozen[r][c][0] for c in range(channels)])
        want_recv = fold([frozen[r][c][1] for c in range(channels)])
        last = prog[-1]
        if last.send_counts != want_send or last.recv_counts != want_recv:
            problems.append(f"rank {r}: frozen at {last.send_counts}/{last.recv_counts}, plan {want_send}/{want_recv}")
        if prog[-1].t_sample_ns <= prog[-3].t_sample_ns:
            problems.append(f"rank {r}: heartbeat times do not advance")
    detail = "; ".join(problems) or f"rank {stop_rank} stopped at step {stop_step}; all ranks frozen as planned"
    return Check("stopped_rank", not problems, detail, time.monotonic() - t0, len(out))


def check_slow_link(
    module: Any,
    nranks: int = 4,
    channels: int = 8,
    n: int = 1 << 20,
    link_src: int = 1,
    link_ns: int = 20_000_000,
    slot_elems: int = 1 << 14,
) -> Check:
    """Sends on one link wait ``link_ns``: the op completes correctly, slowly on every rank, and the
    poller shows it progressing (PROGRESS samples with rising counters) before the DONE."""
    t0 = time.monotonic()
    group = RingGroup(nranks, channels, slot_elems=slot_elems, module=module)
    out: list[KernelRecord] = []
    problems: list[str] = []
    try:
        group.set_faults(Faults(link_src=link_src, link_ns=link_ns))
        poller = _poller(group, out, 0.02).start()
        bufs, want = _inputs(group.cp, nranks, n, seed=11)
        group.launch(RingOp.ALL_REDUCE, bufs, trace(0))
        if not group.synchronize(timeout_s=60):
            problems.append("the op did not finish in 60 s")
            group.release()
        elif not all(np.array_equal(group.cp.asnumpy(b), want) for b in bufs):
            problems.append("reduction differs from numpy")
        poller.stop()
    finally:
        group.close()
    counts = expected_counts(RingOp.ALL_REDUCE, n, nranks, channels, slot_elems)
    min_ns = int(0.9 * max(counts) * link_ns)
    for r in range(nranks):
        mine = [x for x in out if x.rank == r]
        done = [x for x in mine if x.status is Status.DONE]
        prog = [x for x in mine if x.status is Status.PROGRESS]
        if len(done) != 1 or done[0].send_counts != fold(counts):
            problems.append(f"rank {r}: DONE records {[(x.send_counts) for x in done]}")
            continue
        if done[0].t_exit_ns - done[0].t_enter_ns < min_ns:
            problems.append(f"rank {r}: kernel time {done[0].t_exit_ns - done[0].t_enter_ns} ns < {min_ns}")
        if len(prog) < 3:
            problems.append(f"rank {r}: only {len(prog)} PROGRESS samples during a slow op")
        elif not any(0 < sum(p.send_counts) < sum(done[0].send_counts) for p in prog):
            problems.append(f"rank {r}: no PROGRESS sample caught the op part way")
    detail = "; ".join(problems) or f"link {link_src}->{(link_src + 1) % nranks} slowed; op >= {min_ns / 1e6:.0f} ms"
    return Check("slow_link", not problems, detail, time.monotonic() - t0, len(out))


def time_ops(
    module: Any,
    size_bytes: int,
    iters: int,
    nranks: int = 4,
    channels: int = 8,
    slot_elems: int = 1 << 16,
    warmup: int = 3,
) -> dict[str, float]:
    """Median time per all-reduce with the probe off (null frame) and on (frames + poller)."""
    group = RingGroup(nranks, channels, slot_elems=slot_elems, module=module)
    cp = group.cp
    n = size_bytes // 4
    out: list[KernelRecord] = []
    try:
        bufs = [cp.zeros(n, dtype=cp.float32) for _ in range(nranks)]
        cp.cuda.runtime.deviceSynchronize()
        driver = cp.cuda.Stream(non_blocking=True)
        poller = _poller(group, out, 0.1).start()
        times: dict[bool, list[float]] = {False: [], True: []}
        op_seq = 0
        for i in range(warmup + iters):
            for probe in (False, True) if i % 2 == 0 else (True, False):
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record(driver)
                for s in group.streams:
                    s.wait_event(start)
                group.launch(RingOp.ALL_REDUCE, bufs, trace(op_seq), probe=probe, after_current=False)
                op_seq += 1
                for s in group.streams:
                    ev = cp.cuda.Event()
                    ev.record(s)
                    driver.wait_event(ev)
                end.record(driver)
                end.synchronize()
                if i >= warmup:
                    times[probe].append(cp.cuda.get_elapsed_time(start, end))
        poller.stop()
    finally:
        group.close()
    off, on = float(np.median(times[False])), float(np.median(times[True]))
    return {
        "size_bytes": float(size_bytes),
        "iters": float(iters),
        "median_off_ms": off,
        "median_on_ms": on,
        "overhead_pct": (on - off) / off * 100.0 if off > 0 else float("nan"),
        "records": float(len(out)),
    }
