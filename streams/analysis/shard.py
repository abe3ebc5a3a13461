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
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ccld.streams.analysis.hangs import CommDiag, diagnose
from ccld.streams.analysis.incidents import Candidate
from ccld.streams.analysis.jobview import JobAnalysis, slow_candidate

#: Incidents a shard keeps checking for their end (per job); the oldest beyond it are forgotten.
WATCH_MEMORY = 4096


@dataclass(frozen=True)
class Stall:
    """One stalled communicator: its diagnosis and what the job stage needs to judge and name it."""

    comm: str  # 16 hex digits
    diag: CommDiag  # ``diag.cid`` is the shard's own index: the job stage goes by ``comm``
    stall_s: float  # analyzer time since the communicator last progressed
    threshold_s: float  # the hang threshold of ``diag.kind`` for this communicator
    onset: float  # analyzer time of the last progress


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


class Watch:
    """The (communicator, resolve key) pairs a shard has reported: checked for their end every evaluation.

    The shard does not know which of its findings became incidents (the job stage decides), so it
    checks each one it reported until it is over; the job stage ignores the ends of non-incidents.
    """

    def __init__(self) -> None:
        self.items: OrderedDict[tuple[str, str, int], Candidate] = OrderedDict()

    def add(self, c: Candidate) -> None:
        key = (c.communicator, *c.resolve_key)
        self.items[key] = c
        self.items.move_to_end(key)
        while len(self.items) > WATCH_MEMORY:
            self.items.popitem(last=False)

    def ended(self, ja: JobAnalysis) -> dict[tuple[str, str, int], str]:
        out: dict[tuple[str, str, int], str] = {}
        for key, c in list(self.items.items()):
            ev = ja.resolution(c)
            if ev:
                out[key] = ev
                del self.items[key]
        return out


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
    for cid in stalled.tolist():
        mark = float(js.c_progress_now[cid])
        cached = ja.diag_cache.get(cid)
        if cached is None or cached[0] != mark:
            d = diagnose(js, cid, ja.known_sigs(cid), ja.expected_sig(cid))
            ja.diag_cache[cid] = (mark, d)
        else:
            d = cached[1]
        if d is None:
            continue
        diags[cid] = d
        comm = js.comm_hex(cid)
        stalls.append(Stall(comm, d, now - mark, ja.threshold(d.kind, cid, d.op_type), mark))
        watch.add(Candidate(d.kind, ja.job, ja.incarnation, comm, d.seq, d.op_name, (), (), 0.0, "", mark,
                            resolve_key=("hang", d.seq)))
    ja.learn_pauses(diags, now)
    # every root the job stage can name is missing from some H1 op or an H2/H3 culprit, and the shard
    # of that op knows its host (the rank reported there before); waiting ranks need none
    named = sorted({r for d in diags.values() for a in (d.missing, d.culprits) for r in a.tolist() if r >= 0})
    return ShardReport(ja.job, ja.incarnation, now, tuple(slow), tuple(stalls), ja.host_map(named),
                       watch.ended(ja))
