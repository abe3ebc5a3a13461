"""The timing model: when every rank enters and leaves every operation, one whole phase at a time.

A training step on pipeline stage ``p`` is: receive activations from stage ``p-1``, compute,
tensor-parallel ring all-reduce, send activations to stage ``p+1``, data-parallel
reduce-scatter then all-gather. A phase is one operation of one family on one stage for all its
communicators at once, so every rule is numpy arithmetic over ranks and groups, never a Python
event per chunk: a group's data starts moving when its last member enters
(``start = max(enter)``), lasts the op's nominal time divided by the bottleneck link's bandwidth
factor, and every member leaves at about ``start + duration``. ``inf`` means "never": a rank
that never enters (H1, or stuck upstream) has ``enter = inf``; a group that hangs (H2, H3, or a
member that never enters) has ``exit = inf`` and its entered members sit inside the op.

Jitter: a step-wide compute factor ``1 + jitter * N(0, 1)`` shared by all ranks (data-dependent
step time) times a per-rank factor ``1 + jitter / 4 * N(0, 1)``, and up to 1 % of the op time on
each rank's exit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ccld.anomaly import Effect, kinds_with
from ccld.producers.simulator.scenario import Fault, Scenario
from ccld.producers.simulator.topology import Topology
from ccld.records import PEAK_LAG_MAX, DType, OpType

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
INF = math.inf
#: the classes whose faults slow a rank's compute, and those that act on a link (slow or stopped)
COMPUTE_KINDS = kinds_with(Effect.COMPUTE)
LINK_KINDS = kinds_with(Effect.LINK | Effect.LINK_STOP)

#: Share of the step time each part takes when healthy (the remaining ~13 % is waiting).
COMPUTE_SHARE = 0.6
TP_SHARE = 0.08
PP_SHARE = 0.03
DP_SHARE = 0.08
BARRIER_S = 0.005
#: Slots a channel moves per second at nominal bandwidth, and slots in flight per channel
#: (NCCL_STEPS): how far a rank's RecvCount can run ahead of its SendCount behind a slow link.
SLOT_RATE = 2000.0
IN_FLIGHT = 8
#: A healthy ring rank receives a step ahead of forwarding it now and then: the peak backlog its
#: kernel records on a channel is 0..HEALTHY_PEAK slots (uniform, per op, rank and channel). Behind a
#: slow link the source's peak reaches ``source_peak`` less 0..PEAK_SHORTFALL slots.
HEALTHY_PEAK = 2
PEAK_SHORTFALL = 2
ELEMS_PER_SLOT = 1 << 18


@dataclass(frozen=True)
class Timing:
    """Nominal (healthy) durations of one step's parts, in seconds."""

    compute_s: float
    tp_s: float
    pp_s: float
    dp_s: float

    @classmethod
    def of(cls, sc: Scenario) -> Timing:
        t = sc.step_time_s
        return cls(COMPUTE_SHARE * t, TP_SHARE * t, PP_SHARE * t, DP_SHARE * t)


@dataclass(eq=False)
class Phase:
    """One operation of one family on a set of ranks (all its communicators at once).

    Per-rank arrays share one order; ``start``/``dur`` are the rank's group's values.
    Counters at time ``s``: ``L = floor(min(progress, freeze) * slots)``, then
    ``send = min(s_send, L + send_lead)`` and ``recv = min(s_recv, L + recv_lead)`` once started.
    """

    family: str
    op_seq: int
    ranks: I64
    comm: I64
    crank: I64
    csize: I64
    lhost: I64
    op_type: I64
    dtype: I64
    count: I64
    peer: I64
    enter: F64
    exit: F64
    start: F64
    dur: F64
    slots: I64
    s_send: I64
    s_recv: I64
    send_lead: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    recv_lead: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    freeze: F64 = field(default_factory=lambda: np.zeros(0))
    peak_lead: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # a slow link's source: its kernel peak

    def __post_init__(self) -> None:
        n = self.ranks.shape[0]
        if self.peak_lead.shape[0] != n:
            self.peak_lead = np.zeros(n, dtype=np.int64)
        if self.send_lead.shape[0] != n:
            self.send_lead = np.zeros(n, dtype=np.int64)
        if self.recv_lead.shape[0] != n:
            self.recv_lead = np.zeros(n, dtype=np.int64)
        if self.freeze.shape[0] != n:
            self.freeze = np.ones(n)


def source_peak(slots: int, factor: float) -> int:
    """The backlog a slow link's source builds in one op of ``slots`` slots per channel when the link
    runs at ``factor`` of its bandwidth: data arrives faster than it leaves, ``slots x (1 - factor)``
    more over the op, but never more than the slots in flight (``IN_FLIGHT``). A dead link (H3,
    factor 0) fills them before the counters stop."""
    return int(min(IN_FLIGHT, math.ceil(slots * (1.0 - min(max(factor, 0.0), 1.0)))))


def kernel_peaks(rng: np.random.Generator, lead: I64, channels: int, s_send: I64 | None = None,
                 s_recv: I64 | None = None) -> I64:
    """The per-hardware-channel peak RecvCount - SendCount each of ``lead.size`` kernels would record
    (``(n, channels)``): healthy noise, or on a slow link's source (``lead`` = its ``source_peak`` > 0)
    that backlog less a little noise. A hung kernel's peak is what it had by the freeze. With the
    kernels' total counts (``s_send``/``s_recv``): a kernel that receives more than it sends (a p2p
    RECV) peaks at least at the difference, one that never receives (a p2p SEND) at 0."""
    n = lead.shape[0]
    peak = rng.integers(0, HEALTHY_PEAK + 1, size=(n, channels))
    if (lead > 0).any():
        behind = np.maximum(lead[:, None] - rng.integers(0, PEAK_SHORTFALL + 1, size=(n, channels)), 0)
        peak = np.maximum(peak, behind)
    if s_send is not None and s_recv is not None:
        peak = np.maximum(peak, (s_recv - s_send)[:, None])
        peak[s_recv <= 0] = 0
    return np.minimum(peak, PEAK_LAG_MAX)


def fired(faults: Sequence[Fault], h1: Callable[[int], bool], pending_h2: Sequence[Fault],
          pending_h3: Sequence[Fault]) -> list[bool]:
    """Per fault, whether it took effect: an H1 rank stopped (``h1``), an H2 or H3 no longer
    pending; slowdowns and benign events always do."""
    out = []
    for f in faults:
        if f.kind == "H1":
            out.append(h1(f.rank))
        elif f.kind == "H2":
            out.append(f not in pending_h2)
        elif f.kind == "H3":
            out.append(f not in pending_h3)
        else:
            out.append(True)
    return out


class FaultBook:
    """The faults of a scenario as both timing models apply them (mixed into each engine).

    H1 ranks stop at their onset; S1/S3 slow a rank's compute while active; a transient delays one
    compute once; H2, H3 and transients leave their pending lists once they fired.
    """

    def _init_faults(self, sc: Scenario, n: int) -> None:
        self.h1_onset = np.full(n, INF)
        for f in sc.faults:
            if f.kind == "H1":
                self.h1_onset[f.rank] = min(self.h1_onset[f.rank], f.onset_s)
        self.h1_fired: set[int] = set()
        # which faults touch compute and which a link: the class table's effects
        self.compute_faults = [f for f in sc.faults if f.kind in COMPUTE_KINDS]
        self.link_faults = [f for f in sc.faults if f.kind in LINK_KINDS]
        self.pending_h2 = [f for f in sc.faults if f.kind == "H2"]
        self.pending_h3 = [f for f in sc.faults if f.kind == "H3"]
        self.pending_transient = [f for f in sc.faults if f.kind == "transient"]
        self.checkpoints: list[list[Any]] = [[f, f.onset_s] for f in sc.faults if f.kind == "checkpoint"]

    def _stop(self, ranks: I64, enter: F64) -> F64:
        """H1: a rank whose next op would start at or after its onset never enters it."""
        stop = enter >= self.h1_onset[ranks]
        if stop.any():
            self.h1_fired.update(ranks[stop & np.isfinite(enter)].tolist())
        return np.where(stop, INF, enter)

    def _faulty_compute(self, ranks: I64, begin: F64, c: F64) -> F64:
        """Compute times ``c`` of ``ranks`` starting at ``begin``, with the slow and delayed ones applied."""
        for f in self.compute_faults:
            hit = (ranks == f.rank) & f.active(begin)
            if hit.any():
                c = np.where(hit, c * (f.factor if f.kind == "S1" else f.compute_factor), c)
        for f in list(self.pending_transient):
            hit = (ranks == f.rank) & (begin >= f.onset_s) & np.isfinite(begin)
            if hit.any():
                c = np.where(hit, c + f.delay_s, c)
                self.pending_transient.remove(f)
        return c


def _full(n: int, v: int) -> I64:
    return np.full(n, v, dtype=np.int64)


def op_slots(dur_s: float) -> int:
    """Slots per channel one rank moves in an op of nominal (healthy) duration ``dur_s``."""
    return max(IN_FLIGHT * 2, int(round(dur_s * SLOT_RATE)))


class Engine(FaultBook):
    """Runs the timing model of one scenario; ``run()`` returns every phase in creation order."""

    def __init__(self, sc: Scenario, topo: Topology) -> None:
        self.sc, self.topo, self.timing = sc, topo, Timing.of(sc)
        self.rng = np.random.default_rng(sc.seed)
        self.free = self.rng.uniform(0.0, 0.05, topo.n)  # when each rank is ready for its next step
        self._init_faults(sc, topo.n)
        self.seq: dict[str, int] = {}
        self.out: list[Phase] = []

    def manifested(self) -> list[bool]:
        """Per fault of the scenario, whether it took effect in this run (after ``run``).

        A hang can hide another: a rank already stuck behind an earlier hang never gets to stop
        on its own (H1), nor does a group that never starts its next op (H2, H3).
        """
        return fired(self.sc.faults, lambda r: r in self.h1_fired and self._absence_seen(r),
                     self.pending_h2, self.pending_h3)

    def _absence_seen(self, rank: int) -> bool:
        """Whether some peer entered an op that ``rank`` never entered (else its stop is invisible:
        e.g. its only partner of that op is itself stuck behind another hang)."""
        for ph in self.out:
            at = np.flatnonzero(ph.ranks == rank)
            if at.size == 0 or np.isfinite(ph.enter[at[0]]):
                continue
            mates = ph.comm == ph.comm[at[0]]
            if bool(np.any(mates & (ph.enter <= self.sc.duration_s))):
                return True
        return False

    # -- helpers -----------------------------------------------------------------------------
    def _next_seq(self, key: str) -> int:
        s = self.seq.get(key, 0)
        self.seq[key] = s + 1
        return s

    def _compute(self, ranks: I64, begin: F64, step_factor: float) -> F64:
        c = self.timing.compute_s * step_factor * (1.0 + self.sc.jitter / 4 * self.rng.standard_normal(ranks.shape[0]))
        return self._faulty_compute(ranks, begin, np.maximum(c, 0.1 * self.timing.compute_s))

    def _h2_target(self, f: Fault) -> tuple[str, OpType]:
        """Which phase an inconsistent call lands in: this step's first data-parallel op for an
        'order' mismatch (it has two ops to swap), otherwise the tensor-parallel all-reduce."""
        if f.mismatch == "order" or self.topo.tp < 2:
            return ("dp", OpType.REDUCE_SCATTER)
        return ("tp", OpType.ALL_REDUCE)

    def _exit(self, start: F64, dur: F64) -> F64:
        return start + dur * (1.0 + 0.01 * self.rng.random(start.shape[0]))

    # -- phases --------------------------------------------------------------------------------
    def _ring(
        self, family: str, seq: int, grid: I64, enter: F64, op: OpType, dtype: DType, nominal_s: float,
        comm: I64, crank: I64, lhost: I64,
    ) -> F64:
        """A ring collective on the groups that are the rows of ``grid`` (ranks); returns exits."""
        groups, size = grid.shape
        enter = self._stop(grid.ravel(), enter)
        start_g = enter.reshape(groups, size).max(axis=1)
        dur_g = np.full(groups, nominal_s)
        n = grid.size
        send_lead, recv_lead, freeze = np.zeros(n, np.int64), np.zeros(n, np.int64), np.ones(n)
        peak_lead = np.zeros(n, np.int64)
        hang_g = np.zeros(groups, dtype=bool)
        slots = op_slots(nominal_s)
        ranks = grid.ravel()
        op_t, dt, cnt = _full(n, int(op)), _full(n, int(dtype)), _full(n, slots * self.sc.channels * ELEMS_PER_SLOT)
        if family == "tp":
            first = grid[:, 0]
            for f in self.link_faults:
                row = np.flatnonzero(first == (f.rank // size) * size)
                if row.size == 0:
                    continue
                g = int(row[0])
                pos = g * size + f.rank % size
                nxt = g * size + (f.rank + 1) % size
                if f.kind == "H3":
                    if f not in self.pending_h3 or not math.isfinite(start_g[g]) or start_g[g] + dur_g[g] <= f.onset_s:
                        continue
                    self.pending_h3.remove(f)
                    frac = (f.onset_s - start_g[g]) / dur_g[g] if start_g[g] < f.onset_s else self.rng.uniform(0.2, 0.8)
                    hang_g[g] = True
                    freeze[g * size : (g + 1) * size] = frac
                elif bool(f.active(np.asarray(start_g[g]))):
                    dur_g[g] /= f.bandwidth
                else:
                    continue
                # data piles up behind the bad link: everyone but its two ends runs IN_FLIGHT slots ahead
                send_lead[g * size : (g + 1) * size] = IN_FLIGHT
                recv_lead[g * size : (g + 1) * size] = IN_FLIGHT
                send_lead[pos] = 0
                recv_lead[nxt] = 0
                peak_lead[pos] = source_peak(slots, f.bandwidth)
        for f in list(self.pending_h2):
            if self._h2_target(f) != (family, op):
                continue
            hit = np.flatnonzero((ranks == f.rank) & np.isfinite(enter) & (enter >= f.onset_s))
            if hit.size:
                self.pending_h2.remove(f)
                i = int(hit[0])
                if f.mismatch == "order":
                    op_t[i] = int(OpType.ALL_GATHER)  # it called this step's ops in the other order
                elif f.mismatch == "op":
                    op_t[i] = int(OpType.ALL_GATHER if op != OpType.ALL_GATHER else OpType.ALL_REDUCE)
                elif f.mismatch == "dtype":
                    dt[i] = int(DType.FLOAT32 if dtype != DType.FLOAT32 else DType.FLOAT16)
                else:
                    cnt[i] = cnt[i] // 2
                hang_g[i // size] = True
                freeze[(i // size) * size : (i // size + 1) * size] = 0.0
        start = np.repeat(start_g, size)
        dur = np.repeat(dur_g, size)
        exit_ = np.where(np.repeat(hang_g, size), INF, self._exit(start, dur))
        self.out.append(
            Phase(
                family=family, op_seq=seq, ranks=ranks, comm=comm[ranks], crank=crank[ranks],
                csize=_full(n, size), lhost=lhost[ranks], op_type=op_t, dtype=dt, count=cnt, peer=_full(n, -1),
                enter=enter, exit=exit_, start=start, dur=dur, slots=_full(n, slots), s_send=_full(n, slots),
                s_recv=_full(n, slots), send_lead=send_lead, recv_lead=recv_lead, freeze=freeze,
                peak_lead=peak_lead,
            )
        )
        return exit_

    def _p2p(self, seq: int, src: I64, enter_src: F64, enter_dst: F64) -> tuple[F64, F64]:
        """Stage p sends activations to stage p+1 (same tensor index and replica)."""
        t, topo = self.timing, self.topo
        dst = src + topo.tp
        es, ed = self._stop(src, enter_src), self._stop(dst, enter_dst)
        start = np.maximum(es, ed)
        dur = np.full(src.shape[0], t.pp_s)
        xs, xd = self._exit(start, dur), self._exit(start, dur)
        m = src.shape[0]
        slots = op_slots(t.pp_s)
        zeros = _full(m, 0)
        s = _full(m, slots)
        self.out.append(
            Phase(
                family="pp", op_seq=seq, ranks=np.concatenate([src, dst]),
                comm=np.concatenate([topo.pps_comm[src], topo.ppr_comm[dst]]),
                crank=np.concatenate([zeros, _full(m, 1)]), csize=_full(2 * m, 2),
                lhost=np.concatenate([topo.pps_lhost[src], topo.ppr_lhost[dst]]),
                op_type=np.concatenate([_full(m, int(OpType.SEND)), _full(m, int(OpType.RECV))]),
                dtype=_full(2 * m, int(DType.BFLOAT16)), count=_full(2 * m, slots * self.sc.channels * ELEMS_PER_SLOT),
                peer=np.concatenate([_full(m, 1), zeros]), enter=np.concatenate([es, ed]),
                exit=np.concatenate([xs, xd]), start=np.concatenate([start, start]), dur=np.concatenate([dur, dur]),
                slots=_full(2 * m, slots), s_send=np.concatenate([s, zeros]), s_recv=np.concatenate([zeros, s]),
            )
        )
        return xs, xd

    def _barrier(self, f: Fault) -> None:
        """Checkpoint: the writer saves for pause_s while everyone else waits in a world barrier."""
        topo = self.topo
        ranks = np.arange(topo.n, dtype=np.int64)
        enter = self.free.copy()
        enter[f.writer_rank] += f.pause_s
        enter = self._stop(ranks, enter)
        start = np.full(topo.n, enter.max())
        dur = np.full(topo.n, BARRIER_S)
        exit_ = self._exit(start, dur)
        n = topo.n
        self.out.append(
            Phase(
                family="world", op_seq=self._next_seq("world"), ranks=ranks, comm=_full(n, topo.world_comm),
                crank=ranks.copy(), csize=_full(n, n), lhost=topo.host_of.copy(),
                op_type=_full(n, int(OpType.BARRIER)), dtype=_full(n, int(DType.FLOAT32)), count=_full(n, 1),
                peer=_full(n, -1), enter=enter, exit=exit_, start=start, dur=dur, slots=_full(n, 1),
                s_send=_full(n, 1), s_recv=_full(n, 1),
            )
        )
        self.free = exit_.copy()  # the phase keeps its own exits; free is updated in place later

    def run(self) -> list[Phase]:
        sc, topo, t = self.sc, self.topo, self.timing
        step = 0
        while bool(np.any(self.free <= sc.duration_s)):
            ready = float(np.min(self.free))
            for ck in self.checkpoints:
                f, due = ck
                if ready >= due:
                    self._barrier(f)
                    ck[1] = due + f.every_s if f.every_s is not None else INF
            step_factor = max(0.5, 1.0 + sc.jitter * float(self.rng.standard_normal()))
            for p in range(topo.pp):
                stage = topo.stage_ranks(p)
                grid = stage.reshape(topo.dp, topo.tp)  # rows: tensor groups; columns: data-parallel groups
                flat = grid.ravel()
                begin = self.free[flat]
                ready_at = begin + self._compute(flat, begin, step_factor)
                if topo.tp > 1:
                    ready_at = self._ring(
                        "tp", step, grid, ready_at, OpType.ALL_REDUCE, DType.BFLOAT16, t.tp_s,
                        topo.tp_comm, topo.tp_crank, np.zeros(topo.n, np.int64),
                    )
                if p < topo.pp - 1:
                    xs, xd = self._p2p(step, flat, ready_at, self.free[flat + topo.tp])
                    ready_at = xs
                    self.free[flat + topo.tp] = xd
                if topo.dp > 1:
                    col = grid.T  # rows of the transpose: one data-parallel group each
                    order = col.ravel()
                    e = _reorder(flat, order, ready_at)
                    for op, k in ((OpType.REDUCE_SCATTER, 0), (OpType.ALL_GATHER, 1)):
                        e = self._ring(
                            "dp", 2 * step + k, col, e, op, DType.BFLOAT16, t.dp_s,
                            topo.dp_comm, topo.dp_crank, topo.dp_lhost,
                        )
                    ready_at = _reorder(order, flat, e)
                self.free[flat] = ready_at
            step += 1
            if step > 1_000_000:  # pragma: no cover - a guard against a model bug, not a real limit
                break
        return self.out


def _reorder(src_order: I64, dst_order: I64, values: F64) -> F64:
    """Values listed in ``src_order`` (ranks), re-listed in ``dst_order`` (the same ranks)."""
    lookup = np.empty(int(src_order.max()) + 1)
    lookup[src_order] = values
    return lookup[dst_order]


def run_engine(sc: Scenario, topo: Topology) -> list[Phase]:
    return Engine(sc, topo).run()
