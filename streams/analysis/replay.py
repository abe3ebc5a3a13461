"""Replay a stream of kernel batches through an analyzer on their own clock, with an evaluation every tick.

The offline driver the benchmarks, the golden tests and the accuracy suites share: the same
``Analyzer`` (or ``ShardedAnalyzer``) the worker runs, fed in arrival order.
"""

from __future__ import annotations

from collections.abc import Iterable

from ccld.records import KernelBatch, Verdict
from ccld.streams.analysis.analyzer import Analyzer
from ccld.streams.analysis.settings import AnalyzerSettings
from ccld.streams.analysis.sharded import ShardedAnalyzer


def analyze_batches(
    batches: Iterable[tuple[float, KernelBatch]],
    settings: AnalyzerSettings | None = None,
    tick_s: float = 1.0,
    *,
    then: Iterable[float] = (),
    groups: int = 1,
    past_end_s: float = 0.0,
) -> list[Verdict]:
    """Feed ``(arrival time, batch)`` pairs (non-decreasing time) and evaluate every ``tick_s``.

    After the last batch the analyzer evaluates once more, then at every time of ``then``
    (a post-mortem replay lets the clock run on past the hang thresholds). ``past_end_s`` > 0 then lets
    the clock run on that long, with an evaluation every tick and no record: the silence a live worker
    sees after a job ends (its clock goes on with the wall clock), which must bring no new verdict.
    ``groups`` > 1 spreads
    each job's communicators over that many shards and one job stage (``sharded.ShardedAnalyzer``).
    """
    a: Analyzer | ShardedAnalyzer
    if groups > 1:
        a = ShardedAnalyzer(groups, settings)
    else:
        a = Analyzer(settings)
    out: list[Verdict] = []
    next_tick: float | None = None
    now = 0.0
    for t, b in batches:
        if next_tick is None:
            next_tick = t + tick_s
        while t >= next_tick:
            out.extend(a.evaluate(next_tick))
            next_tick += tick_s
        a.ingest(b, t)
        now = t
    if next_tick is not None:
        out.extend(a.evaluate(max(now, next_tick)))
        last = max(now, next_tick)
        while past_end_s > 0 and next_tick + tick_s <= last + past_end_s:
            next_tick += tick_s
            out.extend(a.evaluate(next_tick))
    for t in then:
        out.extend(a.evaluate(t))
    return out
