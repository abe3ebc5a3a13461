"""The Faust app: metrics in, verdicts and dead letters out; the agent only decodes and delegates.

At-least-once (Tansu rejects Faust's exactly-once). Each metrics partition has a
``PartitionProcessor``; its snapshot goes to a changelog-backed table on the same partition
so a restarted worker resumes where the last snapshot left off, and replayed messages are
recognised as duplicates by the analyzer and the sent-verdict memory.

Nothing lost: a verdict counts as sent only once the broker acknowledged it (the delivery
future resolved). Until then it stays pending in the processor and in every snapshot (one is
written and acknowledged before the first send), so a broker outage or a killed worker delays a
verdict but never loses it; the worst case is a repeat (killed between the acknowledgement and
the next snapshot), which consumers drop by its (incident, state) key. The timer only evaluates
and never waits for the broker, so hangs are still found while it is unreachable; a background
``courier`` sends. Consumed events are acked (their offsets may be committed) only after a
snapshot that covers them is on the broker, and after their dead letters are: a worker killed
with SIGKILL re-reads, never skips, what its last snapshot had not seen. Faust acks (so may
commit) messages it drops unseen during a rebalance or recovery; the agent notices a consumer
that went past offsets its processor never saw and reads them back first (``catch_up``).

Nothing silent: every failure on input is a dead letter with a reason plus a counter, and the
agent's loop body catches everything, so no message can stop the stream. The counters go to the
log as one JSON line (``counters {...}``) when they change, and at shutdown.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import faust

from ccld.records import DeadLetter, Verdict, job_partition
from ccld.security import faust_kwargs
from ccld.settings import Settings
from ccld.streams.processor import Output, PartitionProcessor, ProcessorOptions
from ccld.streams.recovery import read_partition, topic_id, verdict_keys_on_topic
from ccld.streams.stage_processor import StageProcessor
from ccld.streams.worker_state import P, WorkerState
from ccld.topics import ensure_topics

log = logging.getLogger(__name__)

#: Attempts to deliver one dead letter before it is counted lost (an outage is not an attempt: the
#: producer waits for the broker inside one attempt; only errors the broker answered count).
DEAD_LETTER_ATTEMPTS = 5
#: Log the counters (when they changed) at most this often (seconds).
COUNTERS_EVERY_S = 5.0
#: Check this often (seconds) that the topics still exist and are the same topics.
TOPIC_CHECK_EVERY_S = 2.0


def counters_line(state: WorkerState[Any]) -> str:
    """Every partition's counters as one JSON object (what the chaos tests and an operator read)."""
    return json.dumps({str(p): proc.report() for p, proc in sorted(state.processors.items())}, sort_keys=True)


def processor_options(settings: Settings) -> ProcessorOptions:
    return ProcessorOptions(eval_every_s=settings.worker_tick_s, clock_max_skew_s=settings.worker_clock_max_skew_s,
                            clock_active_s=settings.worker_clock_active_s,
                            dead_letter_raw_max=settings.worker_deadletter_raw_max_bytes,
                            shard=settings.analysis_groups > 1, partitions=settings.metrics_partitions,
                            groups=settings.analysis_groups)


def create_app(settings: Settings, *, app_id: str | None = None) -> faust.App:
    """Build the worker app for ``settings`` (bootstrap must be set)."""
    faust_dir = Path(tempfile.gettempdir()) / "ccld-faust"
    faust_dir.mkdir(exist_ok=True)
    app = faust.App(
        app_id or settings.worker_app_id,
        broker=f"kafka://{settings.bootstrap}",
        store="memory://",
        # Faust makes this folder even with the memory store (nothing is kept in it): not in the user's
        # working directory, where every app id (each test, each bench run) would leave one behind
        datadir=str(faust_dir / "{conf.name}-data"),
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
        # Events are acked only after a snapshot covers them (WorkerState.checkpoint), so at shutdown or a
        # rebalance some are unacked on purpose: do not wait for them; they are re-read (and de-duplicated).
        stream_wait_empty=False,
        **faust_kwargs(settings),  # TLS / SASL, the same settings every other client uses
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
    options = processor_options(settings)
    shard = options.shard  # jobs spread over partitions: a job stage on the reports topic decides
    state: WorkerState[PartitionProcessor] = WorkerState(
        settings, table, settings.metrics_topic,
        restore=lambda p, raw: PartitionProcessor.restore(p, settings.analyzer, raw, options))
    states: list[WorkerState[Any]] = [state]
    app.ccld_state = state  # type: ignore[attr-defined]
    reports = app.topic(settings.reports_topic, value_type=bytes, key_type=bytes,
                        value_serializer="raw", key_serializer="raw", internal=False)
    stage: WorkerState[StageProcessor] | None = None
    if shard:
        stage_table = app.Table("stage-state", default=None, partitions=settings.metrics_partitions,
                                key_type=bytes, value_type=bytes)
        stage = WorkerState(settings, stage_table, settings.reports_topic,
                            restore=lambda p, raw: StageProcessor.restore(
                                p, settings.analyzer, raw, groups=settings.analysis_groups,
                                dead_letter_raw_max=settings.worker_deadletter_raw_max_bytes))
        stage.wake = state.wake  # one courier sends the verdicts of both
        states.append(stage)
        app.ccld_stage = stage  # type: ignore[attr-defined]

    async def send_dead_letter(proc: PartitionProcessor | StageProcessor, dl: DeadLetter, raw: bytes) -> None:
        log.warning("dead letter from %s[%d]@%d: %s: %s", dl.source_topic, dl.source_partition,
                    dl.source_offset, dl.reason, dl.detail[:200])
        for attempt in range(1, DEAD_LETTER_ATTEMPTS + 1):
            try:
                # force: publish now (not attached to the event's commit); awaiting the future waits for the ack.
                fut = await deadletter.send(key=dl.reason.encode(), value=raw, force=True)
                await fut
                return
            except Exception as exc:  # noqa: BLE001 - counted, retried, never raised into the stream
                proc.counters["dead_letter_send_failures"] = proc.counters.get("dead_letter_send_failures", 0) + 1
                log.warning("dead letter send failed (attempt %d of %d): %s: %s", attempt, DEAD_LETTER_ATTEMPTS,
                            type(exc).__name__, exc)
                await asyncio.sleep(min(0.5 * 2**attempt, 8.0))
        proc.counters["dead_letters_lost"] = proc.counters.get("dead_letters_lost", 0) + 1
        log.error("dead letter LOST after %d attempts: %s[%d]@%d reason %s (%d raw bytes)", DEAD_LETTER_ATTEMPTS,
                  dl.source_topic, dl.source_partition, dl.source_offset, dl.reason, len(dl.raw))

    async def flush_verdicts(st: WorkerState[P], partition: int, proc: P) -> None:
        """Send every pending verdict of ``partition``, each marked sent only after the broker's ack."""
        async with st.lock(partition):
            if proc.restored_pending and proc.pending():
                await reconcile(partition, proc)
            items = proc.pending()
            if not items:
                return
            sent: list[Verdict] = []
            try:
                # The pending verdicts reach the changelog before they reach the verdicts topic.
                await st.checkpoint(partition, force=True)
                for v, raw in items:
                    fut = await verdicts.send(key=v.incident_id.encode(), value=raw, force=True)
                    await fut  # resolves on the broker's acknowledgement (acks=all), raises on failure
                    proc.mark_sent(v)
                    sent.append(v)
                    log.info("verdict %s", v.describe())
            except Exception as exc:  # noqa: BLE001 - the rest stays pending; the next round tries again
                proc.counters["verdict_send_failures"] += 1
                log.warning("partition %d: verdict send failed, %d left pending: %s: %s", partition,
                            len(proc.pending()), type(exc).__name__, exc)
            if sent:
                try:
                    await st.checkpoint(partition, force=True)
                except Exception as exc:  # noqa: BLE001 - a later snapshot carries it; at worst a repeat
                    log.warning("partition %d: snapshot after verdicts failed: %s", partition, exc)

    async def reconcile(partition: int, proc: PartitionProcessor | StageProcessor) -> None:
        """Mark sent the restored pending verdicts that are already on the verdicts topic (no repeat)."""
        try:
            on_topic = await asyncio.to_thread(verdict_keys_on_topic, settings)
        except Exception as exc:  # noqa: BLE001 - then they are sent again: a repeat, never a loss
            log.warning("partition %d: could not read the verdicts topic to reconcile: %s", partition, exc)
            return
        proc.restored_pending = False
        done = [v for v, _ in proc.pending() if v.dedupe_key in on_topic]
        for v in done:
            proc.mark_sent(v)
        proc.counters["verdicts_reconciled"] = proc.counters.get("verdicts_reconciled", 0) + len(done)
        log.info("partition %d: %d restored pending verdicts were already on the topic, %d to send", partition,
                 len(done), len(proc.pending()))

    async def deliver(proc: PartitionProcessor | StageProcessor, out: Output) -> None:
        # Dead letters are awaited here: the event is held (and later acked) only once they are on the broker.
        for dl, raw in out.dead_letters:
            await send_dead_letter(proc, dl, raw)
        if proc.pending():
            state.wake.set()  # verdicts go out from the courier; they are in every snapshot until acknowledged
        if isinstance(proc, PartitionProcessor):
            await send_reports(proc)

    async def send_reports(proc: PartitionProcessor) -> None:
        """Shard mode: the reports go to their job's partition of the reports topic. Not held for an ack: a
        shard reports every job again each second, and the end of a finding for ``OVER_REPORT_S``."""
        for key, raw in proc.take_reports():
            try:
                part = job_partition(key.decode(), settings.metrics_partitions)
                await reports.send(key=key, value=raw, partition=part, force=True)
            except Exception as exc:  # noqa: BLE001 - counted; the next report carries the same state
                proc.counters["report_send_failures"] = proc.counters.get("report_send_failures", 0) + 1
                log.warning("partition %d: report not sent: %s: %s", proc.partition, type(exc).__name__, exc)

    def restore_assigned(st: WorkerState[Any]) -> None:
        # A restarted worker must send the verdicts its snapshot holds pending even if no new message
        # ever arrives on their partition: restore every assigned partition that has a snapshot, once
        # the table's recovery from the changelog has finished (before that its snapshot may be stale).
        recovery = getattr(app.tables, "recovery", None)
        if recovery is None or not recovery.completed.is_set() or recovery.in_recovery or app.rebalancing:
            return
        for tp in app.consumer.assignment():
            if tp.topic == st.topic and tp.partition not in st.processors and st.key(tp.partition) in st.table.data:
                st.processor(tp.partition)

    @app.task
    async def courier() -> None:
        """Send pending verdicts and write due snapshots; the only place that waits for the broker besides
        the agent itself, so an outage never stops the timer from evaluating (and finding verdicts)."""
        while True:
            try:
                await asyncio.wait_for(state.wake.wait(), timeout=settings.worker_tick_s)
            except TimeoutError:
                pass
            state.wake.clear()
            for st in states:
                restore_assigned(st)
                for partition, proc in list(st.processors.items()):
                    try:
                        await flush_verdicts(st, partition, proc)
                        await st.checkpoint(partition, force=False)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:  # noqa: BLE001 - retried on the next round
                        log.warning("%s partition %d: courier round failed: %s: %s", st.topic, partition,
                                    type(exc).__name__, exc)

    @app.agent(metrics, name="ccld-analyze")
    async def analyze(stream: Any) -> None:
        manual = stream.noack()  # events are acked by WorkerState.checkpoint, after the snapshot covering them
        state.ack = manual.ack
        async for event in manual.events():
            msg = event.message
            try:
                proc = state.processor(msg.partition)
                if 0 <= proc.next_offset < msg.offset:
                    await catch_up(msg.partition, proc, msg.offset)
                ts = msg.timestamp if msg.timestamp else None
                out = proc.handle(msg.value, topic=msg.topic, offset=msg.offset, timestamp_s=ts)
                await deliver(proc, out)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug on one message must not stop the stream (handle() itself never raises)
                log.exception("worker failed on %s[%d]@%d; going on", msg.topic, msg.partition, msg.offset)
            # Held even after a failure: an event never acked would stop every later commit of the partition.
            state.held.setdefault(msg.partition, []).append(event)
            try:
                # The stream reads its channel's queue: empty means this burst of messages is done.
                queue = getattr(getattr(stream, "channel", None), "queue", None)
                await state.checkpoint(msg.partition, force=False, idle=queue is not None and queue.empty())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the next checkpoint retries; until then nothing more is committed
                log.warning("partition %d: snapshot not written: %s: %s", msg.partition, type(exc).__name__, exc)

    if stage is not None:
        st_stage = stage

        @app.agent(reports, name="ccld-decide")
        async def decide(stream: Any) -> None:
            """The job stage: each shard report decided at once; its verdicts go out from the courier."""
            manual = stream.noack()  # acked after the snapshot that covers them, as the analyze agent does
            st_stage.ack = manual.ack
            async for event in manual.events():
                msg = event.message
                try:
                    proc = st_stage.processor(msg.partition)
                    await deliver(proc, proc.handle(msg.value, topic=msg.topic, offset=msg.offset))
                except asyncio.CancelledError:
                    raise
                except Exception:  # handle() never raises; a bug elsewhere must not stop the stream
                    log.exception("job stage failed on %s[%d]@%d; going on", msg.topic, msg.partition, msg.offset)
                st_stage.held.setdefault(msg.partition, []).append(event)
                try:
                    await st_stage.checkpoint(msg.partition, force=False)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the next checkpoint retries
                    log.warning("reports partition %d: snapshot not written: %s: %s", msg.partition,
                                type(exc).__name__, exc)

    async def handle_read_back(partition: int, proc: PartitionProcessor,
                               messages: list[tuple[int, float | None, bytes | None]]) -> bool:
        """Handle messages read back from the broker (``read_partition``) in order; False when the partition
        was revoked half way (its next owner resumes from the snapshot and reads them itself)."""
        for i, (offset, ts, value) in enumerate(messages):
            if not state.owns(partition, proc):
                return False
            await deliver(proc, proc.handle(value, topic=settings.metrics_topic, offset=offset, timestamp_s=ts))
            if i % 200 == 199:
                await asyncio.sleep(0)  # let the agent, timer and courier run
        return True

    async def catch_up(partition: int, proc: PartitionProcessor, upto: int) -> None:
        """Read back and handle the offsets between what ``proc`` has seen and ``upto``, the consumer's next.

        Faust acks (so may commit) the messages it drops without handing them to the agent: those of an
        old consumer generation, or fetched while a rebalance or a table recovery pauses the flow. The
        consumer then goes on past them, and a worker that dies meanwhile resumes past them too. Found
        here, where the processor's own next offset says what it has not seen; handled again is free
        (the analyzer drops batches it has seen), so a false alarm costs one read.
        """
        start = proc.next_offset
        try:
            messages = await asyncio.to_thread(read_partition, settings, partition, upto, start=start)
        except Exception as exc:  # noqa: BLE001 - then handle() below counts and logs the offsets skipped
            proc.counters["catch_up_failures"] = proc.counters.get("catch_up_failures", 0) + 1
            log.error("partition %d: could not read back offsets %d to %d: %s", partition, start, upto - 1, exc)
            return
        log.warning("partition %d: the consumer went past offsets %d to %d without delivering them; read back %d "
                    "messages", partition, start, upto - 1, len(messages))
        # The partition's sender waits until the gap is handled: a snapshot older than the last one sent may
        # be what we resumed from, so a verdict found again in these offsets may already be on the topic,
        # and is checked against it (``reconcile``) before anything of this partition is sent.
        async with state.lock(partition):
            if not await handle_read_back(partition, proc, messages):
                return  # revoked meanwhile: the next owner resumes from the snapshot and catches up itself
            if proc.pending():
                proc.restored_pending = True
        proc.counters["caught_up_messages"] = proc.counters.get("caught_up_messages", 0) + len(messages)
        if len(messages) < upto - start:  # retention deleted some, or the read timed out: say so, go on
            proc.counters["caught_up_missing"] = proc.counters.get("caught_up_missing", 0) + upto - start - len(
                messages)
            log.error("partition %d: only %d of the %d messages between offsets %d and %d could be read back",
                      partition, len(messages), upto - start, start, upto - 1)

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        # Another worker owns these now: save what we know and stop ticking them (no double verdicts).
        revoked = args[0] if args else kwargs.get("revoked", ())
        for tp in revoked:
            for st in states:
                if tp.topic == st.topic and tp.partition in st.processors:
                    st.maybe_snapshot(tp.partition, force=True)
                    st.drop(tp.partition)

    @app.timer(TOPIC_CHECK_EVERY_S)
    async def watch_topics() -> None:
        """Recreate lost topics; notice a recreated metrics topic and re-read it from its first offset."""
        try:
            found = await asyncio.to_thread(topic_id, settings)
        except Exception as exc:  # noqa: BLE001 - the broker is unreachable: nothing to decide now
            log.debug("topic check failed: %s", exc)
            return
        if found is None:
            log.warning("topic %s is gone (broker restarted empty?): creating the topics again",
                        settings.metrics_topic)
            try:
                await asyncio.to_thread(ensure_topics, settings)
            except Exception as exc:  # noqa: BLE001 - tried again on the next check
                log.warning("could not recreate the topics: %s", exc)
            return
        old, state.topic_id = state.topic_id, found
        if old is not None and found != old:
            log.warning("topic %s was recreated (id %s, was %s): its offsets start again", settings.metrics_topic,
                        found, old)
        # Judged per processor, not per change seen: a partition restored from a snapshot taken before its
        # re-read finished (a rebalance in the middle of it) still names the old topic and is re-read now.
        for partition, proc in list(state.processors.items()):
            if proc.topic_id is None:
                proc.topic_id = found
            elif proc.topic_id != found:
                proc.counters["topic_resets"] = proc.counters.get("topic_resets", 0) + 1
                await backfill(partition, proc, found)

    async def backfill(partition: int, proc: PartitionProcessor, topic: str) -> None:
        """Read the new log of ``partition`` below the highest offset handled so far, and handle it.

        The consumer went on from its position in the old log, so the new log's first offsets would
        never be read; handling them twice costs nothing (the analyzer drops batches it has seen). The
        processor is marked as counting in the new topic only once all of it is handled and snapshotted:
        if the partition moves to another worker half way, that worker's restored state re-reads it.
        """
        upto = proc.next_offset
        try:
            messages = await asyncio.to_thread(read_partition, settings, partition, upto)
        except Exception as exc:  # noqa: BLE001 - counted and logged, tried again on the next check
            proc.counters["backfill_failures"] = proc.counters.get("backfill_failures", 0) + 1
            log.error("partition %d: could not re-read the recreated topic below offset %d: %s", partition, upto, exc)
            return
        log.warning("partition %d: re-reading %d messages of the recreated topic (offsets 0 to %d)", partition,
                    len(messages), upto - 1)
        if not await handle_read_back(partition, proc, messages):
            log.warning("partition %d: revoked while re-reading the recreated topic; its next owner re-reads it",
                        partition)
            return
        proc.counters["backfilled_messages"] = proc.counters.get("backfilled_messages", 0) + len(messages)
        proc.topic_id = topic
        try:
            await state.checkpoint(partition, force=True)
        except Exception as exc:  # noqa: BLE001 - the courier's next snapshot carries it
            log.warning("partition %d: snapshot after the re-read failed: %s", partition, exc)

    last_report: dict[str, Any] = {"at": time.monotonic(), "line": ""}

    @app.timer(settings.worker_tick_s)
    async def tick() -> None:
        if time.monotonic() - last_report["at"] >= COUNTERS_EVERY_S:
            last_report["at"] = time.monotonic()
            report = counters_line(state)
            if report != last_report["line"]:
                last_report["line"] = report
                log.info("counters %s", report)
        for partition, proc in list(state.processors.items()):
            try:
                # Evaluation only: nothing here waits for the broker (the courier sends), so hangs are
                # still found, and kept pending, while the broker is unreachable.
                if proc.tick():
                    state.wake.set()
                if shard:
                    await send_reports(proc)
            except Exception:  # the timer must survive anything one partition does
                log.exception("tick failed on partition %d", partition)

    @app.on_before_shutdown.connect
    async def on_shutdown(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        # The consumer has committed its last offsets; the producer flushes after this signal.
        for st in states:
            for partition in list(st.processors):
                st.maybe_snapshot(partition, force=True)
        log.info("counters %s", counters_line(state))

    return app
