"""A worker's state per input topic: processors by partition, their snapshots, and the events each snapshot covers.

``WorkerState`` is what the worker (``app.WorkerApp``) keeps for the metrics topic and, in shard
mode, for the reports topic: it restores a partition's processor from its changelog snapshot, writes
snapshots, and acks consumed events only once a snapshot that covers them is on the broker.

A partition's snapshot is several changelog messages: its head under ``<topic>:<partition>`` and one
part per job under ``<topic>:<partition>/<job>`` (``PartitionProcessor.snapshot_parts``). Only the parts
whose bytes differ from those the broker last acknowledged are written, the head last; a job the
processor forgot gets a tombstone, so a compacted changelog keeps one message per live job. An idle
partition adds nothing, a quiet job adds nothing while its neighbours are busy, and no message grows with
the number of jobs a partition holds.
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
#: What a processor is restored with: its partition, its head (None: none stored) and its jobs' parts.
Restore = Callable[[int, "bytes | None", dict[str, bytes]], P]


class WorkerState(Generic[P]):
    """One topic's processors by partition, plus what to snapshot when and which consumed events it covers."""

    def __init__(self, settings: Settings, table: Any, topic: str, restore: Restore[P]) -> None:
        self.settings = settings
        self.table = table
        self.topic = topic
        # a partition's processor from its snapshot (None and no parts: a new one)
        self._restore: Restore[P] = restore
        # the job parts each partition has on the changelog (written or restored): a job missing from the
        # next snapshot gets a tombstone
        self.part_keys: dict[int, set[bytes]] = {}
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
        # the digest of each changelog key's last message the broker acknowledged, and by partition how many
        # snapshots since were not written because every part was that one again (a restored one is written
        # once more: the table may hold a snapshot queued at a revocation that never reached the broker)
        self.written: dict[bytes, bytes] = {}
        self.unchanged: dict[int, int] = {}
        # snapshots not written for being larger than worker_snapshot_max_bytes, by partition, and the
        # partitions whose last one was (said once, until one fits again)
        self.too_large: dict[int, int] = {}
        self._too_large_now: set[int] = set()

    def _fits(self, partition: int, changes: list[tuple[bytes, bytes | None]]) -> bool:
        """Whether every message of the snapshot fits in one changelog message. A snapshot with one that does
        not is not written at all: the broker would refuse it, and the verdicts queued behind it would wait for
        ever. Its events stay unacknowledged (their offsets uncommitted), so a restart re-reads them from the
        last snapshot that was written."""
        limit = self.settings.worker_snapshot_max_bytes
        key, value = max(changes, key=lambda kv: len(kv[1] or b""))
        size = len(value or b"")
        if size <= limit:
            if partition in self._too_large_now:
                self._too_large_now.discard(partition)
                log.warning("%s partition %d: the state snapshot fits again (largest part %d bytes)", self.topic,
                            partition, size)
            return True
        self.too_large[partition] = self.too_large.get(partition, 0) + 1
        if partition not in self._too_large_now:
            log.error("%s partition %d: the state snapshot's part %s is %d bytes, over worker_snapshot_max_bytes "
                      "(%d): not written, so its offsets stay uncommitted and a restart re-reads from the last "
                      "snapshot written; verdicts still go out. A part is one job's state: raise the limit with "
                      "the broker's message.max.bytes", self.topic, partition, key.decode(errors="replace"), size,
                      limit)
        self._too_large_now.add(partition)
        return False

    def _changes(self, partition: int, proc: P) -> list[tuple[bytes, bytes | None]]:
        """The changelog messages the partition's snapshot needs now: the parts that differ from what the broker
        has, tombstones (None) for the jobs the processor forgot, the head last. Empty: counted as unchanged."""
        head, parts = self.key(partition), proc.snapshot_parts()
        out: list[tuple[bytes, bytes | None]] = []
        keys = {self.part_key(partition, name): value for name, value in parts.items() if name}
        for key in sorted(self.part_keys.get(partition, set()) - keys.keys()):
            out.append((key, None))
        out += [(key, value) for key, value in keys.items() if self.written.get(key) != _digest(value)]
        if out or self.written.get(head) != _digest(parts[""]):
            out.append((head, parts[""]))
        if not out:
            self.unchanged[partition] = self.unchanged.get(partition, 0) + 1
        return out

    def _stored(self, partition: int) -> tuple[bytes | None, dict[str, bytes]]:
        """The partition's head and job parts in the table (recovered from the changelog)."""
        if self.table is None:
            return None, {}
        prefix = self.key(partition) + b"/"
        parts = {bytes(k[len(prefix):]).decode(errors="replace"): v for k, v in list(self.table.data.items())
                 if isinstance(k, bytes) and k.startswith(prefix) and v}
        return self.table.data.get(self.key(partition)), parts

    def processor(self, partition: int) -> P:
        """The partition's processor, restored from its snapshot the first time it is asked for."""
        proc = self.processors.get(partition)
        if proc is None:
            raw, parts = self._stored(partition)
            proc = self._restore(partition, raw, parts)
            self.part_keys[partition] = {self.part_key(partition, name) for name in parts}
            if raw or parts:
                size = len(raw or b"") + sum(len(v) for v in parts.values())
                log.info("%s partition %d: resumed from a %d-byte snapshot in %d messages (%d verdicts pending)",
                         self.topic, partition, size, 1 + len(parts), len(proc.pending()))
            self.processors[partition] = proc
            self.last_snapshot[partition] = time.monotonic()
        return proc

    def lock(self, partition: int) -> asyncio.Lock:
        return self.locks.setdefault(partition, asyncio.Lock())

    def key(self, partition: int) -> bytes:
        """The changelog key of the partition's snapshot head."""
        return f"{self.topic}:{partition}".encode()

    def part_key(self, partition: int, job: str) -> bytes:
        """The changelog key of one job's part of the partition's snapshot."""
        return self.key(partition) + b"/" + job.encode()

    def snapshot_bytes(self, partition: int) -> int:
        """The size of the partition's snapshot as the table holds it: head and job parts."""
        if self.table is None:
            return 0
        keys = [self.key(partition), *self.part_keys.get(partition, ())]
        return sum(len(self.table.data.get(k) or b"") for k in keys)

    def _stage(self, partition: int, changes: list[tuple[bytes, bytes | None]]) -> None:
        """Apply the changes to the table (what a restart in this process would read) and the part keys."""
        keys = self.part_keys.setdefault(partition, set())
        for key, value in changes:
            if value is None:
                self.table.data.pop(key, None)
                keys.discard(key)
            else:
                self.table.data[key] = value
                if key != self.key(partition):
                    keys.add(key)

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
            changes = self._changes(partition, proc)
            self.last_snapshot[partition] = time.monotonic()
            if not changes or not self._fits(partition, changes):
                return
            self._stage(partition, changes)
            for key, value in changes:
                self.written.pop(key, None)  # queued, not acknowledged: the next one is written again
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
        changes, upto = self._changes(partition, proc), proc.next_offset
        covered = [e for e in self.held.get(partition, ()) if e.message.offset < upto]
        self.last_snapshot[partition] = time.monotonic()
        if changes:
            if not self._fits(partition, changes):
                return  # nothing acknowledged: the events stay held, their offsets uncommitted
            await self._write(partition, changes)
        # the events it covers are on the broker now (or were, in the same snapshot before)
        done = {id(e) for e in covered}
        self.held[partition] = [e for e in self.held.get(partition, ()) if id(e) not in done]
        if self.ack is not None:
            for e in covered:
                await self.ack(e)

    async def _write(self, partition: int, changes: list[tuple[bytes, bytes | None]]) -> None:
        self._stage(partition, changes)
        # Written straight to the partition's changelog (the timer, outside any event, saves too) and sent
        # now rather than through Faust's buffer, so that awaiting the futures waits for the broker's acks.
        # All go to one partition, in order: the head, last, is on the broker only after every part before it.
        futs = [await self.table.changelog_topic.send(key=key, value=value, partition=partition,
                                                      key_serializer="raw", value_serializer="raw", force=True)
                for key, value in changes]
        for (key, value), fut in zip(changes, futs, strict=True):
            await fut  # raises if the broker refused it: then nothing is acked and a later snapshot retries
            if value is None:
                self.written.pop(key, None)
            else:
                self.written[key] = _digest(value)

    def owns(self, partition: int, proc: P) -> bool:
        """Whether ``proc`` is still this worker's processor of ``partition`` (not revoked meanwhile)."""
        return self.processors.get(partition) is proc

    def drop(self, partition: int) -> None:
        """The partition went to another worker: its unacknowledged events will be re-delivered there."""
        self.processors.pop(partition, None)
        self.held.pop(partition, None)
        # the other worker writes its snapshots from now on
        for key in [self.key(partition), *self.part_keys.pop(partition, ())]:
            self.written.pop(key, None)


def _digest(value: bytes) -> bytes:
    return hashlib.blake2b(value, digest_size=16).digest()
