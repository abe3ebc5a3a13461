"""A table recovery that waits on changelog offsets nothing delivers: re-armed, then checked against the log.

Faust restores the worker's snapshot table from its changelog after every rebalance and ends the recovery
once each active changelog partition has been read up to the high watermark it asked for at the start. It
waits for that as long as it takes, and until then the worker restores no partition and analyses nothing.
CI once saw that wait never end: the broker was killed and restarted empty, the Faust producer's pending
snapshot recreated the changelog, the recovery read a high watermark of 1, sought offset 0, and no message
came in the next 45 s. Tansu's high watermark is known to be wrong (platform notes), and a consumer whose
fetch state did not survive the outage would look the same from outside.

So the worker watches its recovery (``RecoveryWatch.check``, every 2 s from the app's start): once the
recovery has waited ``stuck_s`` with nothing delivered on a partition it still needs, the watch logs the
consumer's fetch state for it and re-arms the consumer the way the recovery armed it (resume the partition and
the flow, seek the offset awaited again). Still nothing ``stuck_s`` later, it reads the partition itself from
that offset (its own consumer, no group; ``recovery.read_partition``). Nothing there: the watermark named
offsets the log does not hold, and the recovery's goal is lowered to what the log holds, so Faust ends it on
its next check (every 5 s). Messages there: they are the consumer's to deliver, so it is logged as an error
and re-armed again. Every step is counted (``counts``, served as ``ccld_worker_recovery_*_total``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: How long a recovery may wait on a partition with nothing delivered before the watch acts (s). Faust's own
#: recovery reads thousands of changelog messages a second: a recovery that moves at all is never stuck.
#: Re-arming costs nothing, and the read that follows is tried again while the broker is away.
STUCK_S = 10.0


@dataclass(frozen=True)
class Awaited:
    """A changelog partition the recovery still waits on: the first offset it needs, and its goal."""

    tp: Any  # Faust's TP (topic, partition)
    offset: int  # the next offset the recovery needs
    goal: int  # the last offset it waits for (Faust's high watermark - 1)


def waiting_on(highwaters: Mapping[Any, int | None], offsets: Mapping[Any, int | None],
               received_at: Mapping[Any, float], started_at: float | None, now: float,
               stuck_s: float) -> list[Awaited]:
    """The partitions a recovery started at ``started_at`` has waited on ``stuck_s`` with nothing delivered.

    ``highwaters`` and ``offsets`` are Faust's (the last offset wanted and the last one read, -1 for none);
    ``received_at`` the monotonic time of each partition's last changelog event."""
    if started_at is None:
        return []
    out = []
    for tp, goal in highwaters.items():
        read = offsets.get(tp)
        if goal is None or read is None or goal <= read:
            continue
        if now - max(received_at.get(tp, started_at), started_at) >= stuck_s:
            out.append(Awaited(tp, read + 1, goal))
    return out


class RecoveryWatch:
    """Watches Faust's table recovery of ``app`` and unsticks it (see the module's docstring).

    ``read(topic, partition, start, upto)`` reads the messages of ``[start, upto)`` by another path (blocking;
    run in a thread) and returns their offsets."""

    def __init__(self, app: Any, read: Callable[[str, int, int, int], list[int]], stuck_s: float = STUCK_S) -> None:
        self.app = app
        self.read = read
        self.stuck_s = stuck_s
        self.counts = {"rearms": 0, "phantom_offsets": 0, "undelivered": 0}
        self._rearmed: dict[Any, tuple[int, float]] = {}  # tp -> (offset awaited, when it was re-armed)

    async def check(self) -> None:
        recovery = getattr(self.app.tables, "recovery", None)
        if recovery is None or not recovery.in_recovery:
            self._rearmed.clear()
            return
        now = time.monotonic()
        stuck = waiting_on(recovery.active_highwaters, recovery.active_offsets,
                           getattr(recovery, "_active_events_received_at", {}),
                           getattr(recovery, "_recovery_started_at", None), now, self.stuck_s)
        for a in stuck:
            at = self._rearmed.get(a.tp)
            if at is None or at[0] != a.offset:
                await self._rearm(a, now, first=True)
            elif now - at[1] >= self.stuck_s:
                await self._verify(recovery, a, now)

    async def _rearm(self, a: Awaited, now: float, *, first: bool) -> None:
        """Log what the consumer knows of the partition, then arm it as the recovery did."""
        consumer = self.app.consumer
        if first:
            log.warning("recovery: no changelog message on %s:%d for %.0f s (waiting on offsets %d to %d); %s; "
                        "seeking it again", a.tp.topic, a.tp.partition, self.stuck_s, a.offset, a.goal,
                        fetch_state(consumer, a.tp))
        self.counts["rearms"] += 1
        self._rearmed[a.tp] = (a.offset, now)
        consumer.resume_partitions([a.tp])
        self.app.flow_control.resume()
        consumer.resume_flow()
        try:
            await consumer.seek(a.tp, a.offset)
        except Exception as exc:  # noqa: BLE001 - a rebalance took the partition: the next recovery is watched anew
            log.warning("recovery: could not seek %s:%d to offset %d: %s", a.tp.topic, a.tp.partition, a.offset, exc)

    async def _verify(self, recovery: Any, a: Awaited, now: float) -> None:
        """Read the awaited offsets by another path: none there lowers the recovery's goal, some re-arm."""
        try:
            found = await asyncio.to_thread(self.read, a.tp.topic, a.tp.partition, a.offset, a.goal + 1)
        except Exception as exc:  # noqa: BLE001 - the broker is away: asked again next time
            log.warning("recovery: could not read %s:%d to check its watermark: %s", a.tp.topic, a.tp.partition, exc)
            self._rearmed[a.tp] = (a.offset, now)
            return
        if recovery.active_offsets.get(a.tp, -1) + 1 != a.offset:  # it moved while we read: not stuck
            return
        if not found:
            self.counts["phantom_offsets"] += a.goal - a.offset + 1
            log.warning("recovery: %s:%d holds no message at offsets %d to %d, which its high watermark "
                        "named: recovered up to offset %d", a.tp.topic, a.tp.partition, a.offset, a.goal,
                        a.offset - 1)
            recovery.active_highwaters[a.tp] = a.offset - 1
            self._rearmed.pop(a.tp, None)
            return
        self.counts["undelivered"] += 1
        log.error("recovery: %s:%d holds %d messages from offset %d that the consumer has not delivered in "
                  "%.0f s; %s; seeking it again", a.tp.topic, a.tp.partition, len(found), a.offset, 2 * self.stuck_s,
                  fetch_state(self.app.consumer, a.tp))
        await self._rearm(a, now, first=False)


def fetch_state(consumer: Any, tp: Any) -> str:
    """What Faust's consumer and aiokafka's fetcher say of ``tp`` (read without their thread: a log line)."""
    parts = [f"flow {'active' if getattr(consumer, 'flow_active', None) else 'stopped'}"]
    try:
        parts.append(f"active {tp in consumer._get_active_partitions()}")
        inner = consumer._thread._ensure_consumer()
        state = inner._subscription.subscription.assignment.state_value(tp)
        if state is None:
            parts.append("not assigned")
        else:
            parts.append(f"paused {state.paused}, position {state.position if state.has_valid_position else None}, "
                         f"fetch highwater {state.highwater}")
        fetcher = inner._fetcher
        parts.append(f"buffered {tp in fetcher._records}, fetches in flight {len(fetcher._in_flight)}")
    except Exception as exc:  # noqa: BLE001 - the internals moved (another aiokafka): say so, never fail
        parts.append(f"fetch state unknown ({type(exc).__name__})")
    return ", ".join(parts)
