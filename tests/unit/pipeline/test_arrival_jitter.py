"""A job's verdicts must not depend on how unevenly its messages are delivered (known to fail: xfail, strict).

The soak of a day of jobs through ``ccld up`` named, besides the slow rank of 3 of its 167 S1 jobs, 1 to 4
ranks that only waited behind it (pipeline neighbours, arriving last at their own data-parallel
reduce_scatter), 1-15 s after the right S1. In process the same jobs give the one S1. Here one of them
through a real ``PartitionProcessor``: every message delivered at once, or all a fixed second late, gives the
one S1; delivered up to half a second late at random (each producer's messages still in order, as Kafka
keeps them), the waiting ranks 5 and 6 are named S1 as well. The worker's timer evaluates between
messages on a clock extrapolated from the newest one, so what the analyzer sees at each evaluation
depends on the delivery's jitter; which of its rules reads that as a slow rank is not found yet.
"""

from __future__ import annotations

import random

import pytest

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import Verdict
from ccld.schemas.codec import encode_batch
from ccld.settings import AnalyzerSettings
from ccld.streams.processor import PartitionProcessor

T0 = 1_800_000_000.0
#: the soak's job soak-1-00683: a four-stage pipeline, two data-parallel replicas, rank 4 3x slower from 20 s
JOB = {"id": "soak-1-00683", "seed": 100_683, "ranks": 8, "layout": {"tp": 1, "pp": 4, "dp": 2}, "channels": 2,
       "step_time_s": 1.0, "duration_s": 60.0, "faults": [{"kind": "S1", "rank": 4, "onset_s": 20.0, "factor": 3.0}],
       "expect": [{"kind": "S1", "rank": 4}]}


def opened(jitter_s: float, fixed: bool) -> list[tuple[str, tuple[int, ...]]]:
    """The job delivered ``jitter_s`` late (``fixed``) or up to that at random, each producer in order; the
    worker's timer ticking every second half-way between the job's windows, 90 s past the end."""
    rnd = random.Random(1)
    sc = Scenario.from_dict(JOB)
    proc = PartitionProcessor(0, AnalyzerSettings())
    out: list[tuple[str, tuple[int, ...]]] = []
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
            if v.state.value == "open":
                out.append((v.kind.value, v.root_cause_ranks))

    tick = 0.5
    for recv, off, t, b in arrivals:
        while recv >= tick:
            keep(proc.tick(T0 + tick, caught_up=True))
            tick += 1.0
        keep(proc.handle(encode_batch(b), topic="m", offset=off, timestamp_s=T0 + t, recv_s=T0 + recv).verdicts)
    for _ in range(90):
        keep(proc.tick(T0 + tick, caught_up=True))
        tick += 1.0
    return out


@pytest.mark.parametrize(("jitter_s", "fixed"), [(0.0, True), (1.0, True)], ids=["at-once", "a-second-late"])
def test_evenly_delivered_the_slow_rank_alone_is_named(jitter_s: float, fixed: bool) -> None:
    assert opened(jitter_s, fixed) == [("S1", (4,))]


@pytest.mark.xfail(strict=True, reason="uneven delivery names the ranks waiting behind the slow one (ranks 5, 6)")
def test_unevenly_delivered_the_slow_rank_alone_is_named() -> None:
    assert opened(0.5, fixed=False) == [("S1", (4,))]
