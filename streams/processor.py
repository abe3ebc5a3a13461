"""What the worker does with one metrics message, free of Faust: decode, analyze, dedupe.

One ``PartitionProcessor`` per metrics partition owns an ``Analyzer`` (all jobs of a
partition) and the set of verdicts already sent, so a message delivered twice (at-least-once)
or a restart from a snapshot never sends a verdict twice. The analyzer's clock is the
Kafka message timestamp, advanced by wall time only while the partition is quiet.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ccld.errors import SchemaError
from ccld.records import DeadLetter, Verdict
from ccld.schemas import decode_metrics, encode_dead_letter, encode_verdict
from ccld.streams.analysis import Analyzer
from ccld.streams.analysis.settings import AnalyzerSettings

log = logging.getLogger(__name__)

#: Remember this many sent (incident, state) pairs per partition for de-duplication.
SENT_MEMORY = 50_000


@dataclass
class Output:
    """What handling a message produced: encoded verdicts and dead letters to send."""

    verdicts: list[tuple[Verdict, bytes]] = field(default_factory=list)
    dead_letters: list[tuple[DeadLetter, bytes]] = field(default_factory=list)


class PartitionProcessor:
    """Analyzer, clock and de-duplication for one partition of the metrics topic."""

    def __init__(self, partition: int, settings: AnalyzerSettings, state: Mapping[str, Any] | None = None) -> None:
        self.partition = partition
        self.counters: dict[str, int] = {"messages": 0, "records": 0, "dead_letters": 0, "verdicts": 0,
                                         "duplicate_verdicts": 0}
        self._sent: OrderedDict[str, None] = OrderedDict()
        self._unsent: list[tuple[Verdict, bytes]] = []  # verdicts handed out but not yet confirmed sent
        self.clock_s = 0.0  # analyzer clock: the newest message timestamp seen (seconds)
        self._clock_wall = time.monotonic()  # when clock_s last moved
        self.next_offset = -1  # offset after the last message handled
        self._resume_offset: int | None = None  # next_offset of the snapshot we resumed from
        if state:
            self.analyzer = Analyzer.from_state_dict(state["analyzer"], settings)
            self._sent.update((k, None) for k in state.get("sent", ()))
            self.clock_s = float(state.get("clock_s", 0.0))
            self._resume_offset = int(state.get("next_offset", -1))
        else:
            self.analyzer = Analyzer(settings)

    # --- per message ------------------------------------------------------------------------

    def handle(self, raw: bytes, *, topic: str, offset: int, timestamp_s: float | None, evaluate: bool) -> Output:
        out = Output()
        self.counters["messages"] += 1
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
            batch = decode_metrics(raw)
        except SchemaError as exc:
            dl = DeadLetter(raw=bytes(raw), reason=exc.reason, detail=exc.detail[:2000], source_topic=topic,
                            source_partition=self.partition, source_offset=offset, time_ms=int(time.time() * 1000))
            self.counters["dead_letters"] += 1
            out.dead_letters.append((dl, encode_dead_letter(dl)))
            return out
        if timestamp_s is not None and timestamp_s > self.clock_s:
            self.clock_s = timestamp_s
            self._clock_wall = time.monotonic()
        self.counters["records"] += batch.n
        self.analyzer.ingest(batch, self.clock_s)
        if evaluate:
            out.verdicts = self.evaluate(self.clock_s)
        return out

    def tick(self) -> list[tuple[Verdict, bytes]]:
        """Re-evaluate on a timer: the clock advances by the wall time the partition was quiet."""
        if self.clock_s == 0.0:
            return []
        return self.evaluate(self.clock_s + (time.monotonic() - self._clock_wall))

    def evaluate(self, now: float) -> list[tuple[Verdict, bytes]]:
        """New verdicts plus any whose send was not confirmed yet; call ``mark_sent`` after each send."""
        pending = {v.dedupe_key for v, _ in self._unsent}
        for v in self.analyzer.evaluate(now):
            key = v.dedupe_key
            if key in self._sent or key in pending:
                self.counters["duplicate_verdicts"] += 1
                continue
            pending.add(key)
            self._unsent.append((v, encode_verdict(v)))
        return list(self._unsent)

    def mark_sent(self, verdict: Verdict) -> None:
        """The verdict reached the producer: never hand it out again (until SENT_MEMORY forgets it)."""
        key = verdict.dedupe_key
        self._unsent = [(v, raw) for v, raw in self._unsent if v.dedupe_key != key]
        self._sent[key] = None
        if len(self._sent) > SENT_MEMORY:
            self._sent.popitem(last=False)
        self.counters["verdicts"] += 1

    # --- recovery -----------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Compact JSON of everything needed to resume after a restart."""
        state = {"analyzer": self.analyzer.state_dict(), "sent": list(self._sent), "clock_s": self.clock_s,
                 "next_offset": self.next_offset}
        return json.dumps(state, separators=(",", ":")).encode()

    @classmethod
    def restore(cls, partition: int, settings: AnalyzerSettings, raw: bytes | None) -> PartitionProcessor:
        if raw:
            try:
                return cls(partition, settings, json.loads(raw))
            except (ValueError, KeyError, TypeError) as exc:
                log.error("partition %d: snapshot unreadable (%s); starting empty", partition, exc)
        return cls(partition, settings)
