"""A worker's state per input topic: processors by partition, their snapshots, and the events each snapshot covers.

``WorkerState`` is what the worker (``app.WorkerApp``) keeps for the metrics topic and, in shard
mode, for the reports topic: it restores a partition's processor from its changelog snapshot, writes
snapshots, and acks consumed events only once a snapshot that covers them is on the broker. A snapshot
whose bytes are those the broker last acknowledged for the partition is not written again: an idle
partition (no message, no verdict, no incident changing) adds nothing to the changelog.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from ccld.settings import Settings
from ccld.streams.processor import PartitionProcessor
from ccld.streams.stage_processor import StageProcessor

log = logging.getLogger(__name__)

#: Write a partition's snapshot at most this often (seconds of wall time; more often than offsets are
#: committed), before and after every verdict send, and at shutdown.
SNAPSHOT_EVERY_S = 1.0
#: ... and sooner, this long after the last one, when the agent has no more messages waiting: records
#: arrive in bursts (every producer flushes once a second), and an event is committed only once a
#: snapshot covers it, so a snapshot at the end of each burst takes a second off the committed lag.
SNAPSHOT_IDLE_S = 0.2


P = TypeVar("P", PartitionProcessor, StageProcessor)


class WorkerState(Generic[P]):
    """One topic's processors by partition, plus what to snapshot when and which consumed events it covers."""

    def __init__(self, settings: Settings, table: Any, topic: str, restore: Callable[[int, bytes | None], P]) -> None:
        self.settings = settings
        self.table = table
        self.topic = topic
        # a partition's processor from its snapshot (None: a new one)
        self._restore: Callable[[int, bytes | None], P] = restore
        self.processors: dict[int, P] = {}
        self.last_snapshot: dict[int, float] = {}
        # One sender per partition at a time: the agent and the timer both flush pending verdicts.
        self.locks: dict[int, asyncio.Lock] = {}
        # Consumed events not yet acknowledged to Faust, by partition: an event is acked (its offset
        # may be committed) only once a snapshot that includes it is on the broker, so a worker killed
        # at any moment resumes from a snapshot at least as new as its committed offsets.
        self.held: dict[int, list[Any]] = {}
        self.ack: Callable[[Any], Awaitable[Any]] | None = None
        self.wake = asyncio.Event()  # set when verdicts are pending: the courier sends them at once
        # The metrics topic's identity (its topic id). A broker that lost its log (an in-memory broker
        # restarted) brings the topic back under a new id with offsets from 0 again, while the consumer
        # goes on from its old position: the offsets below it are read once more (``backfill``).
        self.topic_id: str | None = None
        self.checkpoint_locks: dict[int, asyncio.Lock] = {}
        # the digest of the partition's last snapshot the broker acknowledged, and how many snapshots since
        # were not written because they were that one again (a restored one is written once more: the table
        # may hold a snapshot queued at a revocation that never reached the broker)
        self.written: dict[int, bytes] = {}
        self.unchanged: dict[int, int] = {}
        # snapshots not written for being larger than worker_snapshot_max_bytes, by partition, and the
        # partitions whose last one was (said once, until one fits again)
        self.too_large: dict[int, int] = {}
        self._too_large_now: set[int] = set()

    def _fits(self, partition: int, value: bytes) -> bool:
        """Whether the snapshot fits in one changelog message. One that does not is not written: the broker
        would refuse it, and the verdicts queued behind it would wait for ever. Its events stay unacknowledged
        (their offsets uncommitted), so a restart re-reads them from the last snapshot that was written."""
        limit = self.settings.worker_snapshot_max_bytes
        if len(value) <= limit:
            if partition in self._too_large_now:
                self._too_large_now.discard(partition)
                log.warning("%s partition %d: the state snapshot fits again (%d bytes)", self.topic, partition,
                            len(value))
            return True
        self.too_large[partition] = self.too_large.get(partition, 0) + 1
        if partition not in self._too_large_now:
            log.error("%s partition %d: the state snapshot is %d bytes, over worker_snapshot_max_bytes (%d): not "
                      "written, so its offsets stay uncommitted and a restart re-reads from the last snapshot "
                      "written; verdicts still go out. Spread the jobs over more partitions "
                      "(CCLD_METRICS_PARTITIONS) or raise the limit with the broker's message.max.bytes",
                      self.topic, partition, len(value), limit)
        self._too_large_now.add(partition)
        return False

    def _same(self, partition: int, value: bytes) -> bool:
        """Whether ``value`` is the partition's snapshot already on the broker; counts it when it is."""
        if self.written.get(partition) != _digest(value):
            return False
        self.unchanged[partition] = self.unchanged.get(partition, 0) + 1
        return True

    def processor(self, partition: int) -> P:
        """The partition's processor, restored from its snapshot the first time it is asked for."""
        proc = self.processors.get(partition)
        if proc is None:
            raw = self.table.data.get(self.key(partition)) if self.table is not None else None
            proc = self._restore(partition, raw)
            if raw:
                log.info("%s partition %d: resumed from a %d-byte snapshot (%d verdicts pending)", self.topic,
                         partition, len(raw), len(proc.pending()))
            self.processors[partition] = proc
            self.last_snapshot[partition] = time.monotonic()
        return proc

    def lock(self, partition: int) -> asyncio.Lock:
        return self.locks.setdefault(partition, asyncio.Lock())

    def key(self, partition: int) -> bytes:
        return f"{self.topic}:{partition}".encode()

    def _due(self, partition: int, force: bool, idle: bool = False) -> P | None:
        proc = self.processors.get(partition)
        every = SNAPSHOT_IDLE_S if idle else SNAPSHOT_EVERY_S
        if self.table is None or proc is None or (
                not force and time.monotonic() - self.last_snapshot.get(partition, 0.0) < every):
            return None
        return proc

    def maybe_snapshot(self, partition: int, force: bool) -> None:
        """Queue the partition's snapshot on its changelog without waiting (shutdown, revocation)."""
        proc = self._due(partition, force)
        if proc is not None:
            key, value = self.key(partition), proc.snapshot()
            self.last_snapshot[partition] = time.monotonic()
            if self._same(partition, value) or not self._fits(partition, value):
                return
            self.written.pop(partition, None)  # queued, not acknowledged: the next one is written again
            self.table.data[key] = value
            self.table.send_changelog(partition, key, value)

    async def checkpoint(self, partition: int, force: bool, idle: bool = False) -> None:
        """Snapshot when due (or ``force``), wait for the broker's ack, then ack the events it covers.

        ``idle``: no more messages are waiting, so the snapshot is due sooner (``SNAPSHOT_IDLE_S``).
        """
        async with self.checkpoint_locks.setdefault(partition, asyncio.Lock()):
            await self._checkpoint(partition, force, idle)

    async def _checkpoint(self, partition: int, force: bool, idle: bool = False) -> None:
        proc = self._due(partition, force, idle)
        if proc is None:
            return
        key, value, upto = self.key(partition), proc.snapshot(), proc.next_offset
        covered = [e for e in self.held.get(partition, ()) if e.message.offset < upto]
        self.last_snapshot[partition] = time.monotonic()
        if not self._same(partition, value):
            if not self._fits(partition, value):
                return  # nothing acknowledged: the events stay held, their offsets uncommitted
            await self._write(partition, key, value)
        # the events it covers are on the broker now (or were, in the same snapshot before)
        done = {id(e) for e in covered}
        self.held[partition] = [e for e in self.held.get(partition, ()) if id(e) not in done]
        if self.ack is not None:
            for e in covered:
                await self.ack(e)

    async def _write(self, partition: int, key: bytes, value: bytes) -> None:
        self.table.data[key] = value
        # Written straight to the partition's changelog (the timer, outside any event, saves too) and sent
        # now rather than through Faust's buffer, so that awaiting the future waits for the broker's ack.
        fut = await self.table.changelog_topic.send(key=key, value=value, partition=partition,
                                                    key_serializer="raw", value_serializer="raw", force=True)
        await fut  # raises if the broker refused it: then nothing is acked and a later snapshot retries
        self.written[partition] = _digest(value)

    def owns(self, partition: int, proc: P) -> bool:
        """Whether ``proc`` is still this worker's processor of ``partition`` (not revoked meanwhile)."""
        return self.processors.get(partition) is proc

    def drop(self, partition: int) -> None:
        """The partition went to another worker: its unacknowledged events will be re-delivered there."""
        self.processors.pop(partition, None)
        self.held.pop(partition, None)
        self.written.pop(partition, None)  # the other worker writes its snapshots from now on


def _digest(value: bytes) -> bytes:
    return hashlib.blake2b(value, digest_size=16).digest()
