"""Consume metrics and verdicts, write Parquet per topic partition, commit only after the write.

Offsets are committed manually and only for messages that are in a renamed, complete file,
so a crash loses nothing: the next run re-reads from the last commit and rewrites the same
file names. Undecodable messages and records with impossible values are counted and skipped here
(the worker dead-letters them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ccld.errors import SchemaError
from ccld.schemas.codec import decode_metrics, decode_verdict
from ccld.security import kafka_config
from ccld.settings import Settings
from ccld.sinks.parquet import file_path, metrics_table, verdicts_table, write_atomic

log = logging.getLogger(__name__)


@dataclass
class _Buffer:
    start_offset: int
    first_seen: float
    items: list[tuple[int, int, Any]] = field(default_factory=list)
    rows: int = 0


class Archiver:
    """The Parquet sink of one process; ``run`` until ``stop`` is set."""

    def __init__(self, settings: Settings, root: Path | None = None, *, group: str | None = None) -> None:
        self.settings = settings
        self.root = Path(root or settings.archive_dir)
        self.group = group or settings.sink_group
        self.topics = [settings.metrics_topic, settings.verdicts_topic]
        self.counters = {"messages": 0, "rows": 0, "files": 0, "undecodable": 0, "bad_value": 0, "commit_errors": 0}
        self._buffers: dict[tuple[str, int], _Buffer] = {}
        self.on_file: Callable[[Path, int], None] | None = None
        self.assigned = threading.Event()  # set once the group gave us partitions

    def _consumer(self) -> Consumer:
        return Consumer(kafka_config(self.settings, **{
            "group.id": self.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": self.settings.session_timeout_ms,
            "heartbeat.interval.ms": self.settings.heartbeat_ms,
            "on_commit": self._on_commit,
        }))

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if err is not None:
            self.counters["commit_errors"] += 1
            log.warning("offset commit failed: %s", err)

    def run(self, stop: threading.Event) -> None:
        consumer = self._consumer()
        consumer.subscribe(self.topics, on_assign=lambda c, parts: self.assigned.set(),
                           on_revoke=lambda c, parts: self._flush_all(c, force=True))
        heartbeat = self.root / ".sink-heartbeat"
        self.root.mkdir(parents=True, exist_ok=True)
        beat = 0.0
        try:
            while not stop.is_set():
                if time.monotonic() - beat >= 5.0:  # liveness for the compose healthcheck
                    heartbeat.touch()
                    beat = time.monotonic()
                msgs = consumer.consume(num_messages=500, timeout=0.2)
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            log.warning("consume error: %s", err)
                        continue
                    self._add(str(msg.topic()), msg.partition() or 0, msg.offset() or 0, msg.timestamp()[1],
                              msg.value())
                self._flush_all(consumer, force=False)
            self._flush_all(consumer, force=True)
        finally:
            consumer.close()

    def _add(self, topic: str, partition: int, offset: int, ts_ms: int, value: bytes | None) -> None:
        self.counters["messages"] += 1
        try:
            item: Any = decode_metrics(value or b"") if topic == self.settings.metrics_topic else decode_verdict(
                value or b"")
        except SchemaError as exc:
            # decode_metrics applies the worker's value checks too: an impossible record is never archived.
            self.counters["bad_value" if exc.reason == "bad-value" else "undecodable"] += 1
            log.debug("skipping undecodable message %s[%d]@%d: %s", topic, partition, offset, exc)
            item = None
        buf = self._buffers.get((topic, partition))
        if buf is None:
            buf = self._buffers[(topic, partition)] = _Buffer(start_offset=offset, first_seen=time.monotonic())
        # An undecodable message still belongs to the file's offset range, so it is committed with it.
        buf.items.append((offset, ts_ms, item))
        buf.rows += 0 if item is None else getattr(item, "n", 1)

    def _flush_all(self, consumer: Consumer, *, force: bool) -> None:
        now = time.monotonic()
        for key in list(self._buffers):
            buf = self._buffers[key]
            if force or buf.rows >= self.settings.sink_max_rows or now - buf.first_seen >= self.settings.sink_max_age_s:
                self._flush(consumer, key, buf)
                del self._buffers[key]

    def _flush(self, consumer: Consumer, key: tuple[str, int], buf: _Buffer) -> None:
        topic, partition = key
        good = [(o, t, x) for o, t, x in buf.items if x is not None]
        last = buf.items[-1][0]
        if good:
            table = metrics_table(good) if topic == self.settings.metrics_topic else verdicts_table(good)
            path = write_atomic(table, file_path(self.root, topic, partition, buf.start_offset), last)
            self.counters["files"] += 1
            self.counters["rows"] += table.num_rows
            log.info("archived %d rows of %s[%d] to %s", table.num_rows, topic, partition, path)
            if self.on_file is not None:
                self.on_file(path, table.num_rows)
        try:
            consumer.commit(offsets=[TopicPartition(topic, partition, last + 1)], asynchronous=False)
        except KafkaException as exc:  # the file is complete; a replay rewrites it under the same name
            self.counters["commit_errors"] += 1
            log.warning("commit of %s[%d]@%d failed: %s", topic, partition, last + 1, exc)
