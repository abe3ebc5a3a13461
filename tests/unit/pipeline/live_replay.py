"""A simulated job through a real ``PartitionProcessor`` as a live worker reads it: its messages in the order and
at the wall times they arrive, the worker's timer ticking every second between them and on past the job's end.
Shared by the tests of what a worker says after a job's end and under uneven delivery."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import Verdict
from ccld.schemas.codec import encode_batch
from ccld.settings import AnalyzerSettings
from ccld.streams.processor import PartitionProcessor

T0 = 1_800_000_000.0  # the job's start on the worker's wall clock (s)


def live_replay(job: Mapping[str, Any], *, jitter_s: float = 0.0, fixed: bool = True, first_tick_s: float = 1.0,
                past_end_s: float = 70.0, behind_from_end_s: float | None = None) -> list[Verdict]:
    """Every verdict the processor hands out (each marked sent). A message arrives ``jitter_s`` after its time
    (``fixed``) or up to that at random (seeded), each producer's messages in order as Kafka keeps them; the
    timer ticks from ``first_tick_s`` until ``past_end_s`` after the last arrival, and from
    ``behind_from_end_s`` after it two ticks are told the worker is behind."""
    rnd = random.Random(1)
    sc = Scenario.from_dict(dict(job))
    proc = PartitionProcessor(0, AnalyzerSettings())
    out: list[Verdict] = []
    last: dict[str, float] = {}
    arrivals = []
    for off, (t, b) in enumerate(simulate(sc, job=sc.id)):
        recv = max(last.get(b.producer, 0.0), t + (jitter_s if fixed else rnd.uniform(0.0, jitter_s)))
        last[b.producer] = recv
        arrivals.append((recv, off, t, b))
    arrivals.sort(key=lambda a: (a[0], a[1]))

    def keep(vs: list[tuple[Verdict, bytes]]) -> None:
        for v, _ in vs:
            proc.mark_sent(v)
            out.append(v)

    tick = T0 + first_tick_s
    for recv, off, t, b in arrivals:
        while T0 + recv >= tick:
            keep(proc.tick(tick, caught_up=True))
            tick += 1.0
        keep(proc.handle(encode_batch(b), topic="m", offset=off, timestamp_s=T0 + t, recv_s=T0 + recv).verdicts)
    end = T0 + arrivals[-1][0]
    while tick < end + past_end_s:
        behind = behind_from_end_s is not None and end + behind_from_end_s <= tick < end + behind_from_end_s + 2.0
        keep(proc.tick(tick, caught_up=not behind))
        tick += 1.0
    return out
