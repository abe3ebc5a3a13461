"""The Faust app: metrics in, verdicts and dead letters out; the agent only decodes and delegates.

At-least-once (Tansu rejects Faust's exactly-once). Each metrics partition has a
``PartitionProcessor``; its snapshot goes to a changelog-backed table on the same partition
so a restarted worker resumes where the last snapshot left off, and replayed messages are
recognised as duplicates by the analyzer and the sent-verdict memory.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import faust

from ccld.records import Verdict
from ccld.settings import Settings
from ccld.streams.processor import Output, PartitionProcessor

log = logging.getLogger(__name__)

#: Write a partition's snapshot at most this often (seconds of wall time; more often than offsets are
#: committed), after every verdict, and at shutdown.
SNAPSHOT_EVERY_S = 1.0


class WorkerState:
    """Processors by partition, plus what to snapshot when."""

    def __init__(self, settings: Settings, table: Any) -> None:
        self.settings = settings
        self.table = table
        self.processors: dict[int, PartitionProcessor] = {}
        self.last_snapshot: dict[int, float] = {}

    def processor(self, partition: int) -> PartitionProcessor:
        proc = self.processors.get(partition)
        if proc is None:
            raw = self.table.data.get(self.key(partition)) if self.table is not None else None
            proc = PartitionProcessor.restore(partition, self.settings.analyzer, raw)
            if raw:
                log.info("partition %d: resumed from a %d-byte snapshot", partition, len(raw))
            self.processors[partition] = proc
            self.last_snapshot[partition] = time.monotonic()
        return proc

    def key(self, partition: int) -> bytes:
        return f"{self.settings.metrics_topic}:{partition}".encode()

    def maybe_snapshot(self, partition: int, force: bool) -> None:
        now = time.monotonic()
        if self.table is None or (not force and now - self.last_snapshot.get(partition, 0.0) < SNAPSHOT_EVERY_S):
            return
        key, value = self.key(partition), self.processors[partition].snapshot()
        # Written straight to the partition's changelog so the timer (outside any event) can save too.
        self.table.data[key] = value
        self.table.send_changelog(partition, key, value)
        self.last_snapshot[partition] = now


def create_app(settings: Settings, *, app_id: str | None = None) -> faust.App:
    """Build the worker app for ``settings`` (bootstrap must be set)."""
    app = faust.App(
        app_id or settings.worker_app_id,
        broker=f"kafka://{settings.bootstrap}",
        store="memory://",
        processing_guarantee="at_least_once",
        broker_session_timeout=settings.session_timeout_ms / 1000.0,
        broker_heartbeat_interval=settings.heartbeat_ms / 1000.0,
        topic_partitions=settings.metrics_partitions,
        topic_allow_declare=True,
        web_enabled=settings.worker_web_port > 0,
        web_port=settings.worker_web_port or 6066,
        web_bind="127.0.0.1",
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=settings.worker_commit_interval_s,
        # Metrics messages are columnar batches of tens of KB: fetch many per round trip.
        consumer_max_fetch_size=16 * 1024 * 1024,
    )
    metrics = app.topic(settings.metrics_topic, value_type=bytes, key_type=bytes,
                        value_serializer="raw", key_serializer="raw", internal=False)
    verdicts = app.topic(settings.verdicts_topic, value_type=bytes, key_type=bytes,
                         value_serializer="raw", key_serializer="raw", internal=False)
    deadletter = app.topic(settings.deadletter_topic, value_type=bytes, key_type=bytes,
                           value_serializer="raw", key_serializer="raw", internal=False)
    # bytes keys and values: Faust then uses the raw codec for both (no JSON round trip).
    table = app.Table("analyzer-state", default=None, partitions=settings.metrics_partitions,
                      key_type=bytes, value_type=bytes)
    state = WorkerState(settings, table)
    app.ccld_state = state  # type: ignore[attr-defined]

    async def send(proc: PartitionProcessor, out: Output) -> None:
        for dl, raw in out.dead_letters:
            log.warning("dead letter from %s[%d]@%d: %s: %s", dl.source_topic, dl.source_partition,
                        dl.source_offset, dl.reason, dl.detail[:200])
            await deadletter.send(key=dl.reason.encode(), value=raw)
        await send_verdicts(proc, out.verdicts)

    async def send_verdicts(proc: PartitionProcessor, items: list[tuple[Verdict, bytes]]) -> None:
        for v, raw in items:
            await verdicts.send(key=v.incident_id.encode(), value=raw)
            proc.mark_sent(v)  # only now: a failed send is handed out again on the next evaluation
            log.info("verdict %s", v.describe())

    @app.agent(metrics, name="ccld-analyze")
    async def analyze(stream: Any) -> None:
        last_eval: dict[int, float] = {}
        async for event in stream.events():
            msg = event.message
            proc = state.processor(msg.partition)
            # Evaluate at most once per tick of the analyzer clock: analysis is per window, not per message.
            ts = msg.timestamp if msg.timestamp else None
            due = ts is None or ts - last_eval.get(msg.partition, -1e18) >= settings.worker_tick_s
            try:
                out = proc.handle(msg.value, topic=msg.topic, offset=msg.offset, timestamp_s=ts, evaluate=due)
            except Exception:  # a bug on one message must not stop the stream; keep it as a dead letter
                log.exception("analyzer failed on %s[%d]@%d", msg.topic, msg.partition, msg.offset)
                from ccld.records import DeadLetter
                from ccld.schemas import encode_dead_letter

                dl = DeadLetter(raw=bytes(msg.value or b""), reason="analyzer-error", detail="see worker log",
                                source_topic=msg.topic, source_partition=msg.partition,
                                source_offset=msg.offset, time_ms=int(time.time() * 1000))
                out = Output(dead_letters=[(dl, encode_dead_letter(dl))])
                proc.counters["dead_letters"] += 1
            if due and ts is not None:
                last_eval[msg.partition] = ts
            await send(proc, out)
            state.maybe_snapshot(msg.partition, force=bool(out.verdicts))

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        # Another worker owns these now: save what we know and stop ticking them (no double verdicts).
        revoked = args[0] if args else kwargs.get("revoked", ())
        for tp in revoked:
            if tp.topic == settings.metrics_topic and tp.partition in state.processors:
                state.maybe_snapshot(tp.partition, force=True)
                del state.processors[tp.partition]

    @app.timer(settings.worker_tick_s)
    async def tick() -> None:
        for partition, proc in list(state.processors.items()):
            items = proc.tick()
            await send_verdicts(proc, items)
            state.maybe_snapshot(partition, force=bool(items))

    @app.on_before_shutdown.connect
    async def on_shutdown(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        # The consumer has committed its last offsets; the producer flushes after this signal.
        for partition in list(state.processors):
            state.maybe_snapshot(partition, force=True)

    return app
