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
(``ccld.producers.spool``) instead of being lost, and are replayed in order when it answers again.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
import uuid
from typing import Any

from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError, KafkaException, Message, Producer

from ccld.errors import BrokerError
from ccld.producers.batcher import RecordBatcher
from ccld.producers.spool import Position, Spool, SpooledMessage
from ccld.records import KernelBatch, KernelRecord, comm_hex, metrics_partition, to_signed64
from ccld.schemas.codec import encode_batch
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

#: delivery errors that mean "the broker did not take it (yet)": worth spooling and replaying.
#: Anything else (message too large, authorization, ...) would fail again: counted lost at once.
SPOOLABLE_ERRORS = frozenset({
    KafkaError._MSG_TIMED_OUT, KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT, KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError._UNKNOWN_TOPIC,
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NETWORK_EXCEPTION,
})  # fmt: skip

#: delivery errors on replay that the same bytes would get again, so replaying them once more cannot help.
#: librdkafka has already retried what it deems retriable before it reports an error, and the error a
#: delivery report carries has ``retriable()`` False whatever the code (the binding does not set it), so
#: the decision is ours, by code:
#: - size: the message (or its batch) is larger than the broker or topic accepts; it never shrinks.
#: - content: the broker could not validate the record, or its timestamp is outside the topic's
#:   ``message.timestamp.difference.max.ms`` (a spooled message only gets older).
#: - authorization / invalid topic name: fixing it takes an operator; the same refusal already counts
#:   a fresh message lost (``error_records``), and a spool that waits for an ACL blocks everything behind.
#: Not here: UNKNOWN_TOPIC_OR_PART stays in ``SPOOLABLE_ERRORS`` (an outage): a broker that restarted
#: empty (the embedded one keeps topics in memory; ``ccld up`` creates them again) answers it until the
#: topics are back, and no single reply tells "not yet" from "never"; a topic gone for good ends in the
#: age bound instead (``spool_max_age_s``: its records are discarded and counted ``spool_lost_records``).
PERMANENT_ERRORS = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_MSG_SIZE,
    KafkaError.INVALID_MSG, KafkaError.INVALID_RECORD, KafkaError.INVALID_TIMESTAMP,
    KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT, KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TOPIC_EXCEPTION, KafkaError.POLICY_VIOLATION,
})  # fmt: skip

#: stats keys whose records did not reach the broker and never will (the loss counters)
LOST_KEYS = ("expired_records", "refused_records", "error_records", "spool_lost_records",
             "replay_rejected_records", "dropped_progress", "dropped_critical")


class ReplayFault(enum.Enum):
    """What a delivery error of a replayed message says: wait for the broker, or move past the message."""

    #: the broker is away or not ready (``SPOOLABLE_ERRORS``): replay the same messages again later,
    #: however long it takes; the spool's age bound is what limits the wait
    OUTAGE = "outage"
    #: the message is refused and would be again (``PERMANENT_ERRORS``, or a fatal client error):
    #: count it lost (``replay_rejected_records``) and replay what follows
    PERMANENT = "permanent"
    #: any other error: replayed again up to ``MetricsProducer.REPLAY_ATTEMPTS_MAX`` times in a row,
    #: then counted lost like a permanent one, so no single message holds the spool forever
    OTHER = "other"


def replay_fault(err: KafkaError) -> ReplayFault:
    """Classify one delivery (or produce) error of a replayed message."""
    code = err.code()
    if err.fatal() or code in PERMANENT_ERRORS:
        return ReplayFault.PERMANENT
    if code in SPOOLABLE_ERRORS:
        return ReplayFault.OUTAGE
    return ReplayFault.OTHER


def key_partition(key: bytes, partitions: int, groups: int = 1) -> int:
    """``metrics_partition`` from a message key (``batch_key``: the job and the first row's communicator)."""
    job, comm, _ = key.decode(errors="replace").rsplit("/", 2)
    try:
        h = int(comm, 16)
    except ValueError:
        h = 0
    return metrics_partition(job, to_signed64(h), partitions, groups)


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


class _Replay:
    """One group of spooled messages in flight: committed only when every one was delivered."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # delivery reports of the group may arrive on another polling thread
        self.through: Position | None = None
        self.messages = 0
        self.records = 0
        self.stale_records = 0
        self.waiting = 0
        self.sealed = False  # every message of the group has been handed to librdkafka
        self.finished = False
        self.delivered_records = 0
        self.failed = 0  # messages that failed in a way a retry may fix (OUTAGE or OTHER)
        self.failed_records = 0
        self.outage = False  # one of those failures says the broker is away: retry without a limit
        self.rejected = 0  # messages refused for good (PERMANENT): lost whatever happens next
        self.rejected_records = 0
        self.errors: list[str] = []  # the distinct errors, for the one log line

    def note_error(self, err: KafkaError | None, records: int) -> None:
        """Count one failed message of the group (call with ``lock`` held); None: an unexplained failure."""
        fault = ReplayFault.OTHER if err is None else replay_fault(err)
        if fault is ReplayFault.PERMANENT:
            self.rejected += 1
            self.rejected_records += records
        else:
            self.failed += 1
            self.failed_records += records
            self.outage = self.outage or fault is ReplayFault.OUTAGE
        name = "unknown error" if err is None else f"{err.name()}: {err.str()}"
        if name not in self.errors:
            self.errors.append(name)


class MetricsProducer:
    """Ships kernel records of one process to ``settings.metrics_topic``.

    Use as a context manager, or call ``close()``: it flushes what is queued and logs one stats
    line. Every record submitted ends up counted exactly once in ``stats`` (see the module doc).
    """

    #: how long to wait before asking the broker again for the partition count
    METADATA_RETRY_S = 2.0
    #: spooled messages replayed per round trip at most (one while the broker is being probed)
    REPLAY_WINDOW_MAX = 512
    #: wait between replay attempts while the broker keeps failing, at most
    REPLAY_BACKOFF_MAX_S = 5.0
    #: attempts in a row at the spool's head that fail with an unclassified error (``ReplayFault.OTHER``)
    #: before its failed messages are counted lost and the replay moves on (outages never count)
    REPLAY_ATTEMPTS_MAX = 5
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
        self._spool: Spool | None = None
        self._spool_tried = False
        if not background:
            self._open_spool()  # otherwise the sender thread opens it: never the training thread
        self._outage = False  # a message was not taken: new batches go to the spool behind the older ones
        self._purge_wanted = False
        self._replay: _Replay | None = None
        self._replay_window = 1
        self._replay_backoff_s = 0.25
        self._next_replay_s = 0.0
        self._replay_attempts = 0  # failed attempts (OTHER errors only) since the spool's head last moved
        self._rejections_logged: set[str] = set()  # replay errors already logged as a warning
        self._last_stats_log = (time.monotonic(), 0)
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="ccld-producer", daemon=True)
            self._thread.start()

    def _open_spool(self) -> None:
        """Open (once) the spool slot; it may scan leftovers of a dead process, so never on the caller's path."""
        if self._spool_tried or not self.settings.spool_dir:
            return
        self._spool_tried = True
        try:
            spool = Spool(self.settings.spool_dir, max_bytes=int(self.settings.spool_max_mb * 1024 * 1024),
                          max_age_s=self.settings.spool_max_age_s)
        except OSError as exc:
            log.error("cannot open the spool %s (%s); records the broker does not take will be lost",
                      self.settings.spool_dir, exc)
            return
        self._count(recovered_records=spool.recovered_records)
        if spool.recovered_records:
            log.warning("spool %s holds %d records of an earlier process; they will be replayed",
                        spool.dir, spool.recovered_records)
        self._spool = spool

    # --- the caller's side -------------------------------------------------------------------

    def submit(self, record: KernelRecord) -> None:
        """Queue one record. Never blocks on I/O and never raises: drops are counted."""
        try:
            with self._lock:
                self._batcher.add(record, time.monotonic())
        except Exception:  # the training job must never see our failure
            self._counters["produce_errors"] += 1

    def send_batch(self, batch: KernelBatch, timestamp_ms: int | None = None, *, block_s: float = 10.0) -> bool:
        """Produce a prebuilt batch now (simulator, replay). Waits up to ``block_s`` for queue room.

        True when the batch was handed on (to librdkafka or the spool); False when it was refused
        (counted in ``refused_records``).
        """
        with self._send_lock:
            self._open_spool()
            ok = self._produce(batch, timestamp_ms, block_s)
            self._replay_step()
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
        spool = self._spool
        return {
            **c,
            "in_flight_records": self._in_flight,
            "spooled_records": spool.pending_records if spool is not None else 0,
            "lost_records": c["failed_records"] + b.dropped_progress + b.dropped_critical,
            "accepted": b.accepted,
            "dropped_progress": b.dropped_progress,
            "dropped_critical": b.dropped_critical,
            "queued": len(self._batcher),
        }

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
            self._open_spool()
            with self._lock:
                batches = self._batcher.ready(time.monotonic(), force=True)
            for batch in batches:
                self._produce(batch, None, block_s=max(deadline - time.monotonic(), 0.0))
        if self._producer is None and self._spool is None:
            return 0
        while self._spool is not None and self._spool.pending_messages and time.monotonic() < deadline:
            # The replay needs the partition count (a producer that never reached a broker lacks it).
            self._partition_count(wait_s=min(1.0, max(deadline - time.monotonic(), 0.0)))
            with self._send_lock:
                self._maintain()
            self._client().poll(0.05)
        if self._producer is None:
            return 0
        return int(self._producer.flush(max(deadline - time.monotonic(), 0.0)))

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        left = self.flush(timeout_s)
        if self._producer is not None and self._spool is not None and (left or self._replay is not None):
            # Keep, do not lose: what librdkafka still holds goes to the spool for the next process.
            self._outage = True
            self._producer.purge(in_queue=True, in_flight=True)
            self._producer.poll(0.1)  # serves the purged messages' reports: they land in the spool
            left = 0
        lost = self._in_flight
        if left or lost:
            log.warning("metrics producer closed with %d messages (%d records) undelivered", left, lost)
            with self._count_lock:
                self._counters["delivery_failures"] += left
                self._counters["failed_records"] += lost
                self._counters["error_records"] += lost
                self._in_flight = 0
        if self._spool is not None:
            self._spool.close()
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

    def _lose(self, key: str, records: int, *, messages: int = 0) -> None:
        """Count ``records`` as lost for the reason ``key`` (expired/refused/error/spool_lost)."""
        with self._count_lock:
            self._counters[key] += records
            self._counters["failed_records"] += records
            self._counters["delivery_failures"] += messages

    def _to_spool(self, msg: SpooledMessage) -> bool:
        """Keep ``msg`` on disk; a full spool counts it lost."""
        spool = self._spool
        if spool is None:
            return False
        try:
            ok = spool.append(msg)
        except OSError as exc:
            log.warning("cannot write the spool %s: %s", spool.dir, exc)
            ok = False
        if ok:
            self._count(spooled_in_records=msg.records)
        else:
            self._lose("spool_lost_records", msg.records, messages=1)
        return ok

    def _on_delivery(self, err: KafkaError | None, msg: Message, records: int) -> None:
        with self._count_lock:
            self._in_flight -= records
        if err is None:
            self._count(delivered_records=records)
            return
        code = err.code()
        if self._spool is not None and code in SPOOLABLE_ERRORS:
            if not self._outage:
                log.warning("the broker did not take a message (%s); spooling to %s until it does",
                            err.str(), self._spool.dir)
                self._outage = True
                self._purge_wanted = True  # the rest of librdkafka's queue follows, in order, not piecemeal
            ts_type, ts = msg.timestamp()
            stamp = ts if ts_type == TIMESTAMP_CREATE_TIME else None
            self._to_spool(SpooledMessage(key=msg.key() or b"", value=msg.value() or b"", partition=msg.partition(),
                                          records=records, timestamp_ms=stamp))
            return
        self._lose("expired_records" if code == KafkaError._MSG_TIMED_OUT else "error_records", records, messages=1)
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
        spool = self._spool
        if spool is not None and (self._outage or spool.pending_messages or self._partitions is None):
            # Behind older spooled messages (keep the order: the replay sends it when its turn
            # comes), or no broker has told us the partition count yet (the replay picks it then).
            partitions = self._partitions
            part = -1 if partitions is None else metrics_partition(batch.job, batch.comm_hash, partitions, groups)
            return self._to_spool(SpooledMessage(key=batch_key(batch), value=encode_batch(batch), records=n,
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
            "on_delivery": lambda err, msg: self._on_delivery(err, msg, n),
        }
        if timestamp_ms is not None:
            kwargs["timestamp"] = int(timestamp_ms)
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
                if spool is not None:  # librdkafka's queue is full: the disk takes it instead
                    self._outage = True
                    return self._to_spool(SpooledMessage(key=kwargs["key"], value=kwargs["value"],
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

    # --- the spool's replay -------------------------------------------------------------------

    def _maintain(self) -> None:
        """Purge after an outage began, and replay the spool (call with ``_send_lock`` held)."""
        if self._purge_wanted and self._producer is not None:
            self._purge_wanted = False
            # Queued (not yet sent) messages go to the spool now, in order, ahead of newer batches.
            self._producer.purge(in_queue=True, in_flight=False, blocking=False)
            self._producer.poll(0)
        self._replay_step()

    def _replay_step(self) -> None:
        spool = self._spool
        if spool is None or self._replay is not None:
            return
        if not spool.pending_messages:
            self._outage = False  # nothing waits on disk: new batches go straight to librdkafka again
            return
        if time.monotonic() < self._next_replay_s or self._partitions is None:
            return
        group = spool.peek(self._replay_window)
        if not group:
            return
        producer = self._client()
        replay = self._replay = _Replay()
        for pos, msg in group:
            last = False  # this message ends the group (it is retried next round, in order, with what follows)
            if spool.is_stale(msg):
                replay.stale_records += msg.records
            else:
                partition = msg.partition
                if partition < 0:  # spooled before the partition count was known: the key names job and group
                    partition = key_partition(msg.key, self._partitions, self.settings.analysis_groups)
                kwargs: dict[str, Any] = {
                    "value": msg.value, "key": msg.key, "partition": partition,
                    "on_delivery": lambda err, _m, r=msg.records: self._on_replayed(replay, err, r),
                }
                if msg.timestamp_ms is not None:
                    kwargs["timestamp"] = msg.timestamp_ms
                with replay.lock:
                    replay.waiting += 1
                try:
                    producer.produce(self.settings.metrics_topic, **kwargs)
                except BufferError:
                    with replay.lock:
                        replay.waiting -= 1
                    break  # librdkafka's queue is full: the group ends here; the rest stays for the next round
                except KafkaException as exc:
                    # Refused before it was sent (larger than message.max.bytes, unknown partition, ...):
                    # judged like a delivery error, so a message librdkafka never takes cannot hold the head.
                    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                    with replay.lock:
                        replay.waiting -= 1
                        replay.note_error(err, msg.records)
                    last = err is None or replay_fault(err) is not ReplayFault.PERMANENT  # may pass next time
            replay.through = pos
            replay.messages += 1
            replay.records += msg.records
            if last:
                break
        with replay.lock:
            replay.sealed = True
            done = replay.waiting == 0
        if done:
            self._finish_replay(replay)
        else:
            producer.poll(0)

    def _on_replayed(self, replay: _Replay, err: KafkaError | None, records: int) -> None:
        with replay.lock:
            replay.waiting -= 1
            if err is None:
                replay.delivered_records += records
            else:
                replay.note_error(err, records)
            done = replay.sealed and replay.waiting == 0
        if done:
            self._finish_replay(replay)

    def _finish_replay(self, replay: _Replay) -> None:
        with replay.lock:
            if replay.finished:
                return
            replay.finished = True
        spool = self._spool
        if spool is None:  # pragma: no cover - replays exist only with a spool
            return
        give_up = False
        if replay.failed and not replay.outage:
            # Only unclassified errors: maybe a passing broker state, maybe this message for ever.
            self._replay_attempts += 1
            give_up = self._replay_attempts >= self.REPLAY_ATTEMPTS_MAX
        if replay.through is None or (replay.failed and not give_up):
            # Nothing committed: the whole group goes again, in order (its delivered part twice:
            # at-least-once, the worker drops duplicate batches by producer and batch_seq).
            self._count(replay_duplicate_records=replay.delivered_records)
            self._replay_window = 1  # probe with one message until the broker answers
            self._next_replay_s = time.monotonic() + self._replay_backoff_s
            self._replay_backoff_s = min(self._replay_backoff_s * 2, self.REPLAY_BACKOFF_MAX_S)
        else:
            # Delivered, too old, or refused for good (or failing REPLAY_ATTEMPTS_MAX times in a row):
            # every message of the group has its counter, so the head moves past it.
            spool.commit(replay.through, replay.messages, replay.records)
            self._replay_attempts = 0
            self._count(delivered_records=replay.delivered_records, replayed_records=replay.delivered_records)
            if replay.stale_records:
                self._lose("spool_lost_records", replay.stale_records)
                log.warning("discarded %d spooled records older than %.0f s", replay.stale_records,
                            self.settings.spool_max_age_s)
            lost = replay.rejected_records + replay.failed_records
            if lost:
                self._lose("replay_rejected_records", lost, messages=replay.rejected + replay.failed)
                new = [e for e in replay.errors if e not in self._rejections_logged]
                self._rejections_logged.update(new)
                # Once per kind of error as a warning: one oversized message or a missing ACL could
                # otherwise write a line per message; the count is in the stats line.
                log.log(logging.WARNING if new else logging.DEBUG,
                        "the broker refused %d spooled records for good (%s); counted in replay_rejected_records, "
                        "the replay goes on", lost, "; ".join(replay.errors))
            self._replay_window = min(self._replay_window * 4, self.REPLAY_WINDOW_MAX)
            self._replay_backoff_s = 0.25
            if not spool.pending_messages:
                log.info("spool replayed; %s", self.stats_line())
        self._replay = None

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
            self._open_spool()
        while not self._stop.is_set():
            try:
                # Records wait in the bounded batcher (where the drop policy applies) until the
                # partition count is known.
                # With a spool, batches go to disk while no broker has answered yet.
                if self._partition_count() is not None or self._spool is not None:
                    with self._send_lock:
                        with self._lock:
                            batches = self._batcher.ready(time.monotonic())
                        for batch in batches:
                            # This thread may wait a little for librdkafka's queue; the caller never does.
                            self._produce(batch, None, block_s=1.0)
                        self._maintain()
                if self._producer is not None:
                    self._producer.poll(0)
                self._log_stats_now_and_then()
            except Exception:  # keep shipping whatever happens to one batch
                log.exception("metrics producer loop error")
                self._counters["produce_errors"] += 1
            self._stop.wait(tick)
