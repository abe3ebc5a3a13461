"""From phases to the kernel records a probe would emit, cut into per-communicator batches.

Time is cut into delivery windows of ``sample_interval_s``: what the probes sampled in
``[w0, w1)`` reaches the analyzer at ``w1 + DELIVERY_LATENCY_S``, one batch per communicator.
Per rank and operation: an op shorter than FINE_SAMPLE_S yields only its DONE record (enter
and exit both set); a longer one yields ENTERED, PROGRESS samples (every FINE_SAMPLE_S for its
first FINE_WINDOW_S, then every ``sample_interval_s``: heartbeats with frozen counters while it
hangs, until the end of the run) and DONE. Times are
nanoseconds on the rank's own clock: true time plus its host's skew plus a common epoch.
A DONE record says where the rank's previous op on any communicator ended (``t_prev_exit_ns``), as
the probe and the attachment do: its compute gap must not depend on which of a window's batches the
analyzer happens to read first.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ccld.probe.ring_plan import fold_columns, fold_peaks
from ccld.producers.simulator.engine import Phase, kernel_peaks
from ccld.producers.simulator.topology import Topology
from ccld.records import BATCH_COLUMNS, MAX_CHANNELS, KernelBatch, Status

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

DELIVERY_LATENCY_S = 0.1
#: The probe polls every 100 ms but ships a PROGRESS sample of an op only every FINE_SAMPLE_S
#: during its first FINE_WINDOW_S, then every ``sample_interval_s``: ops shorter than
#: FINE_SAMPLE_S (healthy ones) cost one DONE record, slow or stuck ones are well observed.
FINE_SAMPLE_S = 0.25
POLL_S = 0.1  # the poller's period: a shorter op is sampled once if a poll falls inside it
FINE_WINDOW_S = 2.0
EPOCH_NS = 1_750_000_000 * 1_000_000_000  # the clocks read like a 2025 wall clock


@dataclass(frozen=True)
class Emitter:
    """Cuts phases into delivery windows; holds what every window needs."""

    topo: Topology
    job: str
    channels: int
    interval_s: float
    duration_s: float
    skew_s: F64  # per host
    producer: str
    drift: F64 | None = None  # per host: its clock runs (1 + drift) times as fast
    seed: int = 0  # the scenario's: the kernels' peak backlog noise is drawn from its own stream
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rng", np.random.default_rng([self.seed, 3]))

    def ns(self, t: F64, ranks: I64) -> I64:
        """True seconds -> nanoseconds on each rank's own clock."""
        h = self.topo.host_of[ranks]
        rate = 1.0 if self.drift is None else 1.0 + self.drift[h]
        return EPOCH_NS + np.rint((t * rate + self.skew_s[h]) * 1e9).astype(np.int64)

    def window(self, ph: Phase, w0: float, w1: float, prev: F64) -> dict[str, npt.NDArray[Any]] | None:
        """Records of one phase sampled in ``[w0, w1)`` as columns (plus ``_comm``, ``_t``); ``prev``: per
        member, where its previous op ended (true seconds, NaN: none)."""
        e, x, dt = ph.enter, ph.exit, self.interval_s
        inside = e <= self.duration_s
        with np.errstate(invalid="ignore"):
            long_ = inside & ((x - e) >= min(FINE_SAMPLE_S, dt))
        idx: list[I64] = []
        status: list[int] = []
        times: list[F64] = []
        m = np.flatnonzero(long_ & (e >= w0) & (e < w1))
        if m.size:
            idx.append(m)
            status.append(int(Status.ENTERED))
            times.append(e[m])
        # PROGRESS: every FINE_SAMPLE_S for the first FINE_WINDOW_S of an op, then every interval
        cand = np.flatnonzero(long_ & (e < w1) & (x >= w0))
        if cand.size:
            ec, xc = e[cand], x[cand]
            fine = min(FINE_SAMPLE_S, dt)
            n_fine = int(round(FINE_WINDOW_S / fine))
            for step, base, limit in ((fine, ec, float(n_fine)), (dt, ec + n_fine * fine, math.inf)):
                kmin = np.maximum(1.0, np.ceil((w0 - base) / step))
                for j in range(int(math.ceil((w1 - w0) / step)) + 1):
                    k = kmin + j
                    s = base + k * step
                    ok = (k <= limit) & (s >= w0) & (s < w1) & (s < xc) & (s <= self.duration_s)
                    m = cand[ok]
                    if m.size:
                        idx.append(m)
                        status.append(int(Status.PROGRESS))
                        times.append(s[ok])
        # the first poll (every POLL_S) after the data started moving catches the op in flight with
        # its live counters: the only sample of a short op, and for a long one (whose coarse samples
        # may all fall before the last member arrived) the one that shows where a backlog builds
        run = np.flatnonzero(inside & (e < w1) & (x >= w0) & (ph.start < w1))
        if run.size:
            s = np.ceil(np.maximum(ph.start[run], e[run]) / POLL_S + 1e-9) * POLL_S
            ok = (s >= w0) & (s < x[run]) & (s < w1) & (s <= self.duration_s)
            if ok.any():
                idx.append(run[ok])
                status.append(int(Status.PROGRESS))
                times.append(s[ok])
        m = np.flatnonzero(inside & (x >= w0) & (x < w1) & (x <= self.duration_s))
        if m.size:
            idx.append(m)
            status.append(int(Status.DONE))
            times.append(x[m])
        if not idx:
            return None
        i = np.concatenate(idx)
        t = np.concatenate(times)
        st = np.concatenate([np.full(a.size, s, dtype=np.int64) for a, s in zip(idx, status, strict=True)])
        ranks = ph.ranks[i]
        # counters: a common level L, plus the backlog pattern around a slow or dead link
        with np.errstate(invalid="ignore"):
            frac = np.clip((t - ph.start[i]) / ph.dur[i], 0.0, 1.0)
        frac = np.where(np.isfinite(frac), frac, 0.0)
        frac = np.minimum(frac, ph.freeze[i])
        started = t > ph.start[i]  # data moves once the last member is in
        level = np.floor(frac * ph.slots[i]).astype(np.int64)
        send = np.where(started, np.minimum(ph.s_send[i], level + ph.send_lead[i]), 0)
        recv = np.where(started, np.minimum(ph.s_recv[i], level + ph.recv_lead[i]), 0)
        done = st == int(Status.DONE)
        # DONE carries the peak backlog each kernel kept per channel (probe v2); other rows: unknown
        peak = np.full((i.size, min(self.channels, MAX_CHANNELS)), -1, dtype=np.int64)
        if done.any():
            d = np.flatnonzero(done)
            dr = i[d]
            peak[d] = fold_peaks(kernel_peaks(self.rng, ph.peak_lead[dr], self.channels, ph.s_send[dr], ph.s_recv[dr]),
                                 MAX_CHANNELS)
        return {
            "_comm": ph.comm[i],
            "_t": t,
            "op_seq": np.full(i.size, ph.op_seq, dtype=np.int64),
            "op_type": ph.op_type[i],
            "dtype": ph.dtype[i],
            "count": ph.count[i],
            "peer": ph.peer[i],
            "rank": ranks,
            "comm_rank": ph.crank[i],
            "comm_size": ph.csize[i],
            "status": st,
            "host_idx": ph.lhost[i],
            "t_enter_ns": self.ns(e[i], ranks),
            "t_exit_ns": np.where(done, self.ns(np.where(done, x[i], 0.0), ranks), -1),
            "t_sample_ns": self.ns(t, ranks),
            "t_prev_exit_ns": np.where(done & np.isfinite(prev[i]), self.ns(np.nan_to_num(prev[i]), ranks), -1),
            "_send": send,
            "_recv": recv,
            "_peak": peak,
        }

    def batches(self, parts: list[dict[str, npt.NDArray[Any]]], seq0: int) -> list[KernelBatch]:
        """One batch per communicator from the records of one window, rows in sample-time order."""
        cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        order = np.lexsort((cols["_t"], cols["_comm"]))
        cols = {k: v[order] for k, v in cols.items()}
        comm = cols["_comm"]
        cuts = np.flatnonzero(np.diff(comm)) + 1
        bounds = np.concatenate([[0], cuts, [comm.size]]).tolist()
        c = self.channels
        # every hardware channel moves the same share; more than 8 fold onto the frame's 8 as on a GPU
        send2 = fold_columns(np.repeat(cols["_send"][:, None], c, axis=1), MAX_CHANNELS)
        recv2 = fold_columns(np.repeat(cols["_recv"][:, None], c, axis=1), MAX_CHANNELS)
        out: list[KernelBatch] = []
        topo = self.topo
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            cid = int(comm[a])
            out.append(
                KernelBatch(
                    job=self.job,
                    incarnation=0,
                    comm_hash=topo.comm_hash[cid],
                    world_size=topo.n,
                    hosts=topo.comm_hosts[cid],
                    columns={name: cols[name][a:b] for name in (*BATCH_COLUMNS, "t_prev_exit_ns")},
                    send=send2[a:b],
                    recv=recv2[a:b],
                    producer=self.producer,
                    batch_seq=seq0 + len(out),
                    peak_lag=cols["_peak"][a:b],
                )
            )
        return out


def previous_exits(phases: list[Phase]) -> list[F64]:
    """Per phase and member: the latest end of the same rank's ops (any phase) at or before its entry
    (true seconds; NaN for a rank's first op). What the probe's ``ExitLog`` keeps, for every op at once."""
    if not phases:
        return []
    ranks = np.concatenate([ph.ranks for ph in phases])
    enter = np.concatenate([ph.enter for ph in phases])
    ex = np.concatenate([ph.exit for ph in phases])
    ok = np.isfinite(ex)
    both = np.concatenate([ex, enter])
    # integer keys (rank, time in ns) searched at once: exact, whatever the job's length
    span = int(np.rint(both[np.isfinite(both)].max(initial=0.0) * 1e9)) + 2
    xr, xn = ranks[ok], np.rint(ex[ok] * 1e9).astype(np.int64)
    keys = xr * span + xn
    o = np.argsort(keys, kind="stable")
    keys, xs = keys[o], ex[ok][o]
    if not keys.size:
        return [np.full(ph.ranks.size, np.nan) for ph in phases]
    q_ok = np.isfinite(enter)
    q = ranks * span + np.rint(np.where(q_ok, enter, -1.0) * 1e9).astype(np.int64)
    j = np.searchsorted(keys, q, side="right") - 1
    found = q_ok & (j >= 0)
    jj = np.maximum(j, 0)
    found &= keys[jj] // span == ranks  # the same rank's
    prev = np.where(found, xs[jj], np.nan)  # the exit's own value: the same nanoseconds on the rank's clock
    return np.split(prev, np.cumsum([ph.ranks.size for ph in phases])[:-1])


def emit(
    phases: list[Phase], topo: Topology, *, job: str, channels: int, interval_s: float, duration_s: float,
    skew_s: F64, producer: str, drift: F64 | None = None, seed: int = 0,
) -> Iterator[tuple[float, KernelBatch]]:
    """Yield ``(delivery time, batch)`` in non-decreasing time order."""
    em = Emitter(topo, job, channels, interval_s, duration_s, skew_s, producer, drift, seed)
    spans = []
    for ph, prev in zip(phases, previous_exits(phases), strict=True):
        inside = ph.enter <= duration_s
        if not inside.any():
            continue
        lo = float(ph.enter[inside].min())
        hi = float(np.minimum(ph.exit[inside], duration_s).max())
        spans.append((lo, hi, ph, prev))
    spans.sort(key=lambda s: s[0])
    active: list[tuple[float, float, Phase, F64]] = []
    nxt = 0
    seq = 0
    n_windows = int(math.ceil(duration_s / interval_s))
    for w in range(n_windows):
        w0 = w * interval_s
        last = w == n_windows - 1
        w1 = duration_s + 1e-9 if last else (w + 1) * interval_s
        while nxt < len(spans) and spans[nxt][0] < w1:
            active.append(spans[nxt])
            nxt += 1
        active = [s for s in active if s[1] >= w0]
        parts = [p for s in active if (p := em.window(s[2], w0, w1, s[3])) is not None]
        if not parts:
            continue
        for batch in em.batches(parts, seq):
            seq += 1
            yield min(w1, duration_s) + DELIVERY_LATENCY_S, batch
