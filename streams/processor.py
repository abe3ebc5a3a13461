"""What the worker does with one metrics message, free of Faust: decode, check, analyze, dedupe.

One ``PartitionProcessor`` per metrics partition holds, for every job on the partition, an
``Analyzer`` and that job's analyzer clock (``JobClock``: the job's message timestamps,
checked against the consensus of the job's producers), so no producer can move the clock of
another job. It also holds the verdicts waiting for the broker's acknowledgement and the set of
verdicts already acknowledged: a message delivered twice (at-least-once) or a restart from a
snapshot never sends a verdict twice, and a verdict whose send was never acknowledged is sent
again, after a restart too. Nothing on input raises out of ``handle``: every failure becomes a
dead letter with a reason, and a counter.
"""

from __future__ import annotations

import json
import logging
import math
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ccld.errors import SchemaError
from ccld.records import COMM_COLUMN, DeadLetter, KernelBatch, Verdict, comm_group, job_partition
from ccld.schemas.codec import DEAD_LETTER_RAW_MAX, decode_metrics, encode_dead_letter, make_dead_letter
from ccld.streams.analysis.analyzer import Analyzer
from ccld.streams.analysis.settings import AnalyzerSettings
from ccld.streams.analysis.shard import encode_report
from ccld.streams.clock import JobClock
from ccld.streams.outbox import Outbox

log = logging.getLogger(__name__)

#: Search the analyzer's step patterns for a snapshot at most this often (s of wall time).
CADENCE_SEARCH_EVERY_S = 1.0
#: A rank clock this far (s) from its message's timestamp is broken, not skewed (counted, said once).
FAR_CLOCK_S = 86_400.0
#: Times below this (ns; 2001-09-09 as wall time, 31 years as uptime) are on a since-boot clock, not a
#: wall clock: the PyTorch attachment times with ``time.monotonic_ns``, and no host runs that long
BOOT_CLOCK_MAX_NS = 10**18


@dataclass
class Output:
    """What handling a message produced: encoded verdicts and dead letters to send."""

    verdicts: list[tuple[Verdict, bytes]] = field(default_factory=list)
    dead_letters: list[tuple[DeadLetter, bytes]] = field(default_factory=list)


@dataclass(frozen=True)
class ProcessorOptions:
    """The worker settings a processor needs (defaults: those of ``ccld.settings.Settings``)."""

    eval_every_s: float = 1.0  # evaluate at most once per this much analyzer-clock time (handle(evaluate=None))
    clock_max_skew_s: float = 30.0  # see JobClock
    clock_active_s: float = 120.0  # see JobClock
    caught_up_lag_s: float = 5.0  # reading later than this, the worker is behind: silence is not evidence
    dead_letter_raw_max: int = DEAD_LETTER_RAW_MAX  # raw bytes kept in a dead letter
    shard: bool = False  # jobs spread over partitions: report to the job stage instead of deciding verdicts
    partitions: int = 0  # of the metrics topic (0: unknown, the routing is not checked)
    groups: int = 1  # analysis_groups: where each communicator's rows must arrive


@dataclass
class JobState:
    """One job's analyzer and analyzer clock."""

    analyzer: Analyzer
    clock: JobClock
    last_eval: float = -1e18  # job-clock time of the last evaluation from handle()
    # Offset after the job's newest message handled: its state (in its own snapshot part) covers every
    # message of the job below it, so one delivered again below it is skipped (``replayed_skipped``).
    upto: int = -1


class PartitionProcessor(Outbox):
    """Per-job analyzers and clocks, pending verdicts and de-duplication for one partition of the metrics topic."""

    def __init__(self, partition: int, settings: AnalyzerSettings, state: Mapping[str, Any] | None = None,
                 options: ProcessorOptions | None = None) -> None:
        self.partition = partition
        self.options = options or ProcessorOptions()
        self.counters: dict[str, int] = {"messages": 0, "records": 0, "dead_letters": 0, "bad_value": 0,
                                         "verdicts": 0, "duplicate_verdicts": 0, "verdict_send_failures": 0}
        self.settings = settings
        self.jobs: dict[str, JobState] = {}  # by job name, least recently fed first
        self.next_offset = -1  # offset after the last message handled
        # The identity of the metrics topic that ``next_offset`` counts in (None until the worker learns
        # it): a snapshot taken before a recreated topic was re-read still names the old one.
        self.topic_id: str | None = None
        self._resume_offset: int | None = None  # next_offset of the snapshot we resumed from
        self._cadence_searched = -math.inf  # monotonic time of the last snapshot that searched step patterns
        self._init_outbox(state)
        self._misrouted: set[str] = set()  # jobs already reported as misrouted (one error line each)
        self._far_said: set[str] = set()  # producers whose far-off rank clock was already logged
        self.lag_s = 0.0  # how far behind the latest message was read (JobClock.lag_s), at wall time lag_recv
        self.lag_recv = -math.inf
        # Shard mode (jobs spread over several partitions): reports for the job stage, no verdicts here.
        self._reports: list[tuple[bytes, bytes]] = []
        if state:
            # Counters carry on across restarts and rebalances (replayed messages count again as messages).
            self.counters.update({str(k): int(v) for k, v in dict(state.get("counters", {})).items()})
            if "analyzer" in state and "jobs" not in state:
                log.warning("partition %d: snapshot from before per-job clocks; analyzer state starts empty",
                            partition)
            restored_at = time.time()
            for job, js in dict(state.get("jobs", {})).items():
                j = self._new_job()
                j.analyzer = Analyzer.from_state_dict(js["analyzer"], settings, whole_jobs=not self.options.shard)
                j.clock.load_state_dict(js["clock"])
                j.upto = int(js.get("upto", -1))
                # The downtime was not observed: a quiet job's clock resumes from now where it stopped.
                j.clock.hold(restored_at)
                self.jobs[str(job)] = j
            self._resume_offset = self.next_offset = int(state.get("next_offset", -1))
            self.topic_id = state.get("topic_id")

    def _new_job(self) -> JobState:
        clock = JobClock(max_skew_s=self.options.clock_max_skew_s, active_s=self.options.clock_active_s)
        return JobState(Analyzer(self.settings, whole_jobs=not self.options.shard), clock)

    @property
    def clock_s(self) -> float:
        """The newest analyzer clock of any job on the partition (seconds; 0 before the first message)."""
        return max((j.clock.now_s for j in self.jobs.values()), default=0.0)

    def job_clock(self, job: str) -> float:
        """The analyzer clock of ``job`` (seconds; 0 for a job not seen)."""
        j = self.jobs.get(job)
        return 0.0 if j is None else j.clock.now_s

    # --- per message ------------------------------------------------------------------------

    def handle(self, raw: bytes | None, *, topic: str, offset: int, timestamp_s: float | None,
               evaluate: bool | None = None, recv_s: float | None = None) -> Output:
        """Decode, check and analyze one message; never raises for anything about the message.

        ``evaluate`` None: evaluate when the clock moved ``eval_every_s`` since the last time.
        ``recv_s`` is the worker's wall time at receipt (default: now).
        """
        out = Output()
        self.counters["messages"] += 1
        recv = time.time() if recv_s is None else recv_s
        if self._resume_offset is not None:
            # Offsets committed after the snapshot was written were never analyzed by this state:
            # say so (the analyzer re-learns from the records that follow) rather than hide it.
            if self._resume_offset >= 0 and offset > self._resume_offset:
                self.counters["skipped_by_restart"] = offset - self._resume_offset
                log.warning("partition %d: %d messages between the snapshot and the committed offset were "
                            "not analyzed after the restart", self.partition, offset - self._resume_offset)
            self._resume_offset = None
        self.next_offset = max(self.next_offset, offset + 1)
        try:
            batch = decode_metrics(raw or b"")
        except SchemaError as exc:
            if exc.reason == "bad-value":
                self.counters["bad_value"] += 1
            out.dead_letters.append(self.dead_letter(raw, exc.reason, exc.detail, topic=topic, offset=offset))
            return out
        except Exception as exc:  # a decoder bug on odd bytes is still the message's fault: keep it, go on
            log.exception("decoding %s[%d]@%d failed unexpectedly", topic, self.partition, offset)
            out.dead_letters.append(self.dead_letter(raw, "decode-error", f"{type(exc).__name__}: {exc}",
                                                     topic=topic, offset=offset))
            return out
        self._check_route(batch, topic, offset)
        self._check_clocks(batch, timestamp_s)
        if batch.lost_records:
            self.counters["upstream_lost_records"] = self.counters.get("upstream_lost_records", 0) + batch.lost_records
        job = self.jobs.pop(batch.job, None) or self._new_job()
        self.jobs[batch.job] = job  # re-inserted last: the least recently fed job comes first
        if offset < job.upto:
            # The job's part of the snapshot was written after this message (its partition's head was not):
            # the job's state has it already.
            self.counters["replayed_skipped"] = self.counters.get("replayed_skipped", 0) + 1
            return out
        job.upto = max(job.upto, offset + 1)
        producer = batch.producer or f"job:{batch.job}/{batch.incarnation}"
        if not job.clock.observe(producer, timestamp_s, recv):
            self.counters["clock_rejected"] = sum(j.clock.rejected for j in self.jobs.values())
            self.counters["clock_ignored"] = sum(j.clock.ignored for j in self.jobs.values())
        now = job.clock.now_s
        self.lag_s, self.lag_recv = job.clock.lag_s, recv
        self.counters["records"] += batch.n
        try:
            job.analyzer.ingest(batch, now)
        except Exception as exc:  # an analyzer bug on one batch must not stop the partition: keep the batch
            log.exception("analyzer failed on %s[%d]@%d", topic, self.partition, offset)
            out.dead_letters.append(self.dead_letter(raw, "analyzer-error", f"{type(exc).__name__}: {exc}",
                                                     topic=topic, offset=offset))
            return out
        due = evaluate if evaluate is not None else now - job.last_eval >= self.options.eval_every_s
        if due:
            job.last_eval = now
            self._evaluate_job(batch.job, job, now)
            out.verdicts = self.pending()
        return out

    def offsets_restart(self) -> None:
        """The metrics topic was recreated and its offsets start again: no job's offset covers the new log."""
        for job in self.jobs.values():
            job.upto = -1

    def _check_route(self, batch: KernelBatch, topic: str, offset: int) -> None:
        """Count (and say once per job) rows on a partition their job and communicator group do not map
        to: a producer whose ``analysis_groups`` differs from the workers'. Its rows are still analyzed,
        but a communicator split over two partitions, or a job's groups decided apart, gives wrong roots."""
        p, g = self.options.partitions, self.options.groups
        if p <= 0:
            return
        if g <= 1:
            bad = batch.n if job_partition(batch.job, p) != self.partition else 0
        else:
            home = job_partition(batch.job, p)
            bad = int(((home + comm_group(batch.columns[COMM_COLUMN], g)) % p != self.partition).sum())
        if bad:
            self.counters["misrouted_rows"] = self.counters.get("misrouted_rows", 0) + bad
            if batch.job not in self._misrouted:
                self._misrouted.add(batch.job)
                log.error("partition %d: %s@%d: %d rows of job %s belong on another partition: its producers' "
                          "CCLD_ANALYSIS_GROUPS (or partition count) differs from the workers' (%d groups, %d "
                          "partitions); verdicts of this job may name victims as roots", self.partition, topic,
                          offset, bad, batch.job, g, p)

    def _check_clocks(self, batch: KernelBatch, timestamp_s: float | None) -> None:
        """Count rows whose rank clock is more than ``FAR_CLOCK_S`` from the message's timestamp (a
        since-boot clock, ``BOOT_CLOCK_MAX_NS``, is not a wall clock and is never far).

        The analyzer uses only durations on each rank's own clock, so such rows are analysed, not
        dropped; but a rank clock years off is a broken host clock an operator should hear of: counted
        (``far_clock_records``) and said once per producer.
        """
        if timestamp_s is None or batch.n == 0:
            return
        cols = batch.columns
        t = np.maximum(np.maximum(cols["t_sample_ns"], cols["t_enter_ns"]), cols["t_exit_ns"])
        far = (t >= BOOT_CLOCK_MAX_NS) & (np.abs(t * 1e-9 - timestamp_s) > FAR_CLOCK_S)
        n = int(far.sum())
        if not n:
            return
        self.counters["far_clock_records"] = self.counters.get("far_clock_records", 0) + n
        who = batch.producer or batch.job
        if who not in self._far_said and len(self._far_said) < 1024:
            self._far_said.add(who)
            rank = int(batch.columns["rank"][far][0])
            log.warning("partition %d: %s's rank %d clock is %.0f days from its message's timestamp (%d records "
                        "so far); analysed on its own clock, but check that host's time", self.partition, who, rank,
                        abs(float(t[far][0]) * 1e-9 - timestamp_s) / 86400, n)

    def dead_letter(self, raw: bytes | None, reason: str, detail: str, *, topic: str,
                    offset: int) -> tuple[DeadLetter, bytes]:
        """A counted dead letter for ``raw`` (cut to ``dead_letter_raw_max`` bytes), encoded."""
        return counted_dead_letter(self.counters, raw, reason, detail, topic=topic, partition=self.partition,
                                   offset=offset, raw_max=self.options.dead_letter_raw_max)

    def recent_lag(self, recv: float, window_s: float = 2.0) -> float:
        """How far behind this partition's messages were read, judged on those handled in the last
        ``window_s`` of wall time (none handled: nothing waited, 0)."""
        return self.lag_s if recv - self.lag_recv <= window_s else 0.0

    def tick(self, recv_s: float | None = None, *, caught_up: bool | None = None) -> list[tuple[Verdict, bytes]]:
        """Re-evaluate on a timer: each job's clock advances by the wall time the job was quiet.

        Only while the worker is caught up (``caught_up``; None: this partition's own ``recent_lag``
        under ``caught_up_lag_s``): while messages wait unread, a job's silence is not evidence, so its
        clock holds at the time of its data and stalls are judged on the data alone."""
        recv = time.time() if recv_s is None else recv_s
        if caught_up is None:
            caught_up = self.recent_lag(recv) < self.options.caught_up_lag_s
        self.counters["lag_ms"] = int(self.recent_lag(recv) * 1000)
        if not caught_up:
            self.counters["behind_ticks"] = self.counters.get("behind_ticks", 0) + 1
        for name, job in list(self.jobs.items()):
            if not caught_up:
                job.clock.hold(recv)
            now = job.clock.tick(recv)
            if now > 0.0:
                self._evaluate_job(name, job, now)
            if (now - job.clock.now_s > self.settings.job_expiry_s and not job.analyzer.jobs
                    and not job.analyzer.book.open and not self.pending_of(name)):
                # silent past the analyzer's expiry, nothing open, nothing to send: forget the job (its pending
                # verdicts live in its snapshot part, so a job is kept until they are acknowledged)
                del self.jobs[name]
                self.forget_job(name)
        return self.pending()

    def evaluate(self, now: float) -> list[tuple[Verdict, bytes]]:
        """Evaluate every job at ``now`` (tests and replays); returns every pending verdict."""
        for name, job in list(self.jobs.items()):
            self._evaluate_job(name, job, now)
        return self.pending()

    def _evaluate_job(self, name: str, job: JobState, now: float) -> None:
        try:
            if self.options.shard:
                for rep in job.analyzer.reports(now):
                    self._reports.append((rep.job.encode(), encode_report(rep, self.partition)))
                self.counters["reports"] = self.counters.get("reports", 0) + 1
                return
            found = job.analyzer.evaluate(now)
        except Exception:  # an analyzer bug in one job must not stop the others or the timer
            log.exception("partition %d: evaluating job %s failed", self.partition, name)
            self.counters["analyzer_errors"] = self.counters.get("analyzer_errors", 0) + 1
            return
        self.found(found)

    def take_reports(self) -> list[tuple[bytes, bytes]]:
        """Shard mode: the encoded reports (key: the job) found since the last call, for the reports topic."""
        out, self._reports = self._reports, []
        return out

    def report(self) -> dict[str, int]:
        """The counters plus what the analyzers kept: ``analyzed_records`` counts each record once,
        however often at-least-once delivery or a restart replayed it."""
        out = dict(self.counters)
        out["analyzed_records"] = sum(int(j.analyzer.stats.get("records", 0)) for j in self.jobs.values())
        out["duplicate_batches"] = sum(int(j.analyzer.stats.get("duplicates", 0)) for j in self.jobs.values())
        for held in ("slow_held_starved", "slow_held_cheap"):
            out[held] = sum(int(j.analyzer.stats.get(held, 0)) for j in self.jobs.values())
        out["jobs"] = len(self.jobs)
        out["pending_verdicts"] = len(self._pending)
        out["open_incidents"] = sum(len(j.analyzer.book.open) for j in self.jobs.values())
        return out

    # --- recovery -----------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Everything needed to resume after a restart, the unacknowledged verdicts included: compact JSON,
        zlib-compressed (a snapshot is one changelog message, and the broker refuses messages over ~1 MB).

        The analyzer's step-pattern search runs at most once per ``CADENCE_SEARCH_EVERY_S`` of wall time,
        however often the worker saves (it saves at the end of every burst of messages).
        """
        search = self._search_due()
        state = {"jobs": {name: {"analyzer": j.analyzer.state_dict(search_cadence=search),
                                 "clock": j.clock.state_dict(), "upto": j.upto}
                          for name, j in self.jobs.items()},
                 **self.outbox_state(), "next_offset": self.next_offset, "topic_id": self.topic_id,
                 "counters": self.counters}
        return _pack(state)

    def snapshot_parts(self) -> dict[str, bytes]:
        """The snapshot as separate changelog messages: ``""`` the partition's head (offsets, topic identity,
        counters), and one part per job (its analyzer, clock, the verdicts sent and pending for it, and the
        offset its state covers), keyed by the job's name.

        The worker writes only the parts that changed, the head last. No message grows with the number of
        jobs on the partition, and a quiet job adds nothing to the changelog however busy its neighbours are.
        A worker that dies between a job's part and the head resumes with that job's newer state: the job
        skips its messages below its own offset (``JobState.upto``), so nothing is analysed twice or lost.
        """
        search = self._search_due()
        pending: dict[str, list[dict[str, Any]]] = {}
        for v, _ in self._pending.values():
            pending.setdefault(v.job, []).append(v.to_dict())
        sent: dict[str, list[str]] = {}
        for key, job in self._sent.items():
            sent.setdefault(job, []).append(key)
        parts = {name: _pack({"analyzer": j.analyzer.state_dict(search_cadence=search), "clock": j.clock.state_dict(),
                              "upto": j.upto, "sent": sent.pop(name, []), "pending": pending.pop(name, [])})
                 for name, j in self.jobs.items()}
        # Verdicts of jobs no longer held (a restored snapshot of an older layout) stay with the head.
        parts[""] = _pack({"next_offset": self.next_offset, "topic_id": self.topic_id, "counters": self.counters,
                           "sent": [[k, j] for j, ks in sent.items() for k in ks],
                           "pending": [d for ds in pending.values() for d in ds]})
        return parts

    def _search_due(self) -> bool:
        now = time.monotonic()
        if now - self._cadence_searched < CADENCE_SEARCH_EVERY_S:
            return False
        self._cadence_searched = now
        return True

    @classmethod
    def restore(cls, partition: int, settings: AnalyzerSettings, raw: bytes | None,
                options: ProcessorOptions | None = None,
                parts: Mapping[str, bytes] | None = None) -> PartitionProcessor:
        """The processor from a snapshot: one blob (``snapshot``), or a head and per-job ``parts``
        (``snapshot_parts``: ``raw`` is the head). Anything unreadable starts that much empty, loudly."""
        if raw or parts:
            try:
                state = _unpack(raw) if raw else {}
                if parts:
                    jobs = state.setdefault("jobs", {})
                    sent, pending = list(state.get("sent", ())), list(state.get("pending", ()))
                    for name, blob in parts.items():
                        try:
                            part = _unpack(blob)
                        except Exception as exc:  # noqa: BLE001 - one job's part unreadable: that job starts empty
                            log.error("partition %d: job %s's snapshot part unreadable (%s: %s); the job starts "
                                      "empty", partition, name, type(exc).__name__, exc)
                            continue
                        jobs[name] = {"analyzer": part["analyzer"], "clock": part["clock"],
                                      "upto": part.get("upto", -1)}
                        sent += [[k, name] for k in part.get("sent", ())]
                        pending += list(part.get("pending", ()))
                    state["sent"], state["pending"] = sent, pending
                return cls(partition, settings, state, options)
            except Exception as exc:  # noqa: BLE001 - any unreadable snapshot: start empty, loudly
                log.error("partition %d: snapshot unreadable (%s: %s); starting empty", partition,
                          type(exc).__name__, exc)
        return cls(partition, settings, options=options)


def _pack(state: Mapping[str, Any]) -> bytes:
    """Compact JSON, zlib-compressed (each changelog message must stay under the broker's ~1 MB)."""
    return zlib.compress(json.dumps(state, separators=(",", ":")).encode(), 1)


def _unpack(raw: bytes) -> dict[str, Any]:
    # Plain JSON (written before snapshots were compressed) starts with "{"; zlib never does.
    return dict(json.loads(raw if raw[:1] == b"{" else zlib.decompress(raw)))


def counted_dead_letter(counters: dict[str, int], raw: bytes | None, reason: str, detail: str, *, topic: str,
                        partition: int, offset: int, raw_max: int) -> tuple[DeadLetter, bytes]:
    """A dead letter for ``raw`` (cut to ``raw_max`` bytes), encoded, and counted in ``counters``."""
    counters["dead_letters"] = counters.get("dead_letters", 0) + 1
    dl = make_dead_letter(raw, reason, detail, source_topic=topic, source_partition=partition,
                          source_offset=offset, time_ms=int(time.time() * 1000), raw_max=raw_max)
    if len(dl.raw) < len(raw or b""):
        counters["dead_letters_truncated"] = counters.get("dead_letters_truncated", 0) + 1
    return dl, encode_dead_letter(dl)
