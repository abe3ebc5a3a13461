"""The analyzer clock of one job: its messages' timestamps, but never one producer's alone.

Time on the analyzer's clock is what decides a hang ("nothing moved for 20 s"), so it must
not jump because one producer's clock is wrong. Every job has its own clock (so no producer
moves another job's), and within a job every producer (the batch's ``producer`` id) is
followed separately: its newest timestamp and the worker's wall time when that arrived.
Extrapolated by the worker's wall time, that gives each producer's estimate of "now"; the
**consensus** is the median of the estimates of the producers heard from recently (with an
even count, the middle estimate nearer to the worker's own wall clock). A timestamp more than
``max_skew_s`` ahead of the consensus does not move the clock: the clock moves to the consensus
instead, and the message is counted as ``clock_rejected``.

**Lag.** The clock also says how late the worker reads the job: each producer's *delay* (the
worker's wall time at receipt minus the message's timestamp) has a floor, the smallest delay it
showed (it relaxes upward slowly, so a clock step or drift is forgotten); a message's delay above
its producer's floor is how far behind the worker reads (``lag_s``). The floor absorbs any fixed
offset between that producer's clock and the worker's, so a skewed producer is not "lag".

With a single producer the consensus is that producer, so the simulator and ``ccld bench
--through-kafka`` (one producer stamping simulated time, which runs far faster than the wall
clock and jumps between scenarios) keep driving the clock exactly as before. A producer that
is the first and only one a job has sets the clock until others arrive: there is nothing to
compare it with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: A message timestamp further than this ahead of the worker's own wall clock is never a time (s).
MAX_FUTURE_S = 86_400.0
#: Producers remembered per job at most (the ones heard from longest ago are forgotten first). Every
#: rank is a producer: fewer than a job's ranks and every message comes from a forgotten one.
MAX_PRODUCERS = 16_384
#: Producers a snapshot keeps (the most recently heard): a median needs no more, and the snapshot is
#: written every second.
SNAPSHOT_PRODUCERS = 1024
#: Recompute the consensus from every producer at most this often (s of worker wall time); in between
#: it moves with the wall clock. Every rank is a producer: a median over all of them per message cost
#: 1 ms at a thousand ranks. A timestamp that looks too far ahead is always judged on a fresh one.
CONSENSUS_EVERY_S = 1.0


#: How fast a producer's delay floor forgets its lowest value (s per s of worker wall time): a clock
#: stepped back by NTP stops looking like lag after about (step / FLOOR_RELAX) seconds.
FLOOR_RELAX = 0.01


@dataclass
class _Producer:
    newest_ts: float  # the producer's newest message timestamp (s)
    newest_recv: float  # worker wall time when newest_ts arrived
    last_recv: float  # worker wall time of the producer's latest message
    floor: float = math.inf  # smallest (recv - timestamp) seen, relaxed upward by FLOOR_RELAX

    def estimate(self, recv: float) -> float:
        return self.newest_ts + max(0.0, recv - self.newest_recv)


class JobClock:
    """Monotone analyzer clock of one job, fed with (producer, timestamp, receive time)."""

    def __init__(self, *, max_skew_s: float = 30.0, active_s: float = 120.0) -> None:
        self.max_skew_s = max_skew_s
        self.active_s = active_s
        self.now_s = 0.0  # the clock: seconds, never goes back
        # The timer's clock between messages: ``anchor_s`` (the data's time, or where a hold stopped the clock)
        # advanced by the wall time since ``moved_recv``, never below ``shown`` (the last time a tick gave).
        self.anchor_s = 0.0
        self.moved_recv = 0.0  # worker wall time of the anchor
        self.shown = 0.0  # the timer's clock at its last tick: the analyzer was evaluated at this time
        self.rejected = 0  # timestamps too far ahead of the consensus (clamped)
        self.ignored = 0  # missing, non-positive, non-finite or absurdly-future timestamps
        self._producers: dict[str, _Producer] = {}
        self._lead = 0.0  # consensus minus the worker's wall time, as last computed
        self._lead_at = -math.inf  # worker wall time it was computed at
        self.lag_s = 0.0  # how far behind the worker read this job's latest message (see the module doc)

    def observe(self, producer: str, ts: float | None, recv: float) -> bool:
        """Take one message's timestamp (s) received at worker wall time ``recv``; False if it was not trusted."""
        if ts is None or not math.isfinite(ts) or ts <= 0.0 or ts > recv + MAX_FUTURE_S:
            self.ignored += 1
            return False
        p = self._producers.pop(producer, None)  # re-inserted last: dict order is least recently heard first
        # Not on every new producer: a job's ranks all arrive in its first second (a median over a
        # thousand per message), and a new one that looks too far ahead gets a fresh consensus below.
        fresh = recv - self._lead_at >= CONSENSUS_EVERY_S or recv < self._lead_at
        if p is None:
            p = _Producer(ts, recv, recv)
        elif ts >= p.newest_ts:
            p.newest_ts, p.newest_recv = ts, recv
        delay = recv - ts
        p.floor = min(delay, p.floor + FLOOR_RELAX * max(0.0, recv - p.last_recv))
        self.lag_s = delay - p.floor
        p.last_recv = recv
        self._producers[producer] = p
        if fresh:
            self._refresh(recv)
        consensus = recv + self._lead
        if ts > consensus + self.max_skew_s and not fresh:
            self._refresh(recv)  # before refusing a time, make sure the consensus is today's
            consensus = recv + self._lead
        if ts > consensus + self.max_skew_s:
            self.rejected += 1
            self._advance(consensus, recv)
            return False
        self._advance(ts, recv)
        return True

    def _refresh(self, recv: float) -> None:
        self._forget(recv)
        self._lead, self._lead_at = self.consensus(recv) - recv, recv

    def consensus(self, recv: float) -> float:
        """Median estimate of "now" of the producers heard from within ``active_s`` of ``recv``."""
        est = sorted(p.estimate(recv) for p in self._producers.values() if recv - p.last_recv <= self.active_s)
        if not est:
            return self.now_s
        mid = len(est) // 2
        if len(est) % 2:
            return est[mid]
        # Two halves that disagree: side with the one nearer to the worker's own clock, which no producer can move.
        lo, hi = est[mid - 1], est[mid]
        return lo if abs(lo - recv) <= abs(hi - recv) else hi

    def extrapolated(self, recv: float) -> float:
        """The clock advanced by the wall time since it last moved (for evaluations while the job is quiet),
        never behind the last tick's."""
        if self.now_s == 0.0:
            return 0.0
        return max(self.shown, self.anchor_s + max(0.0, recv - self.moved_recv))

    def tick(self, recv: float) -> float:
        """The time to evaluate the job at on the worker's timer: ``extrapolated``, remembered, so that the
        next tick is never earlier. A job's clock that went back by the silence it had already been judged
        on made that silence new: a job that ended a minute before read as counters frozen for a minute,
        with the last records minutes old and yet "just heard" (false H3s after the job's end)."""
        self.shown = self.extrapolated(recv)
        return self.shown

    def hold(self, recv: float) -> None:
        """The worker is behind: the wall time until ``recv`` is not the job's silence (its messages may be
        waiting unread), so it will not count in ``extrapolated``; only the data's own time does. The clock
        stops where the last tick left it (what was judged stays judged) and goes on from there."""
        self.anchor_s = max(self.anchor_s, self.shown)
        self.moved_recv = max(self.moved_recv, recv)

    def _advance(self, ts: float, recv: float) -> None:
        if ts > self.now_s:
            self.now_s = ts
            self.anchor_s, self.moved_recv = ts, recv

    def _forget(self, recv: float) -> None:
        while len(self._producers) > MAX_PRODUCERS:
            del self._producers[next(iter(self._producers))]
        # Producers silent for ten activity windows no longer matter even as tie-breakers.
        for name in [n for n, p in self._producers.items() if recv - p.last_recv > 10 * self.active_s]:
            del self._producers[name]

    # --- snapshot -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        # not ``shown``: it moves at every tick, and a quiet job's snapshot part is written only when it changed;
        # a restored analyzer has judged nothing yet, so its clock may resume from the anchor
        return {"now_s": self.now_s, "moved_recv": self.moved_recv, "anchor_s": self.anchor_s,
                "producers": {n: [p.newest_ts, p.newest_recv, p.last_recv, p.floor if math.isfinite(p.floor) else None]
                              for n, p in list(self._producers.items())[-SNAPSHOT_PRODUCERS:]}}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.now_s = float(d.get("now_s", 0.0))
        self.moved_recv = float(d.get("moved_recv", 0.0))
        self.anchor_s = float(d.get("anchor_s", self.now_s))
        self._producers = {str(n): _Producer(float(v[0]), float(v[1]), float(v[2]),
                                             math.inf if len(v) < 4 or v[3] is None else float(v[3]))
                           for n, v in dict(d.get("producers", {})).items()}
