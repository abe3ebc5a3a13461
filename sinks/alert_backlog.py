"""The verdicts `ccld alert` holds until every receiver took them, and the offsets that makes safe to commit.

Each receiver takes the backlog in consumption order on its own (a webhook that is down does not
hold Alertmanager back); an entry leaves the backlog once every receiver took it, and a partition's
offset is committed only up to its first entry some receiver still lacks. Entries with nothing to
send (a duplicate, an undecodable message, a repeat of an ended incident) still hold their offset,
so nothing after a pending verdict is committed before it. No I/O: ``ccld.sinks.alerts`` drives it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ccld.sinks.alert_payloads import Step


@dataclass(eq=False)
class Entry:
    """One consumed message: where it was and what it asks of the receivers (``step`` None: nothing)."""

    partition: int
    offset: int
    step: Step | None
    pending: set[str] = field(default_factory=set)  # receivers that have not taken it yet


class Backlog:
    """Consumed messages not yet committable, bounded by ``max_entries`` (the consumer pauses when full)."""

    def __init__(self, receivers: Sequence[str], max_entries: int) -> None:
        self.receivers = tuple(receivers)
        self.max_entries = max_entries
        self._queues: dict[str, deque[Entry]] = {r: deque() for r in self.receivers}
        self._partitions: dict[int, deque[Entry]] = {}
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def room(self) -> int:
        return max(self.max_entries - self._n, 0)

    def add(self, partition: int, offset: int, step: Step | None) -> Entry:
        entry = Entry(partition, offset, step, set(self.receivers) if step is not None else set())
        self._partitions.setdefault(partition, deque()).append(entry)
        for r in entry.pending:
            self._queues[r].append(entry)
        self._n += 1
        return entry

    def head(self, receiver: str) -> Entry | None:
        """The oldest entry ``receiver`` has not taken."""
        q = self._queues[receiver]
        return q[0] if q else None

    def waiting(self, receiver: str) -> int:
        return len(self._queues[receiver])

    def taken(self, receiver: str, entry: Entry) -> None:
        """``receiver`` took ``entry`` (accepted it, or refused it for good: retrying would not help)."""
        q = self._queues[receiver]
        if not q or q[0] is not entry:
            raise ValueError(f"{receiver} can only take its oldest entry")
        q.popleft()
        entry.pending.discard(receiver)

    def committable(self) -> dict[int, int]:
        """Partition -> offset to commit (the next to read), for partitions that moved; those entries are forgotten."""
        out: dict[int, int] = {}
        for partition, q in self._partitions.items():
            while q and not q[0].pending:
                out[partition] = q.popleft().offset + 1
                self._n -= 1
        return out

    def drop(self, partitions: set[int]) -> list[Entry]:
        """Forget the entries of partitions this consumer lost (their new owner re-reads them); returns them."""
        gone: list[Entry] = []
        for p in partitions & set(self._partitions):
            gone += self._partitions.pop(p)
        for r, q in self._queues.items():
            self._queues[r] = deque(e for e in q if e.partition not in partitions)
        self._n -= len(gone)
        return gone
