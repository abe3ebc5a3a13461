"""What the worker does with one shard report, free of Faust: decode, decide, dedupe.

Used when jobs are spread over several metrics partitions (``analysis_groups`` > 1): the
partition processors of the metrics topic only report (``PartitionProcessor`` in shard mode), and
one ``StageProcessor`` per partition of the reports topic (keyed by job, so all of a job's reports
meet in one) runs the job stage (``analysis.stage.JobStage``) and holds its verdicts until the
broker acknowledges them, as the partition processor does in the single-stage shape.

Only the incidents are snapshotted: the stalls are a state every shard sends again each second.
A report that cannot be decoded becomes a dead letter with a reason, and a counter.
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import Mapping
from typing import Any

from ccld.errors import RecordError, SchemaError
from ccld.records import DeadLetter
from ccld.schemas.codec import DEAD_LETTER_RAW_MAX
from ccld.streams.analysis.job_stage import JobStage
from ccld.streams.analysis.settings import AnalyzerSettings
from ccld.streams.analysis.shard import decode_report
from ccld.streams.outbox import Outbox
from ccld.streams.processor import Output, counted_dead_letter

log = logging.getLogger(__name__)

#: Job incarnations whose shards' stalls the stage keeps at most (the least recently reported go first).
VIEW_MEMORY = 4096
#: Wall seconds a job's hangs wait for all its shards, and after which a silent shard is left out.
SHARD_WAIT_S = 30.0


class StageProcessor(Outbox):
    """The job stage of the jobs whose reports land on one partition of the reports topic."""

    def __init__(self, partition: int, settings: AnalyzerSettings, state: Mapping[str, Any] | None = None,
                 *, groups: int = 1, dead_letter_raw_max: int = DEAD_LETTER_RAW_MAX) -> None:
        self.partition = partition
        self.groups = groups  # the shards a job may have (analysis_groups): each on its own metrics partition
        self.settings = settings
        self.dead_letter_raw_max = dead_letter_raw_max
        self.counters: dict[str, int] = {"reports": 0, "dead_letters": 0, "verdicts": 0, "duplicate_verdicts": 0,
                                         "verdict_send_failures": 0}
        self.stage = JobStage(settings)
        self._heard: dict[tuple[str, int], dict[int, float]] = {}  # wall time of each shard's last report
        self._first: dict[tuple[str, int], float] = {}  # wall time of each job's first report
        self.next_offset = -1
        self._init_outbox(state)
        if state:
            self.counters.update({str(k): int(v) for k, v in dict(state.get("counters", {})).items()})
            self.stage.book.load(state.get("incidents", {}))
            self.next_offset = int(state.get("next_offset", -1))

    def handle(self, raw: bytes | None, *, topic: str, offset: int, recv_s: float | None = None) -> Output:
        """Decide on one report; never raises for anything about the message (``recv_s``: wall time now)."""
        out = Output()
        self.next_offset = max(self.next_offset, offset + 1)
        try:
            shard, rep = decode_report(raw or b"")
        except (SchemaError, RecordError) as exc:
            reason = exc.reason if isinstance(exc, SchemaError) else "bad-report"
            detail = exc.detail if isinstance(exc, SchemaError) else str(exc)
            out.dead_letters.append(self.dead_letter(raw, reason, detail, topic=topic, offset=offset))
            return out
        self.counters["reports"] += 1
        try:
            # a report of a newer incarnation ends the open incidents of the older ones
            found = self.stage.restarted({rep.job: rep.incarnation}, rep.now)
            need, live = self._shards((rep.job, rep.incarnation), shard, time.time() if recv_s is None else recv_s)
            found += self.stage.decide([(shard, rep)], rep.now, need=need, live=live)
        except Exception as exc:  # a stage bug on one report must not stop the partition: keep the report
            log.exception("job stage failed on %s[%d]@%d", topic, self.partition, offset)
            out.dead_letters.append(self.dead_letter(raw, "stage-error", f"{type(exc).__name__}: {exc}",
                                                     topic=topic, offset=offset))
            return out
        self._forget_old()
        self.found(found)
        out.verdicts = self.pending()
        return out

    def _shards(self, key: tuple[str, int], shard: int, recv: float) -> tuple[int, set[int]]:
        """How many shards the job's hangs wait for, and which are live, by the wall clock.

        Wall time, not job time: a replay runs a job's clock far faster than the wall, and a shard
        whose worker died reports again only after its partition is taken over (seconds of wall
        time). A job waits for all ``groups`` shards for ``SHARD_WAIT_S`` after its first report
        (a job with no communicator in some group never hears from that shard); a shard silent
        that long is left out (its stalls unknown) rather than holding every hang of the job.
        """
        heard = self._heard.setdefault(key, {})
        heard[shard] = recv
        first = self._first.setdefault(key, recv)
        need = self.groups if recv - first < SHARD_WAIT_S else 1
        return need, {sh for sh, t in heard.items() if recv - t < SHARD_WAIT_S}

    def _forget_old(self) -> None:
        views = self.stage.views
        if len(views) > VIEW_MEMORY:
            for key in sorted(views, key=lambda k: views[k].last_now)[: len(views) - VIEW_MEMORY]:
                self.stage.forget(key)
                self._heard.pop(key, None)
                self._first.pop(key, None)
                if not any(k[0] == key[0] for k in views):  # no incarnation of the job is left
                    self.forget_job(key[0])

    def dead_letter(self, raw: bytes | None, reason: str, detail: str, *, topic: str,
                    offset: int) -> tuple[DeadLetter, bytes]:
        return counted_dead_letter(self.counters, raw, reason, detail, topic=topic, partition=self.partition,
                                   offset=offset, raw_max=self.dead_letter_raw_max)

    def report(self) -> dict[str, int]:
        out = dict(self.counters)
        out["jobs"] = len(self.stage.views)
        out["open_incidents"] = len(self.stage.book.open)
        out["pending_verdicts"] = len(self._pending)
        return out

    def snapshot(self) -> bytes:
        state = {"incidents": self.stage.book.state_dict(), **self.outbox_state(), "next_offset": self.next_offset,
                 "counters": self.counters}
        return zlib.compress(json.dumps(state, separators=(",", ":")).encode(), 1)

    def snapshot_parts(self) -> dict[str, bytes]:
        """The snapshot as the worker writes it: the stage's state is its incidents, one message (``""``)."""
        return {"": self.snapshot()}

    @classmethod
    def restore(cls, partition: int, settings: AnalyzerSettings, raw: bytes | None, *, groups: int = 1,
                dead_letter_raw_max: int = DEAD_LETTER_RAW_MAX) -> StageProcessor:
        if raw:
            try:
                return cls(partition, settings, json.loads(zlib.decompress(raw)), groups=groups,
                           dead_letter_raw_max=dead_letter_raw_max)
            except Exception as exc:  # noqa: BLE001 - any unreadable snapshot: start empty, loudly
                log.error("reports partition %d: snapshot unreadable (%s: %s); starting empty", partition,
                          type(exc).__name__, exc)
        return cls(partition, settings, groups=groups, dead_letter_raw_max=dead_letter_raw_max)
