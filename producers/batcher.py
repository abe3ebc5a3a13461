"""Bounded batching of kernel records, one batch per job incarnation and flush (pure: no threads, no I/O).

The queue is bounded so a stalled broker can never grow a training process's memory. When
it is full, the oldest PROGRESS samples go first (the next sample says the same thing);
ENTERED and DONE records are what hang localization needs, so they are kept as long as a
hard cap of twice the bound allows, and every drop is counted.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ccld.records import KernelBatch, KernelRecord, Status

_Key = tuple[str, int]  # job, incarnation


@dataclass
class BatcherStats:
    """Counters a producer reports (and tests read)."""

    accepted: int = 0
    dropped_progress: int = 0
    dropped_critical: int = 0
    batches: int = 0


class LostRecords:
    """ENTERED/DONE/IDLE records lost per (job, incarnation) since the job's last batch, and their
    ranks: the job's next batch says so (``KernelBatch.lost_records``/``lost_ranks``), so that the
    analyzer does not take their absence for a rank's silence. Bounded: jobs that never send again
    are forgotten, oldest first."""

    def __init__(self, jobs_max: int = 64) -> None:
        self.jobs_max = jobs_max
        self._held: dict[_Key, tuple[int, set[int]]] = {}

    def note(self, key: _Key, ranks: Iterable[int], records: int) -> None:
        n, held = self._held.get(key, (0, set()))
        held.update(ranks)
        self._held[key] = (n + records, held)
        if len(self._held) > self.jobs_max:
            del self._held[next(iter(self._held))]

    def note_batch(self, batch: KernelBatch) -> None:
        """Every ENTERED/DONE/IDLE row of ``batch`` was lost (a PROGRESS sample's loss says nothing)."""
        critical = batch.columns["status"] != int(Status.PROGRESS)
        self.note((batch.job, batch.incarnation), batch.columns["rank"][critical].tolist(), int(critical.sum()))

    def stamp(self, key: _Key, batch: KernelBatch) -> KernelBatch:
        """``batch`` saying what its job lost (added to what it says already); forgotten here."""
        lost = self._held.pop(key, None)
        if lost is None:
            return batch
        return dataclasses.replace(batch, lost_records=batch.lost_records + lost[0],
                                   lost_ranks=tuple(sorted(lost[1].union(batch.lost_ranks))))


@dataclass
class _Pending:
    records: deque[tuple[int, KernelRecord]] = field(default_factory=deque)  # (arrival id, record)
    first_arrival_s: float = 0.0


class RecordBatcher:
    """Collects records per (job, incarnation) and cuts KernelBatches.

    One batch holds every communicator's records of a flush: the worker's cost is per message, and
    a rank is in several communicators (tensor, pipeline and data parallel groups at least).
    """

    def __init__(self, *, producer_id: str, batch_max: int, queue_max: int, linger_s: float) -> None:
        self.producer_id = producer_id
        self.batch_max = batch_max
        self.queue_max = queue_max
        self.linger_s = linger_s
        self.stats = BatcherStats()
        self._pending: OrderedDict[_Key, _Pending] = OrderedDict()
        self._progress: deque[tuple[int, _Key]] = deque()  # arrival ids of queued PROGRESS samples
        self._live_progress: set[int] = set()  # ids of PROGRESS samples still queued
        self._dropped_ids: set[int] = set()  # queued ids evicted, skipped when their batch is cut
        self._size = 0
        self._ids = itertools.count()
        self._seq = itertools.count()
        self.lost = LostRecords()  # ENTERED/DONE/IDLE records lost, said with the job's next batch

    def __len__(self) -> int:
        return self._size

    def add(self, record: KernelRecord, now_s: float) -> bool:
        """Queue one record; returns False when it (or an older sample for it) was dropped."""
        if self._size >= self.queue_max and not self._drop_oldest_progress():
            if record.status is Status.PROGRESS or self._size >= 2 * self.queue_max:
                self._count_drop(record.status)
                if record.status is not Status.PROGRESS:
                    self.lost.note((record.job, record.incarnation), (record.rank,), 1)
                return False
        key = (record.job, record.incarnation)
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending(first_arrival_s=now_s)
        rid = next(self._ids)
        pending.records.append((rid, record))
        if record.status is Status.PROGRESS:
            self._progress.append((rid, key))
            self._live_progress.add(rid)
        self._size += 1
        self.stats.accepted += 1
        return True

    def _count_drop(self, status: Status) -> None:
        if status is Status.PROGRESS:
            self.stats.dropped_progress += 1
        else:
            self.stats.dropped_critical += 1

    def _drop_oldest_progress(self) -> bool:
        # Lazy deletion: mark the id; batches skip marked records when they are cut.
        while self._progress:
            rid, _key = self._progress.popleft()
            if rid in self._live_progress:
                self._live_progress.discard(rid)
                self._dropped_ids.add(rid)
                self._size -= 1
                self.stats.dropped_progress += 1
                return True
        return False

    def ready(self, now_s: float, *, force: bool = False) -> list[KernelBatch]:
        """Batches that are full, have lingered long enough, or (force) everything queued."""
        out: list[KernelBatch] = []
        for key in list(self._pending):
            pending = self._pending[key]
            while pending.records and (
                force or len(pending.records) >= self.batch_max or now_s - pending.first_arrival_s >= self.linger_s
            ):
                out.extend(self._cut(pending, key))
                pending.first_arrival_s = now_s
            if not pending.records:
                del self._pending[key]
        if len(self._progress) > 2 * len(self._live_progress) + 1024:
            # Samples already sent stay in the eviction order until skipped; compact it so a job
            # that always has something queued does not grow this deque forever.
            self._progress = deque(x for x in self._progress if x[0] in self._live_progress)
        return out

    def _cut(self, pending: _Pending, key: _Key) -> list[KernelBatch]:
        take: list[KernelRecord] = []
        while pending.records and len(take) < self.batch_max:
            rid, rec = pending.records.popleft()
            if rid in self._dropped_ids:
                self._dropped_ids.discard(rid)
                continue
            self._live_progress.discard(rid)
            take.append(rec)
            self._size -= 1
        if not take:
            return []
        self.stats.batches += 1
        return [self.lost.stamp(key, KernelBatch.from_records(take, producer=self.producer_id,
                                                             batch_seq=next(self._seq)))]

    def next_batch_seq(self) -> int:
        """A sequence number for a batch built elsewhere (the simulator builds its own batches)."""
        return next(self._seq)
