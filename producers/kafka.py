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


def job_partition(job: str, partitions: int) -> int:
    """The metrics partition of a job: stable across processes and languages (CRC-32)."""
    return zlib.crc32(job.encode("utf-8")) % max(partitions, 1)


def batch_key(batch: KernelBatch) -> bytes:
    """``<job>/<communicator>/<first op_seq>``: the communicator and the Trace ID the batch starts at."""
    first = int(batch.columns["op_seq"][0]) if batch.n else -1
    return f"{batch.job}/{comm_hex(batch.comm_hash)}/{first}".encode()


class MetricsProducer:
    """Ships kernel records of one process to ``settings.metrics_topic``.

    Use as a context manager, or call ``close()``: it flushes what is queued.
    """

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
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._producer: Producer | None = None
        self._partitions: int | None = None
        self._counters = {"sent_batches": 0, "sent_records": 0, "delivery_failures": 0, "produce_errors": 0}
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
        return self._produce(batch, timestamp_ms, block_s)

    @property
    def stats(self) -> dict[str, int]:
        b = self._batcher.stats
        return {
            **self._counters,
            "accepted": b.accepted,
            "dropped_progress": b.dropped_progress,
            "dropped_critical": b.dropped_critical,
            "queued": len(self._batcher),
        }

    def flush(self, timeout_s: float = 10.0) -> int:
        """Send everything queued and wait for delivery; returns messages still undelivered."""
        with self._lock:
            batches = self._batcher.ready(time.monotonic(), force=True)
        for batch in batches:
            self._produce(batch, None, block_s=timeout_s)
        if self._producer is None:
            return 0
        return int(self._producer.flush(timeout_s))

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        left = self.flush(timeout_s)
        if left:
            log.warning("metrics producer closed with %d messages undelivered", left)
            self._counters["delivery_failures"] += left
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
                }
            )
        return self._producer

    def _partition_count(self) -> int:
        if self._partitions is None:
            try:
                md = self._client().list_topics(self.settings.metrics_topic, timeout=5)
                parts = md.topics[self.settings.metrics_topic].partitions
                self._partitions = len(parts) or self.settings.metrics_partitions
            except KafkaException as exc:
                log.warning("cannot read partitions of %s (%s); assuming %d", self.settings.metrics_topic, exc,
                            self.settings.metrics_partitions)
                self._partitions = self.settings.metrics_partitions
        return self._partitions

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._counters["delivery_failures"] += 1
            log.debug("delivery failed: %s", err)

    def _produce(self, batch: KernelBatch, timestamp_ms: int | None, block_s: float) -> bool:
        producer = self._client()
        kwargs: dict[str, Any] = {
            "value": encode_batch(batch),
            "key": batch_key(batch),
            "partition": job_partition(batch.job, self._partition_count()),
            "on_delivery": self._on_delivery,
        }
        if timestamp_ms is not None:
            kwargs["timestamp"] = int(timestamp_ms)
        deadline = time.monotonic() + block_s
        while True:
            try:
                producer.produce(self.settings.metrics_topic, **kwargs)
                self._counters["sent_batches"] += 1
                self._counters["sent_records"] += batch.n
                producer.poll(0)
                return True
            except BufferError:
                if time.monotonic() >= deadline:
                    self._counters["produce_errors"] += 1
                    return False
                producer.poll(0.05)
            except KafkaException as exc:
                self._counters["produce_errors"] += 1
                log.warning("produce failed: %s", exc)
                return False

    def _run(self) -> None:
        tick = max(self.settings.producer_linger_ms / 4000.0, 0.005)
        while not self._stop.is_set():
            try:
                with self._lock:
                    batches = self._batcher.ready(time.monotonic())
                for batch in batches:
                    self._produce(batch, None, block_s=0.0)
                if self._producer is not None:
                    self._producer.poll(0)
            except Exception:  # keep shipping whatever happens to one batch
                log.exception("metrics producer loop error")
                self._counters["produce_errors"] += 1
            self._stop.wait(tick)
