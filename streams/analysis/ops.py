"""Per-operation aggregation: per-rank kernel times and backlog folded into one row per op.

Rows of all communicators of a job are folded at once (sort + reduceat), and an op leaves the
table when every member reported its DONE record (or after a timeout with most of them). The
result is one vector per statistic over the completed ops, so the slow detector never loops
over ranks in Python.

Backlog (RecvCount - SendCount on a rank: it receives faster than it can forward, so the link it
sends on is slow) comes from two places: PROGRESS samples a poll took while the op was in flight,
and the per-kernel peak a DONE record carries (probe v2: the kernel kept, per channel, the largest
backlog it had). A healthy ring rank normally receives a step or two ahead of forwarding, so a peak
counts only where it stands out from the communicator's learned healthy peak level
(``peak_threshold``); the rows that do not stand out teach that level.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from ccld.records import OpType
from ccld.streams.analysis.settings import AnalyzerSettings
from ccld.streams.analysis.state import DONE, PROGRESS, JobState, Rows, sig_code

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

_INF = np.inf
#: ring collectives: every rank receives and forwards, so a peak RecvCount - SendCount means data came in
#: faster than it could leave (a p2p RECV receives everything and forwards nothing: its peak says nothing)
FORWARDING_OPS = np.array([int(OpType.ALL_REDUCE), int(OpType.ALL_GATHER), int(OpType.REDUCE_SCATTER)])


@dataclass
class OpRows:
    """Per-op aggregates (one entry per op); used both for the open table and completed ops."""

    key: I64  # cid << 32 | seq
    cid: I64
    seq: I64
    sig: I64  # packed signature (send/recv folded)
    op_type: I64
    cnt: I64  # DONE records counted
    tmin: F64  # shortest kernel time on a rank's own clock (s)
    late: I64  # comm rank with the shortest kernel time: the last to arrive
    terr: F64  # how far tmin may be off (s): its row's exit uncertainty, within [0, tmin] (0: timed exactly)
    tmax: F64
    lag: F64  # largest RecvCount - SendCount seen in a PROGRESS sample or a standing-out DONE peak (-inf: none)
    lagr: I64  # comm rank where that backlog was seen
    first_now: F64  # analyzer time the op was first seen
    late_gap: F64  # the late arriver's time outside collectives before this op (own clock, s)
    gap_sum: F64  # the same summed over all ranks that reported
    t0: F64  # comm rank 0's entry on its own clock (s; nan: it has not reported): the op's cadence on one clock

    @property
    def n(self) -> int:
        return int(self.key.shape[0])

    def take(self, m: npt.NDArray[np.bool_] | I64) -> OpRows:
        return OpRows(**{f.name: getattr(self, f.name)[m] for f in fields(self)})

    @classmethod
    def empty(cls) -> OpRows:
        z = np.zeros(0, dtype=np.int64)
        f = np.zeros(0)
        return cls(z, z, z, z, z, z, f, z, f, f, f, z, f, f, f, f)

    @classmethod
    def concat(cls, parts: list[OpRows]) -> OpRows:
        return cls(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)})


def peak_threshold(level: F64, s: AnalyzerSettings) -> F64:
    """The peak (counter units) a channel must exceed to count as a slow link's backlog, given the
    communicator's learned healthy peak ``level``."""
    return level + np.maximum(s.peak_margin, s.peak_margin_ratio * level)


def done_peaks(js: JobState, r: Rows, di: I64, s: AnalyzerSettings) -> tuple[F64, F64]:
    """The standing-out part of the DONE rows ``di``'s per-kernel peaks, and learn the healthy level.

    Returns ``(per_channel, per_row)``: per channel the peak where it exceeds ``peak_threshold`` of
    its communicator's learned level (else 0), and per row their sum (-inf where nothing stands out).
    Only ring collectives (``FORWARDING_OPS``) count and teach.
    Nothing counts before a communicator has learned ``peak_learn_rows`` rows; rows with no channel
    standing out teach their member's level (an exponential average of each row's largest channel
    peak, a plain mean over the first ``1 / peak_learn_rate`` rows), so a lasting slow link never
    becomes the norm. The communicator's level is the lower median of its members' levels: a link
    slow from the first op keeps its source's peaks high while the communicator learns, and a level
    averaged over every row would take them in (a pair whose one link ran at half speed from its
    start: peaks of 8 against the other member's 2 learned as a level of 5, which 8 never passed);
    the lower median is a healthy member's as long as most members are healthy (a pair: the lower
    one). Rows without a known peak (older probes, sources without counters) change nothing.
    """
    nd = di.size
    per_row = np.full(nd, -_INF)
    per_ch = np.zeros((nd, r.peak.shape[1]))
    if nd == 0:
        return per_ch, per_row
    pk = r.peak[di]
    known = (pk >= 0).any(axis=1) & np.isin(r.op_type[di], FORWARDING_OPS)
    if not known.any():
        return per_ch, per_row
    ki = np.flatnonzero(known)
    pkk = pk[ki].astype(np.float64)
    cid = r.cid[di][ki]
    ready = js.c_pk_rows[cid] >= s.peak_learn_rows
    thr = peak_threshold(js.c_pk_level[cid], s)
    over = ready[:, None] & (pkk > thr[:, None])
    hit = over.any(axis=1)
    if hit.any():
        per_ch[ki] = np.where(over, pkk, 0.0)
        per_row[ki[hit]] = per_ch[ki[hit]].sum(axis=1)
    learn = ~hit
    if learn.any():
        gi = r.gi[di][ki][learn]
        rowmax = np.maximum(pkk[learn].max(axis=1), 0.0)
        g, inv = np.unique(gi, return_inverse=True)
        k = np.bincount(inv).astype(np.float64)
        mean = np.bincount(inv, weights=rowmax) / k
        n_old = js.m_pk_rows[g].astype(np.float64)
        w = np.maximum(1.0 - (1.0 - s.peak_learn_rate) ** k, k / (n_old + k))
        js.m_pk_level[g] += w * (mean - js.m_pk_level[g])
        js.m_pk_rows[g] += k.astype(np.int64)
        u = np.unique(js.m_cid[g])
        np.add.at(js.c_pk_rows, js.m_cid[g], k.astype(np.int64))
        js.c_pk_level[u] = _lower_median_level(js, u)
    return per_ch, per_row


def _lower_median_level(js: JobState, u: I64) -> F64:
    """Per communicator of ``u``: the lower median of its members' learned peak levels (members that learned
    no row yet left out; 0 where none did). One sorted block per communicator size (a job has a few: its
    tensor groups, pipeline pairs, data-parallel rings), so a tick's many small groups never pad to its
    largest ring."""
    out = np.zeros(u.size)
    size = js.c_size[u]
    for w in np.unique(size).tolist():
        k = np.flatnonzero(size == w)
        gi = js.c_off[u[k]][:, None] + np.arange(w)[None, :]
        known = js.m_pk_rows[gi] > 0
        lv = np.sort(np.where(known, js.m_pk_level[gi], np.inf), axis=1)
        n = known.sum(axis=1)
        out[k] = np.where(n > 0, lv[np.arange(k.size), np.maximum(n - 1, 0) // 2], 0.0)
    return out


class OpTable:
    """Ops still waiting for some DONE records."""

    def __init__(self, settings: AnalyzerSettings | None = None) -> None:
        self.open = OpRows.empty()
        self.s = settings if settings is not None else AnalyzerSettings()

    def add(self, js: JobState, r: Rows) -> int:
        """Fold one tick's rows into the open ops; returns the number of DONE records counted."""
        d = (r.status == DONE) & (r.t_enter >= 0) & (r.t_exit >= r.t_enter) & (r.seq > js.m_last_done[r.gi])
        di = np.flatnonzero(d)
        if di.size > 1:  # one DONE per (member, op): a duplicate inside the tick counts once
            k = r.gi[di] << 32 | (r.seq[di] & 0xFFFF_FFFF)
            _, first = np.unique(k, return_index=True)
            di = di[first]  # now sorted by (member, op sequence)
        if di.size:
            g = r.gi[di]
            last = np.empty(g.shape[0], dtype=bool)
            last[-1] = True
            np.not_equal(g[1:], g[:-1], out=last[:-1])
            js.m_last_done[g[last]] = np.maximum(js.m_last_done[g[last]], r.seq[di][last])
        pi = np.flatnonzero(r.status == PROGRESS)
        lagc = r.recv[pi] - r.send[pi]
        pos = lagc > 0
        if pos.any():  # backlog is rare (a slow or dead link): accumulate only where there is some
            rows_pos = pos.any(axis=1)
            np.add.at(js.m_lagch, r.gi[pi][rows_pos], np.where(pos[rows_pos], lagc[rows_pos], 0))
        short = lagc.sum(axis=1)
        neg = short < 0
        if neg.any():  # and where data is missing: the other end of a slow link
            np.add.at(js.m_deficit, r.gi[pi][neg], -short[neg])
        # the kernels' own peak backlog, reported with DONE: seen even in ops no poll caught in flight
        pk_ch, pk_row = done_peaks(js, r, di, self.s)
        pk_hit = np.isfinite(pk_row)
        if pk_hit.any():
            np.add.at(js.m_lagch, r.gi[di][pk_hit], pk_ch[pk_hit])
        sig = sig_code(r.op_type, r.dtype, r.count, r.peer)
        dur = (r.t_exit[di] - r.t_enter[di]) * 1e-9
        err = np.clip(r.t_exit_err[di] * 1e-9, 0.0, dur)
        gap = js.gaps(r.rank[di], r.t_enter[di], r.t_exit[di], r.t_prev[di])
        nd, npr = di.size, pi.size
        if nd + npr == 0:
            return 0
        rows = np.concatenate([di, pi])
        contrib = OpRows(
            key=r.cid[rows] << 32 | (r.seq[rows] & 0xFFFF_FFFF),
            cid=r.cid[rows],
            seq=r.seq[rows],
            sig=sig[rows],
            op_type=r.op_type[rows],
            cnt=np.concatenate([np.ones(nd, dtype=np.int64), np.zeros(npr, dtype=np.int64)]),
            tmin=np.concatenate([dur, np.full(npr, _INF)]),
            late=np.concatenate([r.crank[di], np.full(npr, -1, dtype=np.int64)]),
            terr=np.concatenate([err, np.zeros(npr)]),
            tmax=np.concatenate([dur, np.full(npr, -_INF)]),
            lag=np.concatenate([pk_row, lagc.sum(axis=1).astype(np.float64)]),
            lagr=np.concatenate([np.where(pk_hit, r.crank[di], -1), r.crank[pi]]),
            first_now=r.now[rows],
            late_gap=np.concatenate([gap, np.zeros(npr)]),
            gap_sum=np.concatenate([gap, np.zeros(npr)]),
            t0=np.concatenate([np.where(r.crank[di] == 0, r.t_enter[di] * 1e-9, np.nan), np.full(npr, np.nan)]),
        )
        self.open = _fold(OpRows.concat([self.open, contrib]))
        return nd

    def take_completed(self, js: JobState, now: float, timeout_s: float) -> OpRows:
        """Remove and return the ops that every member finished (or that timed out with most)."""
        o = self.open
        if o.n == 0:
            return o
        size = js.c_size[o.cid]
        complete = o.cnt >= size
        late = (now - o.first_now) >= timeout_s
        leave = complete | late
        if not leave.any():
            return OpRows.empty()
        keep_done = complete | (late & (o.cnt * 2 >= size) & (o.cnt >= 2))
        out = o.take(leave & keep_done)
        self.open = o.take(~leave)
        return out


def _fold(a: OpRows) -> OpRows:
    """Merge rows with the same op key (min/max/argmin/argmax per op)."""
    if a.n <= 1:
        return a
    order = np.lexsort((a.tmin, a.key))  # per op, the shortest kernel time first
    skey = a.key[order]
    start = np.flatnonzero(np.concatenate([[True], skey[1:] != skey[:-1]]))
    # key, cid, seq, sig, op_type, tmin, late, terr, late_gap of the first row of each op: gathered for
    # those rows only (a gather of every field of every row was a third of the fold)
    out = a.take(order[start])
    out.cnt = np.add.reduceat(a.cnt[order], start)
    out.tmax = np.maximum.reduceat(a.tmax[order], start)
    out.first_now = np.minimum.reduceat(a.first_now[order], start)
    out.gap_sum = np.add.reduceat(a.gap_sum[order], start)
    out.t0 = np.fmin.reduceat(a.t0[order], start)
    # the largest backlog and where it was seen (PROGRESS samples and standing-out DONE peaks carry one)
    slag = a.lag[order]
    out.lag = np.maximum.reduceat(slag, start)
    has = np.isfinite(slag)
    if has.any():
        grp = np.repeat(np.arange(start.shape[0]), np.diff(np.append(start, a.n)))
        hi = has & (slag == out.lag[grp])
        out.lagr = np.full(out.n, -1, dtype=np.int64)
        out.lagr[grp[hi][::-1]] = a.lagr[order][hi][::-1]  # the first such row of each op wins
    return out
