"""Slowdowns: learned per-op baselines, repeated counting, the slow ratio P and the culprit.

For every (communicator, op signature) the detector learns the healthy shortest kernel time
``b_min`` (pure communication: the last arriver does not wait), longest ``b_max`` and the
arrival spread ``b_spr``, all on each rank's own clock (durations only), as medians of the last
healthy ops with their median absolute deviations. A completed op is slow
when its time exceeds ``slow_factor`` x the baseline by a statistically clear margin. A slow
verdict needs ``slow_min_ops`` slow ops among the last ``slow_window_ops`` (repeated counting,
so a blip never alerts) with the same culprit in most of them, for ``slow_confirm_s``.

P = (T_max - T_min - b_spr) / (T_max - b_max): the paper's (T_max - T_min)/(T_max - T_base)
with the healthy arrival spread taken out of both, so normal jitter does not pull a comm-slow
op towards P = 1. Late arriver (comp-slow): P ~ 1; everybody slow (comm-slow): P ~ 0.

Array names say what one entry is, by prefix: ``b_`` one per baseline, i.e. per (communicator,
op signature); ``w_`` the repeated-counting window, one row per baseline and one column per
recent op; ``m_`` and ``c_`` are ``JobState``'s per-member and per-communicator arrays
(see ``state.py``). A ``c_`` local (``c_slow``) is the communication part of an op's time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from ccld.records import VARIABLE_SIZE_OPS, AnomalyKind, OpType
from ccld.streams.analysis.ops import OpRows
from ccld.streams.analysis.settings import AnalyzerSettings
from ccld.streams.analysis.state import JobState

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

A = TypeVar("A", bound=npt.NDArray[Any])

#: Slowness is measured from this quantile of the recent healthy ops: rare outliers (a GC pause)
#: stay above it, recurring schedule positions stay below it.
HIGH_Q = 0.9

RING_OPS = frozenset({int(OpType.ALL_REDUCE), int(OpType.ALL_GATHER), int(OpType.REDUCE_SCATTER)})
P2P_OPS = frozenset({int(OpType.SEND), int(OpType.RECV)})
ALL_TO_ALL = int(OpType.ALL_TO_ALL)
_P2P = np.array(sorted(P2P_OPS), dtype=np.int64)
_RING = np.array(sorted(RING_OPS), dtype=np.int64)
#: ops whose members do different work before them, so a late arriver is judged against its own healthy
#: compute, never against its peers': a send/recv pair's two stages, an all_to_all's experts (each
#: computes on what the router sent it: the most loaded one is late at the combine, and that is no fault)
#: and a barrier (where ranks meet after their own roles' work: the checkpoint writer is last at every
#: checkpoint's barrier, healthy)
OWN_WORK_OPS = P2P_OPS | {int(OpType.ALL_TO_ALL), int(OpType.BARRIER)}
#: a variable-size op (an all_to_all) whose late arriver was the late arriver of this many ops of its
#: baseline in a row is not learned as healthy: healthy experts take turns being last (the router's draw),
#: a straggling expert is last every time, at a lateness that varies with its load, and learning the
#: ones that happen to pass the slow test would lift the baseline under it within seconds
STREAK_OPS = 3
#: the last this many ops of a baseline (judged or not) give its cadence, the time between its calls
CADENCE_OPS = 32
#: An own-work op's healthy top (``HIGH_Q`` of its recent healthy ops) holds this long after it was last
#: reached, if the recent healthy ops alone would put it lower. Such an op's times are several modes of its
#: schedule (a pipeline's last stage sends backward after 1, 8 or 17 ms of its receiver's wait, by
#: micro-batch; an expert's lateness follows the router), and the top mode can be near a tenth of the ops:
#: where a run of ops leaves it under the quantile, the top falls to the next mode, the top mode's ops are
#: judged slow and no longer learned, and the fall feeds itself until the schedule reads as slowness (an S1
#: on a healthy pipeline's last stage after half an hour: fa-33-0507 of ``false_alarms.py --any-shape``).
#: Held, the top mode is learned again within a ring's worth of ops. Only tops that healthy ops reached:
#: a slowdown is never learned, so it is never held; and only once a ring of healthy ops since the warm-up
#: was learned (a pipeline's fill, held, hid the compute part of an S3 that started 7 s after the warm-up).
MODE_HOLD_S = 300.0
#: a rank holds the blame (``SlowDetector._blame``) with ``blame_share`` of its collective's lateness and at
#: least this many times a fair share (1 / members): 80 % of a pair's, half of a larger group's
BLAME_FAIR_X = 1.6
#: ... and on a host short of CPUs, where the scheduler makes each rank last in turn, a rank that keeps at least
#: this share of its collective's lateness (and twice a fair share) is slower than any rotation makes one: real
#: 4-rank DDP on gloo, its host stalled 44-76 %, healthy: each rank's share 0.25-0.29 at the median, 0.63 at
#: most in five runs; one rank computing 2x from step 0: 0.82 at the median, at least 0.7 for 42 s on end
BLAME_DOMINANT_SHARE = 0.7
_OWN_WORK = np.array(sorted(OWN_WORK_OPS), dtype=np.int64)


def own_work(sig: I64) -> npt.NDArray[np.bool_]:
    """Per baseline signature: its members did different work before the op (``OWN_WORK_OPS``), except an
    all_to_all's first op of a pair (``SlowDetector._phased``: the dispatch, or in the backward pass the
    combine's gradient), which follows what every member computed alike (the attention, the router, the
    dense layers after the experts); only the second follows each expert's own load. There a rank that
    computes slowly is last op after op from its first step, judged against its peers like any
    collective's (an MoE job with no dense tensor ring and a slow link that hides its late arrival on the
    data-parallel ring)."""
    op = sig >> 60 & 0xF
    return np.isin(op, _OWN_WORK) & ~((op == ALL_TO_ALL) & ((sig & 1) == 0))


@dataclass(frozen=True)
class SlowFinding:
    """A communicator's op that is repeatedly slow, with its culprit (before victim filtering)."""

    kind: AnomalyKind
    cid: int
    bidx: int
    seq: int  # first slow op of the window
    op_type: int
    culprit: int  # global rank
    culprit_crank: int
    link: tuple[int, int] | None  # global ranks src -> dst
    channel: int | None
    p: float
    share: float
    n_slow: int
    lateness_s: float  # median excess arrival spread of the slow ops
    tmin_s: float
    tmax_s: float
    base_s: float
    base_min_s: float  # healthy kernel time of the last arriver (pure communication)
    onset_now: float
    affected: tuple[int, ...]
    link_unobserved: bool = False  # counters exist, but no poll caught a slow op in flight
    peer_only: bool = False  # slow against its peers only: no learned baseline (yet) says the ops are slow
    late_gap_s: float = 0.0  # median compute gap of the late arriver before the slow ops
    peer_gap_s: float = 0.0  # ... and of its peers
    sibling_s: float = 0.0  # healthy kernel time of the same op on the sibling communicators (0: none compared)
    pair_link: bool = False  # the link is a send/recv pair's one link (named by the pair, not by a backlog)
    cpu_wait_share: float | None = None  # members' hosts' median CPU stall share (PSI; None: unmeasured)
    cost_share: float = float("inf")  # extra communication time per op / time between the op's calls (cost)
    culprit_cpu_wait_share: float | None = None  # a late arriver's own host's CPU stall share (None: unmeasured)


class SlowDetector:
    """Baselines and windows of every (communicator, signature) of one job."""

    def __init__(self, settings: AnalyzerSettings) -> None:
        self.s = settings
        self.w = max(1, settings.slow_window_ops)
        self.sig_ids: dict[int, int] = {}
        self.sig_codes: list[int] = []
        self.key_idx: dict[int, int] = {}
        self._sorted_keys = np.zeros(0, dtype=np.int64)
        self._sorted_idx = np.zeros(0, dtype=np.int64)
        self.nb = 0
        z = np.zeros(0)
        zi = np.zeros(0, dtype=np.int64)
        self.b_cid, self.b_sig, self.b_n, self.b_pos, self.b_okrun = zi, zi, zi, zi, zi
        self.b_min, self.b_max, self.b_spr, self.b_dev, self.b_devmin = z, z, z, z, z
        self.b_since = z  # job time the window became alarmed (nan: not alarmed)
        # the alarmed window's leading late arriver (comm rank; -1: none) and the job time it took the
        # lead (nan: not alarmed): an S1 names a rank, so the confirmation must be that rank's
        self.b_lead, self.b_lead_since = zi, z
        # slow-communication findings held because the members waited for CPUs: alarm episodes counted
        # (baseline -> the job time its window became alarmed), and how many so far
        self._held: dict[int, float] = {}
        self._hidden: dict[int, tuple[int, float]] = {}  # baseline -> (comm rank, since): _hidden_compute holds
        self.held_starved = 0
        # ... and those held because the extra time cost the job a sliver of the time between the op's calls
        self._held_cheap: dict[int, float] = {}
        self.held_cheap = 0
        self.b_hmax, self.b_hmin, self.b_hspr = z, z, z  # the top of the healthy range (HIGH_Q quantile)
        h = max(1, settings.baseline_ops)
        self.h_max = np.zeros((0, h))  # the recent healthy ops' times (nan: not yet), a ring per baseline
        self.h_min = np.zeros((0, h))
        self.h_lgap = np.zeros((0, h))  # the late arriver's compute gap in those ops
        self.b_hlgap = z  # ... its top (HIGH_Q quantile): how long a late arriver here computes when healthy
        # an own-work op's highest tops of the last MODE_HOLD_S (hmax, hspr, hlgap) and the job time they were set
        self.e_hmax, self.e_hspr, self.e_hlgap, self.e_t = z, z, z, z
        self.b_nwarm = zi  # healthy ops learned after the warm-up: a full ring of them before a top is held
        self.b_onset = z  # job time of the first slow op since the window was last clean (nan: clean)
        self.b_cfast = z  # job time of the newest judged op whose communication was not slow (-inf: none)
        self.b_sib, self.b_sibn = z, zi  # healthy kernel time of the sibling communicators (lower quartile), how many
        self.b_run, self.b_runn = zi, zi  # the late arriver of its last ops, and how many in a row (STREAK_OPS)
        # the member of its last sampled backlogs, and how many in a row (slow_link_pinned_ops)
        self.b_pin, self.b_pinn = zi, zi
        # who keeps the others waiting (``_blame``): the candidate (comm rank; -1: none), the share of the time
        # per call its peers waited for it, of that while it computed longer, and of all lateness (averages)
        self.b_blr, self.b_bll, self.b_bl, self.b_btot = zi, z, z, z
        self.b_blast = z  # job time of its last blamed op
        self.b_bchr, self.b_bcll, self.b_bcl = zi, z, z  # the challenger's comm rank and its two averages
        self.b_seen = zi  # ops of the baseline judged or learned so far
        # comm rank 0's entry into its last CADENCE_OPS ops (nan: unknown) and their op sequences
        self.r_t0, self.r_seq = np.zeros((0, CADENCE_OPS)), np.zeros((0, CADENCE_OPS))
        self._sib_at = -np.inf  # job time the sibling references were last computed
        w = self.w
        self.w_slow = np.zeros((0, w), dtype=bool)
        self.w_cslow = np.zeros((0, w), dtype=bool)  # the communication part was slow
        self.w_lslow = np.zeros((0, w), dtype=bool)  # someone arrived late
        self.w_late = np.zeros((0, w), dtype=np.int64)
        self.w_lagr = np.zeros((0, w), dtype=np.int64)
        self.w_p = np.zeros((0, w))
        self.w_seq = np.zeros((0, w), dtype=np.int64)
        self.w_now = np.zeros((0, w))
        self.w_spr = np.zeros((0, w))
        self.w_tmin = np.zeros((0, w))
        self.w_tmax = np.zeros((0, w))
        self.w_lgap = np.zeros((0, w))  # the late arriver's compute gap before the op
        self.w_ogap = np.zeros((0, w))  # the other ranks' mean compute gap
        self.w_sgap = np.zeros((0, w))  # the late arriver's compute gap beyond its healthy top (nan: no baseline)
        self.w_peer = np.zeros((0, w), dtype=bool)  # slow only against its peers (no learned baseline said so)
        self.w_blame = np.zeros((0, w), dtype=bool)  # ... because its late arriver keeps them waiting (_blame)
        # per communicator, its last variable-size op completed: (op sequence, signature, place in its run)
        self._run: dict[int, tuple[int, int, int]] = {}

    # -- baseline index ------------------------------------------------------------------------
    def _sig_ids(self, codes: I64) -> I64:
        u, inv = np.unique(codes, return_inverse=True)
        ids = []
        for c in u.tolist():
            i = self.sig_ids.get(c)
            if i is None:
                i = len(self.sig_codes)
                self.sig_ids[c] = i
                self.sig_codes.append(c)
            ids.append(i)
        return np.asarray(ids, dtype=np.int64)[inv]

    def lookup(self, cid: I64, sig: I64, create: bool) -> I64:
        """Baseline index of each (cid, sig); -1 where unknown and not created."""
        keys = cid << 24 | self._sig_ids(sig)
        out = self._find(keys)
        if create and (out < 0).any():
            self._add_many(np.unique(keys[out < 0]).tolist())
            self._reindex()
            out = self._find(keys)
        return out

    def _find(self, keys: I64) -> I64:
        if self._sorted_keys.size == 0:
            return np.full(keys.shape[0], -1, dtype=np.int64)
        pos = np.searchsorted(self._sorted_keys, keys)
        pos = np.minimum(pos, self._sorted_keys.size - 1)
        hit = self._sorted_keys[pos] == keys
        return np.where(hit, self._sorted_idx[pos], -1)

    def _add_many(self, keys: list[int]) -> None:
        """Append baselines for new keys (all arrays grow once per call)."""
        k = len(keys)
        for key in keys:
            self.key_idx[key] = self.nb
            self.nb += 1
        cids = np.asarray([key >> 24 for key in keys], dtype=np.int64)
        sigs = np.asarray([self.sig_codes[key & 0xFFFFFF] for key in keys], dtype=np.int64)

        def g(a: A, fill: float | int | bool = 0) -> A:
            return cast(A, np.concatenate([a, np.full((k, *a.shape[1:]), fill, dtype=a.dtype)]))

        self.b_cid = np.concatenate([self.b_cid, cids])
        self.b_sig = np.concatenate([self.b_sig, sigs])
        self.b_n, self.b_pos, self.b_okrun = g(self.b_n), g(self.b_pos), g(self.b_okrun)
        self.b_min, self.b_max, self.b_spr = g(self.b_min), g(self.b_max), g(self.b_spr)
        self.b_dev, self.b_devmin = g(self.b_dev), g(self.b_devmin)
        self.b_since = g(self.b_since, np.nan)
        self.b_lead, self.b_lead_since = g(self.b_lead, -1), g(self.b_lead_since, np.nan)
        self.b_hmax, self.b_hmin, self.b_hspr = g(self.b_hmax), g(self.b_hmin), g(self.b_hspr)
        self.h_max, self.h_min = g(self.h_max, np.nan), g(self.h_min, np.nan)
        self.h_lgap, self.b_hlgap, self.b_onset = g(self.h_lgap, np.nan), g(self.b_hlgap), g(self.b_onset, np.nan)
        self.e_hmax, self.e_hspr, self.e_hlgap = g(self.e_hmax), g(self.e_hspr), g(self.e_hlgap)
        self.e_t = g(self.e_t, -np.inf)
        self.b_nwarm = g(self.b_nwarm)
        self.b_cfast = g(self.b_cfast, -np.inf)
        self.b_sib, self.b_sibn = g(self.b_sib), g(self.b_sibn)
        self.b_run, self.b_runn = g(self.b_run, -1), g(self.b_runn)
        self.b_pin, self.b_pinn = g(self.b_pin, -1), g(self.b_pinn)
        self.b_blr, self.b_bll, self.b_bl, self.b_btot = g(self.b_blr, -1), g(self.b_bll), g(self.b_bl), g(self.b_btot)
        self.b_blast = g(self.b_blast, -np.inf)
        self.b_bchr, self.b_bcll, self.b_bcl = g(self.b_bchr, -1), g(self.b_bcll), g(self.b_bcl)
        self.b_seen, self.r_t0, self.r_seq = g(self.b_seen), g(self.r_t0, np.nan), g(self.r_seq, np.nan)
        self.w_slow = g(self.w_slow, False)
        self.w_cslow, self.w_lslow = g(self.w_cslow, False), g(self.w_lslow, False)
        self.w_late, self.w_lagr, self.w_seq = g(self.w_late, -1), g(self.w_lagr, -1), g(self.w_seq, -1)
        self.w_p, self.w_now, self.w_spr = g(self.w_p), g(self.w_now), g(self.w_spr)
        self.w_tmin, self.w_tmax = g(self.w_tmin), g(self.w_tmax)
        self.w_lgap, self.w_ogap = g(self.w_lgap), g(self.w_ogap)
        self.w_sgap, self.w_peer = g(self.w_sgap, np.nan), g(self.w_peer, False)
        self.w_blame = g(self.w_blame, False)

    def _reindex(self) -> None:
        keys = np.fromiter(self.key_idx.keys(), dtype=np.int64, count=len(self.key_idx))
        idx = np.fromiter(self.key_idx.values(), dtype=np.int64, count=len(self.key_idx))
        o = np.argsort(keys)
        self._sorted_keys, self._sorted_idx = keys[o], idx[o]

    # -- completed ops -------------------------------------------------------------------------
    def update(self, js: JobState, ops: OpRows) -> I64:
        """Judge each completed op against its baseline; returns baselines whose window changed."""
        if ops.n == 0:
            return np.zeros(0, dtype=np.int64)
        s = self.s
        # how long its ranks have waited in an op, slow ones too: a job that ends mid-op leaves them waiting
        # about that long, which is no hang (shard_report's cut rule)
        np.maximum.at(js.c_longop_s, ops.cid, ops.tmax)
        var = np.isin(ops.op_type, VARIABLE_SIZE_OPS)  # all_to_all: dispatch and combine apart (_phased)
        b = self.lookup(ops.cid, self._phased(ops, var), create=True)
        order = np.lexsort((ops.seq, b))
        b, var = b[order], var[order]
        ops = ops.take(order)
        start = np.concatenate([[True], b[1:] != b[:-1]])
        grp = np.cumsum(start) - 1
        first = np.flatnonzero(start)
        level = np.arange(b.size) - first[grp]
        if float(ops.first_now.max()) - self._sib_at >= 1.0:
            self._siblings(js)
            self._sib_at = float(ops.first_now.max())
        for lv in range(int(level.max()) + 1):
            i = np.flatnonzero(level == lv)
            bi = b[i]
            tmin, tmax = ops.tmin[i], ops.tmax[i]
            n = self.b_n[bi]
            # a communicator's first seconds (pipeline fill, the first step) are learned, never judged
            warm = (n >= s.baseline_min_ops) & (ops.first_now[i] - js.c_first_now[ops.cid[i]] >= s.baseline_warmup_s)
            bmin, bmax, bspr = self.b_min[bi], self.b_max[bi], self.b_spr[bi]
            spread = tmax - tmin
            thr_max = np.maximum.reduce(
                [np.full(i.size, s.slow_min_excess_s), s.slow_mad_k * self.b_dev[bi], (s.slow_factor - 1) * bmax]
            )
            thr_min = np.maximum.reduce(
                [np.full(i.size, s.slow_min_excess_s), s.slow_mad_k * self.b_devmin[bi], (s.slow_factor - 1) * bmin]
            )
            # two components, judged apart: the communication itself took longer (the last arriver's
            # own kernel time, which has no waiting in it, grew) and someone arrived late (the spread
            # between first and last arrival grew); either makes the op slow
            # measured from the top of the healthy range (its 90th percentile), not its middle: an op
            # signature that recurs at several schedule positions (a pipeline send waits 0, 8 or
            # 16 ms depending on the microbatch) has several healthy modes, all of them normal
            # ... and from the shortest time the measurement allows: a source that knows an exit only
            # between two polls (Flight Recorder on gloo) says by how much (terr; 0 for every other
            # source), and the one rank's midpoint noise must not pass for slower communication, while
            # healthy ops' tmin, a minimum over every rank's noisy times, sits low in that noise
            c_slow = warm & ((tmin - ops.terr[i] - self.b_hmin[bi]) > thr_min)
            l_slow = warm & ((spread - self.b_hspr[bi]) > thr_max)
            hist = warm & (((tmax - self.b_hmax[bi]) > thr_max) | c_slow | l_slow)
            lg = ops.late_gap[i]
            og = (ops.gap_sum[i] - lg) / np.maximum(ops.cnt[i] - 1, 1)
            # against its peers, with no history: a late arriver that computed clearly longer than the
            # other members of a collective (they do the same work) is slow from the job's first
            # steps on, when no baseline exists yet or the baseline has learned the slowness as normal
            own = own_work(self.b_sig[bi])
            peer = (n >= 2) & _peer_late(own, ops.cnt[i], lg, og, spread, s)
            # ... or it is the rank that, op after op, keeps the others waiting: most of the time they wait
            # in this op is for it, it computed longer by a share of each wait, and that costs them a share
            # of the job's time. Where the compute gaps do not compare (a rank's previous op ended long
            # before: gradient buckets queued behind each other on a data-parallel ring, gaps that span
            # several sampled ops), this is what tells a rank slow from its first step
            blame, neutral = self._blame(ops, i, bi, lg, og, spread, hist, own)
            peer = peer | blame
            # ... and its communication against its sibling communicators' (the other tensor-parallel
            # groups run the same op on the same kind of links): a link slow from the start is slow
            # against them, though its own baseline learned it
            # The margin is the siblings' (their time x peer_link_factor), not this baseline's own noise:
            # a link slowed from the start makes its own times noisy too (a pipeline send that the
            # receiver's late arrival hides in some ops: 0.4 or 96 ms), and a margin of 6 deviations of
            # that would hide the link itself. A communicator whose learned median is itself that far
            # above its siblings' is judged so; one healthy like them is never, whatever its spikes.
            ref = self.b_sib[bi]
            far = s.peer_link_factor * ref
            sib = (self.b_sibn[bi] >= 2) & (self.b_min[bi] >= far) & (
                (tmin - ops.terr[i]) > np.maximum(far, ref + s.slow_min_excess_s))
            # ... and against its own other links: in a ring whose links are all of one kind (one host's, or
            # one rank per host), data piles up before a different link at each sample when healthy, and
            # before the same one, sample after sample, when that link is the slow one; no history and no
            # sibling needed (a single tensor group slow from its first op: from-start-heldout's S3-8-043)
            sib = sib | self._pinned(js, ops, i, bi)
            slow = hist | peer | sib
            l_slow = l_slow | peer
            c_slow = c_slow | sib
            den = np.maximum(tmax - bmax, 1e-9)
            # an op slow only against its peers: all its excess is late arrival (P = 1), or all of it is
            # communication (P = 0), or both
            p = np.where(hist | ~(peer | sib), np.clip((spread - bspr) / den, 0.0, 1.0),
                         np.where(peer & sib, 0.5, np.where(peer, 1.0, 0.0)))
            # while a rank holds the blame, an op nobody waited in notably is no evidence either way: it
            # neither fills nor empties the window (the queued buckets after the late one, a pair's ops
            # whose late arriver came with the other)
            k = ~neutral
            bk = bi[k]
            pos = self.b_pos[bk]
            for arr, val in (
                (self.w_slow, slow), (self.w_cslow, c_slow), (self.w_lslow, l_slow),
                (self.w_peer, (peer | sib) & ~hist), (self.w_blame, blame & ~hist), (self.w_late, ops.late[i]),
                (self.w_lagr, np.where(ops.lag[i] > 0, ops.lagr[i], -1)), (self.w_p, p), (self.w_seq, ops.seq[i]),
                (self.w_now, ops.first_now[i]),
                (self.w_spr, np.where(peer & ~hist, spread, np.maximum(spread - bspr, 0.0))),
                (self.w_tmin, tmin), (self.w_tmax, tmax), (self.w_lgap, lg), (self.w_ogap, og),
                (self.w_sgap, np.where(n >= s.baseline_min_ops, lg - self.b_hlgap[bi], np.nan)),
            ):
                arr[bk, pos] = val[k]
            self.b_pos[bk] = (pos + 1) % self.w
            self.r_t0[bi, self.b_seen[bi] % CADENCE_OPS] = ops.t0[i]
            self.r_seq[bi, self.b_seen[bi] % CADENCE_OPS] = ops.seq[i]
            self.b_seen[bi] += 1
            # the onset is the first slow op of the episode, not the one that completed the window
            clean = ~self.w_slow[bk].any(axis=1)
            self.b_onset[bk] = np.where(clean, np.nan, np.where(np.isnan(self.b_onset[bk]) & slow[k],
                                                                 ops.first_now[i][k], self.b_onset[bk]))
            # only judged (warm) ops count towards resolution: a restarted analyzer re-learning its
            # baselines must not resolve an incident that is still going on
            self.b_okrun[bk] = np.where(slow[k], 0, self.b_okrun[bk] + warm[k])
            # the newest op whose communication was healthy: an unnamed slow link must slow every op (findings)
            fast = warm & ~c_slow
            self.b_cfast[bi] = np.where(fast, np.maximum(self.b_cfast[bi], ops.first_now[i]), self.b_cfast[bi])
            # learn from healthy ops only, so a lasting slowdown never becomes the norm; an op slow
            # only against its peers is learned: the peer test stays on it whatever the baseline says
            late_i = ops.late[i]
            streak = np.where((late_i >= 0) & (late_i == self.b_run[bi]), self.b_runn[bi] + 1, 1)
            self.b_run[bi], self.b_runn[bi] = late_i, streak
            streaky = streak >= STREAK_OPS
            learn = ~hist & ~(var[i] & streaky)
            # Any other op whose late arriver was last in STREAK_OPS of its baseline's ops in a row is
            # learned with its spread capped at the healthy top: one rank that computes 35 % longer makes
            # its ring's spread grow by less than the slow test's margin in some ops, and learning those
            # as they are lifts the top (a 90th percentile of 32 ops moves after four) under the next
            # ones within seconds, so a lasting slowdown becomes the norm. Capped, a healthy rank that is
            # always last (the one that logs) keeps its top where it was: the capped ops sit on it.
            top = np.where(streaky & ~var[i] & (n >= s.baseline_min_ops), tmin + self.b_hspr[bi], np.inf)
            li, lb = i[learn], bi[learn]
            if lb.size:
                np.maximum.at(js.c_maxop_s, ops.cid[li], ops.tmax[li])
                slot = self.b_n[lb] % self.h_max.shape[1]
                self.h_max[lb, slot] = np.minimum(ops.tmax[li], top[learn])
                self.h_min[lb, slot] = ops.tmin[li]
                self.h_lgap[lb, slot] = lg[learn]
                self.b_n[lb] += 1
                self.b_nwarm[lb] += warm[learn]
                # a top is held only once the ring holds no op of the warm-up (a pipeline's fill)
                held = np.isin(ops.op_type[li], _OWN_WORK) & (self.b_nwarm[lb] >= self.h_max.shape[1])
                self._relearn(lb, ops.first_now[li], own=held)
        return np.unique(b)

    def _phased(self, ops: OpRows, var: npt.NDArray[np.bool_]) -> I64:
        """The ops' signatures, a variable-size op's with the parity of its place in a run of such ops.

        An MoE layer's dispatch and combine are the same all_to_all (its routed counts are out of the
        signature), but the experts compute between them: the combine's last arriver is an expert, the
        dispatch's is not. One baseline for both would see a straggling expert late at every other op
        only, which never fills the repeated counting; consecutive ops of one run alternate dispatch
        and combine (forward: dispatch, combine; backward: the combine's gradient, the dispatch's), so
        the parity of the place in the run keeps them apart. A run is broken by any other op between
        (a gap in the sequence). ``var``: which of ``ops`` are variable-size."""
        vi = np.flatnonzero(var)
        if vi.size == 0:
            return ops.sig
        sig = ops.sig.copy()
        vi = vi[np.lexsort((ops.seq[vi], ops.cid[vi]))]
        for k, cid, seq, code in zip(vi.tolist(), ops.cid[vi].tolist(), ops.seq[vi].tolist(),
                                     ops.sig[vi].tolist(), strict=True):
            last = self._run.get(cid)
            place = last[2] + 1 if last is not None and last[0] == seq - 1 and last[1] == code else 0
            self._run[cid] = (seq, code, place)
            sig[k] = code | (place & 1)  # the count field, empty for these ops (sig_code)
        return sig

    def _blame(self, ops: OpRows, i: I64, bi: I64, lg: F64, og: F64, spread: F64, hist: npt.NDArray[np.bool_],
               own: npt.NDArray[np.bool_]) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        """Per op ``i`` (of baselines ``bi``, one op each): its late arriver is the rank that keeps the others
        waiting in this baseline's ops, with no history needed.

        Each op's lateness (its arrival spread) is owed to its late arriver when that rank computed longer
        than its peers before it by ``culprit_gap_share`` of it (a victim that waited inside another op did
        not), or clearly longer than they did (``peer_gap_ratio``: a rank whose own outgoing link is slow
        too is late by both, and its compute explains only part of it). Lateness is taken as a share of
        the time between the communicator's calls (per op sequence number, on one rank's clock: a sampling
        source details one op in many) and averaged over the baseline's last ``blame_ops`` ops
        (exponentially): the candidate's, the part of it owed, and all of it. A rank whose lateness the
        others' outweighs no longer is the candidate, the op's late arriver is. While the candidate holds
        ``blame_share`` of the lateness and what it owes costs ``blame_min_share`` of the time per call, an
        op is blamed when it is last again by that share of the time per call itself (a gap no poll
        measured, or a wait in its own slow send before it, changes nothing about whom the others wait
        for; a rank last by a few us after the slowdown ended is jitter, and lets the incident resolve).
        Returns the blamed ops, and the neutral ones: while the blame holds, and within
        ``culprit_confirm_s`` of the last blamed op, an op nobody waited in for that share of the time per
        call (a bucket queued behind the late one, whose late arriver came with the others), or one that
        another rank was last in and no baseline calls slow (a source whose exits are known only between
        two polls, Flight Recorder on gloo, makes others look last now and then), says nothing about
        the rank, and ``update`` keeps it out of the window.
        In a healthy ring the last place rotates and the waits are jitter; a rank slow from its first
        step is last in most ops, by a share of each call: on a data-parallel ring of gradient buckets
        queued behind each other it is late by a few ms at each bucket, where its compute gap, measured
        from a kernel end a poll saw ops before, is hardly longer than its peers' in ratio. Only
        collectives whose members do the same work (``_peer_late``'s)."""
        s = self.s
        if s.blame_ops <= 0:
            return np.zeros(i.size, dtype=bool), np.zeros(i.size, dtype=bool)
        late = ops.late[i]
        same = ~own & (ops.cnt[i] >= 2) & (late >= 0)
        per_call = self._call_interval(bi)
        # an op whose ranks' previous kernel ends no poll saw (no gap on either side) adds nothing either way
        gapless = (lg <= 0) & (og <= 0)
        known = same & np.isfinite(per_call) & ~gapless
        timed = same & np.isfinite(per_call)
        # at most a whole call's time per op: one 30-s pause of a rank is one op's worth of evidence, not 15
        # (eight calls' worth let the head of a chain of buckets queued back to back carry the chain's
        # lateness, but named victims of long waits - a rank 88 ms late behind a slow link - in 5 of the
        # standard suite's 623 jobs: a chain's head is one op in sixteen, and stays so)
        this = np.where(timed, np.minimum(np.maximum(spread, 0.0) / np.where(timed, per_call, 1.0), 1.0), 0.0)
        sp = np.where(known, this, 0.0)
        # computed longer than its peers by a share of its lateness, or clearly longer than they did (a rank
        # whose own outgoing link is slow too is late by both: its compute explains only part of it)
        extra = lg - og
        longer = (extra >= s.culprit_gap_share * spread) | _computed_clearly_longer(extra, og, s)
        owed = np.where(known & longer, sp, 0.0)
        a = np.where(known, 1.0 / s.blame_ops, 0.0)
        # two accounts, the candidate's and a challenger's (a noisy source makes others look last now and
        # then: one account would restart from nothing at each of them); a third rank takes the
        # challenger's place, and a challenger that outgrows the candidate takes its place
        cand, chal = self.b_blr[bi], self.b_bchr[bi]
        mine, theirs = late == cand, late == chal
        bll = self.b_bll[bi] * (1 - a) + a * np.where(mine, sp, 0.0)
        bl = self.b_bl[bi] * (1 - a) + a * np.where(mine, owed, 0.0)
        cll = self.b_bcll[bi] * (1 - a) + a * np.where(theirs, sp, 0.0)
        cl = self.b_bcl[bi] * (1 - a) + a * np.where(theirs, owed, 0.0)
        tot = self.b_btot[bi] * (1 - a) + a * sp
        new = known & ~mine & ~theirs
        chal = np.where(new, late, chal)
        cll, cl = np.where(new, a * sp, cll), np.where(new, a * owed, cl)
        swap = cll > bll
        cand, chal = np.where(swap, chal, cand), np.where(swap, cand, chal)
        bll, cll = np.where(swap, cll, bll), np.where(swap, bll, cll)
        bl, cl = np.where(swap, cl, bl), np.where(swap, bl, cl)
        self.b_blr[bi], self.b_bchr[bi] = cand, chal
        self.b_bll[bi], self.b_bl[bi], self.b_bcll[bi], self.b_bcl[bi], self.b_btot[bi] = bll, bl, cll, cl, tot
        # most of the waiting, and clearly more than a fair share of it (a pair's two ranks hold half each)
        share = np.maximum(s.blame_share, BLAME_FAIR_X / np.maximum(ops.cnt[i], 1))
        holds = same & (bll >= share * tot) & (bl >= s.blame_min_share)
        blamed = holds & (late == self.b_blr[bi]) & (spread > s.slow_min_excess_s) & (this >= s.blame_min_share)
        # neutral only within culprit_confirm_s of the last blamed op: after the slowdown ends, the ops count
        # towards its end again while the averages decay
        t = ops.first_now[i]
        other = (late != self.b_blr[bi]) & ~hist  # another rank last, and no baseline says the op was slow
        neutral = holds & ~blamed & ((this < s.blame_min_share) | other) & (t - self.b_blast[bi] < s.culprit_confirm_s)
        self.b_blast[bi] = np.where(blamed, np.maximum(self.b_blast[bi], t), self.b_blast[bi])
        return blamed, neutral

    def _call_interval(self, bi: I64) -> F64:
        """Seconds between two calls of the communicator of each baseline of ``bi`` (per op sequence number,
        over the baseline's last ``CADENCE_OPS`` ops on comm rank 0's clock, as ``cost``); inf: unknown."""
        t, q = self.r_t0[bi], self.r_seq[bi]
        ok = ~np.isnan(t) & ~np.isnan(q)
        rows = np.arange(bi.size)
        # one rank's clock runs forward within a communicator's life: the first and last op span the calls
        first = np.where(ok, q, np.inf).argmin(axis=1)
        last = np.where(ok, q, -np.inf).argmax(axis=1)
        dq = q[rows, last] - q[rows, first]
        dt = t[rows, last] - t[rows, first]
        good = (ok.sum(axis=1) >= 2) & (dq > 0) & (dt > 0)
        return np.where(good, dt / np.where(good, dq, 1.0), np.inf)

    def _siblings(self, js: JobState) -> None:
        """For each baseline, the healthy kernel time (``b_min``) of the communicators of the job with
        the same op signature and size, and how many there are. A send/recv pair only among the pairs
        between two hosts (network links): one inside a node moves the same bytes over a link 10x
        faster, and over paths that differ from pair to pair; one whose hosts are not known yet may be
        either.

        The reference is their lower quartile, not their median: one slow link slows more than one of
        them (both directions of a pipeline pair, every communicator through a slow NIC), and in a
        small job that is half of them: two of four send/recv pairs of a real gloo job over one shaped
        link (96 and 49 ms against 0.4 ms healthy) put the median at 25 ms, where the 49-ms direction
        was not slow and the other only now and then (named after 20-55 s, test_net_links [start])."""
        p2p = np.isin(self.b_sig >> 60 & 0xF, _P2P)
        net, local = self._network_pairs(js, p2p)
        # pairs inside one node are compared among themselves (a pipeline whose stages share a node, an
        # NVLink slow from the first step: any-3d-S3-96-047 of heldout-any-4), on kernel-timed sources
        # only: a CPU-timed transport's loopback pairs (gloo on one host) differ by the scheduler's slices
        local &= not js.cpu_wait
        # an all_to_all whose late arriver is the same expert op after op is no longer learned (STREAK_OPS):
        # a straggling expert slow from its first step leaves its baseline with the few ops before its
        # streak, and those are enough for its own kernel time (which holds no waiting) against the other
        # expert groups' (an expert link at 34 % from the start: 1.03 ms against 0.35 on every other pair)
        a2a = (self.b_sig >> 60 & 0xF) == ALL_TO_ALL
        least = self.s.baseline_min_ops
        grown = (self.b_n >= least) | (a2a & (self.b_n >= 2) & (self.b_seen >= least))
        ok = grown & (~p2p | net | local)
        self.b_sibn[:] = 0
        idx = np.flatnonzero(ok)
        if idx.size < 2:
            return
        size = js.c_size[self.b_cid[idx]] * 2 + local[idx]  # the link's kind, a key of its own
        o = np.lexsort((self.b_min[idx], size, self.b_sig[idx]))
        idx, size = idx[o], size[o]
        sig = self.b_sig[idx]
        start = np.concatenate([[True], (sig[1:] != sig[:-1]) | (size[1:] != size[:-1])])
        first = np.flatnonzero(start)
        cnt = np.diff(np.append(first, idx.size))
        grp = np.cumsum(start) - 1
        vals = self.b_min[idx]
        self.b_sib[idx] = vals[first + (cnt - 1) // 4][grp]  # the lower quartile (nearest rank)
        # two siblings (two tensor-parallel groups of an 8-GPU job): each is judged against the other
        # (their mean would sit halfway to the slow one)
        two = cnt[grp] == 2
        other = np.where(start, np.arange(idx.size) + 1, np.arange(idx.size) - 1)
        self.b_sib[idx[two]] = vals[other[two]]
        self.b_sibn[idx] = cnt[grp]

    def _link_has_peers(self, js: JobState, cid: int, crank: int) -> bool:
        """The link from comm rank ``crank`` to its ring successor has another link of its kind in the ring of
        ``cid`` to be judged against: both ends on one host (NVLink) or on two (the network); False while a
        member's host is unknown. A ring over 4-GPU nodes has its network links as each other's peers, an
        8-GPU node's tensor ring its NVLink ones."""
        hosts = js.m_host[js.members_of(cid)]
        if hosts.size < 2 or (hosts < 0).any():
            return False
        cross = hosts != np.roll(hosts, -1)  # link i -> i+1 leaves its host
        return int((cross == cross[crank]).sum()) >= 2

    def _pinned(self, js: JobState, ops: OpRows, i: I64, bi: I64) -> npt.NDArray[np.bool_]:
        """Per op ``i`` (of baselines ``bi``): its ring's in-flight samples found the largest backlog before
        the same member ``slow_link_pinned_ops`` sampled ops in a row (counted here), that member's link has
        another of its kind in the ring (``_link_has_peers``), and that member holds ``culprit_share`` of
        all the backlog its communicator's samples
        ever saw (``_backlog_rank``): one link's, not the in-flight data every link of a healthy ring
        shows alike (where the largest of equal backlogs is the same member each time)."""
        lagr = np.where(ops.lag[i] > 0, ops.lagr[i], -1)
        seen = lagr >= 0
        pinn = np.where(seen, np.where(lagr == self.b_pin[bi], self.b_pinn[bi] + 1, 1), self.b_pinn[bi])
        self.b_pin[bi] = np.where(seen, lagr, self.b_pin[bi])
        self.b_pinn[bi] = pinn
        need = self.s.slow_link_pinned_ops
        pinned = seen & (pinn >= need) & np.isin(ops.op_type[i], _RING) & (need > 0)
        for k in np.flatnonzero(pinned).tolist():
            cid = int(ops.cid[i[k]])
            top = self._backlog_rank(js, cid)
            pinned[k] = (top is not None and top[0] == int(lagr[k]) and self._link_has_peers(js, cid, top[0])
                         and top[1] >= self.s.culprit_share)
        return pinned

    def _network_pairs(self, js: JobState, p2p: npt.NDArray[np.bool_]
                       ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        """Of the baselines marked ``p2p``, those of two-rank communicators whose ranks are on two
        different known hosts, and those whose ranks are on one known host."""
        out, local = np.zeros(self.nb, dtype=bool), np.zeros(self.nb, dtype=bool)
        bi = np.flatnonzero(p2p)
        if bi.size == 0:
            return out, local
        cid = self.b_cid[bi]
        off = js.c_off[cid]
        two = js.c_size[cid] == 2
        h0 = js.m_host[off]
        h1 = js.m_host[np.where(two, off + 1, off)]
        known = two & (h0 >= 0) & (h1 >= 0)
        out[bi] = known & (h0 != h1)
        local[bi] = known & (h0 == h1)
        return out, local

    def _relearn(self, lb: I64, now: F64, own: npt.NDArray[np.bool_]) -> None:
        """Baselines of ``lb`` from their recent healthy ops: medians, and median absolute deviations.

        Medians, not running means: a first op that took a second (NCCL set-up, a compile), or a GC
        pause on one rank of sixteen every few steps, moves a median not at all, while each one
        would lift a mean and its deviation, and with them the slow threshold, until a real 2x
        slowdown fits inside the noise band. The window follows a job's phases within
        ``baseline_ops`` ops.
        """
        hx, hn = self.h_max[lb], self.h_min[lb]
        k = np.minimum(self.b_n[lb], hx.shape[1])  # filled entries per row (nan sorts last)
        sx, sn, ss = np.sort(hx, axis=1), np.sort(hn, axis=1), np.sort(hx - hn, axis=1)
        bmax, bmin = _quantile(sx, k, 0.5), _quantile(sn, k, 0.5)
        self.b_max[lb], self.b_min[lb] = bmax, bmin
        self.b_spr[lb] = _quantile(ss, k, 0.5)
        self.b_dev[lb] = _quantile(np.sort(np.abs(hx - bmax[:, None]), axis=1), k, 0.5)
        self.b_devmin[lb] = _quantile(np.sort(np.abs(hn - bmin[:, None]), axis=1), k, 0.5)
        self.b_hmax[lb] = _quantile(sx, k, HIGH_Q)
        self.b_hmin[lb] = _quantile(sn, k, HIGH_Q)
        self.b_hspr[lb] = _quantile(ss, k, HIGH_Q)
        self.b_hlgap[lb] = _quantile(np.sort(self.h_lgap[lb], axis=1), k, HIGH_Q)
        # own-work ops (``own``: a ring of healthy ops since the warm-up) keep their top mode for MODE_HOLD_S
        o = lb[own]
        if o.size:
            t = now[own]
            renew = (self.b_hspr[o] >= self.e_hspr[o]) | (t - self.e_t[o] >= MODE_HOLD_S)
            for top, env in ((self.b_hmax, self.e_hmax), (self.b_hspr, self.e_hspr), (self.b_hlgap, self.e_hlgap)):
                env[o] = np.where(renew, top[o], env[o])
                top[o] = np.maximum(top[o], env[o])
            self.e_t[o] = np.where(renew, t, self.e_t[o])

    def alarmed(self, touched: I64) -> I64:
        """Baselines (of ``touched``) whose window has held enough slow ops for ``slow_confirm_s``.

        Time is the job's own (the newest op of the window), so a burst of late ops that is over
        within seconds (an evaluation phase, a few GC pauses in a row) never alerts, while any
        slowdown that lasts does, ``slow_confirm_s`` later, or at once when its slow ops already
        lie that far apart.
        """
        if touched.size == 0:
            return touched
        ws = self.w_slow[touched]
        hit = ws.sum(axis=1) >= self.s.slow_min_ops
        now = self.w_now[touched]
        newest = now.max(axis=1)
        since = self.b_since[touched]
        since = np.where(hit, np.where(np.isnan(since), newest, since), np.nan)
        self.b_since[touched] = since
        lead = np.where(hit, _lead(ws, self.w_late[touched]), -1)
        old = self.b_lead_since[touched]
        self.b_lead_since[touched] = np.where(
            lead >= 0, np.where((lead != self.b_lead[touched]) | np.isnan(old), newest, old), np.nan)
        self.b_lead[touched] = lead
        # ops seconds apart (a step's gradient sync) already span the time in the window itself
        span = newest - np.where(ws, now, np.inf).min(axis=1)
        c = self.s.slow_confirm_s
        return touched[hit & ((newest - since >= c) | (span >= c))]

    def alarmed_for(self, bi: int) -> float:
        """How long (job time) the window of ``bi`` has been alarmed; 0 when it is not."""
        since = float(self.b_since[bi])
        return 0.0 if np.isnan(since) else float(self.w_now[bi].max()) - since

    def late_for(self, bi: int, crank: int) -> float:
        """How long (job time) comm rank ``crank`` has been the alarmed window of ``bi``'s leading late
        arriver without a break, or how far apart its slow ops in the window lie, whichever is longer
        (ops seconds apart, as in ``alarmed``); 0 when it does not lead."""
        if int(self.b_lead[bi]) != crank:
            return 0.0
        now = self.w_now[bi]
        mine = self.w_slow[bi] & (self.w_late[bi] == crank)
        span = float(now.max()) - float(now[mine].min()) if mine.any() else 0.0
        since = float(self.b_lead_since[bi])
        return max(span, 0.0 if np.isnan(since) else float(now.max()) - since)

    def findings(self, js: JobState, bi: int) -> list[SlowFinding]:
        """The slow findings of one alarmed baseline: none without a consistent culprit, one for a
        single cause, two (S1 and S2) when a late arriver and a slow link are different ranks.

        The class comes from two components, each judged on its own over the slow ops of the
        window (a majority of them must show it): *comm* - the last arriver's own kernel time,
        which holds no waiting, grew past its baseline; *comp* - the arrival spread grew and the
        late arriver computed longer than its peers (else it is a victim of another op). Both on
        one rank (its compute and its outgoing link): S3 naming the rank and the link. P is
        reported as evidence and decides only when neither component is clear on its own.
        The window is a handful of ops, so plain Python on lists is cheaper than numpy here.
        """
        s = self.s
        idx = [j for j, x in enumerate(self.w_slow[bi].tolist()) if x]
        n_slow = len(idx)
        if n_slow == 0:
            return []
        # slow only against the peers (no baseline says so): a noisy machine makes one rank late in a
        # burst of ops (a descheduled process), so such a window must hold twice as long, and below
        # the culprit's excess must hold over its median op too, not only op by op
        peer_only = sum(bool(self.w_peer[bi, j]) for j in idx) * 2 > n_slow
        # the late arriver keeps its peers waiting (_blame): its compute gap against theirs was checked op
        # by op where it told, and it owes a share of the time; the window's median gaps say nothing where
        # they span other ops' waits (its own slow send before a data-parallel bucket, sampled ops)
        blamed = sum(bool(self.w_blame[bi, j]) for j in idx) * 2 > n_slow
        if peer_only and self.alarmed_for(bi) < 2 * s.slow_confirm_s:
            return []
        p = _median([float(self.w_p[bi, j]) for j in idx])
        need = (n_slow + 1) // 2
        comm = sum(bool(self.w_cslow[bi, j]) for j in idx) >= need
        comp = sum(bool(self.w_lslow[bi, j]) for j in idx) >= need
        if not comm and not comp:  # no component stands out alone: the paper's boundaries decide
            comm, comp = p < s.beta, p > s.alpha
        # the paper's boundaries also reveal a component that the job's noise hides from the
        # per-op test: most of the excess is late arrival (P >= beta), or none of it is (P <= alpha)
        comp = comp or p >= s.beta
        comm = comm or p <= s.alpha
        cid = int(self.b_cid[bi])
        cpu_share = None
        if js.cpu_wait:
            nows = [float(self.w_now[bi, j]) for j in idx]
            cpu_share = js.cpu_wait_share(js.m_grank[js.members_of(cid)].tolist(), min(nows), max(nows))
        # communication that runs on the host's CPUs (gloo, a NIC's proxy thread) is slow on every
        # link at once when other work holds those CPUs: while the members waited for a CPU that
        # long, the slowness is the host's load, not a link, and no S2 is reported for it
        starved = comm and cpu_share is not None and 0 < s.starved_wait_share <= cpu_share
        # Below starvation, a contended host still delays a transport that runs on its CPUs, by a
        # scheduler's time slice at a time: a 0.1-ms loopback send that takes 0.4 ms once in a 100-ms
        # step is 4x slower by every per-op test and costs the job 0.3 % (test_long_real_job in CI: the
        # same-host pair 1->0, 0.34-1.3 ms against 0.44 ms in 4 of 5 ops, its host stalled 9 % of
        # the time). Measured so, a slowdown that cheap cannot be told from the contention; a slow
        # link costs a share of every step (the shaped veth of test_net_links: half of each step).
        # Kernel-timed sources (the probe, the simulator) measure no CPU stalls and are not held.
        # On a host that measured no contention to speak of, a time slice is still the resolution of a
        # CPU-timed transfer: a wake-up waits for whatever else runs (the 32-KB loopback send of that job, its
        # host stalled 4.9 % of the time: 30 us more a call in 4 of 5 ops, 0.03 % of its time), so a slowdown
        # that cheap and shorter than host_timed_min_extra_s a call is held on any measured host.
        extra = self.extra_per_call(bi, idx)
        cost = self.cost(bi, extra)
        cheap = comm and not starved and cpu_share is not None and self._cheap(cost, cpu_share, extra)
        if starved:
            self.held_starved += self._new_episode(self._held, bi)
        if cheap:
            self.held_cheap += self._new_episode(self._held_cheap, bi)
        if starved or cheap:
            if not comp:
                return []
            comm = False
        lateness = _median([float(self.w_spr[bi, j]) for j in idx])
        late: int | None = None  # comm rank of the late arriver that computed slowly
        late_share = 0.0
        if comp:
            votes = [int(self.w_late[bi, j]) for j in idx if self.w_late[bi, j] >= 0]
            if votes:
                cr = max(set(votes), key=lambda v: (votes.count(v), -v))
                late_share = votes.count(cr) / n_slow
                # what it computed is judged on the ops it was last in: another member's gap says nothing
                # about it (a pipeline pair whose receiver is late now and then, behind the slow stage
                # upstream: the median over all the slow ops took the receiver's longer gaps for the
                # sender's, and named a stage downstream of the slow one)
                mine = [j for j in idx if int(self.w_late[bi, j]) == cr]
                op_type = int(self.b_sig[bi] >> 60 & 0xF)
                own_op = bool(own_work(self.b_sig[bi : bi + 1])[0])
                if own_op:
                    # a send/recv pair's two ranks do different work (a pipeline stage sends what it
                    # computed to one that waits for it; an all_to_all's experts, on what the router sent
                    # each): the late one always "computed longer" than its
                    # peer, so it is judged against its own healthy compute here; a sender that arrives
                    # late because it waited inside another op (a paused tensor-parallel peer) computed
                    # no longer than usual and is a victim
                    # the lower median: of two ops, one may hold a one-off pause that the healthy pace never
                    # saw (a healthy pipeline's 760-ms stall beside a normal gap averaged to a slow stage)
                    extra = _lower_median([float(self.w_sgap[bi, j]) for j in mine])
                    # ... by a clear share of it, as against peers below: a receiver behind a slow pipeline
                    # link arrives a few hundred us later than before as the schedule shifts around it, its
                    # compute gap 1-2 % longer, and is no slow rank (the link is the pair's finding)
                    ok = extra >= max(s.culprit_gap_share * lateness, s.culprit_gap_ratio * float(self.b_hlgap[bi]),
                                      s.slow_min_excess_s)
                else:
                    # victims are not culprits: the late rank must have computed longer than its peers
                    extra = _median([float(self.w_lgap[bi, j] - self.w_ogap[bi, j]) for j in mine])
                    ogap = _median([float(self.w_ogap[bi, j]) for j in mine])
                    # ... by a clear share of what its peers computed: a rank that computed 8 % longer than
                    # its peers is jitter, whatever the lateness it caused on a us-scale op
                    # (a blamed window's late arriver proved it op by op, where its gap told: _blame)
                    # ... or, where its history says the op got slow, clearly longer than they did, as _blame
                    # owes it: a pipeline stage 4x slower is late at its data-parallel op by every micro-batch
                    # of the step (450 ms), its last compute before it 105 ms against its peer's 27
                    # (heldout-any-5's any-pp-S1-8-068). Not against the peers alone: the stages of a pipeline
                    # meet at a world all-reduce after different work (the first stage computed 20 ms, the
                    # last waited in its receives), and the first is last there from the first step, healthy
                    clearly = not peer_only and bool(_computed_clearly_longer(extra, ogap, s))
                    ok = blamed or clearly or extra >= max(s.culprit_gap_share * lateness, s.culprit_gap_ratio * ogap,
                                                           s.slow_min_excess_s)
                # Ranks that share a host short of CPUs compute at the scheduler's pace: one that got less
                # CPU than its peers is last op after op with nothing wrong with it (the healthy real job
                # restarted on a busy 2-core machine: rank 2 computed 72.5 ms against 58.8, its host
                # stalled 14 % of the time). With no healthy pace of its own to judge by, such a rank must
                # have computed clearly longer than they did; keeping them waiting (the blame) is not enough
                busy = self._busy_shared_host(js, bi, cid, cr, idx) if peer_only or not own_op else None
                if peer_only or busy is not None:  # the gaps' medians, for the two tests below that read them
                    lg = _median([float(self.w_lgap[bi, j]) for j in mine])
                    og = _median([float(self.w_ogap[bi, j]) for j in mine])
                if peer_only and (not blamed or busy is not None):
                    ok = ok and bool(_computed_clearly_longer(lg - og, og, s))
                # ... and by more than the stalls can make it: a host stalled for CPUs a share w of the time
                # (PSI "some": at least one task waiting, so no task waits longer) stretches one rank's compute
                # against another's by up to 1 / (1 - w) (a healthy real DDP job's start beside two busy
                # loops: rank 2 computed 60.2 ms against 25.4, its host stalled 78 %) ... unless it keeps most
                # of its peers' waiting, far beyond the turns the scheduler gives each rank
                # (BLAME_DOMINANT_SHARE); measured only to +/- a poll's window (Flight Recorder on gloo), a
                # rank 2x slower in compute from its first step looked 1.6x, on a host stalled 44 %.
                # So too where its history says the op got slow: that history was learned before the host was
                # short of CPUs, and the window's gaps set the rank against peers that share its stalls (a
                # healthy real DDP job beside six busy loops: rank 0, which does a little more before each
                # broadcast, 200 ms late at it in 4 of 5 ops, its host stalled 73 %: an S1 in CI)
                if busy is not None:
                    ok = ok and (lg * (1.0 - busy) >= og * (1.0 + s.peer_gap_ratio)
                                 or self._dominant(bi, cr, js.members_of(cid)))
                # ... and, like a slow communication above, for what its lateness costs the job where the hosts
                # measured their CPU stalls: a rank late by a contended scheduler's time slice before a us-scale
                # op, once a step, is late by every per-op test and costs nothing (CI's healthy gloo job: the
                # sender of a loopback pair 232 us late after its all-reduce in 4 of 5 of its 100-ms steps, its
                # host stalled 12 %: an S1). A slow rank's lateness is a share of every step.
                if ok and cpu_share is not None:
                    own_wait = self._own_cpu_wait(js, bi, idx, int(js.m_grank[js.members_of(cid).start + cr]))
                    if self._cheap(self.cost(bi, lateness), max(cpu_share, own_wait or 0.0), lateness):
                        ok = False
                        self.held_cheap += self._new_episode(self._held_cheap, bi)
                need_share = s.culprit_share
                if op_type == ALL_TO_ALL:
                    # of the window's ops, not only its slow ones: a straggling expert is last at every op
                    # of its (dispatch or combine) window, a loaded one at some, while other slowness (a
                    # slow link, a peer's wait) keeps the window alarmed
                    need_share = s.all_to_all_culprit_share
                    late_share = votes.count(cr) / max(n_slow, int((self.w_seq[bi] >= 0).sum()))
                elif not own_op and int(js.c_size[cid]) == 2:
                    need_share = s.pair_culprit_share
                if late_share >= need_share and ok:  # (nan, no baseline of its own yet: not ok)
                    # repeated counting is about the rank named: a window kept alarmed by other late
                    # arrivers (GC pauses rotating over the ranks, a victim of another stage) confirms
                    # nothing about the rank that leads it now; it must lead for culprit_confirm_s
                    # itself (and at least twice slow_confirm_s slow only against its peers, as
                    # above), else a burst of its own GC or data-loader pauses, a few seconds long,
                    # would alert. Wait rather than report the communication alone now and change the
                    # class later.
                    need_s = max(s.culprit_confirm_s, s.slow_confirm_s * (2 if peer_only else 1))
                    if self.late_for(bi, cr) < need_s:
                        return []
                    late = cr
        if comm and comp and late is None and p > s.alpha and (
                sum(bool(self.w_cslow[bi, j]) for j in idx) < s.slow_min_ops):
            # the late arrivals that filled the window have no culprit (victims of another op, or no
            # consistent rank): the communication itself must be slow in slow_min_ops of the window's
            # ops on its own (repeated counting), not in half of the slow ops those arrivals made; a
            # few heavy-tailed transfers among them are jitter (fa-1-0038 of benchmarks/false_alarms.py)
            return []
        link_src: int | None = None  # comm rank whose send backlog builds (-1: not observable)
        link_share = 1.0
        unobserved = False  # a counter source that never caught the backlog (else: no counters at all)
        sender = self._p2p_sender(js, cid) if comm else None
        if sender is not None:
            # a send/recv pair has one link, and data flows from the sender: the receiver's counters run
            # ahead of its (zero) SendCount whatever the link does, so the backlog cannot name the source
            link_src = sender
        elif comm:
            votes = [int(self.w_lagr[bi, j]) for j in idx if self.w_lagr[bi, j] >= 0]
            if votes:
                cr = max(set(votes), key=lambda v: (votes.count(v), -v))
                link_share = votes.count(cr) / len(votes)
                if link_share >= s.culprit_share:
                    link_src = cr
            elif js.c_counters[cid] and (backlog := self._backlog_rank(js, cid)) is not None:
                # ops too short for a counter sample inside a judged op (a sampling source, ms ops):
                # the member where the in-flight samples of this communicator saw data pile up
                link_src, link_share = backlog
            else:
                # No link named. A counter source whose polls never caught one of these ops in flight
                # (us-scale ops between 100-ms polls) waits for a sample rather than report the late
                # arriver alone (or nothing about the link) and change the class later; without counters
                # (torch.distributed on gloo, Flight Recorder) none will come. Either way, a slowdown
                # whose link stays unnamed is the only evidence, so it must last: alarmed for
                # slow_link_wait_s, and the communication slow in every op judged in that time. A
                # ms-scale gloo all-reduce on a busy host is slow on every rank in 3 or 4 of 5 ops for
                # seconds, or for a minute on end (the worker and broker beside a 4-rank job on 2 CPUs:
                # the healthy MoE job of test_net_links, test_long_real_job in CI), but some op between
                # is never slow; a slow link slows every one. Then the class is known, the link is not:
                # say so rather than stay silent. Without counters a named late arriver need not wait.
                counters = bool(js.c_counters[cid])
                steady = float(self.w_now[bi].max()) - float(self.b_cfast[bi]) >= s.slow_link_wait_s
                if (self.alarmed_for(bi) < s.slow_link_wait_s or not steady) and (counters or late is None):
                    return []
                link_src, unobserved = -1, counters
        if late is None and link_src is not None and link_src >= 0 and sender is None:
            # The link's own sender may also compute slowly, a share that the slow link's longer ops hide:
            # a rank 1.4x slower in compute is a few ms late at a data-parallel bucket that its slow link
            # stretched by 60 ms, no slow op by the op's time (P near 0), yet the others wait for it, and
            # it computed longer than they did, op after op. Then both parts are its own: S3 (the
            # any-shape draws' dp-zero S3 jobs were S2 before: a 1.39x rank whose link ran at 49 %)
            # ... and it must be so at every evaluation for culprit_confirm_s: a rank behind a slow NIC
            # whose pipeline sends it also slows is last with a longer gap now and then, never for long
            share = self._hidden_compute(bi, idx, link_src)
            now = float(self.w_now[bi].max())
            if share is None:
                self._hidden.pop(bi, None)
            else:
                was, since = self._hidden.get(bi, (link_src, now))
                since = since if was == link_src else now
                self._hidden[bi] = (link_src, since)
                if now - since < s.culprit_confirm_s:
                    return []  # the class is known once the rank has kept them waiting that long
                late, late_share = link_src, share
        if late is not None and link_src is not None and link_src >= 0 and link_src != late and sender is None:
            # Data piled up before the late arriver itself: a network transport's sender waits for its
            # receiver's buffers, so the rank upstream of a late one receives and cannot pass on until it
            # arrives (NCCL's proxy steps, as the profiler plugin counts them). While the op's own kernel
            # time did not grow, that backlog is the lateness's shadow, not a slow link into it.
            size = js.members_of(cid).stop - js.members_of(cid).start
            own = _median([float(self.w_tmin[bi, j]) for j in idx]) - float(self.b_hmin[bi])
            grew = own > max(s.slow_min_excess_s, (s.slow_factor - 1) * float(self.b_min[bi]))
            if int(self.b_sig[bi] >> 60 & 0xF) in RING_OPS and (link_src + 1) % size == late and not grew:
                link_src = None
        if late is None and link_src is not None and sum(
                bool(self.w_cslow[bi, j]) or float(self.w_p[bi, j]) <= s.alpha for j in idx) < s.slow_min_ops:
            # a link named alone is counted on the ops that show slow communication (its own time grew, or
            # P says so), not on ops some rank was merely late in: a healthy pipeline send 1.3-1.4x its
            # baseline in two ops of five and one late arrival between them is jitter (fa-35-0002 of
            # benchmarks/false_alarms.py --any-shape), a slow link is slow op after op
            return []
        mk = functools.partial(self._finding, js=js, bi=bi, idx=idx, p=p, lateness=lateness, unobserved=unobserved,
                               cpu_share=cpu_share, cost=cost,
                               pair=sender is not None)
        if late is not None and link_src is not None and link_src in (late, -1):
            return [mk(AnomalyKind.S3, late, late_share, link=link_src >= 0)]
        out = []
        if late is not None:
            out.append(mk(AnomalyKind.S1, late, late_share, link=False))
        if link_src is not None:
            out.append(mk(AnomalyKind.S2, link_src, link_share, link=True))
        return out

    def _hidden_compute(self, bi: int, idx: list[int], crank: int) -> float | None:
        """The share of the arrival spread of ``bi``'s slow ops ``idx`` that comm rank ``crank`` holds, when
        it holds ``culprit_share`` of it and computed longer than its peers before those ops by
        ``culprit_gap_share`` of its lateness and ``culprit_gap_ratio`` of their compute (the lower middle
        of the ops whose gaps were measured); None otherwise, or where the members' work differs.

        The spread is weighted, not counted: a data-parallel ring's first op after a long gap (an optimizer
        step, another communicator's ops) has a last arriver by a few jittered hundred us, and the slow
        rank is last by ms only at the ops whose gaps are its compute."""
        s = self.s
        if bool(own_work(self.b_sig[bi : bi + 1])[0]):
            return None
        spr = {j: max(float(self.w_spr[bi, j]), 0.0) for j in idx}
        tot = sum(spr.values())
        mine = [j for j in idx if int(self.w_late[bi, j]) == crank]
        if tot <= 0 or not mine:
            return None
        share = sum(spr[j] for j in mine) / tot
        timed = [j for j in mine if self.w_lgap[bi, j] > 0 and self.w_ogap[bi, j] > 0]
        if share < s.culprit_share or not timed:
            return None
        extra = _lower_median([float(self.w_lgap[bi, j] - self.w_ogap[bi, j]) for j in timed])
        lateness = _lower_median([spr[j] for j in timed])
        og = _lower_median([float(self.w_ogap[bi, j]) for j in timed])
        ok = extra >= max(s.culprit_gap_share * lateness, s.culprit_gap_ratio * og, s.peer_min_excess_s)
        return share if ok else None

    def _cheap(self, cost: float, wait: float, extra: float) -> bool:
        """A slowdown timed on hosts that measure their CPU stalls (``wait``: the share of the time they were
        stalled) that costs the job too little to be told from them: under ``slow_min_cost_share`` of the time
        between the communicator's calls (``cost``), on a contended host or by less than a scheduler's time
        slice a call (``extra``, s)."""
        s = self.s
        return cost < s.slow_min_cost_share and (wait >= s.contended_wait_share or extra < s.host_timed_min_extra_s)

    def _new_episode(self, seen: dict[int, float], bi: int) -> int:
        """1 the first time ``bi``'s current alarm episode (the job time it became alarmed) is held for
        the reason whose episodes ``seen`` remembers, else 0: a held finding counts once per episode."""
        since = float(self.b_since[bi])
        if seen.get(bi) == since:
            return 0
        seen[bi] = since
        return 1

    def extra_per_call(self, bi: int, idx: list[int]) -> float:
        """The median extra kernel time (s) of ``bi``'s slow ops' last arriver over the healthy one (the
        baseline's, or its sibling communicators' where lower)."""
        ref = float(self.b_min[bi])
        if self.b_sibn[bi] >= 2:
            ref = min(ref, float(self.b_sib[bi]))
        comm = [j for j in idx if self.w_cslow[bi, j]] or idx
        return _median([max(float(self.w_tmin[bi, j]) - ref, 0.0) for j in comm])

    def cost(self, bi: int, extra: float) -> float:
        """What the slow communication of ``bi``'s window costs the job: ``extra`` (``extra_per_call``: its slow ops'
        last arriver's, pure communication; over the sibling communicators' where lower: a link slow from
        the start has learned its slowness) as a share of the time between the communicator's calls (a
        slow link slows each of them).

        That time is measured over the baseline's last ``CADENCE_OPS`` ops on one rank's clock (the
        analyzer's sees a batch of ops at once), per op sequence number (a sampling source reports one
        op in ten); the share is infinite while it is unknown."""
        per_call = float(self._call_interval(np.array([bi]))[0])
        return extra / per_call if np.isfinite(per_call) else float("inf")

    @staticmethod
    def _p2p_sender(js: JobState, cid: int) -> int | None:
        """The comm rank that sends, when ``cid`` is a two-rank send/recv pair (one sender); else None."""
        sl = js.members_of(cid)
        if sl.stop - sl.start != 2:
            return None
        ops = js.m_op[sl].tolist()
        if sorted(ops) != sorted(P2P_OPS):
            return None
        return ops.index(int(OpType.SEND))

    @staticmethod
    def _backlog_rank(js: JobState, cid: int) -> tuple[int, float] | None:
        """The comm rank with the largest accumulated send backlog and its share of all backlog."""
        sl = js.members_of(cid)
        lag = js.m_lagch[sl].sum(axis=1)
        total = float(lag.sum())
        if total <= 0:
            return None
        cr = int(np.argmax(lag))
        return cr, float(lag[cr]) / total

    def _dominant(self, bi: int, crank: int, members: slice) -> bool:
        """Whether comm rank ``crank`` holds the blame of ``bi`` with ``BLAME_DOMINANT_SHARE`` of its lateness
        and twice a fair share of it (a pair's ranks never do: half each is fair)."""
        tot = float(self.b_btot[bi])
        need = max(BLAME_DOMINANT_SHARE, 2.0 / max(members.stop - members.start, 1))
        return int(self.b_blr[bi]) == crank and tot > 0 and float(self.b_bll[bi]) >= need * tot

    def _busy_shared_host(self, js: JobState, bi: int, cid: int, crank: int, idx: list[int]) -> float | None:
        """How stalled for CPUs the late arriver's host was while the window's slow ops ran (PSI), where that host
        holds another member too and the share is at least ``contended_wait_share``; None elsewhere."""
        s = self.s
        sl = js.members_of(cid)
        hosts = js.m_host[sl]
        if s.contended_wait_share <= 0 or hosts[crank] < 0 or int((hosts == hosts[crank]).sum()) < 2:
            return None
        share = self._own_cpu_wait(js, bi, idx, int(js.m_grank[sl.start + crank]))
        return share if share is not None and share >= s.contended_wait_share else None

    def _own_cpu_wait(self, js: JobState, bi: int, idx: list[int], rank: int) -> float | None:
        """How starved of CPUs the late arriver's own host was while its slow ops ran (PSI; None where its
        source does not measure it): a rank whose host other processes hold computes slowly too, and the
        verdict must say so rather than only blame its GPU."""
        if not js.cpu_wait or rank < 0:
            return None
        nows = [float(self.w_now[bi, j]) for j in idx]
        return js.cpu_wait_share([rank], min(nows), max(nows))

    def _finding(
        self, kind: AnomalyKind, crank: int, share: float, *, link: bool, js: JobState, bi: int, idx: list[int],
        p: float, lateness: float, unobserved: bool, pair: bool = False, cpu_share: float | None = None,
        cost: float = float("inf"),
    ) -> SlowFinding:
        cid = int(self.b_cid[bi])
        sl = js.members_of(cid)
        size = sl.stop - sl.start
        culprit = int(js.m_grank[sl.start + crank]) if crank >= 0 else -1
        op_type = int(self.b_sig[bi] >> 60 & 0xF)
        if op_type in P2P_OPS and crank >= 0 and int(js.m_op[sl.start + crank]) in P2P_OPS:
            # a pair's signature is folded (send and recv are one op), so it names the send; say the
            # culprit's own side: a receiver that arrived last did so at its recv
            op_type = int(js.m_op[sl.start + crank])
        where = None
        channel = None
        if link and size >= 2 and crank >= 0:
            if op_type in RING_OPS:
                where = (culprit, int(js.m_grank[sl.start + (crank + 1) % size]))
            elif op_type in P2P_OPS and size == 2:
                where = (culprit, int(js.m_grank[sl.start + 1 - crank]))
            elif op_type == ALL_TO_ALL:
                # the culprit exchanges with every member: the link's other end is the member whose
                # in-flight samples received behind what it sent (the only other member of a pair)
                short = js.m_deficit[sl].copy()
                short[crank] = 0.0
                if size == 2 or short.max() > 0:
                    where = (culprit, int(js.m_grank[sl.start + (1 - crank if size == 2 else int(np.argmax(short)))]))
            lag = js.m_lagch[sl.start + crank]
            if lag.max() > 0:
                channel = int(np.argmax(lag))
        first = min(idx, key=lambda j: int(self.w_seq[bi, j]))
        granks = js.m_grank[sl]
        return SlowFinding(
            kind=kind,
            cid=cid,
            bidx=bi,
            seq=int(self.w_seq[bi, first]),
            op_type=op_type,
            culprit=culprit,
            culprit_crank=crank,
            link=where,
            channel=channel,
            p=p,
            share=share,
            n_slow=len(idx),
            lateness_s=lateness,
            tmin_s=_median([float(self.w_tmin[bi, j]) for j in idx]),
            tmax_s=_median([float(self.w_tmax[bi, j]) for j in idx]),
            base_s=float(self.b_max[bi]),
            base_min_s=float(self.b_min[bi]),
            onset_now=min(float(self.w_now[bi, first]), float(np.nan_to_num(self.b_onset[bi], nan=np.inf))),
            affected=tuple(granks[(granks >= 0) & (granks != culprit)].tolist()),
            link_unobserved=unobserved,
            peer_only=sum(bool(self.w_peer[bi, j]) for j in idx) * 2 > len(idx),
            late_gap_s=_median([float(self.w_lgap[bi, j]) for j in idx]),
            peer_gap_s=_median([float(self.w_ogap[bi, j]) for j in idx]),
            sibling_s=float(self.b_sib[bi]) if self.b_sibn[bi] >= 2 else 0.0,
            pair_link=pair and where is not None,
            cpu_wait_share=cpu_share,
            cost_share=cost,
            culprit_cpu_wait_share=self._own_cpu_wait(js, bi, idx, culprit) if kind != AnomalyKind.S2 else None,
        )

    def resolved(self, bi: int) -> bool:
        return int(self.b_okrun[bi]) >= self.s.slow_resolve_ops


def _peer_late(
    own: npt.NDArray[np.bool_], cnt: I64, late_gap: F64, peer_gap: F64, spread: F64, s: AnalyzerSettings,
) -> npt.NDArray[np.bool_]:
    """Ops whose last arriver computed clearly longer than the other members before it, and made them
    wait for it: slow against the peers, whatever a baseline says.

    Only collectives whose members do the same work (not ``own``), so their compute gaps compare; a send/recv
    pair's do not (one stage computes while the other waits for its output), nor an all_to_all's after the
    experts (each computes on what the router sent it: the most loaded is late, healthy). The excess must be a
    clear share of what the peers computed (``peer_gap_ratio``: jitter and one rank's logging stay
    below it), at least ``peer_min_excess_s``, and show up as lateness (half of it at least: a rank
    that computed longer but started earlier made nobody wait).
    """
    extra = late_gap - peer_gap
    coll = ~own & (cnt >= 2)
    return coll & _computed_clearly_longer(extra, peer_gap, s) & (spread >= s.culprit_gap_share * extra)


def _computed_clearly_longer(extra: A | float, peer_gap: A | float, s: AnalyzerSettings) -> Any:
    """The peer test itself: ``extra`` compute beyond the peers' ``peer_gap`` is at least
    ``peer_gap_ratio`` of it and ``peer_min_excess_s`` (per op, or over a window's medians)."""
    return extra >= np.maximum(s.peer_gap_ratio * peer_gap, s.peer_min_excess_s)


def _lead(slow: npt.NDArray[np.bool_], late: I64) -> I64:
    """Per window (row), the late arriver (comm rank) of most of its slow ops, the lowest on a tie,
    as ``findings`` votes; -1 where no slow op has one."""
    ok = slow & (late >= 0)
    votes = ((late[:, :, None] == late[:, None, :]) & ok[:, None, :]).sum(axis=2)
    score = np.where(ok, votes * (int(late.max(initial=0)) + 2) - late, -1)
    j = np.argmax(score, axis=1)
    return np.where(ok.any(axis=1), late[np.arange(late.shape[0]), j], -1)


def _quantile(sorted_rows: F64, k: I64, q: float) -> F64:
    """The ``q`` quantile of the first ``k[i]`` values of each sorted row (linear interpolation, as
    numpy's default); 0 for an empty row. ``nanquantile`` goes row by row in Python: 20x slower here."""
    pos = q * np.maximum(k - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(k - 1, 0))
    rows = np.arange(sorted_rows.shape[0])
    a, b = sorted_rows[rows, lo], sorted_rows[rows, hi]
    return np.where(k > 0, a + (pos - lo) * (b - a), 0.0)


def _lower_median(v: list[float]) -> float:
    """The middle value, or the lower of the two middle ones: never lifted by one outlier of two."""
    v = sorted(v)
    return v[(len(v) - 1) // 2] if v else 0.0


def _median(v: list[float]) -> float:
    v = sorted(v)
    n = len(v)
    if n == 0:
        return 0.0
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
