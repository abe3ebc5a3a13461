"""One job incarnation (or one shard of its communicators) as the analyzer sees it; slow findings as candidates.

Holds the job's state (``JobState``), open ops, slow baselines, cached communicator diagnoses,
learned benign pauses, and applies the hang thresholds: a configured minimum per class, raised
by what the communicator has shown to be normal (its longest healthy op, and pauses of the
same shape that ended by themselves before).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ccld.records import AnomalyKind, Link, OpType
from ccld.streams.analysis.cadence import Cadence
from ccld.streams.analysis.hangs import CommDiag
from ccld.streams.analysis.incidents import ENDS, LINK_NOT_OBSERVED, NIC, Candidate
from ccld.streams.analysis.ops import OpTable
from ccld.streams.analysis.settings import AnalyzerSettings
from ccld.streams.analysis.slow import SlowDetector, SlowFinding
from ccld.streams.analysis.state import JobState

BARRIER = int(OpType.BARRIER)
#: A saved state searches 1/this of the communicators' step patterns (the worker saves every second).
CADENCE_SAVE_SPREAD = 30


@dataclass
class _Stall:
    start: float
    kind: AnomalyKind


class JobAnalysis:
    """Everything the analyzer keeps about one (job, incarnation)."""

    def __init__(self, job: str, incarnation: int, settings: AnalyzerSettings) -> None:
        self.job = job
        self.incarnation = incarnation
        self.s = settings
        self.js = JobState(job, incarnation)
        self.ops = OpTable(settings)
        self.slow = SlowDetector(settings)
        self.diag_cache: dict[int, tuple[float, CommDiag | None]] = {}
        self.stalls: dict[int, _Stall] = {}
        self.pauses: dict[int, list[float]] = {}
        self.restored_pauses: dict[str, list[float]] = {}
        self.cadence = Cadence(settings.cadence_ops)
        # rank -> (records its producers said were lost on the way, analyzer time of the newest such report)
        self.lost: dict[int, tuple[int, float]] = {}

    def note_lost(self, ranks: tuple[int, ...], records: int, now: float) -> None:
        """A batch said ``records`` ENTERED/DONE/IDLE records of ``ranks`` were lost before it."""
        for r in ranks:
            n, _ = self.lost.get(r, (0, now))
            self.lost[r] = (n + records, now)

    # -- learned normal behaviour --------------------------------------------------------------
    def known_sigs(self, cid: int) -> frozenset[int]:
        sel = (self.slow.b_cid == cid) & (self.slow.b_n > 0)
        # after a restart the baselines are empty but a restored cadence still lists the step's ops
        restored = self.cadence.restored.get(self.js.comm_hex(cid), ()) if self.cadence.restored else ()
        return frozenset(self.slow.b_sig[sel].tolist()).union(restored)

    def expected_sig(self, cid: int) -> Callable[[int], int | None]:
        """The signature the communicator's cadence predicts at a given op sequence (None: unknown)."""
        return lambda seq: self.cadence.expected(cid, seq, self.js.comm_hex(cid))

    def cadence_items(self, search: bool = True) -> list[tuple[str, list[int]]]:
        """The learned step patterns to save; each call searches a share of the communicators (a step's
        pattern changes rarely, and a saved one is only a fallback after a restart)."""
        return self.cadence.items_spread(self.js.n_comms, self.js.comm_hex, CADENCE_SAVE_SPREAD, search=search)

    def learn_pauses(self, diags: dict[int, CommDiag], now: float) -> None:
        """A stall that ended by itself is a pause this communicator may show again."""
        js = self.js
        for cid, st in list(self.stalls.items()):
            if cid in diags:
                continue
            del self.stalls[cid]
            resumed = float(js.c_progress_now[cid])
            if st.kind == AnomalyKind.H1 and resumed > st.start:
                mem = self.pauses.setdefault(cid, [])
                mem.append(resumed - st.start)
                del mem[: -self.s.pause_memory]
        for cid, d in diags.items():
            mark = float(js.c_progress_now[cid])
            cur = self.stalls.get(cid)
            if cur is None or cur.start != mark:
                self.stalls[cid] = _Stall(mark, d.kind)

    def pause_items(self) -> list[tuple[str, list[float]]]:
        return [(self.js.comm_hex(c), v) for c, v in self.pauses.items() if v]

    def threshold(self, kind: AnomalyKind, cid: int, op_type: int) -> float:
        s = self.s
        # each hang class names its threshold setting in the class table; a barrier waits longer by design
        setting = "barrier_hang_min_s" if kind == AnomalyKind.H1 and op_type == BARRIER else kind.info.threshold_setting
        base = float(getattr(s, setting or "h3_min_s"))
        thr = max(base, s.hang_op_factor * float(self.js.c_maxop_s[cid]))
        if kind == AnomalyKind.H1:
            mem = self.pauses.get(cid) or self.restored_pauses.get(self.js.comm_hex(cid))
            if mem:
                thr = max(thr, s.pause_tolerance * max(mem))
        return min(thr, s.hang_max_s)

    # -- candidates ----------------------------------------------------------------------------
    def hosts_of(self, ranks: tuple[int, ...]) -> tuple[str, ...]:
        """The hosts of ``ranks`` (each once, in the ranks' order; unknown ones left out)."""
        m = self.host_map(ranks)
        return tuple(dict.fromkeys(m[r] for r in ranks if r in m))

    def host_map(self, ranks: tuple[int, ...] | list[int]) -> dict[int, str]:
        """Global rank -> host, for those of ``ranks`` this job has seen a host for (one pass over the members)."""
        js = self.js
        if not ranks:
            return {}
        g = js.m_grank
        idx = np.flatnonzero((js.m_host >= 0) & np.isin(g, np.asarray(ranks, dtype=np.int64)))
        u, first = np.unique(g[idx], return_index=True)  # the first member row of each rank, as before
        return {int(r): js.host_names[int(js.m_host[idx[f]])]
                for r, f in zip(u.tolist(), first.tolist(), strict=True)}

    def resolution(self, comm: str, fam: str, val: int, op: str) -> str:
        """Evidence text when the finding ``(fam, val)`` (a candidate's resolve key) on communicator
        ``comm`` (its op named ``op``) is over, else ''."""
        js = self.js
        cid = js.comm_index.get(_signed(int(comm, 16)))
        if cid is None or cid >= js.c_size.shape[0]:
            return ""
        if fam == "hang":
            sl = js.members_of(cid)
            # a member finished the op (its DONE), or a heartbeat shows it idle after it or beyond it
            over = (js.m_seq[sl] > val) | ((js.m_seq[sl] == val) & js.m_done[sl])
            if bool((js.m_last_done[sl] >= val).any() or over.any()):
                return f"progress resumed: {op} #{val} completed"
            return ""
        bi = self.slow.lookup(np.asarray([cid]), np.asarray([val], dtype=np.int64), create=False)[0]
        if bi >= 0 and self.slow.resolved(int(bi)):
            return f"the last {self.s.slow_resolve_ops} {op} ops ran at their baseline again"
        return ""


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def dur(s: float) -> str:
    """A duration as a person reads it: 180 us, 2.4 ms, 1.25 s."""
    a = abs(s)
    if a < 1e-3:
        return f"{s * 1e6:.0f} us"
    if a < 1.0:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s" if a < 100 else f"{s:.0f} s"


def _no_link(f: SlowFinding) -> str:
    if f.link_unobserved:
        return (f"no counter poll caught one of these {dur(f.tmin_s)} ops in flight, so the slow link cannot be "
                "named yet")
    return "this source reports no per-channel send/recv counters, so the slow link cannot be named"


def _nic(ja: JobAnalysis, f: SlowFinding) -> dict[str, str]:
    """``{"nic": host}`` when the finding's link joins two hosts (a network link leaving ``host``)."""
    if f.link is None:
        return {}
    hm = ja.host_map(list(f.link))
    src, dst = hm.get(f.link[0]), hm.get(f.link[1])
    return {NIC: src} if src and dst and src != dst else {}


#: an unnamed slow communicator of more members than this says too little about where its link is
ENDS_MAX_RANKS = 64


def _ends(ja: JobAnalysis, f: SlowFinding) -> dict[str, str]:
    """``{"ends": "rank@host,..."}``: the two ends of the finding's link, or the members of a communicator
    slow as a whole whose link cannot be named, when they are on two hosts or more (the network: the
    incident book folds findings that share a host into that host's NIC, ``IncidentBook._shared_end``)."""
    if f.link is not None:
        ranks = list(f.link)
    elif f.kind == AnomalyKind.S2 and f.culprit < 0:
        g = ja.js.m_grank[ja.js.members_of(f.cid)]
        if g.size > ENDS_MAX_RANKS or (g < 0).any():
            return {}
        ranks = g.tolist()
    else:
        return {}
    hm = ja.host_map(ranks)
    if len(hm) < len(ranks) or len(set(hm.values())) < 2:
        return {}
    return {ENDS: ",".join(f"{r}@{hm[r]}" for r in ranks)}


def slow_candidate(ja: JobAnalysis, f: SlowFinding) -> Candidate:
    js = ja.js
    op = OpType(f.op_type).name.lower() if f.op_type in OpType._value2member_map_ else f"op{f.op_type}"
    n_of = f"{f.n_slow} of the last {ja.s.slow_window_ops} ops"
    late = (
        f"rank {f.culprit} arrived last at {op} in {n_of}, {dur(f.lateness_s)} after its peers, having computed "
        f"longer than they did"
    )
    where = f"link {f.link[0]}->{f.link[1]}" if f.link else f"rank {f.culprit}"
    backlog = f"send backlog builds at {where}{'' if f.channel is None else f' channel {f.channel}'}"
    if f.pair_link and f.channel is None:  # no counter said so: the pair has one link, from its sender
        backlog = f"a send/recv pair has one link, {where}, from its sender"
    comm = (
        f"its own kernel time, which holds no waiting, took {dur(f.tmin_s)} against {dur(f.base_min_s)} healthy"
    )
    # slow from the start: its own baseline learned the slowness; the sibling communicators did not
    base = f"baseline {dur(f.base_s)}"
    if f.peer_only and f.sibling_s > 0:
        comm = (f"its own kernel time, which holds no waiting, took {dur(f.tmin_s)} against {dur(f.sibling_s)} on "
                f"the sibling communicators running the same op, since its first ops")
        base = f"{dur(f.sibling_s)} on the sibling communicators running the same op, since its first ops"
    elif f.peer_only and f.kind == AnomalyKind.S2 and f.link is not None:
        # no sibling to compare with: its link against the communicator's other links of its kind (_pinned)
        base = ("slow since its first ops, so judged against its other links of the same kind: data piled up "
                "before this one op after op, before no other")
    starved = ""
    if f.culprit_cpu_wait_share is not None and f.culprit_cpu_wait_share >= ja.s.contended_wait_share:
        # a late arriver whose own host is short of CPUs: other processes on it may be why, not its GPU
        starved = (f"; its host was short of CPUs {f.culprit_cpu_wait_share:.0%} of the time while it was late "
                   f"(other processes on it): check what else runs there before its GPU")
    if f.kind == AnomalyKind.S1 and f.peer_only:
        roots: tuple[int, ...] = (f.culprit,)
        ev = (
            f"{late}: it computed {dur(f.late_gap_s)} before each of them against its peers' {dur(f.peer_gap_s)}, "
            f"so every op waits for it; judged against its peers, since this communicator has never run at a "
            f"healthy pace to learn from (slow from its first ops); P={f.p:.2f}"
        )
    elif f.kind == AnomalyKind.S1:
        roots = (f.culprit,)
        ev = (
            f"{late}: its own kernel time {dur(f.tmin_s)} while peers waited up to {dur(f.tmax_s)} "
            f"(baseline {dur(f.base_s)}); P={f.p:.2f}"
        )
    elif f.kind == AnomalyKind.S3:
        # mixed on one rank: it computes slowly *and* its outgoing link is slow; both are named
        roots = (f.culprit,) if f.link is None else (f.link[0], f.link[1])
        ev = f"mixed slowdown on rank {f.culprit}: {late}; and the communication is slow too: {comm}"
        ev += f"; {backlog}" if f.link else f" ({_no_link(f)})"
        ev += f"; P={f.p:.2f}"
    else:
        ev = f"{op} took {dur(f.tmin_s)}-{dur(f.tmax_s)} on every rank ({base}) in {n_of}"
        if f.culprit < 0:  # comm-slow without counters: the class is known, the link is not
            roots = ()
            ev += f": the communication itself is slow; {_no_link(f)}; P={f.p:.2f}"
        else:
            roots = (f.culprit,) if f.link is None else (f.link[0], f.link[1])
            ev += f"; {backlog}; P={f.p:.2f}"
    return Candidate(
        kind=f.kind,
        job=ja.job,
        incarnation=ja.incarnation,
        communicator=js.comm_hex(f.cid),
        op_seq=f.seq,
        op_type=op,
        root_cause_ranks=roots,
        affected_ranks=tuple(r for r in f.affected if r not in roots),
        confidence=round(min(1.0, f.share * f.n_slow / max(ja.s.slow_window_ops, 1)), 3),
        evidence=ev + starved,
        onset_time=f.onset_now,
        root_cause_hosts=ja.hosts_of(roots),
        link=None if f.link is None else Link(*f.link),
        channel=f.channel,
        p=f.p,
        details={"slow_ops": str(f.n_slow), "culprit_share": f"{f.share:.2f}",
                 **({"judged_against": "peers"} if f.peer_only else {}),
                 # how loaded the members' hosts were (their median CPU stall share, PSI), where it was measured
                 **({"cpu_wait_share": f"{f.cpu_wait_share:.2f}"} if f.cpu_wait_share is not None else {}),
                 # ... and the late arriver's own host alone (S1, S3): starved, it is slow for the job, not broken
                 **({"culprit_cpu_wait_share": f"{f.culprit_cpu_wait_share:.2f}"}
                    if f.culprit_cpu_wait_share is not None else {}),
                 # what a slow link's extra time costs the job: a share of the time between the op's calls
                 **({"cost_share": f"{f.cost_share:.3g}"} if f.kind != AnomalyKind.S1 and math.isfinite(f.cost_share)
                    else {}),
                 **({"link": LINK_NOT_OBSERVED} if f.link_unobserved else {}), **_nic(ja, f),
                 **_ends(ja, f)},
        resolve_key=("slow", int(ja.slow.b_sig[f.bidx])),
    )
