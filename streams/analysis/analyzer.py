"""The Analyzer: kernel batches in, deduplicated verdicts out (pure, no I/O).

``ingest`` only queues a batch (cheap, so thousands of small batches cost little); ``evaluate``
applies everything queued with a few numpy passes per job, judges completed ops for slowness,
stalled communicators for hangs, resolves the cross-communicator wait-for relation, and turns
root causes into incidents.
``replay.analyze_batches`` replays a stream with an evaluation every tick.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from ccld.errors import RecordError
from ccld.records import KernelBatch, Verdict
from ccld.streams.analysis.incidents import IncidentBook
from ccld.streams.analysis.inflight import load_comm, save_comm, stalled_comms
from ccld.streams.analysis.job_stage import JobStage
from ccld.streams.analysis.jobview import JobAnalysis
from ccld.streams.analysis.settings import AnalyzerSettings
from ccld.streams.analysis.shard import ShardReport, Watch, shard_report

log = logging.getLogger(__name__)

STATE_VERSION = 1
CADENCE_STATE_MAX = 4096  # communicator cadences kept in state_dict (each a few signatures)
#: Member rows of stalled communicators kept in state_dict (newest stalls first): about 13 bytes a row
#: once compressed (a hung 8,192-rank job: 8,248 rows, 103 KB), so a snapshot stays well under the
#: broker's message limit (~1 MB).
STALL_ROWS_STATE_MAX = 16384


class Analyzer:
    """Detects and localizes H1-H3 hangs and S1-S3 slowdowns across any number of jobs."""

    def __init__(self, settings: AnalyzerSettings | None = None, *, whole_jobs: bool = True) -> None:
        self.settings = settings or AnalyzerSettings()
        # every record of each of its jobs comes here (not a shard of jobs spread over partitions): a rank no record
        # has come from is one the job has never heard from
        self.whole_jobs = whole_jobs
        self.jobs: dict[tuple[str, int], JobAnalysis] = {}
        self.stage = JobStage(self.settings)
        self._watch: dict[tuple[str, int], Watch] = {}  # per job: findings checked for their end
        self._batches: dict[str, OrderedDict[int, str]] = {}  # producer -> batch_seq -> content mark
        self._pauses: dict[str, list[float]] = {}  # "job|inc|comm" -> benign pauses (restored state)
        self._cadence: dict[str, list[int]] = {}  # "job|inc|comm" -> signature pattern (restored state)
        self._stats: dict[str, int] = {
            "batches": 0, "records": 0, "duplicates": 0, "out_of_order": 0, "evaluations": 0,
            "ops_completed": 0, "verdicts": 0, "jobs": 0, "communicators": 0,
            "stalls_unsaved": 0,  # stalled communicators the last state_dict left out (over STALL_ROWS_STATE_MAX)
        }
        self._held_starved = 0  # slow-communication findings held in forgotten jobs (see SlowDetector.held_starved)
        self._held_cheap = 0  # ... and held for costing the job too little (SlowDetector.held_cheap)
        self._now = 0.0  # the newest analyzer time seen (ingest, evaluate, reports)

    # -- input ---------------------------------------------------------------------------------
    def ingest(self, batch: KernelBatch, now: float) -> None:
        """Queue one batch (any job, incarnation, communicator); duplicates are dropped."""
        if batch.n == 0:
            return
        if batch.producer:
            seen = self._batches.get(batch.producer)
            if seen is None:
                seen = self._batches[batch.producer] = OrderedDict()
                if len(self._batches) > self.settings.producer_memory:
                    del self._batches[next(iter(self._batches))]
            # a restarted producer may reuse sequence numbers: only the same content is a duplicate
            ts = batch.columns["t_sample_ns"]
            mark = f"{batch.comm_hash}:{batch.n}:{int(ts[0])}:{int(ts[-1])}"
            if seen.get(batch.batch_seq) == mark:
                self._stats["duplicates"] += 1
                return
            seen[batch.batch_seq] = mark
            if len(seen) > self.settings.batch_memory:
                seen.popitem(last=False)
        key = (batch.job, batch.incarnation)
        ja = self.jobs.get(key)
        if ja is None:
            ja = self._new_job(key)
            self._stats["jobs"] += 1
        if batch.lost_ranks:
            ja.note_lost(batch.lost_ranks, batch.lost_records, now)
        if batch.cpu_wait:
            ja.js.note_cpu(batch.cpu_wait, now)
        ja.js.queue(batch, now)
        if self.whole_jobs and batch.world_size > ja.js.world:
            ja.js.world = batch.world_size
        self._now = max(self._now, now)
        self._stats["batches"] += 1
        self._stats["records"] += batch.n

    # -- decisions -----------------------------------------------------------------------------
    def evaluate(self, now: float) -> list[Verdict]:
        """Verdicts (OPEN, UPDATE, RESOLVED) that are new since the last call: every job's shard
        report, decided at once by the job stage (the single-process analyzer is one shard)."""
        self._stats["evaluations"] += 1
        # never judged at an earlier time than before: silence already judged would be judged again as new
        # (a worker's clock held while it was behind once went back a minute: false hangs on ended jobs)
        now = self._now = max(self._now, now)
        out = self.stage.restarted(self.newest_incarnations(), now)
        for key, ja in list(self.jobs.items()):
            out.extend(self.stage.decide([(0, self._report(key, ja, now))], now))
            if now - ja.js.last_now > self.settings.job_expiry_s and not self.stage.has_open(key):
                self._forget(key)  # an incarnation that stopped reporting long ago: forget it
        self._stats["verdicts"] += len(out)
        self._stats["communicators"] = sum(j.js.n_comms for j in self.jobs.values())
        return out

    def reports(self, now: float) -> list[ShardReport]:
        """This analyzer as one shard of its jobs: every job's report, for a job stage elsewhere.

        A job silent past the expiry is forgotten once none of its findings is still being watched
        for its end (the stage, not the shard, knows which became incidents).
        """
        self._stats["evaluations"] += 1
        now = self._now = max(self._now, now)  # never an earlier time than before (evaluate)
        out: list[ShardReport] = []
        for key, ja in list(self.jobs.items()):
            out.append(self._report(key, ja, now))
            if now - ja.js.last_now > self.settings.job_expiry_s and not self._watch[key].items:
                self._forget(key)
        self._stats["communicators"] = sum(j.js.n_comms for j in self.jobs.values())
        return out

    def newest_incarnations(self) -> dict[str, int]:
        newest: dict[str, int] = {}
        for job, inc in self.jobs:
            newest[job] = max(inc, newest.get(job, inc))
        return newest

    def _new_job(self, key: tuple[str, int]) -> JobAnalysis:
        """A new job incarnation's analysis, with what a restored state learned of it (pauses, cadences)."""
        ja = JobAnalysis(key[0], key[1], self.settings)
        for k, v in self._pauses.items():
            job, inc, comm = k.rsplit("|", 2)
            if (job, int(inc)) == key:
                ja.restored_pauses[comm] = list(v)
        prefix = f"{key[0]}|{key[1]}|"
        ja.cadence.restore({k[len(prefix) :]: v for k, v in self._cadence.items() if k.startswith(prefix)})
        self.jobs[key] = ja
        return ja

    def _report(self, key: tuple[str, int], ja: JobAnalysis, now: float) -> ShardReport:
        watch = self._watch.get(key)
        if watch is None:
            watch = self._watch[key] = Watch()
        return shard_report(ja, watch, now, self._stats)

    def _forget(self, key: tuple[str, int]) -> None:
        self._held_starved += self.jobs[key].slow.held_starved
        self._held_cheap += self.jobs[key].slow.held_cheap
        del self.jobs[key]
        self._watch.pop(key, None)
        self.stage.forget(key)

    @property
    def book(self) -> IncidentBook:
        return self.stage.book

    # -- persistence ---------------------------------------------------------------------------
    def state_dict(self, *, search_cadence: bool = True) -> dict[str, Any]:
        """Compact JSON-serialisable state: emitted/open incidents, duplicate windows, pauses, and the
        newest rows of stalled communicators (a hang not yet reported is found again after a restart).

        ``search_cadence=False`` saves the step patterns found so far without searching more (the
        search is most of a save's cost at thousands of ranks; the worker searches once a second).
        """
        pauses = dict(self._pauses)
        for ja in self.jobs.values():
            for comm, v in ja.pause_items():
                pauses[f"{ja.job}|{ja.incarnation}|{comm}"] = v
        cadence = dict(self._cadence)
        for ja in self.jobs.values():
            for comm, pat in ja.cadence_items(search_cadence):
                cadence[f"{ja.job}|{ja.incarnation}|{comm}"] = pat
        return {
            "version": STATE_VERSION,
            "incidents": self.book.state_dict(),
            # the most recent producers and batches: what an at-least-once replay can resend
            "batches": {
                p: [[k, v] for k, v in list(seen.items())[-256:]] for p, seen in list(self._batches.items())[-64:]
            },
            "pauses": pauses,
            # learned multi-signature cadences (a few ints each), newest jobs last, bounded
            "cadence": dict(list(cadence.items())[-CADENCE_STATE_MAX:]),
            # findings watched for their end: a shard restarted after a hang ended still reports its end
            "watch": {_job_str(key): w.state_dict() for key, w in self._watch.items() if w.items},
            # the newest record's time of each job with an open incident (a shard: with findings watched for the
            # stage's incidents): a job that ended before the snapshot sends nothing after a restart, and only a
            # job held here is judged (reported) silent and its incident closed
            "open_jobs": {_job_str(key): ja.js.last_now for key, ja in self.jobs.items()
                          if self.stage.has_open(key) or self._watched(key)},
            **self._stalled_state(),
            # not the evaluation count: the timer evaluates every second, and a snapshot that differs only in
            # it would be written every second for a partition where nothing happened (the worker writes a
            # snapshot only when it changed); it counts this process's evaluations
            "stats": {k: v for k, v in self._stats.items() if k != "evaluations"},
        }

    def _stalled_state(self) -> dict[str, Any]:
        """``{"stalled": ...}``: the newest rows of every stalled communicator (``inflight``), newest stalls
        first up to ``STALL_ROWS_STATE_MAX`` rows; nothing at all when no communicator is stalled.

        The worker commits its input once a snapshot covers it, so a job that hangs and goes silent is
        found again after a restart only from this (``inflight`` says why these rows and which).
        """
        found: list[tuple[float, tuple[str, int], int]] = []
        for key, ja in self.jobs.items():
            now = max(self._now, ja.js.last_now)
            found.extend((onset, key, cid) for onset, cid in stalled_comms(ja.js, now, self.settings.wait_edge_min_s))
        if not found:
            self._stats["stalls_unsaved"] = 0
            return {}
        found.sort(key=lambda x: -x[0])
        room, cut = STALL_ROWS_STATE_MAX, 0
        keep: dict[tuple[str, int], list[int]] = {}
        for _, key, cid in found:
            size = int(self.jobs[key].js.c_size[cid])
            if size > room:
                cut += 1
                continue
            room -= size
            keep.setdefault(key, []).append(cid)
        self._stats["stalls_unsaved"] = cut
        out: dict[str, Any] = {}
        for key, cids in keep.items():
            js = self.jobs[key].js
            hosts: dict[int, int] = {}
            comms = [save_comm(js, cid, hosts) for cid in sorted(cids)]
            out[_job_str(key)] = {"last_now": js.last_now, "comms": comms,
                                         "hosts": [js.host_names[h] for h in hosts]}
        return {"stalled": out}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any], settings: AnalyzerSettings | None = None, *,
                        whole_jobs: bool = True) -> Analyzer:
        a = cls(settings, whole_jobs=whole_jobs)
        try:
            if int(state.get("version", 0)) != STATE_VERSION:
                raise RecordError(f"analyzer state version {state.get('version')!r} is not {STATE_VERSION}")
            a.book.load(state.get("incidents", {}))
            for p, seqs in state.get("batches", {}).items():
                a._batches[str(p)] = OrderedDict((int(k), str(v)) for k, v in seqs)
            a._pauses = {str(k): [float(x) for x in v] for k, v in state.get("pauses", {}).items()}
            a._cadence = {str(k): [int(x) for x in v] for k, v in state.get("cadence", {}).items()}
            for k, items in state.get("watch", {}).items():
                a._watch[_job_key(str(k))] = Watch.from_state(items)
            for k, v in state.get("stats", {}).items():
                if k in a._stats:
                    a._stats[k] = int(v)
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"bad analyzer state: {exc}") from exc
        for k, saved in dict(state.get("stalled", {})).items():
            a._load_stalled(str(k), saved)
        for k, last in dict(state.get("open_jobs", {})).items():
            a._load_open_job(str(k), last)
        return a

    def _watched(self, key: tuple[str, int]) -> bool:
        w = self._watch.get(key)
        return w is not None and bool(w.items)

    def _load_open_job(self, k: str, last: Any) -> None:
        """A job with an open incident, held again with its newest record's time (it may never send another)."""
        try:
            key, last_now = _job_key(k), float(last)
        except (TypeError, ValueError) as exc:
            log.warning("analyzer state: open job %r unreadable (%s); its incident closes only if it sends again",
                        k, exc)
            return
        ja = self.jobs.get(key) or self._new_job(key)
        ja.js.last_now = max(ja.js.last_now, last_now)
        self._now = max(self._now, last_now)

    def _load_stalled(self, k: str, saved: Mapping[str, Any]) -> None:
        """One job's saved stalled communicators; a bad entry loses them (and says so), never the rest."""
        key: tuple[str, int] | None = None
        try:
            key = _job_key(k)
            ja = self._new_job(key)
            hosts = [str(h) for h in saved["hosts"]]
            for d in saved["comms"]:
                load_comm(ja.js, d, hosts)
            ja.js.last_now = float(saved["last_now"])
            self._now = max(self._now, ja.js.last_now)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            log.warning("analyzer state: the stalled communicators of %s are unreadable (%s: %s); dropped",
                        k, type(exc).__name__, exc)
            if key is not None:
                self.jobs.pop(key, None)

    @property
    def stats(self) -> Mapping[str, int]:
        held = self._held_starved + sum(j.slow.held_starved for j in self.jobs.values())
        cheap = self._held_cheap + sum(j.slow.held_cheap for j in self.jobs.values())
        return {**self._stats, "slow_held_starved": held, "slow_held_cheap": cheap}


def _job_str(key: tuple[str, int]) -> str:
    """A job incarnation as the state's keys name it: ``job|incarnation``."""
    return f"{key[0]}|{key[1]}"


def _job_key(k: str) -> tuple[str, int]:
    """``_job_str``'s inverse (a job's name may hold ``|``; ValueError for a key without an incarnation)."""
    job, inc = k.rsplit("|", 1)
    return job, int(inc)
