"""The per-communicator half of the analysis: what one shard of a job's communicators finds.

Most of the analysis needs one communicator's records only: its ops, slow baselines and windows,
and the diagnosis of a stall (who entered, who did not, what the counters say). What needs every
communicator of the job is a hang's root: a rank missing from one stalled communicator may be
waiting in another (a victim, not a root). So a job's communicators can be split into shards
(``ccld.records.comm_group``), each analyzed apart into a :class:`ShardReport`, and one job stage
(``stage.JobStage``) merges the reports of all shards and decides. The single-process analyzer
is the same two halves with one shard.

A report is compact: a handful of slow candidates, one :class:`Stall` per stalled communicator
(its diagnosis names ranks, never records), the hosts of the ranks it names, and the evidence that
incidents of its communicators are over.

A report travels from its shard to the job stage as an Avro ``ShardReport`` (``schemas/ShardReport.avsc``):
``encode_report`` / ``decode_report`` here, on top of the codec's schema-agnostic ``encode`` / ``decode``.
The dict form lives with the dataclasses rather than in ``ccld.schemas``, which holds the wire
contract every stage shares and imports nothing of any stage (producers load it too).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ccld.errors import RecordError, SchemaError
from ccld.records import AnomalyKind, Link, OpType
from ccld.schemas.codec import decode, encode
from ccld.streams.analysis.hangs import I64, CommDiag, diagnose
from ccld.streams.analysis.incidents import Candidate
from ccld.streams.analysis.jobview import JobAnalysis, slow_candidate
from ccld.streams.analysis.state import JobState

#: Incidents a shard keeps checking for their end (per job); the oldest beyond it are forgotten.
WATCH_MEMORY = 4096
#: A finding's end is reported this long (job time, s) before the shard stops watching it.
OVER_REPORT_S = 30.0


BARRIER = int(OpType.BARRIER)


@dataclass(frozen=True)
class Stall:
    """One stalled communicator: its diagnosis and what the job stage needs to judge and name it."""

    comm: str  # 16 hex digits
    diag: CommDiag  # ``diag.cid`` is the shard's own index: the job stage goes by ``comm``
    stall_s: float  # analyzer time since the communicator last progressed
    threshold_s: float  # the hang threshold of ``diag.kind`` for this communicator
    onset: float  # analyzer time of the last progress

    def to_dict(self) -> dict[str, Any]:
        d = self.diag
        return {
            "comm": self.comm, "stall_s": float(self.stall_s), "threshold_s": float(self.threshold_s),
            "onset": float(self.onset), "seq": int(d.seq), "op_type": int(d.op_type), "kind": d.kind.value,
            "waiting": _ranks_out(d.waiting), "missing": _ranks_out(d.missing), "culprits": _ranks_out(d.culprits),
            "link": _link_out(d.link), "channel": _opt_int(d.channel), "mismatch_field": d.mismatch_field,
            "wait_own_s": float(d.wait_own_s), "frozen_own_s": float(d.frozen_own_s), "note": d.note,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Stall:
        """The inverse of ``to_dict``; ``diag.cid`` is -1, the sender's index meaning nothing here.

        A missing or mistyped field raises KeyError, TypeError or ValueError (``ShardReport.from_dict``
        turns them into ``RecordError``).
        """
        diag = CommDiag(
            cid=-1, seq=int(d["seq"]), op_type=int(d["op_type"]), kind=AnomalyKind(d["kind"]),
            waiting=_ranks_in(d["waiting"]), missing=_ranks_in(d["missing"]), culprits=_ranks_in(d["culprits"]),
            link=_link_in(d["link"]), channel=_opt_int(d["channel"]), mismatch_field=_opt_str(d["mismatch_field"]),
            wait_own_s=float(d["wait_own_s"]), frozen_own_s=float(d["frozen_own_s"]), note=str(d["note"]),
        )
        return cls(str(d["comm"]), diag, float(d["stall_s"]), float(d["threshold_s"]), float(d["onset"]))


@dataclass(frozen=True)
class ShardReport:
    """One shard's findings for one job incarnation at one evaluation."""

    job: str
    incarnation: int
    now: float
    slow: tuple[Candidate, ...] = ()
    stalls: tuple[Stall, ...] = ()  # every stalled communicator of the shard (a state, not an event)
    hosts: dict[int, str] = field(default_factory=dict)  # global rank -> host: the missing ranks and culprits
    over: dict[tuple[str, str, int], str] = field(default_factory=dict)  # (comm, family, value) -> evidence
    seen: float = -1.0  # analyzer time of the newest record of the job this shard took in (-1: unknown)
    lost: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (lost records, when last said)

    def to_dict(self) -> dict[str, Any]:
        """The ``ShardReport`` record less ``shard``, which the sender knows and the report does not."""
        return {
            "job": self.job, "incarnation": int(self.incarnation), "now": float(self.now),
            "slow": [_candidate_out(c) for c in self.slow],
            "stalls": [st.to_dict() for st in self.stalls],
            "hosts": [{"rank": int(r), "host": h} for r, h in self.hosts.items()],
            "over": [{"comm": c, "family": f, "value": int(v), "evidence": ev} for (c, f, v), ev in self.over.items()],
            "seen": float(self.seen),
            "lost": [{"rank": int(r), "records": int(n), "at": float(at)} for r, (n, at) in self.lost.items()],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ShardReport:
        """The inverse of ``to_dict``; a missing or mistyped field raises ``RecordError``."""
        try:
            job, inc = str(d["job"]), int(d["incarnation"])
            return cls(
                job, inc, float(d["now"]),
                slow=tuple(_candidate_in(c, job, inc) for c in d["slow"]),
                stalls=tuple(Stall.from_dict(st) for st in d["stalls"]),
                hosts={int(h["rank"]): str(h["host"]) for h in d["hosts"]},
                over={(str(o["comm"]), str(o["family"]), int(o["value"])): str(o["evidence"]) for o in d["over"]},
                seen=float(d.get("seen", -1.0)),
                lost={int(x["rank"]): (int(x["records"]), float(x["at"])) for x in d.get("lost", ())},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"shard report lacks or mistypes a field: {exc}") from exc


def encode_report(report: ShardReport, shard: int) -> bytes:
    """One ``ShardReport`` message: the report of shard ``shard`` (its metrics partition)."""
    return encode("ShardReport", {**report.to_dict(), "shard": shard})


def decode_report(raw: bytes) -> tuple[int, ShardReport]:
    """``(shard, report)`` of one message; any bad message raises ``SchemaError`` with its reason."""
    _, rec = decode(raw, reader="ShardReport")
    shard = int(rec["shard"])
    if shard < 0:
        raise SchemaError("bad-record", f"shard report of shard {shard}")
    try:
        return shard, ShardReport.from_dict(rec)
    except RecordError as exc:
        raise SchemaError("bad-record", str(exc)) from exc


# --- wire form of the parts (Avro has no tuples, numpy arrays or optional numpy scalars) -------------


def _candidate_out(c: Candidate) -> dict[str, Any]:
    # job and incarnation are the report's: every candidate of a report has them
    return {
        "kind": c.kind.value, "communicator": c.communicator, "op_seq": int(c.op_seq), "op_type": c.op_type,
        "root_cause_ranks": [int(r) for r in c.root_cause_ranks], "affected_ranks": [int(r) for r in c.affected_ranks],
        "confidence": float(c.confidence), "evidence": c.evidence, "onset_time": float(c.onset_time),
        "root_cause_hosts": list(c.root_cause_hosts), "link": _link_out(c.link), "channel": _opt_int(c.channel),
        "p": None if c.p is None else float(c.p), "mismatch_field": c.mismatch_field, "details": dict(c.details),
        "resolve_family": c.resolve_key[0], "resolve_value": int(c.resolve_key[1]),
    }


def _candidate_in(d: Mapping[str, Any], job: str, incarnation: int) -> Candidate:
    return Candidate(
        kind=AnomalyKind(d["kind"]), job=job, incarnation=incarnation, communicator=str(d["communicator"]),
        op_seq=int(d["op_seq"]), op_type=str(d["op_type"]),
        root_cause_ranks=tuple(int(r) for r in d["root_cause_ranks"]),
        affected_ranks=tuple(int(r) for r in d["affected_ranks"]),
        confidence=float(d["confidence"]), evidence=str(d["evidence"]), onset_time=float(d["onset_time"]),
        root_cause_hosts=tuple(str(h) for h in d["root_cause_hosts"]), link=_verdict_link_in(d["link"]),
        channel=_opt_int(d["channel"]), p=None if d["p"] is None else float(d["p"]),
        mismatch_field=_opt_str(d["mismatch_field"]), details={str(k): str(v) for k, v in d["details"].items()},
        resolve_key=(str(d["resolve_family"]), int(d["resolve_value"])),
    )


def _ranks_out(a: I64) -> list[int]:
    return [int(r) for r in a.tolist()]


def _ranks_in(values: Iterable[int]) -> I64:
    return np.asarray(list(values), dtype=np.int64)


def _link_out(link: tuple[int, int] | None) -> dict[str, int] | None:
    return None if link is None else {"src": int(link[0]), "dst": int(link[1])}


def _link_in(d: Mapping[str, Any] | None) -> tuple[int, int] | None:
    return None if d is None else (int(d["src"]), int(d["dst"]))


def _verdict_link_in(d: Mapping[str, Any] | None) -> Link | None:
    return None if d is None else Link(int(d["src"]), int(d["dst"]))


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _opt_str(v: Any) -> str | None:
    return None if v is None else str(v)


class Watch:
    """The findings a shard has reported, by (communicator, family, value): checked for their end at
    every evaluation (the op's name is kept for the evidence text).

    The shard does not know which of its findings became incidents (the job stage decides), so it
    checks each one it reported, and reports the end of each at every evaluation for ``OVER_REPORT_S``
    of job time: a report lost or read late by the stage costs a second, never a resolution. The
    evidence is computed afresh each time, so a finding that comes back is not reported over.
    """

    def __init__(self) -> None:
        self.items: OrderedDict[tuple[str, str, int], str] = OrderedDict()
        self.over_since: dict[tuple[str, str, int], float] = {}

    def add(self, c: Candidate) -> None:
        key = (c.communicator, *c.resolve_key)
        self.items[key] = c.op_type
        self.items.move_to_end(key)
        while len(self.items) > WATCH_MEMORY:
            old, _ = self.items.popitem(last=False)
            self.over_since.pop(old, None)

    def ended(self, ja: JobAnalysis, now: float) -> dict[tuple[str, str, int], str]:
        out: dict[tuple[str, str, int], str] = {}
        for key, op in list(self.items.items()):
            ev = ja.resolution(*key, op)
            if not ev:
                self.over_since.pop(key, None)
                continue
            out[key] = ev
            if now - self.over_since.setdefault(key, now) >= OVER_REPORT_S:
                del self.items[key]
                del self.over_since[key]
        return out

    def state_dict(self) -> list[list[Any]]:
        return [[*k, op, self.over_since.get(k)] for k, op in self.items.items()]

    @classmethod
    def from_state(cls, items: list[list[Any]]) -> Watch:
        w = cls()
        for comm, fam, val, op, since in items[-WATCH_MEMORY:]:
            key = (str(comm), str(fam), int(val))
            w.items[key] = str(op)
            if since is not None:
                w.over_since[key] = float(since)
        return w


def shard_report(ja: JobAnalysis, watch: Watch, now: float, stats: dict[str, Any]) -> ShardReport:
    """Apply what ``ja`` has queued and judge its communicators (``stats`` counts ops and reordering)."""
    s = ja.s
    js = ja.js
    rows = js.take_rows()
    if rows is not None and rows.n:
        stats["out_of_order"] += js.apply_latest(rows)
        ja.ops.add(js, rows)
    completed = ja.ops.take_completed(js, now, s.finalize_timeout_s)
    stats["ops_completed"] += completed.n
    ja.cadence.update(completed.cid, completed.seq, completed.sig, js.n_comms)
    touched = ja.slow.update(js, completed)
    slow = [slow_candidate(ja, f) for bi in ja.slow.alarmed(touched).tolist() for f in ja.slow.findings(js, bi)]
    for c in slow:
        watch.add(c)
    # hangs: the diagnosis of each stalled communicator (cached while it stays stalled at the same mark)
    stalled = np.flatnonzero((js.c_inside > 0) & (now - js.c_progress_now >= s.wait_edge_min_s))
    diags: dict[int, CommDiag] = {}
    stalls: list[Stall] = []
    last: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None  # _rank_last, once a cut needs it
    for cid in stalled.tolist():
        mark = float(js.c_progress_now[cid])
        sl = slice(int(js.c_off[cid]), int(js.c_off[cid] + js.c_size[cid]))
        waited = np.inf
        if now - float(js.m_seen_now[sl].max(initial=-1.0)) >= s.cut_min_s:
            # every rank of it went silent (for longer than records take to come: at cut_min_s = the delivery
            # interval a pipeline receiver that reports every second counted as silent, and a stage behind a
            # hang was named as its root): a hang only if its own records showed someone waiting in the op
            # longer than its ops have ever lasted, slow ones too, before they stopped; else the job ended
            # mid-op (mid-slowdown: its ranks waited about as long in every op), or its link to the broker
            # was cut (a hung rank's peers report every interval while they wait)
            inside = ~js.m_done[sl] & (js.m_t_enter[sl] >= 0) & (js.m_t_sample[sl] >= js.m_t_enter[sl])
            waited = float((js.m_t_sample[sl] - js.m_t_enter[sl])[inside].max(initial=0)) / 1e9
            longest = max(float(js.c_maxop_s[cid]), float(js.c_longop_s[cid]))
            need = max(s.cut_wait_min_s, 2.0 * longest)
            # ... and only if a member it waited for had stopped too: one whose communicators moved until
            # shortly before the silence was on its way (a pipeline stage behind, busy in its sends when the
            # job ended), and the wait, however long against this op's own, was the end's
            if waited < need:
                continue
            last = last or _rank_last(js)
            if not _missing_stopped(js, sl, inside, need, *last):
                continue
        cached = ja.diag_cache.get(cid)
        if cached is None or cached[0] != mark or (cached[1] is not None and cached[1].provisional):
            d = diagnose(js, cid, ja.known_sigs(cid), ja.expected_sig(cid))
            ja.diag_cache[cid] = (mark, d)
        else:
            d = cached[1]
        if d is None:
            continue
        thr = ja.threshold(d.kind, cid, d.op_type)
        if d.op_type == BARRIER and waited < thr:
            # silent at a barrier: a job ends in one (the ranks that finish first wait for the others), a
            # checkpoint waits in one; a hang only if its ranks were seen waiting the whole threshold
            continue
        diags[cid] = d
        comm = js.comm_hex(cid)
        stalls.append(Stall(comm, d, now - mark, thr, mark))
        watch.add(Candidate(kind=d.kind, job=ja.job, incarnation=ja.incarnation, communicator=comm, op_seq=d.seq,
                            op_type=d.op_name, root_cause_ranks=(), affected_ranks=(), confidence=0.0, evidence="",
                            onset_time=mark, resolve_key=("hang", d.seq)))
    ja.learn_pauses(diags, now)
    # every root the job stage can name is missing from some H1 op or an H2/H3 culprit, and the shard
    # of that op knows its host (the rank reported there before); waiting ranks need none
    named = sorted({r for d in diags.values() for a in (d.missing, d.culprits) for r in a.tolist() if r >= 0})
    return ShardReport(ja.job, ja.incarnation, now, tuple(slow), tuple(stalls), ja.host_map(named),
                       watch.ended(ja, now), seen=js.last_now, lost=dict(ja.lost))


def _rank_last(js: JobState) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per global rank, the analyzer time its communicators last moved (the latest ``c_progress_now`` of any
    communicator it is a member of) and the time its newest record came (``m_seen_now``); -1 where unknown."""
    n = int(js.m_grank.max(initial=-1)) + 1
    moved, seen = np.full(n, -1.0), np.full(n, -1.0)
    ok = js.m_grank >= 0
    g = js.m_grank[ok]
    np.maximum.at(moved, g, js.c_progress_now[js.m_cid[ok]])
    np.maximum.at(seen, g, js.m_seen_now[ok])
    return moved, seen


def _missing_stopped(js: JobState, sl: slice, inside: npt.NDArray[np.bool_], need_s: float,
                     moved: npt.NDArray[np.float64], seen: npt.NDArray[np.float64]) -> bool:
    """Whether some member of a silent communicator that is not inside its op (one the others wait for)
    had stopped for ``need_s`` before the silence: no communicator of it moved for that long before the
    members inside last reported (a rank that stopped leaves every one of its communicators where it was;
    one still at work moves some), or it fell silent that long before them (``moved``, ``seen``: ``_rank_last``).
    True when every member is inside (what they hold decides: H2, H3)."""
    out = ~inside
    if not out.any():
        return True
    seen_inside = float(js.m_seen_now[sl][inside].max(initial=-1.0))
    g = js.m_grank[sl][out]
    g = g[g >= 0]
    if g.size < int(out.sum()):
        return True  # a member of unknown rank: nothing known of it
    m = moved[g]
    return bool((m < 0).any() or (np.maximum(seen_inside - m, seen_inside - seen[g]) >= need_s).any())
