"""Per-job operation tracking over all communicators at once: who is in which op, counters.

One ``JobState`` holds every communicator of one job incarnation as a slice of flat "member"
arrays (one entry per (communicator, comm rank)), so a whole tick of batches is applied with a
few numpy passes whatever the number of communicators. Updates are idempotent: replaying the
same records changes nothing. Times are of two kinds that are never mixed: ``*_ns`` on the
reporting rank's own clock (only differences on one rank are used) and ``*_now`` on the
analyzer's clock.

Array names say what one entry is, by prefix:

- ``m_``: one per member, i.e. per (communicator, comm rank); a communicator's members are the
  slice ``c_off[cid] : c_off[cid] + c_size[cid]``;
- ``c_``: one per communicator (``cid``, the job's dense communicator index);
- ``g_``: one per global rank of the job.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from ccld.records import COMM_COLUMN, MAX_CHANNELS, VARIABLE_SIZE_OPS, KernelBatch, OpType, Status

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
BOOL = npt.NDArray[np.bool_]

DONE = int(Status.DONE)
PROGRESS = int(Status.PROGRESS)
IDLE = int(Status.IDLE)
P2P_OPS = (int(OpType.SEND), int(OpType.RECV))
#: CPU stall (PSI) samples kept per rank (one a state interval, 1 s by default: about a minute)
CPU_SAMPLES = 64
#: a CPU wait sample arrives with its rank's next batch, up to this long after the ops it covers
CPU_LATE_S = 2.0
SIG_FIELDS = ("op_type", "dtype", "count", "peer")


def sig_code(op_type: I64, dtype: I64, count: I64, peer: I64) -> I64:
    """Pack an op signature into one int64 (send and recv share one code: a p2p transfer).

    A variable-size collective's count is left out (as Flight Recorder's own analysis leaves it out of
    its size check): ranks that send different amounts in one all_to_all called the same op (no H2),
    and its steps share one baseline instead of one per routing draw (which never fills)."""
    p2p = (op_type == P2P_OPS[0]) | (op_type == P2P_OPS[1])
    op = np.where(p2p, P2P_OPS[0], op_type)
    pe = np.where(p2p, 0, peer + 1) & 0xFFFF
    cnt = np.where(np.isin(op_type, VARIABLE_SIZE_OPS), 0, count)
    return (op & 0xF) << 60 | (dtype & 0xF) << 56 | pe << 40 | (cnt & ((1 << 40) - 1))


@dataclass
class Rows:
    """One tick's records of a job, concatenated column-wise, with member index and arrival time."""

    gi: I64  # member index (communicator slice offset + comm rank)
    cid: I64  # communicator id inside the job
    now: F64  # analyzer time the row's batch arrived
    seq: I64
    status: I64
    op_type: I64
    dtype: I64
    count: I64
    peer: I64
    rank: I64
    crank: I64
    host: I64  # job-level host id
    t_enter: I64
    t_exit: I64
    t_sample: I64
    t_prev: I64  # end of the rank's previous op on any communicator, when the source says (-1: unknown)
    t_exit_err: I64  # the exit happened within +/- this of t_exit (ns; 0: timed exactly, and older writers)
    send: I64  # (n, MAX_CHANNELS)
    recv: I64
    peak: I64  # (n, MAX_CHANNELS): the kernel's own peak RecvCount - SendCount per channel (DONE, probe v2); -1 unknown

    @property
    def n(self) -> int:
        return int(self.gi.shape[0])


A = TypeVar("A", bound=npt.NDArray[Any])


def _grow(a: A, extra: int, fill: float | int | bool) -> A:
    """``a`` with ``extra`` more rows filled with ``fill``."""
    pad = [(0, extra)] + [(0, 0)] * (a.ndim - 1)
    return cast(A, np.pad(a, pad, constant_values=fill))


class JobState:
    """Every communicator of one (job, incarnation)."""

    MEMBER_FIELDS: dict[str, tuple[type, float | int | bool]] = {
        "m_cid": (np.int64, -1),
        "m_crank": (np.int64, -1),
        "m_grank": (np.int64, -1),
        "m_host": (np.int64, -1),
        "m_seq": (np.int64, -1),
        "m_done": (np.bool_, False),
        "m_op": (np.int64, 0),
        "m_dtype": (np.int64, 0),
        "m_count": (np.int64, 0),
        "m_peer": (np.int64, -1),
        "m_t_enter": (np.int64, -1),
        "m_t_sample": (np.int64, -1),
        "m_t_change": (np.int64, -1),
        "m_seen_now": (np.float64, -1.0),
        "m_last_done": (np.int64, -1),
        # what in-flight samples saw the member receive behind what it sent (SendCount - RecvCount, summed
        # over channels and samples): the receiving end of a slow link (an all_to_all's, see SlowDetector)
        "m_deficit": (np.float64, 0.0),
        # the healthy level of the member's own per-kernel peak backlog (DONE rows that did not stand out;
        # see ``c_pk_level``) and its rows learned
        "m_pk_level": (np.float64, 0.0),
        "m_pk_rows": (np.int64, 0),
    }
    COMM_FIELDS: dict[str, tuple[type, float | int | bool]] = {
        "c_off": (np.int64, 0),
        "c_size": (np.int64, 0),
        "c_progress_now": (np.float64, -1.0),
        "c_inside": (np.int64, 0),
        "c_maxop_s": (np.float64, 0.0),
        "c_longop_s": (np.float64, 0.0),  # the longest op it completed, slow ones too (waiting included)
        "c_counters": (np.bool_, False),  # some record of this communicator carried channel counters
        "c_first_now": (np.float64, np.inf),  # analyzer time the communicator was first seen
        # the healthy level of the per-kernel peak backlog DONE records carry: the lower median of its
        # members' levels (``m_pk_level``: an exponential average of each of its rows' largest channel peak,
        # learned from rows that do not stand out), and rows learned
        "c_pk_level": (np.float64, 0.0),
        "c_pk_rows": (np.int64, 0),
    }

    def __init__(self, job: str, incarnation: int) -> None:
        self.job = job
        self.incarnation = incarnation
        self.comm_index: dict[int, int] = {}
        # comm_hashes sorted, and their indices (_sorted_comms)
        self._by_hash: tuple[I64, I64] = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self.comm_hashes: list[int] = []
        self.host_names: list[str] = []
        self.host_ids: dict[str, int] = {}
        self._host_maps: dict[tuple[str, ...], I64] = {}
        self._host_by_id: dict[int, tuple[tuple[str, ...], I64]] = {}
        # (now, communicator index, or one per row for a batch of several communicators, batch)
        self.pending: list[tuple[float, int | I64, KernelBatch]] = []
        self._new_sizes: dict[int, int] = {}  # comm id -> size of a comm that needs (re)allocation
        self.n_members = 0
        for name, (dt, fill) in self.MEMBER_FIELDS.items():
            setattr(self, name, np.full(0, fill, dtype=dt))
        self.m_send = np.zeros((0, MAX_CHANNELS), dtype=np.int64)
        self.m_recv = np.zeros((0, MAX_CHANNELS), dtype=np.int64)
        self.m_lagch = np.zeros((0, MAX_CHANNELS))
        for name, (dt, fill) in self.COMM_FIELDS.items():
            setattr(self, name, np.full(0, fill, dtype=dt))
        self.last_now = 0.0
        # the job's world size as its producers say it, kept only by an analyzer that sees whole jobs (0: unknown;
        # a shard of a job sees some of its communicators, and its unseen ranks are not the job's)
        self.world = 0
        self.g_last_exit = np.full(0, -1, dtype=np.int64)  # per global rank: end of its latest op (own clock)
        # global rank -> its CPU samples (analyzer time the batch came, stalled ns, not stalled ns)
        self.cpu_wait: dict[int, deque[tuple[float, int, int]]] = {}

    # typed views of the dynamic arrays (mypy sees these names)
    m_cid: I64
    m_crank: I64
    m_grank: I64
    m_host: I64
    m_seq: I64
    m_done: BOOL
    m_op: I64
    m_dtype: I64
    m_count: I64
    m_peer: I64
    m_t_enter: I64
    m_t_sample: I64
    m_t_change: I64
    m_seen_now: F64
    m_last_done: I64
    m_deficit: F64
    m_pk_level: F64
    m_pk_rows: I64
    c_off: I64
    c_size: I64
    c_progress_now: F64
    c_inside: I64
    c_maxop_s: F64
    c_longop_s: F64
    c_counters: BOOL
    c_first_now: F64
    c_pk_level: F64
    c_pk_rows: I64

    @property
    def n_comms(self) -> int:
        return len(self.comm_hashes)

    def note_cpu(self, samples: tuple[tuple[int, int, int], ...], now: float) -> None:
        """A batch's CPU stall samples (``KernelBatch.cpu_wait``), kept for the last few minutes."""
        for rank, wait_ns, span_ns in samples:
            dq = self.cpu_wait.get(rank)
            if dq is None:
                dq = self.cpu_wait[rank] = deque(maxlen=CPU_SAMPLES)
            dq.append((now, wait_ns, span_ns))

    def cpu_wait_share(self, ranks: Iterable[int], t0: float, t1: float) -> float | None:
        """The median over ``ranks`` of how starved of CPUs each was between analyzer times ``t0`` and
        ``t1``: its host's stalled / wall time (PSI), from its samples that arrived then and up to
        ``CPU_LATE_S`` after (a sample describes the interval before its batch left); None when fewer
        than half of them were measured then (an unmeasured rank is unknown, not idle)."""
        shares = []
        ranks = list(ranks)
        for r in ranks:
            dq = self.cpu_wait.get(int(r))
            if not dq:
                continue
            wait = run = 0
            for now, w, r_ns in dq:
                if t0 <= now <= t1 + CPU_LATE_S:
                    wait += w
                    run += r_ns
            if wait + run:
                shares.append(wait / (wait + run))
        return float(np.median(shares)) if shares and 2 * len(shares) >= len(ranks) else None

    # -- ingest: cheap, only queues the batch --------------------------------------------------
    def queue(self, batch: KernelBatch, now: float) -> None:
        c = batch.columns
        if batch.one_comm:
            cid: int | I64 = self._comm(batch.comm_hash, c["comm_size"], c["comm_rank"])
        else:  # a producer's flush of several communicators: a communicator index per row
            cid = self._comm_column(c)
        self.pending.append((now, cid, batch))
        if now > self.last_now:
            self.last_now = now

    def _comm_column(self, c: Mapping[str, I64]) -> I64:
        """The communicator index of every row of a batch of several communicators.

        One sorted search for all rows (np.unique per batch was a third of queueing a host's batch, a
        dict lookup per row more); only a new communicator needs its rows' sizes.
        """
        col = c[COMM_COLUMN]
        keys, cids = self._sorted_comms()
        pos = np.searchsorted(keys, col)
        known = pos < keys.shape[0]
        known[known] = keys[pos[known]] == col[known]
        if not known.all():
            for h in np.unique(col[~known]).tolist():
                rows = col == h
                self._comm(h, c["comm_size"][rows], c["comm_rank"][rows])
            keys, cids = self._sorted_comms()
            pos = np.searchsorted(keys, col)
        return cids[pos]

    def _sorted_comms(self) -> tuple[I64, I64]:
        """The known communicators' hashes, sorted, and their indices (the new ones merged in)."""
        keys, cids = self._by_hash
        n_old, n = keys.shape[0], len(self.comm_hashes)
        if n_old != n:
            h = np.asarray(self.comm_hashes[n_old:], dtype=np.int64)
            o = np.argsort(h, kind="stable")
            at = np.searchsorted(keys, h[o])
            self._by_hash = keys, cids = np.insert(keys, at, h[o]), np.insert(cids, at, n_old + o)
        return keys, cids

    def _comm(self, comm_hash: int, size: I64, crank: I64) -> int:
        """The index of a communicator, registered (its member slice allocated later) when new."""
        cid = self.comm_index.get(comm_hash)
        if cid is None:
            cid = len(self.comm_hashes)
            self.comm_index[comm_hash] = cid
            self.comm_hashes.append(comm_hash)
            self._new_sizes[cid] = max(int(size.max()), int(crank.max()) + 1)
        return cid

    def restore_comm(self, comm_hash: int, size: int) -> int:
        """Register a communicator of ``size`` members and allocate its slice now (rows restored from a
        snapshot are written into it); a communicator already known raises ValueError."""
        if size <= 0 or comm_hash in self.comm_index:
            raise ValueError(f"communicator {comm_hash:#x} of size {size} is bad or known already")
        cid = self.comm_index[comm_hash] = len(self.comm_hashes)
        self.comm_hashes.append(comm_hash)
        self._new_sizes[cid] = size
        self._allocate()
        return cid

    def host_ids_of(self, hosts: tuple[str, ...]) -> I64:
        """The job-level host ids of ``hosts`` (registering new names)."""
        return self._host_map(hosts)

    def _allocate(self) -> None:
        """Give new (or grown) communicators their member slices, in one pass."""
        if not self._new_sizes:
            return
        n_old = self.c_size.shape[0]
        extra_c = self.n_comms - n_old
        if extra_c > 0:
            for name, (_dt, fill) in self.COMM_FIELDS.items():
                setattr(self, name, _grow(getattr(self, name), extra_c, fill))
        total = sum(self._new_sizes.values())
        base = self.n_members
        for name, (_dt, fill) in self.MEMBER_FIELDS.items():
            setattr(self, name, _grow(getattr(self, name), total, fill))
        self.m_send = _grow(self.m_send, total, 0)
        self.m_recv = _grow(self.m_recv, total, 0)
        self.m_lagch = _grow(self.m_lagch, total, 0.0)
        off = base
        for cid, size in sorted(self._new_sizes.items()):
            if cid < n_old and self.c_size[cid] > 0:  # grown: copy the old slice, retire it
                o, s = int(self.c_off[cid]), int(self.c_size[cid])
                for name in self.MEMBER_FIELDS:
                    arr = getattr(self, name)
                    arr[off : off + s] = arr[o : o + s]
                for arr2 in (self.m_send, self.m_recv, self.m_lagch):
                    arr2[off : off + s] = arr2[o : o + s]
                self.m_cid[o : o + s] = -1
            self.c_off[cid] = off
            self.c_size[cid] = size
            self.m_cid[off : off + size] = cid
            self.m_crank[off : off + size] = np.arange(size)
            off += size
        self.n_members = off
        self._new_sizes.clear()

    def _host_map(self, hosts: tuple[str, ...]) -> I64:
        # producers reuse one hosts tuple per communicator: an identity hit avoids hashing it
        hit = self._host_by_id.get(id(hosts))
        if hit is not None and hit[0] is hosts:
            return hit[1]
        m = self._host_maps.get(hosts)
        if m is None:
            ids = []
            for h in hosts:
                i = self.host_ids.get(h)
                if i is None:
                    i = len(self.host_names)
                    self.host_ids[h] = i
                    self.host_names.append(h)
                ids.append(i)
            m = np.asarray(ids, dtype=np.int64)
            self._host_maps[hosts] = m
        if len(self._host_by_id) > 65536:
            self._host_by_id.clear()
        self._host_by_id[id(hosts)] = (hosts, m)
        return m

    def take_rows(self) -> Rows | None:
        """Concatenate the queued batches into one ``Rows`` (allocating new communicators)."""
        if not self.pending:
            return None
        self._allocate()
        pend = self.pending
        self.pending = []
        bs = [b for _, _, b in pend]
        cols = [b.columns for b in bs]
        cat = {k: np.concatenate([c[k] for c in cols]) for k in BATCH_COLUMNS_USED}
        counts = np.fromiter((c["op_seq"].shape[0] for c in cols), dtype=np.int64, count=len(cols))
        if all(isinstance(p[1], int) for p in pend):
            cid_col = np.repeat(np.fromiter((p[1] for p in pend), dtype=np.int64, count=len(pend)), counts)
        else:  # some batches hold several communicators: their rows carry their own
            cid_col = np.concatenate([np.full(k, p[1], dtype=np.int64) if isinstance(p[1], int) else p[1]
                                      for p, k in zip(pend, counts.tolist(), strict=True)])
        # host names: one table per batch, concatenated, indexed once for all rows
        maps = [self._host_map(b.hosts) for b in bs]
        moff = np.cumsum([0] + [m.shape[0] for m in maps[:-1]])
        host = np.concatenate(maps)[np.repeat(moff, counts) + cat["host_idx"]]
        sends = [b.send for b in bs]
        recvs = [b.recv for b in bs]
        nows = [p[0] for p in pend]
        crank = cat["comm_rank"]
        ok = (crank >= 0) & (crank < self.c_size[cid_col])
        rows = Rows(
            gi=self.c_off[cid_col] + crank,
            cid=cid_col,
            now=np.repeat(np.asarray(nows), counts),
            seq=cat["op_seq"],
            status=cat["status"],
            op_type=cat["op_type"],
            dtype=cat["dtype"],
            count=cat["count"],
            peer=cat["peer"],
            rank=cat["rank"],
            crank=crank,
            host=host,
            t_enter=cat["t_enter_ns"],
            t_exit=cat["t_exit_ns"],
            t_sample=cat["t_sample_ns"],
            t_prev=cat["t_prev_exit_ns"],
            t_exit_err=cat["t_exit_err_ns"],
            send=_stack_counters(sends),
            recv=_stack_counters(recvs),
            peak=_stack_counters([b.peaks for b in bs], fill=-1),
        )
        self._note_counters(pend, counts, rows)
        if not ok.all():
            # a communicator grew (comm_size rose in its records): widen it for the next tick
            for cid, cr in zip(cid_col[~ok].tolist(), crank[~ok].tolist(), strict=True):
                if cr >= 0:
                    self._new_sizes[cid] = max(self._new_sizes.get(cid, 0), cr + 1, int(self.c_size[cid]))
            rows = Rows(**{f: getattr(rows, f)[ok] for f in Rows.__dataclass_fields__})
        return rows

    def _note_counters(self, pend: list[tuple[float, int | I64, KernelBatch]], counts: I64, rows: Rows) -> None:
        """Mark the communicators whose rows carry counters, for all queued batches at once.

        A batch of one communicator has them all when it has channels. In a batch of several, rows are
        padded to the widest communicator's channels, so a communicator of a source without counters
        (a gloo group beside a probed NCCL one) would look like one whose data never moves: only rows
        that show a counted element or a known peak say their communicator has counters.
        """
        chan = np.fromiter((b.channels > 0 for _, _, b in pend), dtype=bool, count=len(pend))
        if not chan.any():
            return
        multi = np.fromiter((not isinstance(c, int) for _, c, _ in pend), dtype=bool, count=len(pend))
        use = np.repeat(chan, counts) & ~self.c_counters[rows.cid]  # (once known, a communicator stays so)
        if multi.any():
            u = np.flatnonzero(use & np.repeat(multi, counts))
            shows = rows.send[u].any(axis=1) | rows.recv[u].any(axis=1) | (rows.peak[u] >= 0).any(axis=1)
            use[u[~shows]] = False
        self.c_counters[rows.cid[use]] = True

    # -- the latest state of every member ------------------------------------------------------
    def apply_latest(self, r: Rows) -> int:
        """Update who is in which op; returns the number of out-of-order rows."""
        np.minimum.at(self.c_first_now, r.cid, r.now)
        self.m_grank[r.gi] = r.rank
        self.m_host[r.gi] = r.host
        if r.n == 1:
            idx = np.zeros(1, dtype=np.int64)
        else:
            order = np.lexsort((r.t_sample, r.seq * 4 + r.status, r.gi))
            g = r.gi[order]
            last = np.empty(order.shape[0], dtype=bool)
            last[-1] = True
            np.not_equal(g[1:], g[:-1], out=last[:-1])
            idx = order[last]
        u = r.gi[idx]
        s_new = r.seq[idx]
        st_new = r.status[idx]
        ts_new = r.t_sample[idx]
        s_old = self.m_seq[u]
        ooo = int(np.count_nonzero(s_new < s_old))
        same = s_new == s_old
        fin = (st_new == DONE) | (st_new == IDLE)  # the op is over on that rank (IDLE: a later heartbeat saying so)
        newer = (s_new > s_old) | (same & ~self.m_done[u] & (fin | (ts_new > self.m_t_sample[u])))
        self.m_seen_now[u] = r.now[idx]
        if not newer.any():
            return ooo
        u2 = u[newer]
        i2 = idx[newer]
        snd = r.send[i2]
        rcv = r.recv[i2]
        seq_moved = s_new[newer] != s_old[newer]
        cnt_moved = (snd != self.m_send[u2]).any(axis=1) | (rcv != self.m_recv[u2]).any(axis=1)
        done_new = fin[newer]
        moved = seq_moved | cnt_moved | (done_new & ~self.m_done[u2])
        if moved.any():
            mc, mn = r.cid[i2[moved]], r.now[i2[moved]]
            o = np.argsort(mn, kind="stable")  # the latest arrival of each communicator is written last
            latest = np.full(self.c_progress_now.shape[0], -np.inf)
            latest[mc[o]] = mn[o]
            np.maximum(self.c_progress_now, latest, out=self.c_progress_now)
        ts2 = ts_new[newer]
        self.m_t_change[u2] = np.where(moved, ts2, self.m_t_change[u2])
        self.m_seq[u2] = s_new[newer]
        self.m_done[u2] = done_new
        self.m_op[u2] = r.op_type[i2]
        self.m_dtype[u2] = r.dtype[i2]
        self.m_count[u2] = r.count[i2]
        self.m_peer[u2] = r.peer[i2]
        self.m_t_enter[u2] = r.t_enter[i2]
        self.m_t_sample[u2] = ts2
        self.m_send[u2] = snd
        self.m_recv[u2] = rcv
        # first sighting of a communicator: its clock of progress starts now
        fresh = self.c_progress_now[r.cid[i2]] < 0
        if fresh.any():
            self.c_progress_now[r.cid[i2[fresh]]] = r.now[i2[fresh]]
        self._recount_inside(np.unique(r.cid[i2]))
        return ooo

    def _recount_inside(self, cids: I64) -> None:
        off = self.c_off[cids]
        size = self.c_size[cids]
        inside = ((self.m_seq >= 0) & ~self.m_done).astype(np.int64)
        cs = np.concatenate([[0], np.cumsum(inside)])
        self.c_inside[cids] = cs[off + size] - cs[off]

    def gaps(self, grank: I64, t_enter: I64, t_exit: I64, t_prev: I64 | None = None) -> F64:
        """Seconds each rank spent outside collectives before each op (its own clock).

        The gap between the end of a rank's previous op (any communicator) and the start of this
        one is its compute time: long for a late arriver that computes slowly, normal for a rank
        that arrives late only because it waited inside another op (a victim). A source that sends
        only some ops in full says where the previous one ended (``t_prev``); otherwise it is the
        previous op this analyzer saw.
        """
        if grank.size == 0:
            return np.zeros(0)
        hi = int(grank.max()) + 1
        if hi > self.g_last_exit.shape[0]:
            self.g_last_exit = _grow(self.g_last_exit, hi - self.g_last_exit.shape[0], -1)
        order = np.lexsort((t_enter, grank))
        g, te, tx = grank[order], t_enter[order], t_exit[order]
        prev = np.empty_like(tx)
        prev[0] = self.g_last_exit[g[0]]
        prev[1:] = np.where(g[1:] == g[:-1], tx[:-1], self.g_last_exit[g[1:]])
        if t_prev is not None:
            told = t_prev[order]
            # what the source says, unless an op this analyzer saw end before the entry ended later (a source's
            # previous end can only be the latest; one on another clock made every gap a year long)
            seen_later = (prev > told) & (prev <= te)
            prev = np.where((told >= 0) & ~seen_later, told, prev)
        gap = np.where(prev >= 0, np.maximum(te - prev, 0) * 1e-9, 0.0)
        last = np.empty(g.shape[0], dtype=bool)
        last[-1] = True
        np.not_equal(g[1:], g[:-1], out=last[:-1])
        self.g_last_exit[g[last]] = np.maximum(self.g_last_exit[g[last]], tx[last])
        out = np.empty_like(gap)
        out[order] = gap
        return out

    def never_seen(self) -> I64:
        """The job's global ranks no record has come from on any communicator (empty when the world size is
        unknown): a rank that hangs before its first op is one of them."""
        if self.world <= 0:
            return np.zeros(0, dtype=np.int64)
        seen = np.zeros(self.world, dtype=bool)
        g = self.m_grank[: self.n_members]
        seen[g[(g >= 0) & (g < self.world)]] = True
        return np.flatnonzero(~seen).astype(np.int64)

    def members_of(self, cid: int) -> slice:
        o = int(self.c_off[cid])
        return slice(o, o + int(self.c_size[cid]))

    def comm_hex(self, cid: int) -> str:
        return f"{self.comm_hashes[cid] & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def _stack_counters(parts: list[I64], fill: int = 0) -> I64:
    """Concatenate (n, channels) counter blocks into (N, MAX_CHANNELS), ``fill``-ing narrower ones."""
    widths = {p.shape[1] for p in parts}
    if len(widths) == 1:
        cat = np.concatenate(parts)
        w = cat.shape[1]
        if w == MAX_CHANNELS:
            return cat
        out = np.full((cat.shape[0], MAX_CHANNELS), fill, dtype=np.int64)
        out[:, :w] = cat
        return out
    out = np.full((sum(p.shape[0] for p in parts), MAX_CHANNELS), fill, dtype=np.int64)
    a = 0
    for p in parts:
        out[a : a + p.shape[0], : p.shape[1]] = p
        a += p.shape[0]
    return out


BATCH_COLUMNS_USED = (
    "op_seq", "op_type", "dtype", "count", "peer", "rank", "comm_rank", "comm_size", "status", "host_idx",
    "t_enter_ns", "t_exit_ns", "t_sample_ns", "t_prev_exit_ns", "t_exit_err_ns",
)
