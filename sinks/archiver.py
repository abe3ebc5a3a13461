"""Consume metrics and verdicts, write Parquet per topic partition, commit only after the write.

Offsets are committed manually and only for messages that are in renamed, complete files (one per
job and day the messages hold, ``sinks.layout``), so a crash loses nothing: the next run re-reads
from the last commit and rewrites the same file names. Undecodable messages and records with
impossible values are counted and skipped here (the worker dead-letters them).

Files are named per topic incarnation (``sinks.incarnation``): a topic recreated, or a memory
broker restarted, numbers offsets from 0 again, and its rows must not replace the old ones.
A partition's incarnation is looked up when it is assigned and again whenever its offsets go
back with no rebalance in between (what a consumer sees when the topic under it was recreated).

The sink also keeps the cluster's view (``sinks.fleet``) over every verdict it archives, seeded at start from
the verdicts the archive already holds, for its ``/metrics`` (``ccld_host_suspect_score``): a service of
``ccld up`` whether or not alerts are configured.

The sink keeps its archive compact on a timer (``sinks.upkeep``, beside the consume loop): files of flushes
below the offsets it has committed are merged, and whole days past the retention removed.

An archive folder that cannot be written (full, read-only) is said once ("archive not
writable: <path>: <reason>"); the files wait in memory, uncommitted, fetching is paused, and
the write is tried again every few seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ccld.errors import SchemaError
from ccld.reachability import broker_reachable
from ccld.schemas.codec import decode_metrics, decode_verdict
from ccld.security import kafka_config
from ccld.settings import Settings
from ccld.sinks.fleet import HostStanding, HostTracker, fleet_settings
from ccld.sinks.incarnation import SinkTokens, TopicIds
from ccld.sinks.layout import write_offsets
from ccld.sinks.parquet import metrics_table, verdicts_table
from ccld.sinks.upkeep import Upkeep

log = logging.getLogger(__name__)


#: How long a topic id lookup may take (it runs in the consume loop; a dead broker must not hold it up long).
ID_TIMEOUT_S = 2.0

#: How often a sink whose archive folder cannot be written (full, read-only, ...) tries again.
RETRY_WRITE_S = 5.0


@dataclass
class _Buffer:
    start_offset: int
    first_seen: float
    incarnation: str | None  # the folder of the topic incarnation its messages came from; None: not known yet
    items: list[tuple[int, int, Any]] = field(default_factory=list)
    rows: int = 0


class Archiver:
    """The Parquet sink of one process; ``run`` until ``stop`` is set."""

    def __init__(self, settings: Settings, root: Path | None = None, *, group: str | None = None) -> None:
        self.settings = settings
        self.root = Path(root or settings.archive_dir)
        self.group = group or settings.sink_group
        self.topics = [settings.metrics_topic, settings.verdicts_topic]
        self.counters = {"messages": 0, "rows": 0, "files": 0, "undecodable": 0, "bad_value": 0, "commit_errors": 0,
                         "offset_resets": 0, "write_failures": 0}
        self._buffers: dict[tuple[str, int], _Buffer] = {}
        self._ids = TopicIds(kafka_config(settings))
        self._tokens = SinkTokens(self.root)
        self._topic_ids: dict[str, str] = {}  # topic -> incarnation label, asked once per assignment
        self._incarnation: dict[tuple[str, int], str | None] = {}  # partition -> its messages' incarnation now
        self._last: dict[tuple[str, int], int] = {}  # partition -> last offset taken since it was assigned
        self._unwritable: str | None = None  # what was said when the archive folder could not be written
        self._blocked_until: float | None = None  # a file could not be written: fetching paused, retry then
        # the partitions whose files could not be written: only they pause, so a folder that cannot be
        # written (one topic's) does not hold back the others' files
        self._blocked_parts: set[tuple[str, int]] = set()
        self._unreachable_said = False
        self.on_file: Callable[[Path, int], None] | None = None
        # (topic, partition, incarnation) -> the offset last committed there (what the upkeep may merge below)
        self.committed: dict[tuple[str, int, str], int] = {}
        self.upkeep = Upkeep(settings, self.root, self.counters)
        self.fleet = HostTracker(fleet_settings(settings))
        self.hosts: list[HostStanding] = []  # the fleet's standings as last computed (read by /metrics)
        self._hosts_at = 0.0
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

    def _seed_fleet(self) -> None:
        """The verdicts the archive holds within the fleet's window: the view survives a restart of the sink."""
        from ccld.sinks.report_model import archived_verdicts

        since = time.time() - self.fleet.settings.window_s
        try:
            held = archived_verdicts(self.root, self.settings.verdicts_topic) if self.root.is_dir() else []
            self.fleet.observe_all(v for v in held if v.detected_time >= since)
        except Exception as exc:  # noqa: BLE001 - an unreadable old file costs the view its history, never the sink
            log.warning("the fleet view starts empty: the archive's verdicts could not be read: %s: %s",
                        type(exc).__name__, exc)

    def _update_hosts(self) -> None:
        now = time.time()
        if now - self._hosts_at >= 5.0:
            self._hosts_at = now
            self.hosts = self.fleet.current(now)

    def run(self, stop: threading.Event) -> None:
        self._seed_fleet()
        consumer = self._consumer()
        consumer.subscribe(self.topics, on_assign=self._on_assign,
                           on_revoke=lambda c, parts: self._flush_all(c, force=True))
        heartbeat = self.root / ".sink-heartbeat"
        beat = 0.0
        try:
            while not stop.is_set():
                if time.monotonic() - beat >= 5.0:  # liveness for the compose healthcheck
                    beat = time.monotonic()
                    try:
                        self.root.mkdir(parents=True, exist_ok=True)
                        heartbeat.touch()
                    except OSError as exc:  # said once; files that cannot be written pause the fetching
                        self._cannot_write(exc)
                if self._blocked_parts:
                    # Nothing more is fetched for a partition whose buffered file cannot be written: memory
                    # stays bounded, and what is fetched later resumes right after it. (Paused again after a
                    # rebalance.)
                    consumer.pause([tp for tp in consumer.assignment()
                                    if (tp.topic, tp.partition) in self._blocked_parts])
                msgs = consumer.consume(num_messages=500, timeout=0.2)
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            log.warning("consume error: %s", err)
                        continue
                    self._take(consumer, str(msg.topic()), msg.partition() or 0, msg.offset() or 0,
                               msg.timestamp()[1], msg.value())
                self._flush_all(consumer, force=False)
                self.upkeep.maybe_start(self.committed)
                self._update_hosts()
            self._flush_all(consumer, force=True)
        finally:
            consumer.close()
            self.upkeep.stop()

    def uncommitted(self) -> tuple[int, float]:
        """Messages taken but not committed yet (buffered for a file), and how long the oldest has waited (s).

        Read from the metrics server's thread: ``list()`` of a dict's values runs without releasing the GIL,
        so it is one consistent copy even while the consume loop adds and removes buffers."""
        bufs = list(self._buffers.values())
        if not bufs:
            return 0, 0.0
        return sum(len(b.items) for b in bufs), max(time.monotonic() - min(b.first_seen for b in bufs), 0.0)

    @property
    def blocked(self) -> bool:
        """Whether files wait because the archive folder could not be written (fetching is paused)."""
        return self._blocked_until is not None

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # An assignment starts each partition at its committed offset: going back to it is no reset, and
        # the incarnation is asked again (the assignment may come from a broker that was restarted).
        self._topic_ids.clear()
        for tp in partitions:
            self._last.pop((tp.topic, tp.partition), None)
            self._incarnation.pop((tp.topic, tp.partition), None)
        self.assigned.set()

    def _take(self, consumer: Consumer, topic: str, partition: int, offset: int, ts_ms: int,
              value: bytes | None) -> None:
        """One fetched message: notice a recreated topic, label the partition's incarnation, buffer the message."""
        key = (topic, partition)
        last = self._last.get(key)
        if last is not None and offset <= last:
            # Back to an offset already taken, with no rebalance in between: the topic under us was recreated
            # (a memory broker restarted, or someone deleted it) and numbers its messages anew. What is
            # buffered came from the old incarnation: written under its label, and not committed, since the
            # group we would commit to may now belong to the new one.
            self.counters["offset_resets"] += 1
            old = self._incarnation.pop(key, None)
            buf = self._buffers.pop(key, None)
            if buf is not None and buf.incarnation is not None:
                self._flush(consumer, key, buf, commit=False)
            elif buf is not None:  # the broker never answered for them; the old incarnation is gone with it
                log.warning("dropping %d messages of %s[%d] from offset %d: their topic incarnation is unknown",
                            len(buf.items), topic, partition, buf.start_offset)
            self._topic_ids.pop(topic, None)
            new = self._incarnation[key] = self._resolve(topic, partition, offset, ts_ms)
            if new != old:
                log.warning("%s[%d] went back from offset %d to %d: the topic was recreated; its messages now go to "
                            "%s, the old incarnation's stay in %s", topic, partition, last, offset, new, old)
            else:  # the same incarnation read again (a reset of the consumer's position): files are rewritten
                log.warning("%s[%d] went back from offset %d to %d in the same incarnation (%s)", topic, partition,
                            last, offset, new)
        self._last[key] = offset
        if key not in self._incarnation:  # the first message since the assignment; None is retried at the flush
            self._incarnation[key] = self._resolve(topic, partition, offset, ts_ms)
        self._add(topic, partition, offset, ts_ms, value)

    def _resolve(self, topic: str, partition: int, offset: int, ts_ms: int) -> str | None:
        """The label of the incarnation ``topic`` has now; None when the broker does not answer."""
        if topic not in self._topic_ids:
            self._topic_ids.update(self._ids.labels([topic], ID_TIMEOUT_S))
        label = self._topic_ids.get(topic)
        if label is None:
            return None
        return label or self._tokens.label(topic, partition, offset, ts_ms)  # "": a broker without topic ids

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
        if item is not None and topic == self.settings.verdicts_topic:
            self.fleet.observe(item)  # repeats and replays too: the tracker keeps one entry per incident
        buf = self._buffers.get((topic, partition))
        if buf is None:
            buf = self._buffers[(topic, partition)] = _Buffer(start_offset=offset, first_seen=time.monotonic(),
                                                              incarnation=self._incarnation.get((topic, partition)))
        # An undecodable message still belongs to the file's offset range, so it is committed with it.
        buf.items.append((offset, ts_ms, item))
        buf.rows += 0 if item is None else getattr(item, "n", 1)

    def _flush_all(self, consumer: Consumer, *, force: bool) -> None:
        now = time.monotonic()
        # a file that could not be written a moment ago waits for its retry; the other partitions' go on
        waiting = self._blocked_until is not None and now < self._blocked_until and not force
        full, age = self.settings.sink_max_rows, self.settings.sink_max_age_s
        due = [key for key, buf in self._buffers.items()
               if not (waiting and key in self._blocked_parts)
               and (force or key in self._blocked_parts or buf.rows >= full or now - buf.first_seen >= age)]
        if not due:
            if self._blocked_until is not None and not self._blocked_parts & self._buffers.keys():
                self._unblock(consumer)  # what could not be written was dropped (revoked): fetch again
            return
        topics = sorted({topic for topic, _ in due})
        # With no broker listening, a commit waits about 7 s to fail (and a stop with it): the files are
        # written all the same, uncommitted, and a replay rewrites them under the same names. Probed first
        # only when stopping; while running, only when the broker did not answer the question below.
        reachable = not force or self._reachable()
        # The incarnations now, asked once for every file of this round: a file whose messages came from
        # another incarnation than the topic has now must not commit its offsets to the new one's group.
        current = self._ids.labels(topics, ID_TIMEOUT_S) if reachable else {}
        if reachable and not force and len(current) < len(topics):
            reachable = self._reachable()
        failed = False
        for key in due:
            buf = self._buffers[key]
            topic, partition = key
            if buf.incarnation is None and reachable:  # the broker did not answer when the first message came
                buf.incarnation = self._incarnation[key] = self._resolve(topic, partition, buf.start_offset,
                                                                         buf.items[0][1])
            if buf.incarnation is None:
                if force:  # not committed: read again by the next owner of the partition
                    log.warning("dropping %d buffered messages of %s[%d] from offset %d: the broker never said "
                                "which incarnation of the topic they belong to", len(buf.items), topic, partition,
                                buf.start_offset)
                    del self._buffers[key]
                continue
            now_id = current.get(topic) or ""
            recreated = now_id.startswith("id-") and now_id != buf.incarnation
            if recreated:
                log.warning("%s was recreated (now %s) while %d messages of %s[%d] from offset %d waited; they are "
                            "archived under %s, not committed", topic, now_id, len(buf.items), topic, partition,
                            buf.start_offset, buf.incarnation)
            try:
                self._flush(consumer, key, buf, commit=reachable and not recreated)
            except OSError as exc:
                self.counters["write_failures"] += 1
                self._cannot_write(exc)
                failed = True
                if force:  # stopping or revoked: not committed, so read again by the next owner
                    del self._buffers[key]
                else:  # stays buffered, uncommitted; tried again in a while
                    self._blocked_parts.add(key)
                continue
            del self._buffers[key]
            self._blocked_parts.discard(key)
        if failed:
            self._blocked_until = time.monotonic() + RETRY_WRITE_S
            return
        if self._blocked_parts & self._buffers.keys():
            return  # written what was due; a blocked partition's file waits for its retry
        if self._blocked_until is not None:
            self._unblock(consumer)
        if self._unwritable is not None:
            log.warning("archive writable again: %s", self.root.resolve())
            self._unwritable = None

    def _unblock(self, consumer: Consumer) -> None:
        self._blocked_until = None
        self._blocked_parts.clear()
        consumer.resume(consumer.assignment())

    def _reachable(self) -> bool:
        """Whether the broker accepts connections; said once when it does not."""
        if broker_reachable(self.settings.bootstrap):
            self._unreachable_said = False
            return True
        if not self._unreachable_said:
            self._unreachable_said = True
            log.warning("the broker at %s does not answer: files are written, offsets not committed until it is "
                        "back", self.settings.bootstrap)
        return False

    def _cannot_write(self, exc: OSError) -> None:
        """Say once per outage that the archive folder cannot be written, and why."""
        if self._unwritable is None:
            self._unwritable = f"archive not writable: {exc.filename or self.root}: {exc.strerror or exc}"
            log.error("%s (offsets stay uncommitted; trying again every %.0f s)", self._unwritable, RETRY_WRITE_S)

    def _flush(self, consumer: Consumer, key: tuple[str, int], buf: _Buffer, *, commit: bool = True) -> None:
        topic, partition = key
        good = [(o, t, x) for o, t, x in buf.items if x is not None]
        last = buf.items[-1][0]
        if good:
            if buf.incarnation is None:
                raise RuntimeError(f"no incarnation for {topic}[{partition}]")  # _flush_all resolved it first
            table = metrics_table(good) if topic == self.settings.metrics_topic else verdicts_table(good)
            paths = write_offsets(self.root, topic, partition, buf.incarnation, buf.start_offset, last, table)
            self.counters["files"] += len(paths)
            self.counters["rows"] += table.num_rows
            log.info("archived %d rows of %s[%d] to %s", table.num_rows, topic, partition,
                     paths[0] if len(paths) == 1 else f"{len(paths)} files ({paths[0].name})")
            if self.on_file is not None:
                for path in paths:
                    self.on_file(path, pq.ParquetFile(path).metadata.num_rows)
        if not commit:
            return
        try:
            consumer.commit(offsets=[TopicPartition(topic, partition, last + 1)], asynchronous=False)
        except KafkaException as exc:  # the file is complete; a replay rewrites it under the same name
            self.counters["commit_errors"] += 1
            log.warning("commit of %s[%d]@%d failed: %s", topic, partition, last + 1, exc)
            return
        if buf.incarnation is not None:
            self.committed[(topic, partition, buf.incarnation)] = last + 1
