"""The per-job half of the analysis: shard reports in, hang roots across all communicators, verdicts out.

A job's shards (``shard.shard_report``) each see some of its communicators. The job stage keeps,
per job incarnation, the newest stalled communicators of every shard, resolves the wait-for
relation over all of them (``waitfor.resolve``: a rank missing from one op that waits in another
is a victim, not a root), picks the most specific slow finding per incident, and owns the
incident book: it alone turns candidates into OPEN, UPDATE and RESOLVED verdicts. Everything it
decides comes from the reports, so it runs next to the shards (one process) or behind them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ccld.records import AnomalyKind, Link, Verdict
from ccld.streams.analysis.hangs import CommDiag
from ccld.streams.analysis.incidents import NIC, NIC_LINKS, Candidate, IncidentBook, mixed_slow, show_links
from ccld.streams.analysis.settings import AnalyzerSettings
from ccld.streams.analysis.shard import ShardReport, Stall
from ccld.streams.analysis.waitfor import HangRoot, resolve


@dataclass
class _JobView:
    """What the stage knows of one job incarnation: each shard's newest stalls and hosts, the roots."""

    stalls: dict[int, tuple[Stall, ...]] = field(default_factory=dict)  # by shard
    hosts: dict[int, Mapping[int, str]] = field(default_factory=dict)  # by shard
    seen: dict[int, float] = field(default_factory=dict)  # by shard: the job time of its newest report
    last_now: float = 0.0
    data_seen: float = -1.0  # the newest record of the job any shard took in (analyzer time)
    roots_sig: tuple[tuple[str, float, str, int], ...] = ()
    roots: list[tuple[HangRoot, Stall]] = field(default_factory=list)
    victims: set[int] = field(default_factory=set)  # ranks waiting on a hang root at the last evaluation
    freed: dict[int, float] = field(default_factory=dict)  # rank -> job time it stopped waiting on a root
    lost: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (records lost on the way, when)


class JobStage:
    """Decides the verdicts of any number of jobs from their shards' reports."""

    def __init__(self, settings: AnalyzerSettings) -> None:
        self.settings = settings
        self.book = IncidentBook(settings.resolved_memory, settings.update_min_interval_s, settings.incident_reopen_s)
        self.views: dict[tuple[str, int], _JobView] = {}

    def restarted(self, newest: Mapping[str, int], now: float) -> list[Verdict]:
        """Close the open incidents of incarnations older than their job's ``newest``."""
        out: list[Verdict] = []
        for mk, incd in list(self.book.open.items()):
            c = incd.first
            if newest.get(c.job, c.incarnation) > c.incarnation:
                out.extend(self.book.resolve(mk, now, f"job restarted as incarnation {newest[c.job]}", hold=False))
        return out

    def has_open(self, key: tuple[str, int]) -> bool:
        return any((c.first.job, c.first.incarnation) == key for c in self.book.open.values())

    def forget(self, key: tuple[str, int]) -> None:
        self.views.pop(key, None)

    def decide(self, reports: Sequence[tuple[int, ShardReport]], now: float, *, need: int = 1,
               live: Collection[int] | None = None) -> list[Verdict]:
        """One job's evaluation from the ``(shard, report)`` pairs of its shards that evaluated now.

        A shard that did not report keeps its last stalls (a stall is a state): its communicators
        are still stalled as far as the stage knows. Hangs are judged only once ``need`` shards of
        the job have reported, from the stalls of the ``live`` ones (None: all), as of the job time
        every live shard has reached (the watermark), never ahead of the slowest: a rank missing
        from one shard's stalled op may be a victim waiting in a communicator of a shard whose
        reports of that moment have not arrived yet. Who is live and how many to wait for is the
        caller's (it knows the wall clock and the job's shards; ``stage.StageProcessor``).
        """
        if not reports:
            return []
        job, inc = reports[0][1].job, reports[0][1].incarnation
        v = self.views.setdefault((job, inc), _JobView())
        for shard, rep in reports:
            v.stalls[shard], v.hosts[shard] = rep.stalls, rep.hosts
            v.seen[shard] = max(v.seen.get(shard, rep.now), rep.now)
            v.last_now = max(v.last_now, rep.now)
            v.data_seen = max(v.data_seen, rep.seen)
            for r, (n, at) in rep.lost.items():  # every shard of a job hears of the same losses: the largest
                held = v.lost.get(r, (0, at))
                v.lost[r] = (max(held[0], n), max(held[1], at))
        verdicts: list[Verdict] = []
        silent = now - v.data_seen
        # a job silent this long has ended (or was killed, or lost its broker): its incidents are closed
        # below, and nothing new is opened about it - a hang that stood when it ended is one more stall
        # second by second, and a finding it yields now (a changed root, a merged one) is no new fault
        over = v.data_seen >= 0 and silent >= self.settings.incident_close_silent_s
        for c in () if over else best_slow(merge_nic([c for _, rep in reports for c in rep.slow])):
            verdicts.extend(self.book.report(c, now))
        alive = [sh for sh in v.seen if live is None or sh in live]
        if len(v.seen) >= need and alive and not over:
            mark = min(v.seen[sh] for sh in alive)
            for c in self._hangs(v, job, inc, alive, mark):
                verdicts.extend(self.book.report(c, mark))
        ended: dict[tuple[str, str, int], str] = {}
        for _, rep in reports:
            ended.update(rep.over)
        for mk, incd in list(self.book.open.items()):
            c = incd.first
            if (c.job, c.incarnation) == (job, inc):
                ev = ended.get(incd.ending)
                if ev:
                    verdicts.extend(self.book.resolve(mk, now, ev))
        verdicts.extend(self.book.expire(now, job, inc))
        if over:
            reason = (f"job silent for {silent:.0f} s (no record from any rank): it ended, was killed, or lost "
                      f"its link to the broker")
            for mk, incd in list(self.book.open.items()):
                if (incd.first.job, incd.first.incarnation) == (job, inc):
                    verdicts.extend(self.book.close(mk, now, reason))
        return verdicts

    def _hangs(self, v: _JobView, job: str, inc: int, alive: Collection[int], mark: float) -> list[Candidate]:
        # each stall as it stood at the watermark: one that began after it is not known to every shard yet
        stalls = sorted((replace(st, stall_s=mark - st.onset) for sh in sorted(v.stalls) if sh in alive
                         for st in v.stalls[sh] if st.onset <= mark), key=lambda st: st.comm)
        if not stalls:
            v.roots_sig, v.roots = (), []
            self._track_victims(v, mark)
            return []
        # the roots change only when a communicator stalls or moves again, or its diagnosis changes (a
        # provisional one: two ranks left in an all_to_all become an H3 once they reported frozen counters)
        sig = tuple((st.comm, st.onset, st.diag.kind.value, st.diag.seq) for st in stalls)
        if sig != v.roots_sig:
            v.roots_sig = sig
            diags: dict[int, CommDiag] = {i: st.diag for i, st in enumerate(stalls)}
            roots = resolve(diags, {i: st.stall_s for i, st in enumerate(stalls)})
            v.roots = [(r, stalls[r.cid]) for r in roots]
        by_comm = {st.comm: st for st in stalls}
        self._track_victims(v, mark)
        out: list[Candidate] = []
        for root, st in v.roots:
            cur = by_comm[st.comm]  # the newest stall time of the root's communicator
            # a rank that waited on another root until lately has not been stuck for the threshold: it
            # was held up (the root resumed, it is on its way into this op); judged from when it was freed
            if any(mark - v.freed.get(r, -1e18) < cur.threshold_s for r in root.roots):
                continue
            c = hang_candidate(root, cur, self._hosts(v, root.roots), job, inc, lost=v.lost)
            if c is not None:
                out.append(self._network(v, c))
        return merge_by_host(merge_nic(out))

    def _network(self, v: _JobView, c: Candidate) -> Candidate:
        """A hang whose link joins two hosts names the host it leaves (``details["nic"]``, as a slow
        finding's does, ``jobview.slow_candidate``): the links of one host's NIC are one incident."""
        if c.link is None:
            # a dead NIC under an all_to_all names the host's ranks, no link (hangs._dead_nic): the host's
            # incident, however many of its expert groups' all_to_alls froze
            hosts = self._hosts(v, c.root_cause_ranks)
            if c.kind == AnomalyKind.H3 and len(c.root_cause_ranks) >= 2 and len(hosts) == 1:
                return replace(c, details={**c.details, "host": hosts[0]})
            return c
        src, dst = self._hosts(v, (c.link.src,)), self._hosts(v, (c.link.dst,))
        if not src or not dst or src == dst:
            return c
        return replace(c, details={**c.details, NIC: src[0]})

    def _track_victims(self, v: _JobView, mark: float) -> None:
        """Remember when each rank stopped waiting on a hang root (``_JobView.freed``)."""
        now_waiting = {r for root, _ in v.roots for r in root.affected}
        for r in v.victims - now_waiting:
            v.freed[r] = mark
        v.victims = now_waiting
        for r in [r for r, t in v.freed.items() if mark - t > self.settings.hang_max_s]:
            del v.freed[r]

    @staticmethod
    def _hosts(v: _JobView, ranks: tuple[int, ...]) -> tuple[str, ...]:
        out: list[str] = []
        for r in ranks:
            for sh in sorted(v.hosts):
                h = v.hosts[sh].get(r)
                if h is not None:
                    if h not in out:
                        out.append(h)
                    break
        return tuple(out)


def merge_by_host(cands: list[Candidate]) -> list[Candidate]:
    """Not-entered hangs whose roots are all on one host, found together, are one incident: the host.

    A node that dies (or whose ranks all stop at once) leaves each of its ranks missing from some op
    its peers wait in; one H1 per rank would page once per rank for one fault. The merged candidate
    names every such rank and the host, is matched as that host's incident (``details["host"]``), and
    keeps the earliest op as its own. One rank alone on its host stays a rank's incident.
    """
    groups: dict[tuple[AnomalyKind, str], list[Candidate]] = {}
    for c in cands:
        if c.kind == AnomalyKind.H1 and len(c.root_cause_hosts) == 1:
            groups.setdefault((c.kind, c.root_cause_hosts[0]), []).append(c)
        elif c.kind == AnomalyKind.H3 and c.link is None and c.details.get("host"):
            # a dead NIC's all_to_alls, one per expert group through it (hangs._dead_nic)
            groups.setdefault((c.kind, c.details["host"]), []).append(c)
    merged = {id(c) for g in groups.values() if len(g) > 1 for c in g}
    out = [c for c in cands if id(c) not in merged]
    for (kind, host), g in sorted(groups.items(), key=lambda kv: (kv[0][0].value, kv[0][1])):
        if len(g) < 2:
            continue
        first = min(g, key=lambda c: (c.onset_time, c.communicator, c.op_seq))
        roots = tuple(sorted({r for c in g for r in c.root_cause_ranks}))
        affected = tuple(sorted({r for c in g for r in c.affected_ranks} - set(roots)))
        comms = {c.communicator for c in g}
        if kind == AnomalyKind.H3:
            ev = (f"host {host}: ranks {_ranks(roots)} hold data they cannot pass on in {len(g)} all_to_alls "
                  f"({len(affected)} ranks wait); every link that leaves the host stopped: first {first.evidence}")
        else:
            ev = (f"host {host}: ranks {_ranks(roots)} never entered the ops their peers wait in "
                  f"({len(g)} ops in {len(comms)} communicators; {len(affected)} ranks wait); the host stopped, "
                  f"or all its ranks did: first {first.evidence}")
        out.append(replace(first, root_cause_ranks=roots, affected_ranks=affected, evidence=ev,
                           confidence=max(c.confidence for c in g),
                           details={**first.details, "host": host, "communicators": str(len(comms))}))
    return out


def merge_nic(cands: list[Candidate]) -> list[Candidate]:
    """Link faults found together on links that leave one host are one incident: the host's NIC.

    A network interface that slows or stops data does so on every communicator that crosses it (the
    data-parallel rings of its ranks, the pipeline pairs to other hosts); one verdict per link would
    page once per communicator for one fault. Per family, the link findings (H3; S2 and S3) that
    leave one host (``details["nic"]``) become one candidate naming each link's source rank, the
    host, and the links (``details["nic_links"]``); the most specific class of them is its class. A
    hang NIC is matched as the host's incident (``details["host"]``); a slow one keeps the key of its
    first link, and the incident book folds links found later into it. One link alone (however many
    findings name it) stays a link's.
    """
    groups: dict[tuple[str, str], list[Candidate]] = {}
    for c in cands:
        nic = c.details.get(NIC)
        if c.kind in (AnomalyKind.H3, AnomalyKind.S2, AnomalyKind.S3) and c.link is not None and nic:
            groups.setdefault((c.family, nic), []).append(c)
    # one link seen twice (two signatures of one ring: its reduce-scatter and its all-gather) is a link, not a NIC
    groups = {k: g for k, g in groups.items() if len({c.link for c in g}) > 1}
    merged = {id(c) for g in groups.values() for c in g}
    out = [c for c in cands if id(c) not in merged]
    for (family, host), g in sorted(groups.items()):
        g.sort(key=lambda c: (c.onset_time, c.communicator, c.op_seq))
        first = g[0]
        links = list(dict.fromkeys(c.link for c in g if c.link is not None))
        roots = tuple(sorted({lk.src for lk in links}))
        affected = tuple(sorted({r for c in g for r in c.affected_ranks} - set(roots)))
        what = "data stopped on" if family == "hang" else "slow:"
        ev = (f"the network interface of {host}: {what} {len(links)} links that leave it ({show_links(links)}), in "
              f"{len({c.communicator for c in g})} communicators that share nothing but this host; "
              f"first: {first.evidence}")
        kind = max((c.kind for c in g), key=lambda k: k.info.precedence)
        out.append(replace(first, kind=kind, root_cause_ranks=roots, root_cause_hosts=(host,),
                           affected_ranks=affected, evidence=ev, confidence=max(c.confidence for c in g),
                           details={**first.details, **({"host": host} if family == "hang" else {}),
                                    NIC_LINKS: ",".join(f"{lk.src}>{lk.dst}" for lk in links)}))
    return out


def best_slow(cands: Iterable[Candidate]) -> list[Candidate]:
    """Per incident (match key), the most specific slow class found (S3 over S2 over S1).

    Among equally specific ones the first by communicator and op wins, so the choice is the same
    whichever shard reported first.
    """
    best: dict[str, Candidate] = {}
    for c in sorted(cands, key=lambda c: (c.communicator, c.op_seq)):
        held = best.get(c.match_key)
        mixed = None if held is None else mixed_slow(held, c)
        if mixed is not None:  # its compute in one communicator, its own link in another: S3
            best[c.match_key] = mixed
        elif held is None or c.kind.info.precedence > held.kind.info.precedence:
            best[c.match_key] = c
    return list(best.values())


def _ranks(rs: tuple[int, ...] | list[int], limit: int = 8) -> str:
    rs = list(rs)
    head = ",".join(map(str, rs[:limit]))
    return head + (f" and {len(rs) - limit} more" if len(rs) > limit else "")


#: records of a rank lost on the way from this long before a stall's onset on make a verdict that rests on
#: that rank's absence uncertain (its ENTERED of the stalled op may be among them)
LOST_BEFORE_ONSET_S = 60.0


def hang_candidate(root: HangRoot, st: Stall, hosts: tuple[str, ...], job: str, incarnation: int,
                   lost: Mapping[int, tuple[int, float]] | None = None) -> Candidate | None:
    """A verdict candidate for a hang root, or None while its communicator's stall is below its threshold.

    ``lost``: rank -> (records lost on the way, when last said). An H1 ("never entered") or H3 ("stopped
    moving") about a rank some of whose records never arrived rests on data we do not have: it says so
    and carries half the confidence.
    """
    d = root.diag
    stall, thr = st.stall_s, st.threshold_s
    if stall < thr:
        return None
    op = d.op_name
    waiting = d.waiting.tolist()
    if root.kind == AnomalyKind.H1:
        ev = (
            f"ranks {_ranks(waiting)} entered {op} #{d.seq} and waited {max(d.wait_own_s, stall):.1f} s; "
            f"rank{'s' if len(root.roots) > 1 else ''} {_ranks(root.roots)} never entered and "
            f"{'are' if len(root.roots) > 1 else 'is'} in no collective"
        )
        if d.note:
            ev += f" ({d.note})"
        conf = 0.95 if len(root.via) > 0 else 0.9
    elif root.kind == AnomalyKind.H2:
        ev = f"{d.note}; no progress for {stall:.1f} s (differs in {d.mismatch_field})"
        conf = 0.97
    else:
        ev = f"{d.note}; counters frozen for {stall:.1f} s" if d.note else f"counters frozen for {stall:.1f} s"
        conf = 0.9 if d.link is not None else 0.6
    if len(root.via) > 1:
        ev += f"; {len(root.affected)} ranks in {len(root.via)} communicators wait for it"
    details = {"stall_s": f"{stall:.1f}", "threshold_s": f"{thr:.1f}", "communicators": str(len(root.via))}
    gone = sorted(r for r in root.roots if lost and r in lost and lost[r][1] >= st.onset - LOST_BEFORE_ONSET_S)
    if gone and root.kind in (AnomalyKind.H1, AnomalyKind.H3):
        n = sum(lost[r][0] for r in gone) if lost else 0
        ev += (f"; but {n} ENTERED/DONE records of rank{'s' if len(gone) > 1 else ''} {_ranks(gone)} were lost on "
               f"the way (a producer's queue full, a message undeliverable): what they did may be among them, "
               f"so this rests on records that never arrived")
        conf = round(conf / 2, 3)
        details["lost_records"] = str(n)
    return Candidate(
        kind=root.kind,
        job=job,
        incarnation=incarnation,
        communicator=st.comm,
        op_seq=d.seq,
        op_type=op,
        root_cause_ranks=root.roots,
        affected_ranks=root.affected,
        confidence=conf,
        evidence=ev,
        onset_time=st.onset,
        root_cause_hosts=hosts,
        link=None if d.link is None else Link(*d.link),
        channel=d.channel,
        mismatch_field=d.mismatch_field,
        details=details,
        resolve_key=("hang", d.seq),
    )
