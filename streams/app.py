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

``WorkerApp`` is the worker: its agents, timers, courier and rebalance hooks are named methods, and
the state they share is its attributes; ``create_app`` builds one and returns its Faust app.
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
from confluent_kafka import KafkaException
from faust.types import TopicT
from faust.web import Request, Response, View

from ccld.errors import CcldError
from ccld.records import DeadLetter, Verdict, job_partition
from ccld.schemas.codec import ENCODING_HEADER, JSON_CONTENT_TYPE, encode_verdict_json
from ccld.security import faust_kwargs
from ccld.settings import Settings
from ccld.streams.lag import LagWatch
from ccld.streams.processor import Output, PartitionProcessor, ProcessorOptions
from ccld.streams.recovery import read_partition, topic_id, verdict_keys_on_topic
from ccld.streams.recovery_watch import RecoveryWatch
from ccld.streams.stage_processor import StageProcessor
from ccld.streams.status import job_status, merge
from ccld.streams.transport import WorkerFaustApp
from ccld.streams.worker_metrics import WorkerMetrics
from ccld.streams.worker_state import P, WorkerState
from ccld.topics import ensure_topics, state_log_configs

log = logging.getLogger(__name__)

#: Attempts to deliver one dead letter before it is counted lost (an outage is not an attempt: the
#: producer waits for the broker inside one attempt; only errors the broker answered count).
DEAD_LETTER_ATTEMPTS = 5
#: Log the counters (when they changed) at most this often (seconds).
COUNTERS_EVERY_S = 5.0
#: evaluation ticks (about a second each) a partition may stay behind with nothing delivered before the worker
#: reads its unread messages back itself: after a broker restarted empty, the consumer can sit past the new
#: log's end while the messages below it wait, and nothing later comes to trigger the catch-up
STUCK_TICKS = 10
#: Check this often (seconds) that the topics still exist and are the same topics.
TOPIC_CHECK_EVERY_S = 2.0
#: Check this often (seconds) that Faust's table recovery is not waiting on what nothing delivers.
RECOVERY_CHECK_EVERY_S = 2.0
#: What the blocking confluent-kafka reads (``recovery``, ``ensure_topics``, run in a thread) raise when
#: the broker is unreachable or refuses: the library's own error, a result's timeout, and ours (BrokerError).
READ_ERRORS = (KafkaException, TimeoutError, CcldError)


def counters_line(state: WorkerState[Any]) -> str:
    """Every partition's counters as one JSON object (what the chaos tests and an operator read)."""
    return json.dumps({str(p): proc.report() for p, proc in sorted(state.processors.items())}, sort_keys=True)


def processor_options(settings: Settings) -> ProcessorOptions:
    return ProcessorOptions(eval_every_s=settings.worker_tick_s, clock_max_skew_s=settings.worker_clock_max_skew_s,
                            clock_active_s=settings.worker_clock_active_s,
                            caught_up_lag_s=settings.worker_caught_up_lag_s,
                            dead_letter_raw_max=settings.worker_deadletter_raw_max_bytes,
                            shard=settings.analysis_groups > 1, partitions=settings.metrics_partitions,
                            groups=settings.analysis_groups)


def faust_app(settings: Settings, app_id: str | None = None) -> WorkerFaustApp:
    """The Faust app configured for ``settings``, with nothing registered on it yet."""
    faust_dir = Path(tempfile.gettempdir()) / "ccld-faust"
    faust_dir.mkdir(exist_ok=True)
    return WorkerFaustApp(
        app_id or settings.worker_app_id,
        fetch_wait_ms=settings.worker_fetch_wait_ms,
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
        web_bind=settings.metrics_bind,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=settings.worker_commit_interval_s,
        # Metrics messages are columnar batches of tens of KB: fetch many per round trip.
        consumer_max_fetch_size=16 * 1024 * 1024,
        # Events are acked only after a snapshot covers them (WorkerState.checkpoint), so at shutdown or a
        # rebalance some are unacked on purpose: do not wait for them; they are re-read (and de-duplicated).
        stream_wait_empty=False,
        **faust_kwargs(settings),  # TLS / SASL, the same settings every other client uses
    )


def _raw_topic(app: faust.App, name: str) -> TopicT:
    """A topic of raw bytes keys and values (Faust's raw codec: no JSON round trip)."""
    return app.topic(name, value_type=bytes, key_type=bytes, value_serializer="raw", key_serializer="raw",
                     internal=False)


class WorkerApp:
    """The stream worker on one Faust app: metrics in, verdicts and dead letters out (see the module docstring).

    ``state`` holds the metrics topic's processors; in shard mode (``analysis_groups`` > 1) ``stage``
    holds the job stage's on the reports topic, and one courier sends the verdicts of both.

    Sends through Faust's producer (verdicts, dead letters, reports, snapshots on the changelog) catch
    ``Exception``, not KafkaError: besides Faust's ProducerSendError and aiokafka's errors, aiokafka
    asserts on a partition its stale metadata lacks (AssertionError, or TypeError with no metadata at
    all), which is what a broker restarted empty looks like. Each failure is counted or retried there.
    """

    def __init__(self, settings: Settings, *, app_id: str | None = None) -> None:
        self.settings = settings
        self.app = app = faust_app(settings, app_id)
        self.metrics = _raw_topic(app, settings.metrics_topic)
        self.verdicts = _raw_topic(app, settings.verdicts_topic)
        self.deadletter = _raw_topic(app, settings.deadletter_topic)
        # bytes keys and values: Faust then uses the raw codec for both (no JSON round trip).
        table = app.Table("analyzer-state", default=None, partitions=settings.metrics_partitions,
                          key_type=bytes, value_type=bytes, extra_topic_configs=state_log_configs(settings))
        options = processor_options(settings)
        self.shard = options.shard  # jobs spread over partitions: a job stage on the reports topic decides
        self.state: WorkerState[PartitionProcessor] = WorkerState(
            settings, table, settings.metrics_topic,
            restore=lambda p, raw, parts: PartitionProcessor.restore(p, settings.analyzer, raw, options, parts))
        self.states: list[WorkerState[Any]] = [self.state]
        self.reports = _raw_topic(app, settings.reports_topic)
        self.stage: WorkerState[StageProcessor] | None = None
        if self.shard:
            stage_table = app.Table("stage-state", default=None, partitions=settings.metrics_partitions,
                                    key_type=bytes, value_type=bytes,
                                    extra_topic_configs=state_log_configs(settings))
            self.stage = WorkerState(settings, stage_table, settings.reports_topic,
                                     restore=lambda p, raw, _parts: StageProcessor.restore(
                                         p, settings.analyzer, raw, groups=settings.analysis_groups,
                                         dead_letter_raw_max=settings.worker_deadletter_raw_max_bytes))
            self.stage.wake = self.state.wake  # one courier sends the verdicts of both
            self.states.append(self.stage)
        # The counters line last logged, and when (``_tick`` logs it again only when it changed).
        self._counters_at = time.monotonic()
        self._stuck: dict[int, tuple[int, int]] = {}  # partition -> (next offset, ticks it has stayed there behind)
        self._reading: dict[int, asyncio.Task[None]] = {}  # partition -> its read-back by _read_stuck
        self._skipping: set[int] = set()  # partitions in a run of re-delivered messages (logged once per run)
        self._topic_retry_at = 0.0  # monotonic time before which _learn_topic does not ask the broker again
        self._agent_busy = False  # the metrics agent is inside a message (a slow deliver or checkpoint)
        self._agent_queue: Any = None  # the metrics agent's channel queue (empty: nothing fetched waits)
        self._counters_line = ""
        self.lag = LagWatch(settings.worker_caught_up_lag_s)
        # Faust's table recovery waiting on changelog offsets nothing delivers (recovery_watch.py)
        self.recovery_watch = RecoveryWatch(self.app, lambda topic, partition, start, upto: [
            offset for offset, _, _ in read_partition(settings, partition, upto, start=start, topic=topic)])
        self.telemetry = WorkerMetrics(self.states, self.lag, self.recovery_watch.counts)  # /metrics
        self._register()

    def _register(self) -> None:
        """Hand the methods to Faust: the courier task, the agents, the rebalance and shutdown hooks, the timers."""
        app = self.app
        app.ccld_state = self.state  # type: ignore[attr-defined]
        if self.stage is not None:
            app.ccld_stage = self.stage  # type: ignore[attr-defined]
        app.task(self._courier)
        app.agent(self.metrics, name="ccld-analyze")(self._analyze)
        if self.stage is not None:
            app.agent(self.reports, name="ccld-decide")(self._decide)
        app.on_partitions_revoked.connect(self._on_revoke)
        app.timer(TOPIC_CHECK_EVERY_S)(self._watch_topics)
        app.timer(self.settings.worker_tick_s)(self._tick)
        app.early_tasks.append(self._watch_recovery)  # from the start: the first recovery is watched too
        app.on_before_shutdown.connect(self._on_shutdown)
        self.telemetry.serve(app)  # /metrics (Prometheus): served when the web server is on

        async def status_page(view: View, request: Request) -> Response:  # a Faust view's get(): (view, request)
            return view.json(self._status_body(request.query.get("job")))

        app.page("/status/")(status_page)  # `ccld status`: served when the web server is on

    def _status_body(self, job: str | None) -> dict[str, Any]:
        """``/status/?job=J``: that job's live status (``streams.status``); without ``job``, the jobs held here."""
        parts: list[dict[str, Any]] = []
        for proc in list(self.state.processors.values()):
            for name, j in list(proc.jobs.items()):
                if job is None:
                    parts.append({"job": name, "now": j.clock.now_s})
                elif name == job:
                    parts.append(job_status(j.analyzer, job, j.clock.extrapolated(time.time())))
        return {"jobs": parts} if job is None else merge(parts) if parts else {"job": job, "comms": []}

    # -- the agents: decode, delegate to the processor, deliver its output ------------------------------

    async def _analyze(self, stream: Any) -> None:
        """The metrics agent: each message handled by its partition's processor, its output delivered."""
        state = self.state
        manual = stream.noack()  # events are acked by WorkerState.checkpoint, after the snapshot covering them
        state.ack = manual.ack
        # The stream reads its channel's queue: empty means this burst of messages is done.
        queue = self._agent_queue = getattr(getattr(stream, "channel", None), "queue", None)
        async for event in manual.events():
            msg = event.message
            self._agent_busy = True
            try:
                reading = self._reading.get(msg.partition)
                if reading is not None:  # in order: what the read-back handles comes before this message
                    await asyncio.wait([reading])
                proc = state.processor(msg.partition)
                if proc.topic_id is None:
                    await self._learn_topic(proc)
                if self._handled(proc, msg.offset):
                    # Delivered again (the consumer resumed below a snapshot, or a read-back got there first):
                    # analysed once only, so every record counts once; still held and checkpointed below.
                    proc.counters["redelivered_skipped"] = proc.counters.get("redelivered_skipped", 0) + 1
                    if msg.partition not in self._skipping:  # once per run of re-deliveries, not per message
                        self._skipping.add(msg.partition)
                        log.info("partition %d: offset %d delivered again below the snapshot's next offset %d: "
                                 "skipping re-deliveries (each record is analysed once)", msg.partition,
                                 msg.offset, proc.next_offset)
                else:
                    self._skipping.discard(msg.partition)
                    if 0 <= proc.next_offset < msg.offset:
                        await self._catch_up(msg.partition, proc, msg.offset)
                    ts = msg.timestamp if msg.timestamp else None
                    began = time.perf_counter()
                    out = proc.handle(msg.value, topic=msg.topic, offset=msg.offset, timestamp_s=ts)
                    self.telemetry.observe_analysis(time.perf_counter() - began)
                    await self._deliver(proc, out)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a bug on one message must not stop the stream (handle() never raises)
                log.exception("worker failed on %s[%d]@%d; going on", msg.topic, msg.partition, msg.offset)
            # Held even after a failure: an event never acked would stop every later commit of the partition.
            state.held.setdefault(msg.partition, []).append(event)
            try:
                await state.checkpoint(msg.partition, force=False, idle=queue is not None and queue.empty())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any send error (class docstring); the next checkpoint retries,
                # and until then nothing more is committed
                log.warning("partition %d: snapshot not written: %s: %s", msg.partition, type(exc).__name__, exc)
            finally:
                self._agent_busy = False

    def _handled(self, proc: PartitionProcessor, offset: int) -> bool:
        """Whether ``offset`` is below what ``proc`` has handled in the metrics topic as the worker knows it.

        A topic recreated but not yet noticed (``_check_topics``) counts as the old one: its new log below
        ``next_offset`` is then skipped here, and read whole by ``_backfill`` once the change is seen."""
        if offset >= proc.next_offset:
            return False
        return proc.topic_id is None or self.state.topic_id is None or proc.topic_id == self.state.topic_id

    async def _decide(self, stream: Any) -> None:
        """The job stage: each shard report decided at once; its verdicts go out from the courier."""
        stage = self.stage
        if stage is None:  # registered only in shard mode, where the stage exists
            return
        manual = stream.noack()  # acked after the snapshot that covers them, as the analyze agent does
        stage.ack = manual.ack
        async for event in manual.events():
            msg = event.message
            try:
                proc = stage.processor(msg.partition)
                await self._deliver(proc, proc.handle(msg.value, topic=msg.topic, offset=msg.offset))
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - handle() never raises; a bug elsewhere must not stop the stream
                log.exception("job stage failed on %s[%d]@%d; going on", msg.topic, msg.partition, msg.offset)
            stage.held.setdefault(msg.partition, []).append(event)
            try:
                await stage.checkpoint(msg.partition, force=False)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any send error (class docstring); the next checkpoint retries
                log.warning("reports partition %d: snapshot not written: %s: %s", msg.partition,
                            type(exc).__name__, exc)

    async def _deliver(self, proc: PartitionProcessor | StageProcessor, out: Output) -> None:
        """Send a message's dead letters (awaited: the event is held, later acked, only once they are on the
        broker), wake the courier for its verdicts, and send a shard's reports."""
        for dl, raw in out.dead_letters:
            await self._send_dead_letter(proc, dl, raw)
        if proc.pending():
            self.state.wake.set()  # verdicts go out from the courier; they are in every snapshot until acknowledged
        if isinstance(proc, PartitionProcessor):
            await self._send_reports(proc)

    async def _send_dead_letter(self, proc: PartitionProcessor | StageProcessor, dl: DeadLetter, raw: bytes) -> None:
        log.warning("dead letter from %s[%d]@%d: %s: %s", dl.source_topic, dl.source_partition,
                    dl.source_offset, dl.reason, dl.detail[:200])
        for attempt in range(1, DEAD_LETTER_ATTEMPTS + 1):
            try:
                # force: publish now (not attached to the event's commit); awaiting the future waits for the ack.
                fut = await self.deadletter.send(key=dl.reason.encode(), value=raw, force=True)
                await fut
                return
            except Exception as exc:  # noqa: BLE001 - any send error (class docstring): counted, retried
                proc.counters["dead_letter_send_failures"] = proc.counters.get("dead_letter_send_failures", 0) + 1
                log.warning("dead letter send failed (attempt %d of %d): %s: %s", attempt, DEAD_LETTER_ATTEMPTS,
                            type(exc).__name__, exc)
                await asyncio.sleep(min(0.5 * 2**attempt, 8.0))
        proc.counters["dead_letters_lost"] = proc.counters.get("dead_letters_lost", 0) + 1
        log.error("dead letter LOST after %d attempts: %s[%d]@%d reason %s (%d raw bytes)", DEAD_LETTER_ATTEMPTS,
                  dl.source_topic, dl.source_partition, dl.source_offset, dl.reason, len(dl.raw))

    async def _send_reports(self, proc: PartitionProcessor) -> None:
        """Shard mode: the reports go to their job's partition of the reports topic. Not held for an ack: a
        shard reports every job again each second, and the end of a finding for ``OVER_REPORT_S``."""
        for key, raw in proc.take_reports():
            try:
                part = job_partition(key.decode(), self.settings.metrics_partitions)
                await self.reports.send(key=key, value=raw, partition=part, force=True)
            except Exception as exc:  # noqa: BLE001 - any send error (class docstring): counted; the next
                # report carries the same state
                proc.counters["report_send_failures"] = proc.counters.get("report_send_failures", 0) + 1
                log.warning("partition %d: report not sent: %s: %s", proc.partition, type(exc).__name__, exc)

    # -- the courier: the only sender of verdicts ---------------------------------------------------------

    async def _courier(self) -> None:
        """Send pending verdicts and write due snapshots; the only place that waits for the broker besides
        the agent itself, so an outage never stops the timer from evaluating (and finding verdicts)."""
        while True:
            try:
                await asyncio.wait_for(self.state.wake.wait(), timeout=self.settings.worker_tick_s)
            except TimeoutError:
                pass
            self.state.wake.clear()
            for st in self.states:
                self._restore_assigned(st)
                for partition, proc in list(st.processors.items()):
                    try:
                        await self._flush_verdicts(st, partition, proc)
                        await st.checkpoint(partition, force=False)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:  # noqa: BLE001 - the only sender must outlive any round; retried
                        log.warning("%s partition %d: courier round failed: %s: %s", st.topic, partition,
                                    type(exc).__name__, exc)

    async def _flush_verdicts(self, st: WorkerState[P], partition: int, proc: P) -> None:
        """Send every pending verdict of ``partition``, each marked sent only after the broker's ack."""
        async with st.lock(partition):
            if proc.restored_pending and proc.pending():
                await self._reconcile(partition, proc)
            items = proc.pending()
            if not items:
                return
            sent: list[Verdict] = []
            try:
                # The pending verdicts reach the changelog before they reach the verdicts topic.
                await st.checkpoint(partition, force=True)
                json_out = self.settings.verdicts_encoding == "json"
                for v, raw in items:
                    # the snapshot keeps the Avro bytes; a consumer without our schemas gets JSON (verdicts_encoding)
                    fut = await self.verdicts.send(
                        key=v.incident_id.encode(), value=encode_verdict_json(v) if json_out else raw, force=True,
                        headers={ENCODING_HEADER: JSON_CONTENT_TYPE} if json_out else None)
                    await fut  # resolves on the broker's acknowledgement (acks=all), raises on failure
                    proc.mark_sent(v)
                    sent.append(v)
                    log.info("verdict %s", v.describe())
            except Exception as exc:  # noqa: BLE001 - any send error (class docstring): the rest stays pending
                proc.counters["verdict_send_failures"] += 1
                log.warning("partition %d: verdict send failed, %d left pending: %s: %s", partition,
                            len(proc.pending()), type(exc).__name__, exc)
            if sent:
                try:
                    await st.checkpoint(partition, force=True)
                except Exception as exc:  # noqa: BLE001 - any send error (class docstring): a later snapshot
                    # carries it; at worst a repeat
                    log.warning("partition %d: snapshot after verdicts failed: %s", partition, exc)

    async def _reconcile(self, partition: int, proc: PartitionProcessor | StageProcessor) -> None:
        """Mark sent the restored pending verdicts that are already on the verdicts topic (no repeat)."""
        try:
            on_topic = await asyncio.to_thread(verdict_keys_on_topic, self.settings)
        except READ_ERRORS as exc:  # then they are sent again: a repeat, never a loss
            log.warning("partition %d: could not read the verdicts topic to reconcile: %s", partition, exc)
            return
        proc.restored_pending = False
        done = [v for v, _ in proc.pending() if v.dedupe_key in on_topic]
        for v in done:
            proc.mark_sent(v)
        proc.counters["verdicts_reconciled"] = proc.counters.get("verdicts_reconciled", 0) + len(done)
        log.info("partition %d: %d restored pending verdicts were already on the topic, %d to send", partition,
                 len(done), len(proc.pending()))

    # -- rebalances: what a worker does with partitions that come and go ----------------------------------

    def _restore_assigned(self, st: WorkerState[Any]) -> None:
        """Restore every assigned partition of ``st`` that has a snapshot, once the table has recovered.

        A restarted worker must send the verdicts its snapshot holds pending even if no new message ever
        arrives on their partition; before the table's recovery from the changelog has finished, its
        snapshot may be stale.
        """
        app = self.app
        recovery = getattr(app.tables, "recovery", None)
        if recovery is None or not recovery.completed.is_set() or recovery.in_recovery or app.rebalancing:
            return
        for tp in app.consumer.assignment():
            if tp.topic == st.topic and tp.partition not in st.processors and st.key(tp.partition) in st.table.data:
                st.processor(tp.partition)

    async def _on_revoke(self, sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        """Another worker owns these partitions now: save what we know and stop ticking them (no double verdicts)."""
        revoked = args[0] if args else kwargs.get("revoked", ())
        for tp in revoked:
            for st in self.states:
                if tp.topic == st.topic and tp.partition in st.processors:
                    st.maybe_snapshot(tp.partition, force=True)
                    st.drop(tp.partition)

    async def _on_shutdown(self, sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        """Queue every partition's snapshot and log the counters a last time."""
        # The consumer has committed its last offsets; the producer flushes after this signal.
        for st in self.states:
            for partition in list(st.processors):
                st.maybe_snapshot(partition, force=True)
        log.info("counters %s", counters_line(self.state))

    # -- read-back: offsets the consumer went past, a recreated topic's new log ---------------------------

    async def _handle_read_back(self, partition: int, proc: PartitionProcessor,
                                messages: list[tuple[int, float | None, bytes | None]]) -> bool:
        """Handle messages read back from the broker (``read_partition``) in order; False when the partition
        was revoked half way (its next owner resumes from the snapshot and reads them itself)."""
        for i, (offset, ts, value) in enumerate(messages):
            if not self.state.owns(partition, proc):
                return False
            await self._deliver(proc, proc.handle(value, topic=self.settings.metrics_topic, offset=offset,
                                                  timestamp_s=ts))
            if i % 200 == 199:
                await asyncio.sleep(0)  # let the agent, timer and courier run
        return True

    async def _catch_up(self, partition: int, proc: PartitionProcessor, upto: int, *, to_end: bool = False) -> None:
        """Read back and handle the offsets between what ``proc`` has seen and ``upto``, the consumer's next.

        Faust acks (so may commit) the messages it drops without handing them to the agent: those of an
        old consumer generation, or fetched while a rebalance or a table recovery pauses the flow. The
        consumer then goes on past them, and a worker that dies meanwhile resumes past them too. Found
        here, where the processor's own next offset says what it has not seen; handled again is free
        (the analyzer drops batches it has seen), so a false alarm costs one read.
        """
        start = proc.next_offset
        try:
            messages = await asyncio.to_thread(read_partition, self.settings, partition, upto, start=start)
        except READ_ERRORS as exc:  # then handle() in the agent counts and logs the offsets skipped
            proc.counters["catch_up_failures"] = proc.counters.get("catch_up_failures", 0) + 1
            log.error("partition %d: could not read back offsets %d to %d: %s", partition, start, upto - 1, exc)
            return
        log.warning("partition %d: the consumer went past offsets %d to %d without delivering them; read back %d "
                    "messages", partition, start, start + len(messages) - 1 if to_end else upto - 1, len(messages))
        # The partition's sender waits until the gap is handled: a snapshot older than the last one sent may
        # be what we resumed from, so a verdict found again in these offsets may already be on the topic,
        # and is checked against it (``reconcile``) before anything of this partition is sent.
        async with self.state.lock(partition):
            if not await self._handle_read_back(partition, proc, messages):
                return  # revoked meanwhile: the next owner resumes from the snapshot and catches up itself
            if proc.pending():
                proc.restored_pending = True
        proc.counters["caught_up_messages"] = proc.counters.get("caught_up_messages", 0) + len(messages)
        if len(messages) < upto - start and not to_end:  # retention deleted some, or the read timed out: say so
            proc.counters["caught_up_missing"] = proc.counters.get("caught_up_missing", 0) + upto - start - len(
                messages)
            log.error("partition %d: only %d of the %d messages between offsets %d and %d could be read back",
                      partition, len(messages), upto - start, start, upto - 1)

    async def _learn_topic(self, proc: PartitionProcessor) -> None:
        """Name the topic ``proc``'s offsets count in before it handles its first message.

        Left to the topic timer, a broker that restarted empty before its first check (2 s after start)
        made the new log look like the old one: its offsets below the old position were taken as handled
        and skipped, records lost without a word (CI: a broker killed 2 s after the worker was ready)."""
        if self.state.topic_id is None and time.monotonic() >= self._topic_retry_at:
            try:
                self.state.topic_id = await asyncio.to_thread(topic_id, self.settings)
            except READ_ERRORS as exc:  # unreachable just now: the next message (at most once a second) asks again
                log.debug("topic id unknown: %s", exc)
            if self.state.topic_id is None:  # unreachable, or no such topic yet: not on every message
                self._topic_retry_at = time.monotonic() + 1.0
        proc.topic_id = self.state.topic_id

    async def _watch_topics(self) -> None:
        """The topic timer: ``_check_topics``, surviving anything."""
        try:
            await self._check_topics()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - an error escaping a Faust timer crashes the worker; checked again soon
            log.exception("topic check failed")

    async def _watch_recovery(self) -> None:
        """``RecoveryWatch.check`` every ``RECOVERY_CHECK_EVERY_S``, surviving anything (its own task: a check
        may read the log for seconds)."""
        while True:
            await asyncio.sleep(RECOVERY_CHECK_EVERY_S)
            try:
                await self.recovery_watch.check()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the task must outlive one failed check; checked again soon
                log.exception("recovery check failed")

    async def _check_topics(self) -> None:
        """Recreate lost topics; notice a recreated metrics topic and re-read it from its first offset."""
        settings = self.settings
        try:
            found = await asyncio.to_thread(topic_id, settings)
        except READ_ERRORS as exc:  # the broker is unreachable: nothing to decide now
            log.debug("topic check failed: %s", exc)
            return
        if found is None:
            log.warning("topic %s is gone (broker restarted empty?): creating the topics again",
                        settings.metrics_topic)
            try:
                await asyncio.to_thread(ensure_topics, settings)
            except READ_ERRORS as exc:  # tried again on the next check
                log.warning("could not recreate the topics: %s", exc)
            return
        old, self.state.topic_id = self.state.topic_id, found
        if old is not None and found != old:
            log.warning("topic %s was recreated (id %s, was %s): its offsets start again", settings.metrics_topic,
                        found, old)
        # Judged per processor, not per change seen: a partition restored from a snapshot taken before its
        # re-read finished (a rebalance in the middle of it) still names the old topic and is re-read now.
        for partition, proc in list(self.state.processors.items()):
            if proc.topic_id is None:
                proc.topic_id = found
            elif proc.topic_id != found:
                proc.counters["topic_resets"] = proc.counters.get("topic_resets", 0) + 1
                await self._backfill(partition, proc, found)

    async def _backfill(self, partition: int, proc: PartitionProcessor, topic: str) -> None:
        """Read the new log of ``partition`` below the highest offset handled so far, and handle it.

        The consumer went on from its position in the old log, so the new log's first offsets would
        never be read; handling them twice costs nothing (the analyzer drops batches it has seen). The
        processor is marked as counting in the new topic only once all of it is handled and snapshotted:
        if the partition moves to another worker half way, that worker's restored state re-reads it.
        """
        upto = proc.next_offset
        proc.offsets_restart()
        try:
            messages = await asyncio.to_thread(read_partition, self.settings, partition, upto)
        except READ_ERRORS as exc:  # counted and logged, tried again on the next check
            proc.counters["backfill_failures"] = proc.counters.get("backfill_failures", 0) + 1
            log.error("partition %d: could not re-read the recreated topic below offset %d: %s", partition, upto, exc)
            return
        log.warning("partition %d: re-reading %d messages of the recreated topic (offsets 0 to %d)", partition,
                    len(messages), upto - 1)
        if not await self._handle_read_back(partition, proc, messages):
            log.warning("partition %d: revoked while re-reading the recreated topic; its next owner re-reads it",
                        partition)
            return
        proc.counters["backfilled_messages"] = proc.counters.get("backfilled_messages", 0) + len(messages)
        proc.topic_id = topic
        try:
            await self.state.checkpoint(partition, force=True)
        except Exception as exc:  # noqa: BLE001 - any send error (class docstring): the courier's next
            # snapshot carries it
            log.warning("partition %d: snapshot after the re-read failed: %s", partition, exc)

    # -- the timer: evaluation only -----------------------------------------------------------------------

    def _caught_up(self) -> bool:
        """Whether the worker reads its metrics partitions as the messages arrive (``lag.LagWatch``)."""
        now = time.time()
        unread: dict[int, int | None] = {}
        for tp in self.app.consumer.assignment():
            if tp.topic != self.state.topic:
                continue
            proc = self.state.processors.get(tp.partition)
            try:
                high = self.app.consumer.highwater(tp)
            except Exception:  # noqa: BLE001 - no fetch yet, or a rebalance: unknown, not behind
                high = None
            unread[tp.partition] = None if high is None or proc is None or proc.next_offset < 0 \
                else int(high) - proc.next_offset
            if proc is not None and unread[tp.partition] is not None:
                proc.counters["unread_messages"] = max(0, int(unread[tp.partition] or 0))
        lags = {p: proc.recent_lag(now) for p, proc in self.state.processors.items()}
        return self.lag.update(now, unread, lags)

    def _unstick(self) -> None:
        """Start reading back a partition that stayed behind for ``STUCK_TICKS`` ticks with nothing delivered.

        Counted in ticks, not seconds: a worker the host stopped (SIGSTOP, a long pause) ticks not at all, so
        it is never taken for stuck; one that reads, however slowly, moves its next offset. A tick counts
        only while the agent waits with nothing fetched: an overloaded worker, busy in a message or with a
        queue to work through, is slow, not stuck (reading back under it would only add work)."""
        waiting = not self._agent_busy and (self._agent_queue is None or self._agent_queue.empty())
        for partition, proc in list(self.state.processors.items()):
            unread = int(proc.counters.get("unread_messages", 0))
            if unread <= 0 or proc.next_offset < 0 or partition in self._reading:
                self._stuck.pop(partition, None)
                continue
            if not waiting:
                continue
            at, ticks = self._stuck.get(partition, (-1, 0))
            ticks = ticks + 1 if at == proc.next_offset else 0
            self._stuck[partition] = (proc.next_offset, ticks)
            if ticks >= STUCK_TICKS:
                proc.counters["stuck_reads"] = proc.counters.get("stuck_reads", 0) + 1
                log.warning("partition %d: %d messages unread and none delivered for %d ticks: reading them back",
                            partition, unread, ticks)
                self._reading[partition] = asyncio.ensure_future(self._read_stuck(partition, proc))

    async def _read_stuck(self, partition: int, proc: PartitionProcessor) -> None:
        try:  # to the log's end (the read stops after a few idle seconds): the watermark may be a batch short
            await self._catch_up(partition, proc, 2**62, to_end=True)
        except Exception:  # noqa: BLE001 - tried again after STUCK_TICKS more ticks
            log.exception("partition %d: reading back the unread messages failed", partition)
        finally:
            self._reading.pop(partition, None)
            self._stuck.pop(partition, None)

    async def _tick(self) -> None:
        """Evaluate every partition (finding hangs even with the broker away) and log changed counters."""
        if time.monotonic() - self._counters_at >= COUNTERS_EVERY_S:
            self._counters_at = time.monotonic()
            report = counters_line(self.state)
            if report != self._counters_line:
                self._counters_line = report
                log.info("counters %s", report)
        caught_up = self._caught_up()
        self._unstick()
        for partition, proc in list(self.state.processors.items()):
            try:
                # Evaluation only: nothing here waits for the broker (the courier sends), so hangs are
                # still found, and kept pending, while the broker is unreachable.
                if proc.tick(caught_up=caught_up):
                    self.state.wake.set()
                if self.shard:
                    await self._send_reports(proc)
            except Exception:  # noqa: BLE001 - the timer must survive anything one partition does
                log.exception("tick failed on partition %d", partition)


def create_app(settings: Settings, *, app_id: str | None = None) -> faust.App:
    """Build the worker app for ``settings`` (bootstrap must be set)."""
    return WorkerApp(settings, app_id=app_id).app
