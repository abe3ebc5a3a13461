"""A producer's clock within the allowed skew must not make stalls for the others (no false hangs).

A healthy job shipped by four producers (its communicators split among them), one of which
stamps its messages ``SKEW_S`` ahead or behind the others, fed to a ``PartitionProcessor`` in
arrival order with the timer ticking every second, as the worker does. The skew is under the
clock's bound (``clock_max_skew_s``, 30 s) and over the hang thresholds (15 and 20 s): an
accepted timestamp that moved the job's clock would make every honest rank look stalled.
"""

from __future__ import annotations

import dataclasses

import pytest

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import Verdict
from ccld.schemas.codec import encode_batch
from ccld.settings import AnalyzerSettings
from ccld.streams.processor import PartitionProcessor

T0 = 1_700_000_000.0
HEALTHY = Scenario.from_dict({
    "id": "skew-healthy", "seed": 11, "ranks": 32, "layout": {"tp": 8, "pp": 1, "dp": 4}, "channels": 2,
    "step_time_s": 1.0, "duration_s": 90.0, "clock_skew_s": 1.0, "jitter": 0.05, "faults": [], "expect": [],
})
HANG = Scenario.from_dict({**HEALTHY.to_dict(), "id": "skew-hang", "faults": [{"kind": "H1", "rank": 9,
                                                                                 "onset_s": 40.0}],
                           "expect": [{"kind": "H1", "rank": 9}]})


def sent(proc: PartitionProcessor, verdicts: list[tuple[Verdict, bytes]]) -> list[str]:
    """Acknowledge ``verdicts`` as the broker would; each as state/kind/ranks."""
    for v, _ in verdicts:
        proc.mark_sent(v)
    return [f"{v.state.value}/{v.kind.value}/{v.root_cause_ranks}" for v, _ in verdicts]


def run(sc: Scenario, skew_s: float, producers: int = 4) -> list[str]:
    """Feed the job, producer ``producers - 1`` stamping ``skew_s`` off; the verdicts as kind/ranks."""
    proc = PartitionProcessor(0, AnalyzerSettings())
    comms: list[int] = []
    out: list[str] = []
    next_tick = None
    for i, (t, b) in enumerate(simulate(sc)):
        if b.comm_hash not in comms:
            comms.append(b.comm_hash)
        p = comms.index(b.comm_hash) % producers
        recv = T0 + t + 0.05
        if next_tick is None:
            next_tick = recv + 1.0
        while recv >= next_tick:
            out += sent(proc, proc.tick(next_tick))
            next_tick += 1.0
        b = dataclasses.replace(b, producer=f"p{p}")
        res = proc.handle(encode_batch(b), topic="m", offset=i, timestamp_s=T0 + t + (skew_s if p == producers - 1
                                                                                        else 0.0), recv_s=recv)
        out += sent(proc, res.verdicts)
    return out


@pytest.mark.parametrize("skew_s", [0.0, 25.0, -25.0])
def test_a_skewed_producer_in_a_healthy_job_makes_no_verdict(skew_s: float) -> None:
    assert run(HEALTHY, skew_s) == []


@pytest.mark.parametrize("skew_s", [0.0, 25.0])
def test_a_real_hang_is_still_found_with_a_skewed_producer(skew_s: float) -> None:
    got = run(HANG, skew_s)
    assert any(v.startswith("open/H1/(9,)") for v in got), got
