"""The cluster's view: which machines keep breaking jobs. Pure: verdicts in, per-host standing out.

An incident answers "what broke this job"; a machine whose GPU computes slowly or whose NIC flaps hurts
every job placed on it, and each job alone sees one incident. ``HostTracker`` takes the verdicts of every
job (in any order, repeats and later states of an incident included) and keeps, per incident, when it was
first reported, its job, and its latest class and root-cause hosts. Per host it then gives the incidents
it was root cause of within a window, by class and job, a score that halves every ``half_life_s``, and
whether it is a **drain candidate**: root cause in at least ``min_incidents`` incidents of one part of the
machine, of at least ``min_jobs`` different jobs, within ``window_s``. The parts (``PARTS``): its GPUs
(S1, H1: a rank that computes slowly or stops; S3 too), its network (S2, H3: a link or interface that is slow
or stops; S3 too) and its software (H2: a rank whose op differs). A broken part fails the same way job after
job; faults that strike machines at random spread over the classes, so counting per part keeps a good
machine that met three unrelated faults from looking like a bad one. One job's own bug, hitting the same
rank at every restart, is one job. Only root-cause hosts count, never the hosts of ranks that merely
waited; a NIC or link incident counts for the host the analyzer names (the host whose interface, or whose
sending rank, is slow). An incident that names more than ``max_hosts`` hosts blames no one machine: it is
listed for each, never counted toward a candidate. Used by ``ccld nodes``, the alert bridge
(``CcldHostSuspect``, the ``ccld_host_suspect_score`` gauge) and ``benchmarks/fleet.py``.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ccld.records import Verdict
from ccld.settings import Settings

DAY_S = 86_400.0
#: the parts of a machine and the classes that point at each (S3, a slow rank with a slow link, at both)
PARTS = {"gpu": frozenset({"S1", "H1", "S3"}), "network": frozenset({"S2", "H3", "S3"}), "software": frozenset({"H2"})}


@dataclass(frozen=True)
class FleetSettings:
    window_s: float = DAY_S  # incidents older than this are forgotten
    min_incidents: int = 4  # a candidate was root cause in at least this many incidents ...
    min_jobs: int = 2  # ... of at least this many different jobs, within the window
    half_life_s: float = DAY_S  # the score of an incident halves every half_life_s
    max_hosts: int = 2  # an incident naming more hosts than this blames no one machine

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.half_life_s <= 0 or self.min_incidents < 1 or self.min_jobs < 1 \
                or self.max_hosts < 1:
            raise ValueError(f"fleet settings out of range: {self}")


def _part(incs: list[HostIncident], st: FleetSettings) -> tuple[str, bool]:
    """The part most of ``incs`` point at, and whether that part (or another) meets the candidate rule."""
    best, best_n, met = "", 0, ""
    for part, kinds in PARTS.items():
        mine = [i for i in incs if i.kind in kinds]
        if len(mine) > best_n:
            best, best_n = part, len(mine)
        if not met and len(mine) >= st.min_incidents and len({i.job for i in mine}) >= st.min_jobs:
            met = part
    return (met, True) if met else (best, False)


def fleet_settings(settings: Settings) -> FleetSettings:
    """The tracker's rule from the ``fleet_*`` settings."""
    return FleetSettings(window_s=settings.fleet_window_days * DAY_S, min_incidents=settings.fleet_min_incidents,
                         min_jobs=settings.fleet_min_jobs, half_life_s=settings.fleet_half_life_h * 3600.0)


@dataclass
class HostIncident:
    incident_id: str
    job: str
    kind: str
    first_s: float  # when it was first reported (the analyzer's clock)
    hosts: tuple[str, ...]  # its root-cause hosts, as last reported
    evidence: str = ""


@dataclass(frozen=True)
class HostStanding:
    """One host's record within the window, as of ``now``."""

    host: str
    incidents: int  # counted toward a candidate (naming at most max_hosts hosts)
    jobs: int  # distinct jobs among them
    by_kind: dict[str, int]
    score: float
    candidate: bool
    part: str  # the part with the most incidents (the candidate's: the one that met the rule)
    first_s: float
    last_s: float
    spread: int = 0  # incidents naming more hosts: listed, not counted
    recent: tuple[HostIncident, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "candidate": self.candidate, "part": self.part, "score": round(self.score, 3),
                "incidents": self.incidents, "jobs": self.jobs, "by_kind": dict(sorted(self.by_kind.items())),
                "spread_incidents": self.spread, "first_s": self.first_s, "last_s": self.last_s,
                "recent": [{"incident_id": i.incident_id, "job": i.job, "kind": i.kind, "time_s": i.first_s,
                            "evidence": i.evidence} for i in self.recent]}  # fmt: skip


class HostTracker:
    """Per-incident memory of root-cause hosts; ``standings(now)`` per host (see the module doc)."""

    def __init__(self, settings: FleetSettings | None = None) -> None:
        self.settings = settings or FleetSettings()
        self.incidents: dict[str, HostIncident] = {}

    def observe(self, v: Verdict) -> None:
        """Take one verdict of any state; the first seen of an incident sets its time, the newest its claim."""
        self.observe_claim(v.incident_id, v.job, v.kind.value, tuple(v.root_cause_hosts), v.detected_time, v.evidence)

    def observe_claim(self, incident_id: str, job: str, kind: str, hosts: tuple[str, ...], t_s: float,
                      evidence: str = "") -> None:
        """``observe`` of a verdict's parts (the fleet benchmark replays them so)."""
        inc = self.incidents.get(incident_id)
        if inc is None:
            self.incidents[incident_id] = HostIncident(incident_id, job, kind, t_s, hosts, evidence)
            return
        if t_s < inc.first_s:  # read out of order (partitions, a replay): the earliest is the onset
            inc.first_s = t_s
        if hosts:  # a RESOLVED or CLOSED verdict repeats the claim; an empty one keeps it
            inc.kind, inc.hosts, inc.evidence = kind, hosts, evidence

    def observe_all(self, verdicts: Iterable[Verdict]) -> HostTracker:
        for v in verdicts:
            self.observe(v)
        return self

    def forget_before(self, t_s: float) -> None:
        """Drop incidents first reported before ``t_s`` (the window's start): memory stays bounded."""
        for iid in [i for i, inc in self.incidents.items() if inc.first_s < t_s]:
            del self.incidents[iid]

    def current(self, now_s: float) -> list[HostStanding]:
        """Forget what left the window, then the standings at ``now_s`` (a service's periodic view)."""
        self.forget_before(now_s - self.settings.window_s)
        return self.standings(now_s)

    def standings(self, now_s: float, *, window_s: float | None = None) -> list[HostStanding]:
        """Every host root cause of an incident in the window ending at ``now_s``: candidates first, then by
        score."""
        st = self.settings
        start = now_s - (st.window_s if window_s is None else window_s)
        per_host: dict[str, list[HostIncident]] = {}
        for inc in self.incidents.values():
            if inc.first_s >= start:  # one ahead of now_s too: the analyzer's clock may run ahead of ours
                for h in dict.fromkeys(inc.hosts):
                    per_host.setdefault(h, []).append(inc)
        out = []
        for host, incs in per_host.items():
            counted = [i for i in incs if len(set(i.hosts)) <= st.max_hosts]
            jobs = {i.job for i in counted}
            score = sum(0.5 ** (max(now_s - i.first_s, 0.0) / st.half_life_s) / len(set(i.hosts)) for i in counted)
            part, candidate = _part(counted, st)
            out.append(HostStanding(
                host=host, incidents=len(counted), jobs=len(jobs), by_kind=dict(Counter(i.kind for i in counted)),
                score=score, candidate=candidate, part=part,
                first_s=min(i.first_s for i in incs), last_s=max(i.first_s for i in incs),
                spread=len(incs) - len(counted), recent=tuple(sorted(incs, key=lambda i: -i.first_s)[:5]),
            ))  # fmt: skip
        return sorted(out, key=lambda h: (not h.candidate, -h.score, h.host))

    def candidates(self, now_s: float) -> list[HostStanding]:
        return [h for h in self.standings(now_s) if h.candidate]


#: what to check on a drained host, by the classes it was root cause of (docs/runbook.md, "Drain candidates")
CHECKS = {
    "H1": "the GPU and its process: Xid errors in the kernel log, nvidia-smi -q (ECC, retired pages), dcgmi diag -r 3",
    "H2": "the software: a node with another driver, CUDA, NCCL or framework version than its peers",
    "H3": "the NIC, cable and switch port: ibstat, perfquery or ethtool -S error counters, link flaps in the log",
    "S1": "the GPU's clocks and thermals (nvidia-smi -q -d CLOCK,PERFORMANCE,TEMPERATURE), dcgmi diag -r 3",
    "S2": "the NIC: link speed and width, error and retransmit counters (ethtool -S, perfquery), the cable",
    "S3": "both the GPU (clocks, thermals, dcgmi diag) and the NIC (counters, link speed)",
}


def drain_action(h: HostStanding) -> str:
    """The runbook's action for a candidate: drain it, then the checks of the classes it was root cause of."""
    checks = "; ".join(f"{k}: {CHECKS[k]}" for k in sorted(h.by_kind) if k in CHECKS)
    return (f"drain {h.host} (no new jobs; move the running ones when they can checkpoint), then check "
            f"{checks or 'the node'}; put it back after the checks pass")


def describe(h: HostStanding) -> str:
    """One line for a person: the host, whether to drain it, and why."""
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(h.by_kind.items(), key=lambda kv: (-kv[1], kv[0])))
    verdict = f"DRAIN CANDIDATE ({h.part})" if h.candidate else "watch"
    spread = f" (+{h.spread} naming several hosts)" if h.spread else ""
    return (f"{h.host}: {verdict}: root cause of {h.incidents} incidents{spread} in {h.jobs} jobs ({kinds or '-'}), "
            f"score {h.score:.2f}")


_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"s": 1.0, "": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 7 * 86_400.0}


def span_s(text: str) -> float:
    """``"7d"``, ``"12h"``, ``"90m"``, ``"3600"`` -> seconds (an argparse type: ``--since``)."""
    m = _SPAN.match(text)
    if m is None or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a span of time: {text!r} (e.g. 7d, 12h, 90m, 3600)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]
