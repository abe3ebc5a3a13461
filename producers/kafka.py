"""Kernel records to the metrics topic with confluent-kafka, never blocking the caller.

``submit`` only appends to a bounded in-memory batcher under a lock; a daemon thread cuts
batches, encodes them (Avro single-object, columnar) and hands them to librdkafka. All
records of one job go to one partition (the analyzer correlates communicators of a job),
and the message key names the communicator and the Trace ID of the batch's first record (a batch
holds every communicator of a flush).

Every record ends in exactly one counter (``stats``): delivered, expired (the broker did not
take it within ``producer_message_timeout_ms``), refused (librdkafka's queue stayed full, or no
partition count), failed (any other delivery error, or undelivered at close), dropped by the
bounded batcher, spool-lost (spool full or too old), or replay-rejected (a spooled message the
broker refused for good when it was replayed); or it is still queued, in flight or spooled. With
``spool_dir`` set, messages the broker did not take go to a bounded on-disk spool
(``ccld.producers.spool``) instead of being lost, and are replayed in order when it answers again
(``ccld.producers.spool_replay`` decides what is spooled and runs the replay).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ccld.errors import BrokerError
from ccld.producers.batcher import RecordBatcher
from ccld.producers.spool import SpooledMessage
from ccld.producers.spool_replay import SpoolReplay
from ccld.records import KernelBatch, KernelRecord, comm_hex, metrics_partition
from ccld.schemas.codec import decode_metrics, encode_batch
from ccld.security import kafka_config
from ccld.settings import Settings

log = logging.getLogger(__name__)


class RepeatFilter(logging.Filter):
    """Let one librdkafka line per facility (FAIL, ERROR, ...) through every ``every_s`` seconds.

    A broker that is gone makes librdkafka log "Connection refused" at every reconnect attempt
    (hundreds of lines per outage); the first line says it, the stats line counts the cost.
    """

    def __init__(self, every_s: float = 30.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        key = str(args[0]) if args else record.getMessage()[:40]
        now = time.monotonic()
        if now - self._last.get(key, -1e18) < self.every_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        self._last[key] = now
        skipped = self._suppressed.pop(key, 0)
        if skipped:
            record.msg = f"{record.msg} (and {skipped} similar lines in the last {self.every_s:.0f} s)"
        return True


#: librdkafka's own log lines (connection refused, ...) go here, never straight to the training job's stderr.
rdkafka_log = logging.getLogger("ccld.librdkafka")
rdkafka_log.addHandler(logging.NullHandler())
rdkafka_log.addFilter(RepeatFilter())

#: stats keys whose records did not reach the broker and never will (the loss counters)
LOST_KEYS = ("expired_records", "refused_records", "error_records", "spool_lost_records",
             "replay_rejected_records", "dropped_progress", "dropped_critical")


def batch_key(batch: KernelBatch) -> bytes:
    """``<job>/<communicator>/<first op_seq>``: the first row's communicator and Trace ID (the batch may hold
    other communicators' rows too; the partition comes from the job alone, ``job_partition``)."""
    first = int(batch.columns["op_seq"][0]) if batch.n else -1
    return f"{batch.job}/{comm_hex(batch.comm_hash)}/{first}".encode()


def format_stats(stats: dict[str, int], producer_id: str = "") -> str:
    """One line a person reads at exit: what was delivered, what was lost and why, what waits."""
    lost = sum(stats.get(k, 0) for k in LOST_KEYS)
    who = f"producer {producer_id}: " if producer_id else ""
    return (f"{who}{stats.get('delivered_records', 0)} records delivered, {lost} lost "
            f"(expired {stats.get('expired_records', 0)}, refused {stats.get('refused_records', 0)}, "
            f"failed {stats.get('error_records', 0)}, "
            f"dropped {stats.get('dropped_progress', 0) + stats.get('dropped_critical', 0)}, "
            f"spool-lost {stats.get('spool_lost_records', 0)}, "
            f"replay-rejected {stats.get('replay_rejected_records', 0)}); "
            f"spooled {stats.get('spooled_records', 0)}, replayed {stats.get('replayed_records', 0)}, "
            f"in flight {stats.get('in_flight_records', 0)}, queued {stats.get('queued', 0)}")


class MetricsProducer:
    """Ships kernel records of one process to ``settings.metrics_topic``.

    Use as a context manager, or call ``close()``: it flushes what is queued and logs one stats
    line. Every record submitted ends up counted exactly once in ``stats`` (see the module doc).
    """

    #: how long to wait before asking the broker again for the partition count
    METADATA_RETRY_S = 2.0
    #: a stats line goes to the log at most this often while records are being lost or spooled
    STATS_LOG_INTERVAL_S = 30.0

    def __init__(self, settings: Settings, producer_id: str | None = None, *, background: bool = True) -> None:
        if not settings.bootstrap:
            raise ValueError("MetricsProducer needs settings.bootstrap (start `ccld broker` or give --bootstrap)")
        self.settings = settings
        self.producer_id = producer_id or uuid.uuid4().hex[:12]
        self._batcher = RecordBatcher(
            producer_id=self.producer_id,
            batch_max=settings.producer_batch_max,
            queue_max=settings.producer_queue_max,
            linger_s=settings.producer_linger_ms / 1000.0,
        )
        self._lock = threading.Lock()  # guards the batcher (taken by the training thread: kept short)
        self._send_lock = threading.Lock()  # one sender at a time, so batches of a communicator keep order
        self._count_lock = threading.Lock()  # counters change in delivery callbacks of more than one thread
        self._stop = threading.Event()
        self._producer: Producer | None = None
        self._partitions: int | None = None
        self._metadata_tried = -1e9
        self._counters = {
            "sent_batches": 0, "sent_records": 0, "delivered_records": 0, "failed_records": 0,
            "delivery_failures": 0, "produce_errors": 0, "expired_records": 0, "refused_records": 0,
            "error_records": 0, "spooled_in_records": 0, "replayed_records": 0, "replay_duplicate_records": 0,
            "spool_lost_records": 0, "replay_rejected_records": 0, "recovered_records": 0,
        }
        self._in_flight = 0  # records handed to librdkafka (not replays) whose delivery report is pending
        # The spool (with ``spool_dir``): what goes to it, and its replay.
        self._spool_replay = SpoolReplay(settings, client=self._client, partitions=lambda: self._partitions,
                                         count=self._count, lose=self._lose, stats_line=self.stats_line)
        if not background:
            self._spool_replay.open()  # otherwise the sender thread opens it: never the training thread
        self._last_stats_log = (time.monotonic(), 0)
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="ccld-producer", daemon=True)
            self._thread.start()

    # --- the caller's side -------------------------------------------------------------------

    def submit(self, record: KernelRecord) -> None:
        """Queue one record. Never blocks on I/O and never raises: drops are counted."""
        try:
            with self._lock:
                self._batcher.add(record, time.monotonic())
        except Exception:  # noqa: BLE001 - the training job must never see our failure
            self._counters["produce_errors"] += 1

    def send_batch(self, batch: KernelBatch, timestamp_ms: int | None = None, *, block_s: float = 10.0) -> bool:
        """Produce a prebuilt batch now (simulator, replay). Waits up to ``block_s`` for queue room.

        True when the batch was handed on (to librdkafka or the spool); False when it was refused
        (counted in ``refused_records``).
        """
        with self._send_lock:
            self._spool_replay.open()
            ok = self._produce(batch, timestamp_ms, block_s)
            self._spool_replay.step()
            return ok

    def check_broker(self, timeout_s: float | None = None) -> int:
        """Ask the broker for the metrics topic's partitions; raise ``BrokerError`` if it does not answer.

        For command-line producers (``ccld simulate``): a broker that is not there fails within
        ``timeout_s`` with a message that says so, instead of records expiring one by one.
        Never called on the training path.
        """
        timeout_s = self.settings.producer_connect_timeout_s if timeout_s is None else timeout_s
        topic = self.settings.metrics_topic
        try:
            md = self._client().list_topics(topic, timeout=timeout_s)
        except KafkaException as exc:
            raise BrokerError(f"no Kafka broker answered at {self.settings.bootstrap} within {timeout_s:g} s "
                              f"({exc.args[0].str() if exc.args else exc}); is it running, and is --bootstrap "
                              f"(or CCLD_BOOTSTRAP) right?") from exc
        meta = md.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise BrokerError(f"the broker at {self.settings.bootstrap} has no topic {topic} "
                              f"({meta.error if meta is not None else 'missing'}); create it with `ccld topics`")
        self._partitions = len(meta.partitions)
        return self._partitions

    @property
    def stats(self) -> dict[str, int]:
        b = self._batcher.stats
        c = self._counters
        return {
            **c,
            "in_flight_records": self._in_flight,
            "spooled_records": self._spool_replay.spooled_records,
            "lost_records": c["failed_records"] + b.dropped_progress + b.dropped_critical,
            "accepted": b.accepted,
            "dropped_progress": b.dropped_progress,
            "dropped_critical": b.dropped_critical,
            "queued": len(self._batcher),
        }

    @property
    def spool_bytes(self) -> int:
        """Bytes the on-disk spool holds now (0 without one), of at most ``spool_max_mb``."""
        spool = self._spool_replay.spool
        try:
            return spool.bytes_used if spool is not None else 0
        except OSError:  # a segment replayed and removed while we looked: next time
            return 0

    @property
    def lost_records(self) -> int:
        """Records that did not reach the broker and never will."""
        return self.stats["lost_records"]

    def stats_line(self) -> str:
        return format_stats(self.stats, self.producer_id)

    def flush(self, timeout_s: float = 10.0) -> int:
        """Send everything queued (replaying the spool if the broker answers) and wait for delivery.

        Returns messages still undelivered in librdkafka (spooled ones are not counted: they wait
        on disk, see ``stats['spooled_records']``).
        """
        deadline = time.monotonic() + timeout_s
        with self._send_lock:
            self._spool_replay.open()
            with self._lock:
                batches = self._batcher.ready(time.monotonic(), force=True)
            for batch in batches:
                self._produce(batch, None, block_s=max(deadline - time.monotonic(), 0.0))
        if self._producer is None and self._spool_replay.spool is None:
            return 0
        while self._spool_replay.pending_messages and time.monotonic() < deadline:
            # The replay needs the partition count (a producer that never reached a broker lacks it).
            self._partition_count(wait_s=min(1.0, max(deadline - time.monotonic(), 0.0)))
            with self._send_lock:
                self._spool_replay.maintain(self._producer)
            self._client().poll(0.05)
        if self._producer is None:
            return 0
        return int(self._producer.flush(max(deadline - time.monotonic(), 0.0)))

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        left = self.flush(timeout_s)
        if self._spool_replay.keep_the_rest(self._producer, left):
            left = 0  # what librdkafka still held went to the spool for the next process
        lost = self._in_flight
        if left or lost:
            log.warning("metrics producer closed with %d messages (%d records) undelivered", left, lost)
            with self._count_lock:
                self._counters["delivery_failures"] += left
                self._counters["failed_records"] += lost
                self._counters["error_records"] += lost
                self._in_flight = 0
        self._spool_replay.close()
        self._producer = None  # librdkafka's client (and its reconnect attempts) ends with the last reference
        line = self.stats_line()
        if self.lost_records or self.stats["spooled_records"]:
            log.warning("%s", line)
        else:
            log.info("%s", line)

    def __enter__(self) -> MetricsProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the background side ------------------------------------------------------------------

    def _client(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                kafka_config(
                    self.settings,
                    **{
                        "client.id": f"ccld-{self.producer_id}",
                        "linger.ms": 5,
                        "compression.type": "lz4",
                        "message.timeout.ms": self.settings.producer_message_timeout_ms,
                        # A request to a frozen broker must fail with its messages, not 30 s later.
                        "request.timeout.ms": min(self.settings.producer_message_timeout_ms, 30_000),
                        "queue.buffering.max.messages": 20_000,
                        "enable.idempotence": False,
                        "reconnect.backoff.max.ms": 10_000,  # a dead broker is retried, not hammered
                    },
                ),
                logger=rdkafka_log,
            )
        return self._producer

    def _partition_count(self, wait_s: float = 0.0) -> int | None:
        """The metrics topic's partition count, or None while the broker has not told us.

        Never guessed: a wrong count would split a job across partitions, and the worker that
        owns the job would then miss some of its ranks.
        """
        deadline = time.monotonic() + wait_s
        while self._partitions is None:
            now = time.monotonic()
            if now - self._metadata_tried >= self.METADATA_RETRY_S:
                self._metadata_tried = now
                try:
                    md = self._client().list_topics(self.settings.metrics_topic,
                                                    timeout=min(5.0, max(deadline - now, 0.5)))
                    topic = md.topics.get(self.settings.metrics_topic)
                    if topic is not None and topic.error is None and topic.partitions:
                        self._partitions = len(topic.partitions)
                        break
                    log.warning("topic %s does not exist yet", self.settings.metrics_topic)
                except KafkaException as exc:
                    log.warning("cannot read partitions of %s: %s", self.settings.metrics_topic, exc)
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))
        return self._partitions

    def _count(self, **changes: int) -> None:
        with self._count_lock:
            for key, n in changes.items():
                self._counters[key] += n

    def _lose(self, key: str, records: int, *, messages: int = 0, value: bytes | None = None) -> None:
        """Count ``records`` as lost for the reason ``key`` (expired/refused/error/spool_lost); with the
        lost message's ``value``, its ranks travel with the job's next batch (``lost_ranks``)."""
        with self._count_lock:
            self._counters[key] += records
            self._counters["failed_records"] += records
            self._counters["delivery_failures"] += messages
        if value:
            try:
                batch = decode_metrics(value, check_values=False)
                with self._lock:
                    self._batcher.lost.note_batch(batch)
            except Exception:  # noqa: BLE001 - a loss we cannot attribute is still counted above
                self._counters["produce_errors"] += 1

    def _on_delivery(self, err: KafkaError | None, msg: Message, records: int, stamp_ms: int) -> None:
        with self._count_lock:
            self._in_flight -= records
        if err is None:
            self._count(delivered_records=records)
            return
        # a failed delivery report carries no timestamp (librdkafka says "not available"): the spool
        # keeps the one the message was produced with, or a replay would stamp it with the replay's time
        if self._spool_replay.take_undelivered(err, msg, records, stamp_ms):  # spooled (or counted spool-lost)
            return
        code = err.code()
        self._lose("expired_records" if code == KafkaError._MSG_TIMED_OUT else "error_records", records, messages=1,
                   value=msg.value())
        log.debug("delivery failed: %s", err)

    def _produce(self, batch: KernelBatch, timestamp_ms: int | None, block_s: float) -> bool:
        """Produce ``batch``: one message, or one per communicator group when jobs are spread over groups."""
        groups = self.settings.analysis_groups
        if groups <= 1:
            return self._produce_one(batch, timestamp_ms, block_s)
        ok = True
        for _, part in sorted(batch.by_group(groups).items()):
            ok = self._produce_one(part, timestamp_ms, block_s) and ok
        return ok

    def _produce_one(self, batch: KernelBatch, timestamp_ms: int | None, block_s: float) -> bool:
        n = batch.n
        groups = self.settings.analysis_groups
        replay = self._spool_replay
        if replay.spooling:
            # Behind older spooled messages (keep the order: the replay sends it when its turn
            # comes), or no broker has told us the partition count yet (the replay picks it then).
            partitions = self._partitions
            part = -1 if partitions is None else metrics_partition(batch.job, batch.comm_hash, partitions, groups)
            return replay.keep(SpooledMessage(key=batch_key(batch), value=encode_batch(batch), records=n,
                                              timestamp_ms=timestamp_ms, partition=part))
        partitions = self._partition_count(wait_s=block_s)
        if partitions is None:
            self._count(produce_errors=1)
            self._lose("refused_records", n)
            return False
        producer = self._client()
        kwargs: dict[str, Any] = {
            "value": encode_batch(batch),
            "key": batch_key(batch),
            "partition": metrics_partition(batch.job, batch.comm_hash, partitions, groups),
        }
        if timestamp_ms is not None:
            kwargs["timestamp"] = int(timestamp_ms)
        # librdkafka would stamp the message now (CreateTime); the same time, known here for a spooled copy
        stamp = int(timestamp_ms) if timestamp_ms is not None else int(time.time() * 1000)
        kwargs["on_delivery"] = lambda err, msg: self._on_delivery(err, msg, n, stamp)
        deadline = time.monotonic() + block_s
        while True:
            try:
                producer.produce(self.settings.metrics_topic, **kwargs)
                with self._count_lock:
                    self._counters["sent_batches"] += 1
                    self._counters["sent_records"] += n
                    self._in_flight += n
                producer.poll(0)
                return True
            except BufferError:
                if replay.spool is not None:  # librdkafka's queue is full: the disk takes it instead
                    return replay.overflow(SpooledMessage(key=kwargs["key"], value=kwargs["value"],
                                                          partition=kwargs["partition"], records=n,
                                                          timestamp_ms=timestamp_ms))
                if time.monotonic() >= deadline:
                    self._count(produce_errors=1)
                    self._lose("refused_records", n)
                    return False
                producer.poll(0.05)
            except KafkaException as exc:
                self._count(produce_errors=1)
                self._lose("refused_records", n)
                log.warning("produce failed: %s", exc)
                return False

    def _log_stats_now_and_then(self) -> None:
        now = time.monotonic()
        last_s, last_sig = self._last_stats_log
        s = self.stats
        sig = s["lost_records"] * 1_000_003 + s["spooled_records"]
        if sig != last_sig and now - last_s >= self.STATS_LOG_INTERVAL_S:
            self._last_stats_log = (now, sig)
            log.warning("%s", format_stats(s, self.producer_id))

    def _run(self) -> None:
        tick = max(self.settings.producer_linger_ms / 4000.0, 0.005)
        with self._send_lock:
            self._spool_replay.open()
        while not self._stop.is_set():
            try:
                # Records wait in the bounded batcher (where the drop policy applies) until the
                # partition count is known.
                # With a spool, batches go to disk while no broker has answered yet.
                if self._partition_count() is not None or self._spool_replay.spool is not None:
                    with self._send_lock:
                        with self._lock:
                            batches = self._batcher.ready(time.monotonic())
                        for batch in batches:
                            # This thread may wait a little for librdkafka's queue; the caller never does.
                            self._produce(batch, None, block_s=1.0)
                        self._spool_replay.maintain(self._producer)
                if self._producer is not None:
                    self._producer.poll(0)
                self._log_stats_now_and_then()
            except Exception:  # keep shipping whatever happens to one batch
                log.exception("metrics producer loop error")
                self._counters["produce_errors"] += 1
            self._stop.wait(tick)
