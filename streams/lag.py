"""Is the worker caught up with its partitions? Lag shows as lag (a counter, a log line), never as verdicts.

A job's silence counts towards a hang only while the worker reads what arrives as it arrives
(``PartitionProcessor.tick(caught_up=...)``). Two signs say it does not:

- **unread messages**: a metrics partition whose consumer position stays below the broker's high
  watermark for longer than ``caught_up_lag_s`` (a healthy stream drains to zero between fetches;
  Tansu reports a high watermark a batch short, which only makes this sign late, never false);
- **late messages**: the partitions' recent lag (``JobClock.lag_s``: how much later than usual the
  last messages were read) at or over ``caught_up_lag_s``.

Pure: the worker hands in what its consumer knows; tests hand in what they like.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class LagWatch:
    """Remembers when each partition last had nothing unread, and whether the worker is caught up."""

    caught_up_lag_s: float = 5.0
    drained_at: dict[int, float] = field(default_factory=dict)  # partition -> wall time it last had 0 unread
    caught_up: bool = True
    behind_since: float = math.nan

    def update(self, now: float, unread: Mapping[int, int | None], lag_s: Mapping[int, float]) -> bool:
        """``unread``: messages between each partition's next offset and its high watermark (None: unknown);
        ``lag_s``: each partition's recent lag. Returns whether the worker is caught up now."""
        for p, n in unread.items():
            if n is None or n <= 0 or p not in self.drained_at:
                self.drained_at[p] = now
        for p in [p for p in self.drained_at if p not in unread]:
            del self.drained_at[p]  # revoked: not ours to wait for
        waiting = max((now - t for t in self.drained_at.values()), default=0.0)
        late = max(lag_s.values(), default=0.0)
        caught_up = waiting < self.caught_up_lag_s and late < self.caught_up_lag_s
        if caught_up != self.caught_up:
            if caught_up:
                log.warning("caught up after %.0f s behind: silence counts towards hangs again",
                            now - self.behind_since)
            else:
                self.behind_since = now
                log.warning("behind: %d messages unread for %.1f s, messages read %.1f s late; until the "
                            "worker catches up, stalls are judged on the data's own time (silence is no hang)",
                            sum(n or 0 for n in unread.values()), waiting, late)
            self.caught_up = caught_up
        return caught_up
