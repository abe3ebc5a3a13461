"""Restart policy for `ccld up`'s children and broker: exponential backoff, reset after a stable run.

Pure (no processes, no clock of its own): the caller passes ``now`` so tests need no sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Backoff:
    """When may a crashed process start again?

    The first restart is immediate-ish (``initial_s``); each crash soon after a start doubles
    the wait up to ``max_s``; a process that stayed up ``stable_s`` starts over at ``initial_s``,
    so one crash a day never waits the maximum.
    """

    initial_s: float = 1.0
    max_s: float = 30.0
    stable_s: float = 60.0
    restarts: int = 0
    delay_s: float = 0.0
    not_before: float = 0.0
    started_at: float | None = None

    def started(self, now: float) -> None:
        self.started_at = now

    def crashed(self, now: float) -> float:
        """Record a crash seen at ``now``; returns how long to wait before the next start."""
        ran = now - self.started_at if self.started_at is not None else 0.0
        if ran >= self.stable_s or self.delay_s == 0.0:
            self.delay_s = self.initial_s
        else:
            self.delay_s = min(self.delay_s * 2, self.max_s)
        self.started_at = None
        self.not_before = now + self.delay_s
        return self.delay_s

    def due(self, now: float) -> bool:
        return now >= self.not_before

    def restarted(self, now: float) -> None:
        self.restarts += 1
        self.started(now)
