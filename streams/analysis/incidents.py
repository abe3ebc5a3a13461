"""Incidents: one verdict per incident, stable ids, updates, resolution and dedupe.

An incident is matched by (job, incarnation, family, root-cause ranks), family being "hang" or
"slow", so the same root cause seen again in another communicator (or after a restart) stays one
incident. Its id is a deterministic hash of job, incarnation, communicator, op sequence, family
and root ranks at first detection: replaying the same input gives the same id, and ids already
emitted (kept in ``state_dict``) are never emitted again.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ccld.records import FINDING_FIELDS, AnomalyKind, Finding, Link, Verdict, VerdictState

#: ``details["link"]`` of a slow verdict whose link no counter poll has caught yet.
LINK_NOT_OBSERVED = "not observed"
#: ``details["nic"]``: the host whose network interface a slow link leaves (set by the job stage on
#: a link between two hosts); ``details["nic_links"]``: a NIC incident's slow links, ``src>dst,...``
NIC = "nic"
NIC_LINKS = "nic_links"
#: ``details["ends"]``: where a slow finding's transfers run, ``rank@host,...``: the two ends of its link,
#: or the members of a communicator whose slow link cannot be named (jobview); in an incident, the ends
#: every finding folded into it shares (``IncidentBook._shared_end``)
ENDS = "ends"
#: ``details["slow_comms"]``: the communicators of the findings an incident folded by their shared end
SLOW_COMMS = "slow_comms"
#: ``details["slow_in"]``: the communicator whose unnamed slow exchange of two ranks made an S1 an S3
#: guess (``IncidentBook._pair_update``)
SLOW_IN = "slow_in"
#: a slowdown whose ranks all waited in a hang, begun while it stood or this soon after it ended, is its
#: aftermath (``IncidentBook._after_hang``)
HANG_SHADOW_S = 30.0


@dataclass(frozen=True, kw_only=True)
class Candidate(Finding):
    """A finding as the detectors produce it: a verdict's fields, plus what matching an incident needs."""

    incarnation: int
    resolve_key: tuple[str, int] = ("", 0)  # hang: ("hang", op_seq); slow: ("slow", signature code)

    @property
    def family(self) -> str:
        return self.kind.info.family.value

    @property
    def match_key(self) -> str:
        host = self.details.get("host")
        if host and self.family == "hang":
            # a host's incident (job_stage.merge_by_host): the host, however many of its ranks are named yet
            return f"{self.job}|{self.incarnation}|{self.family}|host:{host}"
        roots = self.root_cause_ranks
        if self.family == "slow" and not roots:
            # a slow communicator whose link cannot be named (yet): that communicator's incident; slow
            # sends of two pipeline pairs are two findings, not one incident switching between them
            return f"{self.job}|{self.incarnation}|{self.family}|comm:{self.communicator}"
        if self.family == "slow" and roots:
            # a slowdown is matched by its first root: the late arriver (S1), the rank whose link is
            # slow (S2) or both at once (S3), so S1 or S2 found to be S3 stays one incident
            roots = roots[:1]
        return f"{self.job}|{self.incarnation}|{self.family}|{','.join(map(str, roots))}"

    def incident_id(self) -> str:
        raw = (
            f"{self.job}|{self.incarnation}|{self.communicator}|{self.op_seq}|{self.family}|"
            f"{','.join(map(str, self.root_cause_ranks))}"
        )
        return hashlib.sha1(raw.encode()).hexdigest()[:16]

    def verdict(self, incident_id: str, state: VerdictState, now: float) -> Verdict:
        found = {name: getattr(self, name) for name in FINDING_FIELDS}
        found.update(confidence=round(self.confidence, 4), p=None if self.p is None else round(self.p, 4),
                     details=dict(self.details))
        return Verdict(incident_id=incident_id, state=state, detected_time=now, **found)


@dataclass
class Incident:
    """An open incident: its first candidate, the latest one, and when it was last reported.

    ``quiet_since``: the fault stopped then (analyzer clock; None while it is on). The incident resolves
    only after ``reopen_s`` of quiet: a fault that comes back on the same root cause within that time
    is another episode of this incident (``episodes``: when each began), not a new incident and a new page.
    """

    incident_id: str
    first: Candidate
    last: Candidate
    last_report: float
    affected_n: int = 0
    quiet_since: float | None = None
    quiet_evidence: str = ""
    episodes: list[float] = field(default_factory=list)
    #: what ends the episode now on: (communicator, family, value) of its finding; None: the first's
    ends_on: tuple[str, str, int] | None = None

    @property
    def ending(self) -> tuple[str, str, int]:
        """The key of the finding whose end ends this incident's current episode (``ShardReport.over``)."""
        return self.ends_on or (self.first.communicator, *self.first.resolve_key)

    def episode_details(self) -> dict[str, str]:
        if not self.episodes:
            return {}
        times = [self.first.onset_time, *self.episodes]
        return {"episodes": str(len(times)), "episode_times": ",".join(f"{t:.1f}" for t in times)}


class IncidentBook:
    """Open incidents and the ids already emitted (bounded)."""

    def __init__(self, resolved_memory: int, update_min_interval_s: float, reopen_s: float = 0.0) -> None:
        self.reopen_s = reopen_s  # an incident resolves after this long quiet; a fault back sooner is an episode
        self.open: dict[str, Incident] = {}
        self.emitted: OrderedDict[str, str] = OrderedDict()  # id -> "open" | "resolved" (resolved or closed)
        self.resolved_memory = resolved_memory
        self.update_min_interval_s = update_min_interval_s

    def report(self, c: Candidate, now: float) -> list[Verdict]:
        """Feed one detection; returns the OPEN or UPDATE verdict it causes, if any."""
        self._adopt_blind(c)
        if (pair := self._blind_pair(c)) is not None:
            return self._pair_update(pair, c, now)
        if self._behind_nic(c) or self._after_hang(c):
            return []
        inc = self.open.get(c.match_key) or self._same_nic(c)
        if inc is not None and inc.quiet_since is None and SLOW_COMMS in inc.last.details:
            # an incident folded by its shared end: a finding through that end again adds to it or is
            # nothing new; it never replaces the summary with one of its parts
            common = set(_ends(inc.last).values()) & set(_ends(c).values())
            if common:
                return self._ends_update(inc, common, c, now)
        if inc is not None and inc.quiet_since is None and _nic_of(c) and _nic_of(c) == _nic_of(inc.last):
            return self._nic_update(inc, c, now)
        if inc is None and (shared := self._shared_end(c)) is not None:
            return self._ends_update(*shared, c, now)
        if inc is not None and inc.quiet_since is not None:
            quiet, inc.quiet_since = inc.quiet_since, None
            if c.onset_time < quiet:
                # a part of this episode that began before its first part ended (an S3's link, slow on after
                # its compute part ended): the same episode goes on, and ends when this part does
                inc.ends_on = (c.communicator, *c.resolve_key)
                return []
            # the same root cause again within reopen_s: one more episode of this incident, not a new one
            inc.episodes.append(c.onset_time)
            c = _keep_class(inc.last, c)
            upd = replace(
                c, communicator=inc.first.communicator, op_seq=inc.first.op_seq, onset_time=inc.first.onset_time,
                resolve_key=inc.first.resolve_key, details={**c.details, **inc.episode_details()},
            )
            inc.last, inc.last_report, inc.affected_n = upd, now, len(c.affected_ranks)
            inc.ends_on = (c.communicator, *c.resolve_key)  # this episode ends when its own finding does
            return [upd.verdict(inc.incident_id, VerdictState.UPDATE, now)]
        if inc is not None:
            n = len(c.affected_ranks)
            grew = n >= max(inc.affected_n * 1.25, inc.affected_n + 1)
            # a more specific class (a link named, a mismatch seen) replaces a less specific one at once
            better = (c.kind.info.precedence > inc.last.kind.info.precedence
                      or (c.link is not None and inc.last.link is None))
            # S3 without a link was a guess (no poll had caught the slow link): once a link is named
            # elsewhere in the communicator, the late rank computes slowly and that is all (S1)
            better = better or (c.kind == AnomalyKind.S1 and inc.last.kind == AnomalyKind.S3
                                and inc.last.details.get("link") == LINK_NOT_OBSERVED
                                and SLOW_IN not in inc.last.details)
            mixed = mixed_slow(inc.last, c)
            if mixed is not None:  # its compute (one communicator) and its own link (another): S3
                c, better = mixed, True
            if better or (grew and c.kind.info.precedence == inc.last.kind.info.precedence
                          and now - inc.last_report >= self.update_min_interval_s):
                upd = replace(
                    c, communicator=inc.first.communicator, op_seq=inc.first.op_seq, onset_time=inc.first.onset_time,
                    resolve_key=inc.first.resolve_key,
                )
                inc.last = upd
                inc.last_report = now
                inc.affected_n = n
                return [upd.verdict(inc.incident_id, VerdictState.UPDATE, now)]
            return []
        iid = c.incident_id()
        seen = self.emitted.get(iid)
        if seen == "resolved":
            return []  # a replay of an incident already opened and closed
        self.open[c.match_key] = Incident(iid, c, c, now, len(c.affected_ranks))
        if seen == "open":
            return []  # emitted before a restart: adopt it silently
        self._remember(iid, "open")
        return [c.verdict(iid, VerdictState.OPEN, now)]

    def _adopt_blind(self, c: Candidate) -> None:
        """A slow link named at last takes over the open incident that reported its communicator slow
        with the link unknown (no counter sample had caught it yet): one incident, updated, not two."""
        if c.family != "slow" or c.link is None or c.match_key in self.open:
            return
        blind = replace(c, root_cause_ranks=()).match_key
        inc = self.open.get(blind)
        if inc is not None and inc.first.communicator == c.communicator:
            self.open[c.match_key] = self.open.pop(blind)

    def _blind_pair(self, c: Candidate) -> Incident | None:
        """The open slow incident of the same job whose first root is one end of ``c``, a communication slow
        between two ranks with its link not named yet (no counter poll caught it), where ``c`` is new.

        Between two ranks every link is one of theirs: the rank already found computing slowly (S1)
        whose exchange with the other is slow too is the mixed case (S3) until a poll names the link,
        not a second incident and a second page for the same two ranks."""
        ends = _ends(c)
        if c.family != "slow" or c.root_cause_ranks or c.link is not None or len(ends) != 2:
            return None
        mine = self.open.get(c.match_key)
        for inc in [mine] if mine is not None else self.open.values():
            first = inc.last.root_cause_ranks[:1]
            if (inc.quiet_since is None and inc.first.family == "slow" and first and first[0] in ends
                    and (inc.first.job, inc.first.incarnation) == (c.job, c.incarnation)):
                self.open[c.match_key] = inc
                return inc
        return None

    def _pair_update(self, inc: Incident, c: Candidate, now: float) -> list[Verdict]:
        """Fold ``c`` (see ``_blind_pair``) into ``inc``: an S1 becomes S3 with its link unobserved; an
        incident that already names a link or a mixed slowdown takes it as nothing new."""
        old = inc.last
        if old.kind != AnomalyKind.S1:
            return []
        upd = replace(old, kind=AnomalyKind.S3, p=c.p,
                      evidence=f"{old.evidence}; and its exchange with rank "
                               f"{next(r for r in _ends(c) if r != old.root_cause_ranks[0])} is slow too: {c.evidence}",
                      details={**c.details, **old.details, "link": LINK_NOT_OBSERVED, SLOW_IN: c.communicator})
        inc.last, inc.last_report = upd, now
        return [upd.verdict(inc.incident_id, VerdictState.UPDATE, now)]

    def _same_nic(self, c: Candidate) -> Incident | None:
        """The open incident of the same job and family whose link leaves the same host as ``c``'s (a NIC):
        ``c``'s key becomes another key of that incident, so a slow (or dead) NIC is one incident, not
        one per link."""
        nic = _nic_of(c)
        if not nic:
            return None
        for inc in self.open.values():
            if (inc.quiet_since is None and inc.first.family == c.family and _nic_of(inc.last) == nic
                    and (inc.first.job, inc.first.incarnation) == (c.job, c.incarnation)):
                self.open[c.match_key] = inc
                return inc
        return None

    def _behind_nic(self, c: Candidate) -> bool:
        """``c`` is a late rank (S1) on a host whose network interface an open incident already names slow,
        found after it: the rank waited for its transfers through that NIC (its receives, its sends), which
        reads as computing longer before its next op, and the NIC's incident already names its host. A
        second page for it would send the operator to the rank's GPU (heldout-any-6's any-pp-S2-20-159: two
        pipeline stages behind a NIC at 33 %, each its own S1 10 and 23 s after the NIC's S2)."""
        if c.kind != AnomalyKind.S1 or len(c.root_cause_hosts) != 1:
            return False
        host = c.root_cause_hosts[0]
        return any(inc.quiet_since is None and NIC_LINKS in inc.last.details and inc.last.details.get(NIC) == host
                   and (inc.first.job, inc.first.incarnation) == (c.job, c.incarnation)
                   and inc.first.onset_time <= c.onset_time for inc in self.open.values())

    def _after_hang(self, c: Candidate) -> bool:
        """``c`` is a slowdown every named rank of which waited in a hang of the same job (its affected ranks,
        not its roots) that was open when the slowdown began, or had ended less than ``HANG_SHADOW_S`` before:
        ranks that waited out a stall show it in their timings for a while after (a pipeline refills behind
        the stage that stopped, the ops of a window still hold the stalled ones), and a page for them would
        send the operator to ranks that only waited (a real 4-stage pipeline whose third stage paused 20 s:
        beside its H1, an S2 on the pair link 0->1 upstream of it, or an S1 on the first stage at the next
        world all-reduce, in about one run of ten). Held while the hang's incident is kept, not dropped: a
        slowdown that lasts beyond it opens its own incident then."""
        if c.family != "slow" or not c.root_cause_ranks:
            return False
        named = set(c.root_cause_ranks)
        for inc in self.open.values():
            h = inc.last
            if (h.family != "hang" or (inc.first.job, inc.first.incarnation) != (c.job, c.incarnation)
                    or c.onset_time < inc.first.onset_time):
                continue
            if inc.quiet_since is not None and c.onset_time > inc.quiet_since + HANG_SHADOW_S:
                continue
            if named <= set(h.affected_ranks) - set(h.root_cause_ranks):
                return True
        return False

    def _nic_update(self, inc: Incident, c: Candidate, now: float) -> list[Verdict]:
        """A slow link through the NIC of an open incident's link: the incident names the host's NIC and
        lists its links (an UPDATE each time one more is found), or takes a more specific class."""
        links = nic_links(inc.last)
        found = [lk for lk in nic_links(c) if lk not in links]
        if not found:
            if c.kind.info.precedence <= inc.last.kind.info.precedence:
                return []
            upd = replace(inc.last, kind=c.kind, p=c.p)
        else:
            links += found
            nic = _nic_of(c)
            roots = tuple(sorted({lk.src for lk in links}))
            kind = max(inc.last.kind, c.kind, key=lambda k: k.info.precedence)
            what = "data stopped on" if c.family == "hang" else "slow:"
            ev = (f"the network interface of {nic}: {what} {len(links)} links that leave it ({show_links(links)}), "
                  f"in communicators that share nothing but this host; first: {inc.first.evidence}")
            affected = tuple(sorted(set(inc.last.affected_ranks) | set(c.affected_ranks) - set(roots)))
            upd = replace(inc.last, kind=kind, root_cause_ranks=roots, root_cause_hosts=(nic,),
                          affected_ranks=affected, evidence=ev, confidence=max(inc.last.confidence, c.confidence),
                          details={**inc.last.details, NIC: nic,
                                   NIC_LINKS: ",".join(f"{lk.src}>{lk.dst}" for lk in links)})
        upd = replace(upd, communicator=inc.first.communicator, op_seq=inc.first.op_seq,
                      onset_time=inc.first.onset_time, resolve_key=inc.first.resolve_key)
        inc.last, inc.last_report, inc.affected_n = upd, now, len(upd.affected_ranks)
        return [upd.verdict(inc.incident_id, VerdictState.UPDATE, now)]

    def _shared_end(self, c: Candidate) -> tuple[Incident, set[str]] | None:
        """The open slow incident of the same job whose transfers share one host with ``c``'s, or run
        between the same two hosts, and those hosts.

        A host's network interface slows every transfer through it, in both directions and in every
        communicator that crosses it: a pipeline send to the host and one from it, and the gradient
        all-reduce of its data-parallel group (slow as a whole: no counters name its link). Each of them
        alone has two or more hosts at its ends; the host they all share is the NIC. Two findings
        between the same two hosts (both directions of one link) are one incident too: the cable, or
        either end's NIC, until a third finding narrows it to one host.
        """
        ends = _ends(c)
        if c.family != "slow" or not ends:
            return None
        hc = set(ends.values())
        for inc in list({id(i): i for i in self.open.values()}.values()):  # a NIC's incident has many keys
            ie = _ends(inc.last)
            if (not ie or inc.quiet_since is not None or inc.first.family != "slow"
                    or (inc.first.job, inc.first.incarnation) != (c.job, c.incarnation)):
                continue
            common = hc & set(ie.values())
            if common and (len(common) == 1 or common == hc == set(ie.values())) and (c.link or inc.last.link):
                self.open[c.match_key] = inc
                return inc, common
        return None

    def _ends_update(self, inc: Incident, common: set[str], c: Candidate, now: float) -> list[Verdict]:
        """Fold ``c`` into ``inc``, whose findings all run through ``common``: one host (its NIC) or the
        two hosts of one link; an UPDATE when it adds a link or a communicator, or a more specific class."""
        old = inc.last
        links = nic_links(old)
        found = [lk for lk in nic_links(c) if lk not in links]
        comms = [x for x in old.details.get(SLOW_COMMS, old.communicator).split(",") if x]
        new_comm = c.communicator not in comms
        kind = max(old.kind, c.kind, key=lambda k: k.info.precedence)
        if not found and not new_comm and kind == old.kind:
            return []
        links += found
        comms += [c.communicator] if new_comm else []
        ends = {r: h for r, h in {**_ends(old), **_ends(c)}.items() if h in common}
        roots = tuple(sorted(ends))
        hosts = tuple(sorted(common))
        shown = f"{len(links)} slow links ({show_links(links)})" if links else "no link named"
        details = {k: v for k, v in old.details.items() if k not in (NIC, NIC_LINKS)}
        details.update({ENDS: _show_ends(ends), SLOW_COMMS: ",".join(comms)})
        if links:
            details[NIC_LINKS] = ",".join(f"{lk.src}>{lk.dst}" for lk in links)
        if len(hosts) == 1:
            details[NIC] = hosts[0]
            ev = (f"the network interface of {hosts[0]}: every slow transfer found runs through it, {shown} in "
                  f"{len(comms)} communicators that share nothing but this host (its ranks {_show_ranks(roots)}); "
                  f"first: {inc.first.evidence}")
        else:
            ev = (f"both directions between {hosts[0]} and {hosts[1]} are slow, {shown}: the link between them or "
                  f"either host's network interface (a transfer through only one of them would tell which); "
                  f"first: {inc.first.evidence}")
        affected = tuple(sorted((set(old.affected_ranks) | set(c.affected_ranks)) - set(roots)))
        upd = replace(old, kind=kind, root_cause_ranks=roots, root_cause_hosts=hosts, affected_ranks=affected,
                      evidence=ev, confidence=max(old.confidence, c.confidence), details=details,
                      link=old.link or c.link, p=c.p if kind != old.kind else old.p,
                      communicator=inc.first.communicator, op_seq=inc.first.op_seq, onset_time=inc.first.onset_time,
                      resolve_key=inc.first.resolve_key)
        inc.last, inc.last_report, inc.affected_n = upd, now, len(upd.affected_ranks)
        return [upd.verdict(inc.incident_id, VerdictState.UPDATE, now)]

    def _drop(self, inc: Incident) -> None:
        """Remove an incident from the open ones under every key it has (a NIC's links each add one)."""
        for k in [k for k, v in self.open.items() if v is inc]:
            del self.open[k]

    def resolve(self, match_key: str, now: float, evidence: str, *, hold: bool = True) -> list[Verdict]:
        """The fault of an incident ended: RESOLVED at once, or (``hold`` with ``reopen_s``) once it has
        stayed away ``reopen_s`` (``expire``); ``hold=False`` for an end that is final (a restart)."""
        inc = self.open.get(match_key)
        if inc is None:
            return []
        if hold and self.reopen_s > 0:
            if inc.quiet_since is None:
                inc.quiet_since, inc.quiet_evidence = now, evidence
            return []
        self._drop(inc)
        self._remember(inc.incident_id, "resolved")
        c = replace(inc.last, evidence=evidence, confidence=1.0,
                    details={**inc.last.details, **inc.episode_details()})
        return [c.verdict(inc.incident_id, VerdictState.RESOLVED, now)]

    def expire(self, now: float, job: str, incarnation: int) -> list[Verdict]:
        """RESOLVED for the incidents of one job incarnation that stayed quiet ``reopen_s`` (``now``: its clock)."""
        out: list[Verdict] = []
        for mk, inc in list(self.open.items()):
            if (inc.quiet_since is not None and (inc.first.job, inc.first.incarnation) == (job, incarnation)
                    and now - inc.quiet_since >= self.reopen_s):
                out += self.resolve(mk, now, inc.quiet_evidence, hold=False)
        return out

    def close(self, match_key: str, now: float, reason: str) -> list[Verdict]:
        """End an open incident that did not resolve (its job went silent): a CLOSED verdict saying why."""
        inc = self.open.get(match_key)
        if inc is None:
            return []
        if inc.quiet_since is not None:  # its fault had ended already: that is how it ends
            return self.resolve(match_key, now, inc.quiet_evidence, hold=False)
        self._drop(inc)
        self._remember(inc.incident_id, "resolved")  # ended either way: a replay never opens it again
        c = replace(inc.last, details={**inc.last.details, "closed": reason})
        return [c.verdict(inc.incident_id, VerdictState.CLOSED, now)]

    def _remember(self, iid: str, state: str) -> None:
        self.emitted[iid] = state
        self.emitted.move_to_end(iid)
        # forget the oldest resolved ids beyond the bound; open ones are always kept
        excess = len(self.emitted) - self.resolved_memory - len(self.open)
        if excess > 0:
            for k in [k for k, v in self.emitted.items() if v == "resolved"][:excess]:
                del self.emitted[k]

    # -- persistence -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        incs = list({id(inc): inc for inc in self.open.values()}.values())  # a NIC's incident has many keys
        return {
            "emitted": [[k, v] for k, v in self.emitted.items()],
            "open": [
                {"id": inc.incident_id, "first": _cand_dict(inc.first), "last": _cand_dict(inc.last),
                 "last_report": inc.last_report, "quiet_since": inc.quiet_since, "quiet_evidence": inc.quiet_evidence,
                 "episodes": inc.episodes, "ends_on": None if inc.ends_on is None else list(inc.ends_on),
                 **({"keys": keys} if len(keys := [k for k, v in self.open.items() if v is inc]) > 1 else {})}
                for inc in incs
            ],
        }

    def load(self, d: Mapping[str, Any]) -> None:
        self.emitted = OrderedDict((str(k), str(v)) for k, v in d.get("emitted", []))
        for o in d.get("open", []):
            first, last = _cand_from(o["first"]), _cand_from(o["last"])
            n = int(o["last"].get("affected", 0))
            quiet = o.get("quiet_since")
            inc = self.open[first.match_key] = Incident(
                str(o["id"]), first, last, float(o["last_report"]), n, None if quiet is None else float(quiet),
                str(o.get("quiet_evidence", "")), [float(t) for t in o.get("episodes", [])],
                None if not o.get("ends_on") else (str(o["ends_on"][0]), str(o["ends_on"][1]), int(o["ends_on"][2])))
            for k in o.get("keys", []):
                self.open[str(k)] = inc


def _nic_of(c: Candidate) -> str:
    return c.details.get(NIC, "") if c.link is not None else ""


def _ends(c: Finding) -> dict[int, str]:
    """``details["ends"]`` as rank -> host."""
    out: dict[int, str] = {}
    for item in c.details.get(ENDS, "").split(","):
        rank, _, host = item.partition("@")
        if host:
            out[int(rank)] = host
    return out


def _show_ends(ends: dict[int, str]) -> str:
    return ",".join(f"{r}@{h}" for r, h in sorted(ends.items()))


def _show_ranks(ranks: tuple[int, ...]) -> str:
    return ", ".join(map(str, ranks))


def show_links(links: list[Link], limit: int = 8) -> str:
    head = ", ".join(f"{lk.src}->{lk.dst}" for lk in links[:limit])
    return head + (f" and {len(links) - limit} more" if len(links) > limit else "")


def nic_links(c: Finding) -> list[Link]:
    """The slow links a (NIC) finding names: ``details["nic_links"]``, else its one link."""
    raw = c.details.get(NIC_LINKS, "")
    if raw:
        return [Link(int(a), int(b)) for a, b in (x.split(">") for x in raw.split(","))]
    return [] if c.link is None else [c.link]


def mixed_slow(a: Candidate, b: Candidate) -> Candidate | None:
    """S1 on a rank (its compute, seen in one communicator) and S2 on that rank's own outgoing link
    (seen in another: a network link of the data-parallel ring or the pipeline): one rank that computes
    slowly and whose link is slow, S3 naming both; None for any other pair."""
    if a.kind == AnomalyKind.S3 and a.link is None and a.details.get("link") == LINK_NOT_OBSERVED:
        # a guess without its link (_pair_update), whose link is named now
        a = replace(a, kind=AnomalyKind.S1,
                    details={k: v for k, v in a.details.items() if k not in ("link", SLOW_IN)})
    kinds = {a.kind, b.kind}
    if kinds != {AnomalyKind.S1, AnomalyKind.S2}:
        return None
    s1, s2 = (a, b) if a.kind == AnomalyKind.S1 else (b, a)
    if s2.link is None or not s1.root_cause_ranks or s2.link.src != s1.root_cause_ranks[0] or s2.details.get(NIC_LINKS):
        return None
    return replace(s2, kind=AnomalyKind.S3,
                   evidence=f"{s1.evidence}; and its own link is slow: {s2.evidence}",
                   details={**s1.details, **s2.details, "compute_in": s1.communicator})


def _keep_class(last: Candidate, c: Candidate) -> Candidate:
    """``c``, a new episode of the incident whose latest finding is ``last``, at ``last``'s class where that
    is the more specific: an incident moves only up (an S3's compute part may end an episode before its
    link's does, and the link alone is part of the same fault, not a lesser one)."""
    if c.kind.info.precedence >= last.kind.info.precedence:
        return c
    return replace(c, kind=last.kind, link=c.link or last.link, root_cause_ranks=last.root_cause_ranks,
                   root_cause_hosts=last.root_cause_hosts, details={**last.details, **c.details})


def _cand_dict(c: Candidate) -> dict[str, Any]:
    return {
        "kind": c.kind.value, "job": c.job, "incarnation": c.incarnation, "communicator": c.communicator,
        "op_seq": c.op_seq, "op_type": c.op_type, "roots": list(c.root_cause_ranks),
        "affected": len(c.affected_ranks), "confidence": c.confidence, "evidence": c.evidence,
        "onset_time": c.onset_time, "hosts": list(c.root_cause_hosts),
        "link": None if c.link is None else list(c.link), "channel": c.channel, "p": c.p,
        "mismatch_field": c.mismatch_field, "resolve_key": list(c.resolve_key),
        # what the match key reads (a host's incident), not the free-text details
        **({"host": c.details["host"]} if "host" in c.details else {}),
        # and the NIC its link leaves, with the links found through it (later links fold into it)
        **({"nic": {k: c.details[k] for k in (NIC, NIC_LINKS) if k in c.details}} if NIC in c.details else {}),
    }


def _cand_from(d: Mapping[str, Any]) -> Candidate:
    link = d.get("link")
    rk = d.get("resolve_key") or ["", 0]
    return Candidate(
        kind=AnomalyKind(d["kind"]), job=str(d["job"]), incarnation=int(d["incarnation"]),
        communicator=str(d["communicator"]), op_seq=int(d["op_seq"]), op_type=str(d["op_type"]),
        root_cause_ranks=tuple(int(x) for x in d["roots"]),
        affected_ranks=(),  # only the count is kept (bounded state); updates re-learn the set
        confidence=float(d["confidence"]), evidence=str(d["evidence"]), onset_time=float(d["onset_time"]),
        root_cause_hosts=tuple(str(x) for x in d.get("hosts", [])),
        link=None if link is None else Link(int(link[0]), int(link[1])),
        channel=None if d.get("channel") is None else int(d["channel"]),
        p=None if d.get("p") is None else float(d["p"]), mismatch_field=d.get("mismatch_field"),
        resolve_key=(str(rk[0]), int(rk[1])),
        details={**({"host": str(d["host"])} if d.get("host") else {}),
                 **{str(k): str(v) for k, v in (d.get("nic") or {}).items()}},
    )
