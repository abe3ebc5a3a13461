"""Kernel records to the metrics topic with confluent-kafka, never blocking the caller.

``submit`` only appends to a bounded in-memory batcher under a lock; a daemon thread cuts
batches, encodes them (Avro single-object, columnar) and hands them to librdkafka. All
records of one job go to one partition (the analyzer correlates communicators of a job),
and the message key names the communicator and the Trace ID of the batch's first record.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import zlib
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ccld.producers.batcher import RecordBatcher
from ccld.records import KernelBatch, KernelRecord, comm_hex
from ccld.schemas import encode_batch
from ccld.settings import Settings

log = logging.getLogger(__name__)
#: librdkafka's own log lines (connection refused, ...) go here, never straight to the training job's stderr.
rdkafka_log = logging.getLogger("ccld.librdkafka")
rdkafka_log.addHandler(logging.NullHandler())


def job_partition(job: str, partitions: int) -> int:
    """The metrics partition of a job: stable across processes and languages (CRC-32)."""
    return zlib.crc32(job.encode("utf-8")) % max(partitions, 1)


def batch_key(batch: KernelBatch) -> bytes:
    """``<job>/<communicator>/<first op_seq>``: the communicator and the Trace ID the batch starts at."""
    first = int(batch.columns["op_seq"][0]) if batch.n else -1
    return f"{batch.job}/{comm_hex(batch.comm_hash)}/{first}".encode()


class MetricsProducer:
    """Ships kernel records of one process to ``settings.metrics_topic``.

    Use as a context manager, or call ``close()``: it flushes what is queued. Every record
    submitted ends up counted exactly once in ``stats``: delivered, failed (a produce error, a
    delivery failure, or still undelivered at close), dropped by the bounded queue, or queued.
    """

    #: how long to wait before asking the broker again for the partition count
    METADATA_RETRY_S = 2.0

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
        self._stop = threading.Event()
        self._producer: Producer | None = None
        self._partitions: int | None = None
        self._metadata_tried = -1e9
        self._counters = {
            "sent_batches": 0, "sent_records": 0, "delivered_records": 0, "failed_records": 0,
            "delivery_failures": 0, "produce_errors": 0,
        }
        self._delivery_failed_records = 0  # records of messages librdkafka reported failed (or lost at close)
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
        except Exception:  # the training job must never see our failure
            self._counters["produce_errors"] += 1

    def send_batch(self, batch: KernelBatch, timestamp_ms: int | None = None, *, block_s: float = 10.0) -> bool:
        """Produce a prebuilt batch now (simulator, replay). Waits up to ``block_s`` for queue room."""
        with self._send_lock:
            return self._produce(batch, timestamp_ms, block_s)

    @property
    def stats(self) -> dict[str, int]:
        b = self._batcher.stats
        c = self._counters
        return {
            **c,
            "in_flight_records": c["sent_records"] - c["delivered_records"] - self._delivery_failed_records,
            "accepted": b.accepted,
            "dropped_progress": b.dropped_progress,
            "dropped_critical": b.dropped_critical,
            "queued": len(self._batcher),
        }

    def flush(self, timeout_s: float = 10.0) -> int:
        """Send everything queued and wait for delivery; returns messages still undelivered."""
        deadline = time.monotonic() + timeout_s
        with self._send_lock:
            with self._lock:
                batches = self._batcher.ready(time.monotonic(), force=True)
            for batch in batches:
                self._produce(batch, None, block_s=max(deadline - time.monotonic(), 0.0))
        if self._producer is None:
            return 0
        return int(self._producer.flush(max(deadline - time.monotonic(), 0.0)))

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        left = self.flush(timeout_s)
        lost = self.stats["in_flight_records"]
        if left or lost:
            log.warning("metrics producer closed with %d messages (%d records) undelivered", left, lost)
            self._counters["delivery_failures"] += left
            self._counters["failed_records"] += lost
            self._delivery_failed_records += lost
        self._producer = None  # librdkafka's client (and its reconnect attempts) ends with the last reference

    def __enter__(self) -> MetricsProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the background side ------------------------------------------------------------------

    def _client(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                {
                    "bootstrap.servers": self.settings.bootstrap,
                    "client.id": f"ccld-{self.producer_id}",
                    "linger.ms": 5,
                    "compression.type": "lz4",
                    "message.timeout.ms": 30_000,
                    "queue.buffering.max.messages": 20_000,
                    "enable.idempotence": False,
                    "reconnect.backoff.max.ms": 10_000,  # a dead broker is retried, not hammered
                },
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

    def _on_delivery(self, err: KafkaError | None, msg: Message, records: int) -> None:
        if err is None:
            self._counters["delivered_records"] += records
        else:
            self._counters["delivery_failures"] += 1
            self._counters["failed_records"] += records
            self._delivery_failed_records += records
            log.debug("delivery failed: %s", err)

    def _produce(self, batch: KernelBatch, timestamp_ms: int | None, block_s: float) -> bool:
        partitions = self._partition_count(wait_s=block_s)
        if partitions is None:
            self._counters["produce_errors"] += 1
            self._counters["failed_records"] += batch.n
            return False
        producer = self._client()
        n = batch.n
        kwargs: dict[str, Any] = {
            "value": encode_batch(batch),
            "key": batch_key(batch),
            "partition": job_partition(batch.job, partitions),
            "on_delivery": lambda err, msg: self._on_delivery(err, msg, n),
        }
        if timestamp_ms is not None:
            kwargs["timestamp"] = int(timestamp_ms)
        deadline = time.monotonic() + block_s
        while True:
            try:
                producer.produce(self.settings.metrics_topic, **kwargs)
                self._counters["sent_batches"] += 1
                self._counters["sent_records"] += n
                producer.poll(0)
                return True
            except BufferError:
                if time.monotonic() >= deadline:
                    self._counters["produce_errors"] += 1
                    self._counters["failed_records"] += n
                    return False
                producer.poll(0.05)
            except KafkaException as exc:
                self._counters["produce_errors"] += 1
                self._counters["failed_records"] += n
                log.warning("produce failed: %s", exc)
                return False

    def _run(self) -> None:
        tick = max(self.settings.producer_linger_ms / 4000.0, 0.005)
        while not self._stop.is_set():
            try:
                # Records wait in the bounded batcher (where the drop policy applies) until the
                # partition count is known.
                if self._partition_count() is not None:
                    with self._send_lock:
                        with self._lock:
                            batches = self._batcher.ready(time.monotonic())
                        for batch in batches:
                            # This thread may wait a little for librdkafka's queue; the caller never does.
                            self._produce(batch, None, block_s=1.0)
                if self._producer is not None:
                    self._producer.poll(0)
            except Exception:  # keep shipping whatever happens to one batch
                log.exception("metrics producer loop error")
                self._counters["produce_errors"] += 1
            self._stop.wait(tick)
