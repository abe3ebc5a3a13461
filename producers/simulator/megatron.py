"""The Megatron-style job, op by op, and the bounded records its probes send.

Each rank runs one program per step: a 1F1B pipeline schedule of ``microbatches`` forward and
backward passes; every layer of a pass computes and then meets its tensor-parallel group in a
ring collective (a group's data moves once its last member arrived and lasts the op's time from
size and bandwidth); stages exchange activations and gradients with send/recv (the sender does
not wait, the receiver does); the backward pass of the last micro-batch issues the gradient
reduce-scatter buckets, which run on the network while it goes on computing; the step ends with
the parameter all-gather. Ops are evaluated for all groups of a stage at once (numpy over ranks),
and successive ops of one layout that no fault touches as one chain (``_chain``: the same draws
and floats as op by op, the per-op loop compiled). Each op goes into the step's log; at the step's
end the compiled recording rules (``record_kernel.play``) play the log member by member and say
which records it makes, and ``record_kernel.format_rows`` makes them.

What goes out is the bounded record format (docs/wire-format.md, "Record format and its cost"), not one
record per op: per delivery interval, for every communicator a rank is in, its newest state
(PROGRESS with live counters while inside an op, IDLE after), plus the DONE record of every op
that ``detail_sampled`` picks for that communicator's stride (the same ops on every rank). Each
host's records of a window go out as one batch (its communicators in the ``comm`` column), as the
attachment's per-host aggregator sends them.
Faults, noise and the scenario format are those of ``engine.py``; ``expect`` never leaves here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ccld.probe.ring_plan import fold_peaks
from ccld.producers.simulator import record_kernel as rk
from ccld.producers.simulator.engine import IN_FLIGHT, SLOT_RATE, FaultBook, fired, kernel_peaks, source_peak
from ccld.producers.simulator.scenario import Fault, Scenario
from ccld.producers.simulator.topology import Topology, comm_hash_of
from ccld.records import (
    COMM_COLUMN,
    DETAIL_OPS_PER_S,
    MAX_CHANNELS,
    DType,
    KernelBatch,
    OpType,
    Status,
    detail_one_in,
    detail_sampled,
)

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
INF = math.inf
DELIVERY_LATENCY_S = 0.1
POLL_S = 0.1  # the probe's poll period
EPOCH_NS = 1_750_000_000 * 1_000_000_000
BF16 = int(DType.BFLOAT16)

# the newest op of each member (communicator x comm rank) is kept packed, because it is rewritten
# for every op of the job: times in one float block, sequence and op template in one int block
_F_ENTER, _F_EXIT, _F_START, _F_DUR, _F_PREV = rk.F_ENTER, rk.F_EXIT, rk.F_START, rk.F_DUR, rk.F_PREV
_I_SEQ, _I_TMPL = range(2)
# the batch columns, in KernelBatch order, and the block row each comes from (t_exit_err_ns: the
# simulator times exits exactly, 0; comm: every batch holds one communicator)
_BATCH_ROWS = (
    ("op_seq", rk.R_SEQ), ("op_type", rk.R_OP), ("dtype", rk.R_DTYPE), ("count", rk.R_COUNT), ("peer", rk.R_PEER),
    ("rank", rk.R_RANK), ("comm_rank", rk.R_CRANK), ("comm_size", rk.R_CSIZE), ("status", rk.R_STATUS),
    ("host_idx", rk.R_LHOST), ("t_enter_ns", rk.R_ENTER), ("t_exit_ns", rk.R_EXIT), ("t_sample_ns", rk.R_SAMPLE),
    ("t_prev_exit_ns", rk.R_PREV), ("t_exit_err_ns", rk.R_ZERO), (COMM_COLUMN, rk.R_HASH),
)
_BATCH_NAMES = tuple(k for k, _ in _BATCH_ROWS)
_BATCH_ROW_IX = tuple(r for _, r in _BATCH_ROWS)
# an op template: what every member of a call shares (op, dtype, count, peer, slots, total send, total recv)
Template = tuple[int, int, int, int, int, int, int]


def _slots(dur_s: float) -> int:
    return max(IN_FLIGHT * 2, int(round(dur_s * SLOT_RATE)))


@dataclass
class _Comms:
    """Every communicator of the job: the topology's, plus one per stage pair for gradients."""

    hashes: list[int]
    hosts: list[tuple[str, ...]]
    off: I64  # comm id -> first member index
    m_rank: I64  # member -> global rank
    m_crank: I64
    m_cid: I64
    m_lhost: I64  # member -> index into its comm's host table
    bwd_comm: I64  # rank on stage p+1 -> comm where it sends gradients to stage p (-1: none)
    family: list[str]  # comm id -> "tp", "dp", "pp" (either direction), "ep", "world"


def _comms(topo: Topology) -> _Comms:
    hashes = list(topo.comm_hash)
    hosts = list(topo.comm_hosts)
    sizes = list(topo.comm_size)
    n = topo.n
    bwd = np.full(n, -1, dtype=np.int64)
    r = np.arange(n, dtype=np.int64)
    if topo.pp > 1:
        for dst in r[(r // topo.tp) % topo.pp > 0].tolist():  # dst on stage p+1 sends to dst - tp
            pair = np.array([dst, dst - topo.tp], dtype=np.int64)
            bwd[dst] = len(hashes)
            hashes.append(comm_hash_of("ppb", pair))
            hs = sorted({int(topo.host_of[dst]), int(topo.host_of[dst - topo.tp])})
            hosts.append(tuple(topo.hosts[h] for h in hs))
            sizes.append(2)
    off = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    m = int(sum(sizes))
    m_rank = np.full(m, -1, dtype=np.int64)
    m_crank = np.full(m, -1, dtype=np.int64)

    def place(comm: I64, crank: I64) -> None:
        ok = comm >= 0
        gi = off[comm[ok]] + crank[ok]
        m_rank[gi] = r[ok]
        m_crank[gi] = crank[ok]

    place(topo.tp_comm, topo.tp_crank)
    place(topo.dp_comm, topo.dp_crank)
    place(topo.pps_comm, np.zeros(n, dtype=np.int64))
    place(topo.ppr_comm, np.ones(n, dtype=np.int64))
    place(np.full(n, topo.world_comm, dtype=np.int64), r.copy())
    if topo.ep_comm is not None and topo.ep_crank is not None:
        place(topo.ep_comm, topo.ep_crank)
    place(bwd, np.zeros(n, dtype=np.int64))
    recv_b = np.full(n, -1, dtype=np.int64)
    has = bwd >= 0
    recv_b[r[has] - topo.tp] = bwd[has]
    place(recv_b, np.ones(n, dtype=np.int64))
    m_cid = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    host_ix = {h: i for i, h in enumerate(topo.hosts)}
    m_lhost = np.zeros(m, dtype=np.int64)
    for cid, names in enumerate(hosts):  # members' host -> index in the comm's table
        loc = np.full(len(topo.hosts), -1, dtype=np.int64)
        loc[[host_ix[h] for h in names]] = np.arange(len(names))
        sl = slice(int(off[cid]), int(off[cid]) + sizes[cid])
        m_lhost[sl] = loc[topo.host_of[m_rank[sl]]]
    fam = [{"ppb": "pp"}.get(f, f) for f in topo.comm_family] + ["pp"] * (len(hashes) - topo.n_comms)
    return _Comms(hashes, hosts, off, m_rank, m_crank, m_cid, m_lhost, bwd, fam)


_SAMPLE_BLOCK = 2048  # sequence numbers whose sampling is decided at once, per layout


@dataclass(frozen=True)
class _Layout:
    ranks: I64
    cids: I64
    crank: I64
    gi: I64  # member index of each rank in its group's communicator
    cid_g: I64  # communicator of each group
    has_rank0: bool  # rank 0 takes part (its ops are counted for the ops/s figure)
    cache: dict[str, Any] = field(default_factory=dict)  # sampling decisions, buffers, next sampling instant


class MegatronSim(FaultBook):
    """Plays one scenario with a ``workload`` and yields ``(delivery time, batch)`` in time order."""

    def __init__(
        self, sc: Scenario, topo: Topology, *, job: str, producer: str, skew_s: F64,
        detail_ops_per_s: float = DETAIL_OPS_PER_S, drift: F64 | None = None,
    ) -> None:
        if sc.workload is None:
            raise ValueError("MegatronSim needs a scenario with a workload")
        self.sc, self.topo, self.w = sc, topo, sc.workload
        self.job, self.producer, self.skew = job, producer, skew_s
        self.drift = np.zeros(len(topo.hosts)) if drift is None else drift  # per host, fraction
        self.budget = detail_ops_per_s
        self.rng = np.random.default_rng(sc.seed)
        self.pk_rng = np.random.default_rng([sc.seed, 3])  # kernel peaks: their own stream, timing keeps its draws
        self.c = _comms(topo)
        n = topo.n
        self.clock = self.rng.uniform(0.0, 0.05, n)
        self.last_exit = np.full(n, -1.0)
        self.rs_exit = np.full(n, -1.0)
        nm = self.c.m_rank.shape[0]
        self.mf = np.full((nm, 5), INF)
        self.mf[:, _F_PREV] = -1.0
        self.mf[:, _F_EXIT] = -INF  # no op yet: nothing to wait for
        self.mi = np.full((nm, 2), -1, dtype=np.int64)
        self.m_exit = np.full(nm, -INF)  # the newest op's exit as the timing model sees it (mf's is recorded later)
        self.tmpl_ids: dict[Template, int] = {}
        self.tmpl = np.zeros((0, 7), dtype=np.int64)
        # members whose newest op a fault changed: a link backlog (send/recv lead) or a freeze
        self.m_sl = np.zeros(nm, dtype=np.int64)
        self.m_rl = np.zeros(nm, dtype=np.int64)
        self.m_pl = np.zeros(nm, dtype=np.int64)  # a slow link's source: the peak backlog its kernel keeps
        self.m_fr = np.ones(nm)
        self.m_probewin = np.full(nm, -1, dtype=np.int64)  # interval of the member's last in-flight sample
        self.next_inst = np.zeros(nm, dtype=np.int64)
        n_c = len(self.c.hashes)
        self.cseq = np.zeros(n_c, dtype=np.int64)
        self.one_in = np.ones(n_c, dtype=np.int64)
        self.hash_arr = np.asarray(self.c.hashes, dtype=np.int64)
        # queued records, each call's (int block, sampling times, peaks); see rk.R_* for the block's rows
        # each with the first and last delivery window of its rows, so a flush takes or keeps whole blocks
        self.pending: list[tuple[I64, F64, I64, int, int]] = []
        # a batch holds one host's records (a table of its own name); each rank's host
        self.m_host = np.asarray(topo.host_of, dtype=np.int64)
        self.n_hosts = len(topo.hosts)
        self.host_names = [(h,) for h in topo.hosts]
        self._log_reset()  # the step's ops, recorded at its end (_drain)
        self.window = 0
        self.batch_seq = 0
        dt = sc.sample_interval_s
        self.dt = dt
        self.n_inst = int(math.floor(sc.duration_s / dt + 1e-9)) + 1  # instants 0, dt, ... <= duration
        self._init_faults(sc, n)
        self.ops_per_rank = 0  # collectives rank 0 issued (for the workload's ops/s figure)
        self.train = True
        self.inc = 0  # incarnation: a restart starts a new one
        self.measure = True  # the next step measures op rates (the first one, and the first after a restart)
        self.step_t0 = 0.0
        self.restarts = [f for f in sc.faults if f.kind == "restart"]
        self.recreates = [f for f in sc.faults if f.kind == "recreate"]
        self.all_one = True  # every communicator's stride is 1 (the first step, before rates are known)
        self._tbuf, self._tpos = np.zeros(0), 0
        self._ubuf, self._upos = np.zeros(0), 0
        self.any_h1 = bool(np.isfinite(self.h1_onset).any())
        # ranks a fault names: ops whose ranks include none of them take the batched path (_chain)
        # (a link fault names the sources of its links: a NIC's are many)
        self.fault_ranks = np.asarray(sorted({f.rank for f in sc.faults if f.rank >= 0}
                                             | {src for f in sc.faults for _, src, _ in f.links}), dtype=np.int64)
        self.stopped: list[tuple[str, int, int]] = []  # links an H3 stopped (family, src, dst), for scenario authors
        self.pp_links = any(fam == "pp" for f in self.link_faults for fam, _, _ in f.links)
        self.ep_links = any(fam == "ep" for f in self.link_faults for fam, _, _ in f.links)
        self._egrids: dict[int, I64] = {}  # stage -> its expert groups (rows)
        self._clean: dict[tuple[Any, ...], bool] = {}
        self._layouts: dict[tuple[Any, ...], _Layout] = {}
        self.sizes = np.diff(np.append(self.c.off, nm))
        # what a record of a member carries whatever its op: gathered once per _rows call, not five times
        self.m_static = np.stack([self.c.m_cid, self.c.m_rank, self.c.m_crank, self.sizes[self.c.m_cid],
                                  self.c.m_lhost])
        # each member's clock (its host's drift and skew), so a timestamp is one multiply-add per record
        h = topo.host_of[self.c.m_rank]
        self.m_scale = 1.0 + self.drift[h]
        self.m_skew = self.skew[h]
        self._stages = [topo.stage_ranks(p) for p in range(topo.pp)]
        ch = min(sc.channels, MAX_CHANNELS)
        # a record's per-slot counters are its per-channel counter times the hardware channels folded
        # onto that slot (fold_columns of equal channels: a sum of equal terms is this product)
        self.slot_mult = np.bincount(np.arange(sc.channels) % MAX_CHANNELS, minlength=MAX_CHANNELS)[:ch]

    # -- time and noise ------------------------------------------------------------------------
    def _t4(self, n: int) -> F64:
        """``n`` heavy-tailed (Student t, 4 degrees of freedom) noise values, drawn in bulk."""
        if self._tpos + n > self._tbuf.shape[0]:
            self._tbuf = self.rng.standard_t(4, max(1 << 16, 4 * n))
            self._tpos = 0
        out = self._tbuf[self._tpos : self._tpos + n]
        self._tpos += n
        return out

    def _u(self, n: int) -> F64:
        if self._upos + n > self._ubuf.shape[0]:
            self._ubuf = self.rng.random(max(1 << 16, 4 * n))
            self._upos = 0
        out = self._ubuf[self._upos : self._upos + n]
        self._upos += n
        return out

    def _compute(self, ranks: I64, begin: F64, base_s: float | F64, step_factor: float) -> F64:
        jit = self.sc.jitter
        c = base_s * step_factor * (1.0 + jit / 4 * self._t4(ranks.shape[0]))
        return begin + self._faulty_compute(ranks, begin, np.maximum(c, 0.2 * base_s))

    # -- one collective on many groups at once ---------------------------------------------------
    def _layout(self, key: tuple[Any, ...], ranks: I64, cids: I64, crank: I64, groups: int) -> _Layout:
        """Arrays that only depend on which ranks meet where (cached: the same groups meet every step)."""
        lay = self._layouts.get(key)
        if lay is None:
            size = ranks.shape[0] // groups
            lay = _Layout(ranks, cids, crank, self.c.off[cids] + crank, cids.reshape(groups, size)[:, 0].copy(),
                          bool((ranks == 0).any()))
            self._layouts[key] = lay
        return lay

    def coll(
        self, grid: I64, comm_of: I64, crank_of: I64, enter: F64, op: OpType, nominal_s: float, count: int,
        *, family: str, key: tuple[Any, ...], blocking: bool = True,
    ) -> F64:
        """A ring collective on the groups that are the rows of ``grid``; returns each rank's exit.

        ``key`` names the set of groups (family and stage) so their static arrays are built once.
        """
        groups, size = grid.shape
        ranks = grid.ravel()
        lay = self._layouts.get(key)  # built on first use only: the two gathers are not free per op
        if lay is None:
            lay = self._layout(key, ranks, comm_of[ranks], crank_of[ranks], groups)
        if not blocking:
            # a communicator runs its ops in order (one stream): an op issued while the previous one
            # is still running (gradient buckets) starts on the GPU when that one ends, never before
            enter = np.maximum(enter, self.m_exit[lay.gi])
        if self.any_h1:
            enter = self._stop(ranks, enter)
        start_g = enter.reshape(groups, size).max(axis=1)
        dur_g = nominal_s * (1.0 + self.sc.jitter / 2 * np.abs(self._t4(groups)))
        nn = ranks.shape[0]
        special: dict[str, npt.NDArray[Any]] = {}  # per-rank arrays a fault changes (else the defaults)
        hang_g = None
        if self.link_faults and family in ("tp", "dp"):
            hang_g = self._ring_links(lay, family, size, start_g, dur_g, nominal_s, special, hang_g)
        for f in list(self.pending_h2):
            want = ("dp", OpType.REDUCE_SCATTER) if f.mismatch == "order" or self.topo.tp < 2 else ("tp", op)
            if want != (family, op):
                continue
            hit = np.flatnonzero((ranks == f.rank) & np.isfinite(enter) & (enter >= f.onset_s))
            if hit.size:
                self.pending_h2.remove(f)
                i = int(hit[0])
                op_t = special.setdefault("op", np.full(nn, int(op), dtype=np.int64))
                dt_ = special.setdefault("dtype", np.full(nn, BF16, dtype=np.int64))
                cnt = special.setdefault("count", np.full(nn, count, dtype=np.int64))
                if f.mismatch == "order":
                    op_t[i] = int(OpType.ALL_GATHER)  # it issued the step's ops in the other order
                elif f.mismatch == "op":
                    op_t[i] = int(OpType.ALL_GATHER if op != OpType.ALL_GATHER else OpType.ALL_REDUCE)
                elif f.mismatch == "dtype":
                    dt_[i] = int(DType.FLOAT32)
                else:
                    cnt[i] = cnt[i] // 2
                hang_g = np.zeros(groups, dtype=bool) if hang_g is None else hang_g
                hang_g[i // size] = True
                special.setdefault("freeze", np.ones(nn))[(i // size) * size : (i // size + 1) * size] = 0.0
        start = np.repeat(start_g, size)
        dur = np.repeat(dur_g, size)
        exit_ = start + dur * (1.0 + 0.01 * self._u(nn))
        if hang_g is not None:
            exit_ = np.where(np.repeat(hang_g, size), INF, exit_)
        slots = _slots(nominal_s)
        tmpl: int | I64 = self._tmpl((int(op), BF16, count, -1, slots, slots, slots))
        if "op" in special:  # H2: one member called something else
            tmpl = np.asarray([self._tmpl((int(o), int(d), int(c), -1, slots, slots, slots)) for o, d, c in
                               zip(special["op"].tolist(), special["dtype"].tolist(), special["count"].tolist(),
                                   strict=True)], dtype=np.int64)
        self._record(lay, enter, exit_, start, dur, tmpl, special)
        if blocking:
            fin = np.isfinite(exit_)
            self.last_exit[ranks[fin]] = exit_[fin]
        return exit_

    def _ring_links(self, lay: _Layout, family: str, size: int, start_g: F64, dur_g: F64, nominal_s: float,
                    special: dict[str, npt.NDArray[Any]], hang_g: npt.NDArray[np.bool_] | None
                    ) -> npt.NDArray[np.bool_] | None:
        """Apply the link faults on rings of ``family`` to one collective (in place: ``dur_g``, ``special``):
        a slow link stretches its group's op, a dead one (H3) freezes it; returns the hung groups."""
        pos_of = lay.cache.get("pos")
        if pos_of is None:
            pos_of = lay.cache["pos"] = {r: i for i, r in enumerate(lay.ranks.tolist())}
        nn, groups = lay.ranks.shape[0], lay.cid_g.shape[0]
        for f in self.link_faults:
            on = [pos_of[src] for fam, src, _ in f.links if fam == family and src in pos_of]
            on = [pos for pos in on if math.isfinite(start_g[pos // size])]
            if not on:
                continue
            if f.kind == "H3":
                if f not in self.pending_h3:
                    continue
                on = [pos for pos in on if start_g[pos // size] + dur_g[pos // size] > f.onset_s]
                if not on:
                    continue
                self.pending_h3.remove(f)  # every link of the fault (a NIC's) that this op uses stops now
                for pos in on:
                    g = pos // size
                    nxt = g * size + (pos % size + 1) % size
                    self.stopped.append((family, int(lay.ranks[pos]), int(lay.ranks[nxt])))
                    frac = (f.onset_s - start_g[g]) / dur_g[g] if start_g[g] < f.onset_s else self.rng.uniform(0.2, 0.8)
                    hang_g = np.zeros(groups, dtype=bool) if hang_g is None else hang_g
                    hang_g[g] = True
                    special.setdefault("freeze", np.ones(nn))[g * size : (g + 1) * size] = frac
            else:
                on = [pos for pos in on if bool(f.active(np.asarray(start_g[pos // size])))]
                for pos in on:
                    dur_g[pos // size] /= f.bandwidth
            for pos in on:
                g = pos // size
                nxt = g * size + (pos % size + 1) % size
                # data piles up behind the bad link: everyone but its two ends runs IN_FLIGHT slots ahead
                sl_ = special.setdefault("send_lead", np.zeros(nn, np.int64))
                rl_ = special.setdefault("recv_lead", np.zeros(nn, np.int64))
                sl_[g * size : (g + 1) * size] = IN_FLIGHT
                rl_[g * size : (g + 1) * size] = IN_FLIGHT
                sl_[pos] = 0
                rl_[nxt] = 0
                peak = special.setdefault("peak_lead", np.zeros(nn, np.int64))
                peak[pos] = source_peak(_slots(nominal_s), f.bandwidth)
        return hang_g

    def _p2p_links(self, src: I64, dst: I64, start: F64, dur: F64, nominal_s: float
                   ) -> tuple[dict[str, npt.NDArray[Any]], npt.NDArray[np.bool_] | None]:
        """Apply the pipeline link faults to one send/recv of each pair (``dur`` in place): the
        members' fault marks (sender first, then receiver) and which pairs hang."""
        m = src.shape[0]
        special: dict[str, npt.NDArray[Any]] = {}
        hang: npt.NDArray[np.bool_] | None = None
        for f in self.link_faults:
            on = [int(i) for fam, s, d in f.links if fam == "pp" for i in np.flatnonzero((src == s) & (dst == d))]
            on = [i for i in on if math.isfinite(start[i])]
            if not on:
                continue
            if f.kind == "H3":
                if f not in self.pending_h3:
                    continue
                on = [i for i in on if start[i] + dur[i] > f.onset_s]
                if not on:
                    continue
                self.pending_h3.remove(f)
                for i in on:
                    self.stopped.append(("pp", int(src[i]), int(dst[i])))
                    frac = (f.onset_s - start[i]) / dur[i] if start[i] < f.onset_s else self.rng.uniform(0.2, 0.8)
                    hang = np.zeros(m, dtype=bool) if hang is None else hang
                    hang[i] = True
                    fr = special.setdefault("freeze", np.ones(2 * m))
                    fr[i] = fr[m + i] = frac
            else:
                on = [i for i in on if bool(f.active(np.asarray(start[i])))]
                for i in on:
                    dur[i] /= f.bandwidth
            for i in on:
                peak = special.setdefault("peak_lead", np.zeros(2 * m, np.int64))
                peak[i] = source_peak(_slots(nominal_s), f.bandwidth)
        return special, hang

    def _chain(
        self, grid: I64, comm_of: I64, crank_of: I64, begin: F64, ops: list[OpType], nominal_s: float, count: int,
        *, family: str, key: tuple[Any, ...], compute: tuple[float, float] | None = None,
    ) -> F64:
        """Blocking ring collectives ``ops``, one after the other, on the groups that are the rows of
        ``grid``, each after a compute of ``compute = (base_s, step_factor)`` when given; returns the
        ranks' exits from the last. The same as ``_compute`` then ``coll`` op by op (the same draws in
        the same order, the same records), but when no fault names one of these ranks the timing is a
        few array operations per op and the records of the whole chain are made at once (``_record_chain``).
        """
        groups, size = grid.shape
        ranks = grid.ravel()
        clean = self._clean.get(key)
        if clean is None:
            clean = self._clean[key] = not bool(np.isin(ranks, self.fault_ranks).any())
        if not clean:  # a fault may act on these ranks: the op-by-op model, which applies them
            t = begin
            for op in ops:
                if compute is not None:
                    t = self._compute(ranks, t, compute[0], compute[1])
                t = self.coll(grid, comm_of, crank_of, t, op, nominal_s, count, family=family, key=key)
            return t
        lay = self._layouts.get(key)  # built on first use only: the two gathers are not free per op
        if lay is None:
            lay = self._layout(key, ranks, comm_of[ranks], crank_of[ranks], groups)
        k, nn = len(ops), ranks.shape[0]
        # the noise, drawn in the order the op-by-op model draws it (compute, op duration, exits); when
        # neither bulk buffer runs out inside the chain, op by op would take consecutive slices of them,
        # so the chain takes them as one slice each, shaped by op
        c_cols = nn if compute is not None else 0  # a row of tb: the compute noise (if any), then the ops'
        per_t = groups + c_cols
        if self._tpos + k * per_t <= self._tbuf.shape[0] and self._upos + k * nn <= self._ubuf.shape[0]:
            tb = self._tbuf[self._tpos : self._tpos + k * per_t].reshape(k, per_t)
            self._tpos += k * per_t
            u_all = self._ubuf[self._upos : self._upos + k * nn].reshape(k, nn)
            self._upos += k * nn
        else:
            t_noise, u_noise = [], []
            for _ in range(k):
                t_noise.append(np.concatenate([self._t4(nn), self._t4(groups)]) if c_cols else self._t4(groups))
                u_noise.append(self._u(nn))
            tb, u_all = np.stack(t_noise), np.stack(u_noise)
        base_s, step_factor = compute if compute is not None else (0.0, 0.0)
        fop = np.empty((k, nn, 5))
        # written as _compute and coll write them, element by element, so every float is the same; the
        # kernel also moves the ranks' last exits and the members' newest exits the timing model reads
        entered = rk.chain_times(np.ascontiguousarray(begin, dtype=np.float64), tb, c_cols, u_all, self.sc.jitter,
                                 nominal_s, base_s, step_factor, size, ranks, self.last_exit, lay.gi, self.m_exit,
                                 self.sc.duration_s, fop)
        seq0 = int(self.cseq[lay.cid_g[0]])  # the groups of a layout run in lockstep (see _sampled)
        self.cseq[lay.cid_g] += k
        if lay.has_rank0:
            self.ops_per_rank += k
        if entered:
            slots = _slots(nominal_s)
            known = lay.cache.setdefault("tmpl", {})  # (ops, count, slots) -> the chain's templates, member by member
            tkey = (tuple(ops), count, slots)
            tmpl = known.get(tkey)
            if tmpl is None:
                ids = [self._tmpl((int(op), BF16, count, -1, slots, slots, slots)) for op in ops]
                tmpl = known[tkey] = np.repeat(np.asarray(ids, dtype=np.int64), nn)
            write = bool(lay.cache.get("special"))
            lay.cache["special"] = False
            self._log(lay, k, fop, tmpl, seq0, self._sampled_run(lay, seq0, k), {} if write else None)
        exit_ = fop[:, :, _F_EXIT]
        return exit_[-1].copy()

    def p2p(self, src: I64, dst: I64, enter_src: F64, enter_dst: F64, comm: I64, nominal_s: float,
            key: tuple[Any, ...]) -> tuple[F64, F64]:
        """``src[i]`` sends one tensor to ``dst[i]`` on ``comm[i]`` (comm rank 0 sends); the receiver waits."""
        m = src.shape[0]
        lay = self._layouts.get(key)  # the same pairs meet under a key every step: built once
        if lay is None:
            ranks = np.concatenate([src, dst])
            cr = np.concatenate([np.zeros(m, np.int64), np.ones(m, np.int64)])
            lay = self._layout(key, ranks, np.concatenate([comm, comm]), cr, m)
        slots = _slots(nominal_s)
        send_t = self._tmpl((int(OpType.SEND), BF16, self.w.act_elems, 1, slots, slots, 0))
        recv_t = self._tmpl((int(OpType.RECV), BF16, self.w.act_elems, 0, slots, 0, slots))
        cached = lay.cache.get("p2p_tmpl")
        if cached is None or cached[:2] != (send_t, recv_t):
            both = np.concatenate([np.full(m, send_t, dtype=np.int64), np.full(m, recv_t, dtype=np.int64)])
            cached = lay.cache["p2p_tmpl"] = (send_t, recv_t, both)
        tmpl = cached[2]
        if not (self.any_h1 or self.pp_links):  # no fault can act on it: compiled (the same draws and floats)
            fop = np.empty((2 * m, 5))
            dn = self._t4(m)
            us, ud = self._u(m), self._u(m)
            entered = rk.p2p_times(np.ascontiguousarray(enter_src, dtype=np.float64),
                                   np.ascontiguousarray(enter_dst, dtype=np.float64), dn, us, ud, self.sc.jitter,
                                   nominal_s, lay.ranks, self.last_exit, lay.gi, self.m_exit, self.sc.duration_s, fop)
            self._log_op(lay, fop if entered else None, tmpl, {})
            return fop[:m, _F_EXIT].copy(), fop[m:, _F_EXIT].copy()
        enter_src = np.maximum(enter_src, self.m_exit[lay.gi[:m]])  # in order on its communicator
        if self.any_h1:
            enter_src, enter_dst = self._stop(src, enter_src), self._stop(dst, enter_dst)
        start = np.maximum(enter_src, enter_dst)
        dur = nominal_s * (1.0 + self.sc.jitter / 2 * np.abs(self._t4(m)))
        special, hang = self._p2p_links(src, dst, start, dur, nominal_s) if self.pp_links else ({}, None)
        xs = start + dur * (1.0 + 0.01 * self._u(m))
        xd = start + dur * (1.0 + 0.01 * self._u(m))
        if hang is not None:
            xs, xd = np.where(hang, INF, xs), np.where(hang, INF, xd)
        self._record(lay, np.concatenate([enter_src, enter_dst]), np.concatenate([xs, xd]),
                     np.concatenate([start, start]), np.concatenate([dur, dur]), tmpl, special)
        fin = np.isfinite(xd)
        self.last_exit[dst[fin]] = xd[fin]
        return xs, xd

    # -- members: state samples and sampled detail ---------------------------------------------
    def _sampled(self, lay: _Layout, seq_g: I64) -> npt.NDArray[np.bool_]:
        """Which groups' op is detailed; the groups of one layout run in lockstep (one sequence
        number), so the rule is evaluated for a block of upcoming sequence numbers at once."""
        if self.all_one:
            return np.ones(seq_g.shape[0], dtype=np.bool_)
        seq = int(seq_g[0])
        if not bool((seq_g == seq).all()):  # pragma: no cover - lockstep is how layouts are built
            return detail_sampled(self.hash_arr[lay.cid_g], seq_g, self.one_in[lay.cid_g])
        base, block = lay.cache.get("base", -1), lay.cache.get("block")
        if block is None or not base <= seq < base + _SAMPLE_BLOCK:
            seqs = np.arange(seq, seq + _SAMPLE_BLOCK, dtype=np.int64)
            block = detail_sampled(self.hash_arr[lay.cid_g][:, None], seqs[None, :], self.one_in[lay.cid_g][:, None])
            lay.cache["base"], lay.cache["block"] = seq, block
            base = seq
        return np.asarray(block[:, seq - base])

    def _sampled_run(self, lay: _Layout, seq0: int, k: int) -> npt.NDArray[np.bool_]:
        """``_sampled`` for the ``k`` successive ops from ``seq0`` of a layout's groups, ``(k, groups)``:
        one slice of the cached block instead of ``k`` calls (a chain's ops are a few array operations each)."""
        groups = lay.cid_g.shape[0]
        if self.all_one:
            return np.ones((k, groups), dtype=np.bool_)
        base, block = lay.cache.get("base", -1), lay.cache.get("block")
        if block is not None and base <= seq0 and seq0 + k <= base + _SAMPLE_BLOCK:
            return np.ascontiguousarray(block[:, seq0 - base : seq0 - base + k].T)
        return np.stack([self._sampled(lay, np.full(groups, seq0 + j, dtype=np.int64)) for j in range(k)])

    def _tmpl(self, t: Template) -> int:
        i = self.tmpl_ids.get(t)
        if i is None:
            i = self.tmpl_ids[t] = len(self.tmpl_ids)
            self.tmpl = np.vstack([self.tmpl, np.asarray(t, dtype=np.int64)[None, :]])
        return i

    def _record(
        self, lay: _Layout, enter: F64, exit_: F64, start: F64, dur: F64, tmpl: int | I64,
        special: dict[str, npt.NDArray[Any]],
    ) -> None:
        """One op of each group of ``lay``: it takes the groups' next sequence number and goes into the
        step's log (``_log``), with the fault marks ``special`` holds for its members."""
        ok = enter <= self.sc.duration_s  # inf (never entered) is not
        allok = bool(ok.all())
        entered = allok or bool(ok.any())
        fop = None
        if entered:
            self.m_exit[lay.gi if allok else lay.gi[ok]] = exit_ if allok else exit_[ok]
            fop = np.empty((enter.shape[0], 5))
            fop[:, _F_ENTER], fop[:, _F_EXIT], fop[:, _F_START], fop[:, _F_DUR] = enter, exit_, start, dur
            fop[:, _F_PREV] = self.last_exit[lay.ranks]
        self._log_op(lay, fop, tmpl, special)

    def _log_op(self, lay: _Layout, fop: F64 | None, tmpl: int | I64, special: dict[str, npt.NDArray[Any]]) -> None:
        """``_record``'s second half: the sequence number, and the op's floats ``fop`` into the log
        (None: no member entered it inside the run)."""
        seq_g = self.cseq[lay.cid_g]
        self.cseq[lay.cid_g] += 1  # one op of each group's own communicator
        if lay.has_rank0:
            self.ops_per_rank += 1
        if fop is None:
            return
        nn = fop.shape[0]
        marks = None
        if special or lay.cache.get("special"):  # the members' marks are written (else they keep theirs)
            marks = special
            lay.cache["special"] = bool(special)
        self._log(lay, 1, fop, np.full(nn, tmpl, dtype=np.int64) if isinstance(tmpl, int) else tmpl,
                  int(seq_g[0]), self._sampled(lay, seq_g), marks)

    # -- the step's log: recorded at its end --------------------------------------------------------
    def _log_reset(self) -> None:
        self._lg_gi: list[I64] = []
        self._lg_f: list[F64] = []  # per member and op: its five floats (_F_*)
        self._lg_tmpl: list[I64] = []
        self._lg_samp: list[npt.NDArray[np.bool_]] = []
        self._lg_mk: list[tuple[I64, F64]] = []
        self._lg_mk_rows = 0
        self._lg_meta: list[tuple[int, int, int, int, int]] = []  # per chunk: ops, members, group size, seq, marks

    def _log(self, lay: _Layout, k: int, f: F64, tmpl: I64, seq0: int, samp: npt.NDArray[np.bool_],
             marks: dict[str, npt.NDArray[Any]] | None) -> None:
        """``k`` successive ops of ``lay``'s members (``f``: ``(k, members, 5)`` or ``(members, 5)``;
        ``tmpl`` and ``samp`` op-major), sequence numbers from ``seq0``; ``marks``, when not None,
        the fault marks the first op writes on its members (absent ones: no fault)."""
        nn = lay.gi.shape[0]
        self._lg_gi.append(lay.gi)  # the chain's k ops share their members
        self._lg_f.append(f.reshape(k * nn, 5))
        self._lg_tmpl.append(tmpl)
        self._lg_samp.append(samp.ravel())
        mo = -1  # the first row of its marks in the step's marks, if it writes them
        if marks is not None:
            mk = np.zeros((nn, 3), dtype=np.int64)
            for c, name in enumerate(("send_lead", "recv_lead", "peak_lead")):
                if name in marks:
                    mk[:, c] = marks[name]
            mo = self._lg_mk_rows
            self._lg_mk.append((mk, marks["freeze"] if "freeze" in marks else np.ones(nn)))
            self._lg_mk_rows += nn
        self._lg_meta.append((k, nn, nn // lay.cid_g.shape[0], seq0, mo))

    def _drain(self) -> None:
        """Record the step's log (``record_kernel.play``): its state samples and in-flight looks are
        queued, then its DONE records with their kernel peaks."""
        meta = self._lg_meta
        if not meta:
            return
        gi = np.concatenate(self._lg_gi) if len(self._lg_gi) > 1 else self._lg_gi[0]
        fop = np.concatenate(self._lg_f) if len(self._lg_f) > 1 else self._lg_f[0]
        tmpl = np.concatenate(self._lg_tmpl)
        samp = np.concatenate(self._lg_samp)
        mks = self._lg_mk
        mk_i = np.concatenate([m[0] for m in mks]) if mks else np.zeros((0, 3), dtype=np.int64)
        mk_f = np.concatenate([m[1] for m in mks]) if mks else np.zeros(0)
        # per entry (op): members, group size, sequence number, where its members and floats begin
        # and its marks (a chain's k ops are k entries on the same members; only its first writes marks)
        m = np.asarray(meta, dtype=np.int64).reshape(-1, 5)
        ks, nns = m[:, 0], m[:, 1]
        head = np.cumsum(ks) - ks  # each chain's first entry
        n_e = int(ks.sum())
        n_arr = np.repeat(nns, ks)
        e_size = np.repeat(m[:, 2], ks)
        e_seq = np.repeat(m[:, 3] - head, ks) + np.arange(n_e)
        e_gio = np.repeat(np.cumsum(nns) - nns, ks)
        e_moff = np.full(n_e, -1, dtype=np.int64)
        e_moff[head] = m[:, 4]
        e_off = np.cumsum(n_arr) - n_arr
        groups = n_arr // e_size
        e_goff = np.cumsum(groups) - groups
        self._log_reset()
        # room for every row: each op at most one look and one DONE per member, and the state
        # samples of every member up to the last instant an op of the log enters after
        en = fop[:, _F_ENTER]
        last = float(en[en <= self.sc.duration_s].max(initial=0.0))
        k_hi = min(int(math.ceil(last / self.dt)) + 1, self.n_inst)
        n_states = int(np.maximum(k_hi - self.next_inst, 0).sum())
        cap = fop.shape[0] + n_states
        oi, of = np.empty((cap, rk.N_OI), dtype=np.int64), np.empty((cap, rk.N_OF))
        di, df = np.empty((fop.shape[0], rk.N_OI), dtype=np.int64), np.empty((fop.shape[0], rk.N_OF))
        no, nd = rk.play(self.mf, self.mi, self.m_sl, self.m_rl, self.m_pl, self.m_fr, self.m_probewin, self.next_inst,
                      e_off, n_arr, e_size, e_seq, e_goff, e_moff, e_gio, gi, fop, tmpl, samp, mk_i, mk_f,
                      float(self.sc.duration_s), float(self.dt), int(self.n_inst), POLL_S, oi, of, di, df)
        if no:
            self._queue(oi[:no], of[:no], None)
        if nd:
            self._done_rows(di[:nd], df[:nd])


    def _states(self, g: I64, upto: F64) -> None:
        """State samples of members ``g`` at every instant before ``upto`` not yet sampled."""
        k0 = self.next_inst[g]
        k1 = np.minimum(np.ceil(np.minimum(upto, 1e15) / self.dt - 1e-9).astype(np.int64), self.n_inst)
        n = np.where(self.mi[g, _I_SEQ] >= 0, k1 - k0, 0)
        for j in range(int(n.max(initial=0))):
            sel = n > j
            self._rows(g[sel], (k0[sel] + j) * self.dt)
        self.next_inst[g] = np.maximum(k0, k1)

    def _rows(self, g: I64, t: npt.NDArray[np.floating[Any]]) -> None:
        """State records of members ``g`` at times ``t`` about their newest op, with the fault marks
        they carry now."""
        n = g.shape[0]
        oi, of = np.zeros((n, rk.N_OI), dtype=np.int64), np.empty((n, rk.N_OF))
        oi[:, rk.O_G] = g
        oi[:, rk.O_SEQ : rk.O_TMPL + 1] = self.mi.take(g, axis=0)
        oi[:, rk.O_SL], oi[:, rk.O_RL], oi[:, rk.O_PL] = self.m_sl[g], self.m_rl[g], self.m_pl[g]
        of[:, rk.O_T] = t
        of[:, rk.O_F0 : rk.O_F0 + 5] = self.mf.take(g, axis=0)
        of[:, rk.O_FR] = self.m_fr[g]
        self._queue(oi, of, None)

    def _done_rows(self, di: I64, df: F64) -> None:
        """The step's DONE records (``play``'s rows, in the order they were noted). Their kernel
        peaks come from their own random stream in that order too: rows of ops without a slow
        link's source are drawn in one call (PCG64 hands out the same integers for one draw of
        n + m as for draws of n then m), an op's rows with such a source in a call of their own
        (it draws twice)."""
        pl = di[:, rk.O_PL]
        tp = self.tmpl.take(di[:, rk.O_TMPL], axis=0)

        def draw(a: int, b: int) -> I64:
            return kernel_peaks(self.pk_rng, pl[a:b], self.sc.channels, tp[a:b, 5], tp[a:b, 6])

        ent = di[:, rk.O_ENTRY]
        src = np.unique(ent[pl > 0])  # ops whose DONE rows hold a slow link's source
        peaks, run = [], 0  # run: the first row not drawn yet
        for e in src.tolist():
            lo, hi = int(np.searchsorted(ent, e, "left")), int(np.searchsorted(ent, e, "right"))
            if run < lo:
                peaks.append(draw(run, lo))
            peaks.append(draw(lo, hi))
            run = hi
        if run < di.shape[0]:
            peaks.append(draw(run, di.shape[0]))
        peak = fold_peaks(np.concatenate(peaks) if len(peaks) > 1 else peaks[0], MAX_CHANNELS)
        self._queue(di, df, peak)


    def _queue(self, oi: I64, of: F64, peak: I64 | None) -> None:
        """Queue the records of ``play``'s rows (``rk.O_*`` columns): state samples, or DONE records
        when ``peak`` (their kernel peaks) is given."""
        n = oi.shape[0]
        blk = np.empty((rk.N_ROWS, n), dtype=np.int64)
        rk.format_rows(oi, of, self.tmpl, self.m_static, self.hash_arr, self.m_scale, self.m_skew, self.inc,
                       peak is not None, EPOCH_NS, int(Status.PROGRESS), int(Status.DONE), int(Status.IDLE), blk)
        # DONE carries the peak backlog each kernel kept per channel (probe v2); other rows: unknown
        if peak is None:
            peak = np.full((n, min(self.sc.channels, MAX_CHANNELS)), -1, dtype=np.int64)
        t = of[:, rk.O_T].copy()
        # the window of the earliest and latest row (floor of a monotonic expression: the min and max windows)
        w_lo = int(math.floor(float(t.min()) / self.dt + 1e-9))
        w_hi = int(math.floor(float(t.max()) / self.dt + 1e-9))
        self.pending.append((blk, t, peak, w_lo, w_hi))

    # -- windows out ----------------------------------------------------------------------------
    def _flush(self, upto: float) -> Iterator[tuple[float, KernelBatch]]:
        """Batches of every delivery window that ends at or before ``upto``."""
        dt = self.dt
        last = int(math.floor(min(upto, self.sc.duration_s + dt) / dt + 1e-9))  # windows [w*dt, (w+1)*dt) < last
        if last <= self.window or not self.pending:
            self.window = max(self.window, min(last, self.n_inst))
            return
        # most blocks lie wholly before ``last`` or wholly after it (state samples queued ahead): only
        # the rows that go out are copied, blocks that stay are kept as they are, in their order, so
        # the rows go out in the order one concatenation of all of them would give
        out_p: list[tuple[I64, F64, I64, int, int]] = []
        kept: list[tuple[I64, F64, I64, int, int]] = []
        for p in self.pending:
            if p[4] < last:
                out_p.append(p)
            elif p[3] >= last:
                kept.append(p)
            else:
                o = np.floor(p[1] / dt + 1e-9) < last
                out_p.append((p[0][:, o], p[1][o], p[2][o], p[3], last - 1))
                kept.append((p[0][:, ~o], p[1][~o], p[2][~o], last, p[4]))
        self.pending = kept
        if not out_p:
            self.window = last
            return
        if len(out_p) == 1:
            blk, t, peak = out_p[0][:3]
        else:
            blk = np.concatenate([p[0] for p in out_p], axis=1)
            t = np.concatenate([p[1] for p in out_p])
            peak = np.concatenate([p[2] for p in out_p])
        win = np.floor(t / dt + 1e-9).astype(np.int64)
        # one batch per window, incarnation and host, as the attachment's host aggregator sends them (a
        # job may restart as a new incarnation inside one window), rows in time order: the three keys
        # packed in one integer (each below its range), so the stable sort has two passes, not four
        host = self.m_host.take(blk[rk.R_RANK])
        inc = blk[rk.R_INC]
        key = (win * (int(inc.max()) + 1) + inc) * self.n_hosts + host if win.shape[0] else win
        order = np.lexsort((t, key))
        # np.take gathers a row at a time: well over a third cheaper than fancy indexing of the block
        blk, peak, win, key = np.take(blk, order, axis=1), np.take(peak, order, axis=0), win[order], key[order]
        cuts = np.flatnonzero(np.diff(key) != 0) + 1
        bounds = np.concatenate([[0], cuts, [win.shape[0]]]).tolist()
        send2 = blk[rk.R_SEND][:, None] * self.slot_mult
        recv2 = blk[rk.R_RECV][:, None] * self.slot_mult
        firsts = bounds[:-1]
        host_l = (key[firsts] % self.n_hosts).tolist()
        win_l = win[firsts].tolist()
        inc_l = blk[rk.R_INC][firsts].tolist()
        hash_l = blk[rk.R_HASH][firsts].tolist()
        names, job, producer, world = self.host_names, self.job, self.producer, self.topo.n
        # a batch's columns are slices of the block's rows (1-D slicing is the cheapest view numpy makes);
        # every rule KernelBatch checks holds by construction, so they are not checked again per batch.
        # Its hosts table is its host alone: every row's host_idx is 0
        zero = np.zeros(win.shape[0], dtype=np.int64)
        rows = [(k, zero if k == "host_idx" else blk[r]) for k, r in zip(_BATCH_NAMES, _BATCH_ROW_IX, strict=True)]
        seq0 = self.batch_seq
        dur_s = self.sc.duration_s
        make = KernelBatch.prebuilt
        for i, (a, b) in enumerate(zip(firsts, bounds[1:], strict=True)):
            batch = make(
                job=job, incarnation=inc_l[i], comm_hash=hash_l[i], world_size=world, hosts=names[host_l[i]],
                columns={k: row[a:b] for k, row in rows}, send=send2[a:b],
                recv=recv2[a:b], producer=producer, batch_seq=seq0 + i, peak_lag=peak[a:b],
            )
            self.batch_seq = seq0 + i + 1
            yield min((win_l[i] + 1) * dt, dur_s) + DELIVERY_LATENCY_S, batch
        self.window = last

    # -- the schedule -------------------------------------------------------------------------------
    def _program(self, p: int, train: bool) -> list[tuple[str, int]]:
        m, pp = self.w.microbatches, self.topo.pp
        if not train:
            return [("F", i) for i in range(m)]
        warm = min(pp - p - 1, m)
        prog = [("F", i) for i in range(warm)]
        f, b = warm, 0
        while f < m:
            prog += [("F", f), ("B", b)]
            f += 1
            b += 1
        return prog + [("B", i) for i in range(b, m)]

    def _pass(self, p: int, kind: str, i: int, step_factor: float, last_mb: bool) -> None:
        """Layers of one forward or backward pass of stage ``p`` (tensor-parallel ops inside)."""
        topo, w = self.topo, self.w
        stage = self._stages[p]
        grid = stage.reshape(topo.dp, topo.tp)
        per_layer = w.fwd_s * (1.0 if kind == "F" else 2.0)
        k = w.tp_ops_per_layer
        tp_s = w.tp_op_s(topo.tp)
        ops: list[OpType] = (
            [OpType.ALL_GATHER, OpType.REDUCE_SCATTER] * 2 if w.seq_parallel else [OpType.ALL_REDUCE] * 2
        )
        buckets_after: dict[int, list[int]] = {}
        if kind == "B" and last_mb and topo.dp > 1 and self.train:
            # bucket b is ready after the layer that fills its share of the gradients; with more buckets
            # than layers several are ready after one layer (never before the first: every bucket is played)
            for b in range(w.dp_buckets):
                buckets_after.setdefault(max(0, (b + 1) * w.layers // w.dp_buckets - 1), []).append(b)
        t = self.clock[stage]
        count = w.act_elems // (topo.tp if w.seq_parallel else 1)
        seg: list[OpType] = []  # the layers' ops up to the next gradient bucket, played as one chain
        half = k // 2
        for layer in range(w.layers):
            moe = topo.ep_comm is not None and (layer + 1) % w.moe_every == 0
            if moe:  # attention, dispatch, experts, combine, then the MLP's tensor-parallel ops
                if topo.tp > 1:
                    t = self._chain(grid, topo.tp_comm, topo.tp_crank, t, seg + ops[:half], tp_s, count, family="tp",
                                    key=("tp", p), compute=(per_layer / k, step_factor))
                else:
                    t = self._compute(stage, t, per_layer / 2, step_factor)
                seg = []
                t = self._moe(p, stage, grid, t, per_layer / 2, step_factor)
                if topo.tp > 1:
                    t = self._chain(grid, topo.tp_comm, topo.tp_crank, t, ops[half:k], tp_s, count, family="tp",
                                    key=("tp", p))
            elif topo.tp > 1:
                seg += ops[:k]
                if layer in buckets_after or layer == w.layers - 1:
                    t = self._chain(grid, topo.tp_comm, topo.tp_crank, t, seg, tp_s, count, family="tp",
                                    key=("tp", p), compute=(per_layer / k, step_factor))
                    seg = []
            else:
                for _j in range(k):
                    t = self._compute(stage, t, per_layer / k, step_factor)
            for _b in buckets_after.get(layer, []):
                ex = self.coll(grid.T.copy(), topo.dp_comm, topo.dp_crank, self._reorder(stage, grid.T.ravel(), t),
                               OpType.REDUCE_SCATTER, w.dp_op_s(topo.tp, topo.dp),
                               int(w.grad_bytes(topo.tp) / 2 / w.dp_buckets), family="dp", key=("dp", p),
                               blocking=False)
                order = grid.T.ravel()
                self.rs_exit[order] = np.maximum(self.rs_exit[order], ex)
        self.clock[stage] = t

    def _moe(self, p: int, stage: I64, grid: I64, t: F64, expert_s: float, step_factor: float) -> F64:
        """One MoE layer of stage ``p`` from the attention's end ``t`` (stage order): the dispatch
        all_to_all over each expert group, the experts' compute, the combine all_to_all."""
        topo, w = self.topo, self.w
        ep = self.sc.layout.ep
        egrid = self._egrids.get(p)  # rows: expert groups (ep consecutive replicas of one tensor index)
        if egrid is None:
            egrid = self._egrids[p] = grid.reshape(topo.dp // ep, ep, topo.tp).transpose(0, 2, 1).reshape(-1, ep).copy()
        order = egrid.ravel()
        same = bool((topo.host_of[egrid] == topo.host_of[egrid[:, :1]]).all())
        a2a_s = w.a2a_op_s(ep, same)
        count = w.act_elems * w.topk
        e, load = self.a2a(egrid, self._reorder(stage, order, t), a2a_s, count, key=("ep", p))
        # an expert computes on what the router sent it: the most loaded one is last at the combine
        e = self._compute(order, e, expert_s * load, step_factor)
        e, _ = self.a2a(egrid, e, a2a_s, count, key=("ep", p), load=load)  # each sends back what it got
        return self._reorder(order, stage, e)

    def a2a(self, grid: I64, enter: F64, nominal_s: float, count: int, *, key: tuple[Any, ...],
            load: F64 | None = None) -> tuple[F64, F64]:
        """An all_to_all on the expert groups that are the rows of ``grid``; returns each rank's exit
        and its load (its count over ``count``: drawn, or ``load`` as given).

        Every member exchanges with every other, so the data moves once the last member arrived;
        a member leaves when its own exchanges are done: a slow or dead link (``_a2a_links``) holds
        its two ends only, the others leave on time (and wait for them in the next op). Each rank's
        count is what the router sent it: one of eight levels from 0.75 to 1.19 of ``count``."""
        topo = self.topo
        assert topo.ep_comm is not None and topo.ep_crank is not None
        groups, size = grid.shape
        ranks = grid.ravel()
        lay = self._layouts.get(key)
        if lay is None:
            lay = self._layout(key, ranks, topo.ep_comm[ranks], topo.ep_crank[ranks], groups)
        enter = np.maximum(enter, self.m_exit[lay.gi])  # in order on its communicator
        if self.any_h1:
            enter = self._stop(ranks, enter)
        start_g = enter.reshape(groups, size).max(axis=1)
        dur_g = nominal_s * (1.0 + self.sc.jitter / 2 * np.abs(self._t4(groups)))
        nn = ranks.shape[0]
        start, dur = np.repeat(start_g, size), np.repeat(dur_g, size)
        special: dict[str, npt.NDArray[Any]] = {}
        hang = self._a2a_links(lay, start, dur, nominal_s, special) if self.ep_links else None
        exit_ = start + dur * (1.0 + 0.01 * self._u(nn))
        if hang is not None:
            exit_ = np.where(hang, INF, exit_)
        slots = _slots(nominal_s)
        tmpls = lay.cache.get("a2a_tmpl")
        if tmpls is None:
            tmpls = lay.cache["a2a_tmpl"] = np.asarray(
                [self._tmpl((int(OpType.ALL_TO_ALL), BF16, count * (12 + j) // 16, -1, slots, slots, slots))
                 for j in range(8)], dtype=np.int64)
        lvl = (self._u(nn) * 8).astype(np.int64) if load is None else np.rint(load * 16 - 12).astype(np.int64)
        self._record(lay, enter, exit_, start, dur, tmpls[lvl], special)
        fin = np.isfinite(exit_)
        self.last_exit[ranks[fin]] = exit_[fin]
        return exit_, (12 + lvl) / 16

    def _a2a_links(self, lay: _Layout, start: F64, dur: F64, nominal_s: float,
                   special: dict[str, npt.NDArray[Any]]) -> npt.NDArray[np.bool_] | None:
        """Apply the expert-group link faults to one all_to_all (``dur`` in place, per member): a slow
        link stretches its two ends' exchanges, a dead one (H3) leaves them inside the op with the
        sender's data piled up (RecvCount ahead of SendCount) and the receiver's RecvCount behind."""
        pos_of = lay.cache.get("pos")
        if pos_of is None:
            pos_of = lay.cache["pos"] = {r: i for i, r in enumerate(lay.ranks.tolist())}
        nn = lay.ranks.shape[0]
        hang: npt.NDArray[np.bool_] | None = None
        for f in self.link_faults:
            on = [(pos_of[s], pos_of[d]) for fam, s, d in f.links if fam == "ep" and s in pos_of and d in pos_of]
            on = [(a, b) for a, b in on if math.isfinite(start[a])]
            if not on:
                continue
            if f.kind == "H3":
                if f not in self.pending_h3:
                    continue
                on = [(a, b) for a, b in on if start[a] + dur[a] > f.onset_s]
                if not on:
                    continue
                self.pending_h3.remove(f)  # every link of the fault (a NIC's) that this op uses stops now
                fr = special.setdefault("freeze", np.ones(nn))
                for a, b in on:
                    self.stopped.append(("ep", int(lay.ranks[a]), int(lay.ranks[b])))
                    frac = (f.onset_s - start[a]) / dur[a] if start[a] < f.onset_s else self.rng.uniform(0.2, 0.8)
                    hang = np.zeros(nn, dtype=bool) if hang is None else hang
                    hang[a] = hang[b] = True
                    fr[a] = min(fr[a], frac)
                    fr[b] = min(fr[b], frac)
            else:
                on = [(a, b) for a, b in on if bool(f.active(np.asarray(start[a])))]
                stretched = np.zeros(nn, dtype=bool)
                for a, b in on:
                    stretched[a] = stretched[b] = True
                dur[stretched] /= f.bandwidth  # an end on two slow links is as slow as one (a NIC's)
            for a, b in on:
                sl_ = special.setdefault("send_lead", np.zeros(nn, np.int64))
                rl_ = special.setdefault("recv_lead", np.zeros(nn, np.int64))
                rl_[a] = IN_FLIGHT  # data came in but cannot leave
                sl_[b] = IN_FLIGHT  # it sends on, but receives behind
                special.setdefault("peak_lead", np.zeros(nn, np.int64))[a] = source_peak(_slots(nominal_s), f.bandwidth)
        return hang

    @staticmethod
    def _reorder(src_order: I64, dst_order: I64, values: F64) -> F64:
        lookup = np.empty(int(max(src_order.max(), dst_order.max())) + 1)
        lookup[src_order] = values
        return lookup[dst_order]

    def _step(self, step: int) -> None:
        topo, w, sc = self.topo, self.w, self.sc
        cycle = w.eval_every + w.eval_steps
        self.train = not (w.eval_every and step % cycle >= w.eval_every)
        ready = float(np.min(self.clock))
        for f in list(self.restarts):
            if ready >= f.onset_s:
                self.restarts.remove(f)
                self._restart(float(np.max(self.clock[np.isfinite(self.clock)], initial=ready)) + f.down_s)
                ready = float(np.min(self.clock))
        self.step_t0 = ready
        for f in list(self.recreates):
            if ready >= f.onset_s:
                self.recreates.remove(f)
                self._recreate(f.family)
        for ck in self.checkpoints:
            f, due = ck
            if ready >= due:
                self._barrier(f)
                ck[1] = due + f.every_s if f.every_s is not None else INF
        if w.pause_rate > 0:  # GC, data loader: one rank now and then starts its step late
            hit = self.rng.random(topo.n) < w.pause_rate
            self.clock = self.clock + np.where(hit, self.rng.uniform(0.0, w.pause_ms / 1000.0, topo.n), 0.0)
        step_factor = max(0.5, 1.0 + sc.jitter * float(self.rng.standard_normal()))
        progs = [self._program(p, self.train) for p in range(topo.pp)]
        at = [0] * topo.pp
        sent: dict[tuple[int, str, int], F64] = {}
        pp_s = w.pp_op_s(topo.tp * topo.pp <= sc.gpus_per_node)
        self.rs_exit[:] = -1.0
        m = w.microbatches
        while any(at[p] < len(progs[p]) for p in range(topo.pp)):
            moved = False
            for p in range(topo.pp):
                if at[p] >= len(progs[p]):
                    continue
                kind, i = progs[p][at[p]]
                src_p = p - 1 if kind == "F" else p + 1
                has_src = 0 <= src_p < topo.pp
                if has_src and (src_p, kind, i) not in sent:
                    continue
                stage = self._stages[p]
                if has_src:
                    src = stage - topo.tp if kind == "F" else stage + topo.tp
                    comm = topo.pps_comm[src] if kind == "F" else self.c.bwd_comm[src]
                    _, xd = self.p2p(src, stage, sent.pop((src_p, kind, i)), self.clock[stage], comm, pp_s,
                                     key=("pp", kind, p))
                    self.clock[stage] = xd
                self._pass(p, kind, i, step_factor, last_mb=(kind == "B" and i == m - 1))
                dst_p = p + 1 if kind == "F" else p - 1
                if 0 <= dst_p < topo.pp:
                    sent[(p, kind, i)] = self.clock[stage].copy()  # the send is issued; the sender goes on
                at[p] += 1
                moved = True
            if not moved:  # pragma: no cover - a schedule bug, not a runtime condition
                raise RuntimeError("1F1B schedule made no progress")
        if self.train and topo.dp > 1:
            for p in range(topo.pp):
                stage = self._stages[p]
                grid = stage.reshape(topo.dp, topo.tp)
                t = np.maximum(self.clock[stage], self.rs_exit[stage])  # wait for the gradient buckets
                order = grid.T.ravel()
                e = self._reorder(stage, order, t)
                e = self._chain(grid.T.copy(), topo.dp_comm, topo.dp_crank, e, [OpType.ALL_GATHER] * w.dp_buckets,
                                w.dp_op_s(topo.tp, topo.dp), int(w.grad_bytes(topo.tp) / 2 / w.dp_buckets),
                                family="dp", key=("dp", p))
                self.clock[stage] = self._reorder(order, stage, e)

    def _last_word(self, members: I64) -> None:
        """A clean exit (restart, communicator destroyed): the poller ships each member's final,
        idle state before it goes, so nothing looks stuck inside an op that did finish."""
        members = members[self.mi[members, _I_SEQ] >= 0]
        fin = self.clock[np.isfinite(self.clock)]
        if members.size == 0 or fin.size == 0:
            return
        t = min(float(fin.max()), self.sc.duration_s)
        self._states(members, np.full(members.shape[0], t))
        self._rows(members, np.full(members.shape[0], t))

    def _forget(self, members: I64) -> None:
        """Members with no op yet: no state records until their communicator's next op."""
        self.mi[members, _I_SEQ] = -1
        self.mf[members, _F_EXIT] = -INF
        self.m_exit[members] = -INF
        self.m_probewin[members] = -1
        self.m_sl[members], self.m_rl[members], self.m_fr[members] = 0, 0, 1.0
        for lay in self._layouts.values():
            lay.cache.clear()

    def _restart(self, at: float) -> None:
        """The job dies at a step boundary and comes back at ``at`` as a new incarnation."""
        n = self.topo.n
        self._last_word(np.arange(self.mi.shape[0]))
        self.inc += 1
        self._forget(np.arange(self.mi.shape[0]))
        self.cseq[:] = 0
        self.clock = at + self.rng.uniform(0.0, 0.05, n)
        self.last_exit[:] = -1.0
        self.next_inst[:] = math.ceil(at / self.dt)
        self.one_in[:] = 1
        self.all_one, self.measure = True, True

    def _recreate(self, family: str) -> None:
        """Every communicator of ``family`` is destroyed and created again: new hashes, sequences from 0."""
        cids = np.asarray([c for c, fam in enumerate(self.c.family) if fam == family], dtype=np.int64)
        if cids.size == 0:
            return
        for c in cids.tolist():
            sl = slice(int(self.c.off[c]), int(self.c.off[c] + self.sizes[c]))
            h = comm_hash_of(f"{family}-again-{self.inc}-{int(self.cseq[c])}", self.c.m_rank[sl])
            self._last_word(np.arange(sl.start, sl.stop))
            self.c.hashes[c] = h
            self.hash_arr[c] = h
            self._forget(np.arange(sl.start, sl.stop))
        self.cseq[cids] = 0

    def _barrier(self, f: Fault) -> None:
        topo = self.topo
        ranks = np.arange(topo.n, dtype=np.int64)
        enter = self.clock.copy()
        enter[f.writer_rank] += f.pause_s
        ex = self.coll(ranks[None, :], np.full(topo.n, topo.world_comm, dtype=np.int64), ranks, enter,
                       OpType.BARRIER, 0.005, 1, family="world", key=("world",))
        self.clock = ex.copy()

    def run(self, horizon_s: float | None = None) -> Iterator[tuple[float, KernelBatch]]:
        """Play the job; ``horizon_s`` stops the schedule early (to check which faults fire)."""
        sc = self.sc
        step = 0
        end = sc.duration_s if horizon_s is None else min(sc.duration_s, horizon_s)
        while float(np.min(self.clock)) <= end:
            self._step(step)
            self._drain()
            if self.measure:  # every rank measures its communicators' op rate and picks the stride
                el = max(float(np.min(self.clock)) - self.step_t0, 1e-6)
                self.one_in = np.asarray([detail_one_in(c / el, self.budget) for c in self.cseq.tolist()],
                                         dtype=np.int64)
                self.all_one = bool((self.one_in == 1).all())
                self.measure = False
                for lay in self._layouts.values():
                    lay.cache.clear()
            step += 1
            frontier = float(np.min(self.clock))
            self._states(np.arange(self.next_inst.shape[0]), np.full(self.next_inst.shape[0], frontier))
            yield from self._flush(frontier)
        n = self.next_inst.shape[0]
        self._states(np.arange(n), np.full(n, sc.duration_s + 1e-9))
        yield from self._flush(INF)

    def manifested(self) -> list[bool]:
        """Per fault of the scenario, whether it took effect in this run (after ``run``)."""
        return fired(self.sc.faults, lambda r: r in self.h1_fired, self.pending_h2, self.pending_h3)
