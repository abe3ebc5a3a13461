"""An overloaded worker lags, it does not report hangs: silence while messages wait unread is not evidence.

Two healthy Megatron-style jobs, each on its own metrics partition, produced in real time; the worker reads
them slower than they come (``COST_S`` of wall time per message) and, as a Kafka consumer does,
in chunks of one partition at a time, so the other partition waits. The timer ticks every
second of wall time, as the worker's does. Without the lag rule, the waiting job's clock would
run on with the wall clock and every op it was inside would look stalled.
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

pytestmark = pytest.mark.slow  # about 30 s: Megatron-style jobs, read twice

T0 = 1_700_000_000.0
CHUNK_S = 25.0  # wall time the consumer reads one partition before it turns to the other (a long fetch backlog)


def job(sid: str, seed: int, fault: dict[str, object] | None = None) -> Scenario:
    return Scenario.from_dict({
        "id": sid, "seed": seed, "ranks": 16, "layout": {"tp": 4, "pp": 2, "dp": 2}, "channels": 2,
        "duration_s": 70.0, "clock_skew_s": 1.0, "jitter": 0.05,
        # Megatron-style: hundreds of collectives per second, so some op is always in flight
        "workload": {"microbatches": 4, "layers": 2, "layer_ms": 4.0},
        "faults": [fault] if fault else [], "expect": [{"kind": fault["kind"], "rank": fault["rank"]}] if fault else [],
    })


def run(jobs: list[Scenario], cost_s: float, *, lag_rule: bool = True, cut_rule: bool = True
        ) -> tuple[list[str], float]:
    """Read every job's messages as an overloaded worker would; the verdicts (state/kind/job/ranks), the
    largest lag the processors saw. ``cut_rule=False`` turns the analyzer's silence rule off
    (``cut_min_s``: a communicator all of whose ranks went quiet mid-op is not hung), which also keeps
    a waiting partition's jobs from false hangs: each rule is checked alone."""
    settings = AnalyzerSettings() if cut_rule else dataclasses.replace(AnalyzerSettings(), cut_min_s=1e9)
    procs = [PartitionProcessor(i, settings) for i in range(len(jobs))]
    queues = [[(t, dataclasses.replace(b, producer=f"{sc.id}-p")) for t, b in simulate(sc)] for sc in jobs]
    pos = [0] * len(jobs)
    wall = T0
    next_tick = T0 + 1.0
    out: list[str] = []
    worst = 0.0

    def sent(verdicts: list[tuple[Verdict, bytes]], proc: PartitionProcessor) -> None:
        for v, _ in verdicts:
            proc.mark_sent(v)
            out.append(f"{v.state.value}/{v.kind.value}/{v.job}/{v.root_cause_ranks}")

    turn = 0
    while any(pos[i] < len(q) for i, q in enumerate(queues)):
        i = turn % len(jobs)
        turn += 1
        turn_ends = wall + CHUNK_S
        while wall < turn_ends or cost_s == 0.0:
            if pos[i] >= len(queues[i]):
                break
            t, b = queues[i][pos[i]]
            if T0 + t > wall:  # not produced yet: the consumer waits for it
                wall = T0 + t
            while wall >= next_tick:
                lag = max(p.recent_lag(next_tick) for p in procs)
                worst = max(worst, lag)
                # what the worker knows as a Kafka consumer: messages already written and not yet read
                # (its position behind the partitions' high watermarks), and how late it read the last ones
                unread = any(j < len(q) and T0 + q[j][0] <= next_tick for j, q in zip(pos, queues, strict=True))
                caught_up = not unread and lag < 5.0
                for p in procs:
                    sent(p.tick(next_tick, caught_up=caught_up if lag_rule else True), p)
                next_tick += 1.0
            wall += cost_s
            sent(procs[i].handle(encode_batch(b), topic="m", offset=pos[i], timestamp_s=T0 + t, recv_s=wall)
                 .verdicts, procs[i])
            pos[i] += 1
            if cost_s == 0.0 and pos[i] % 50 == 0:
                break  # a consumer that keeps up still alternates partitions
    return out, worst


@pytest.mark.parametrize("cut_rule", [True, False], ids=["both-rules", "lag-rule-alone"])
def test_an_overloaded_worker_lags_and_reports_nothing_on_healthy_jobs(cut_rule: bool) -> None:
    jobs = [job("busy-a", 1), job("busy-b", 2)]
    n = sum(1 for sc in jobs for _ in simulate(sc))
    cost = 1.5 * 70.0 / n  # 1.5 x slower than the jobs produce: the lag grows all run long
    calm, calm_lag = run(jobs, cost_s=0.0, cut_rule=cut_rule)
    assert calm == [] and calm_lag < 1.0
    verdicts, lag = run(jobs, cost_s=cost, cut_rule=cut_rule)
    assert lag > 20.0, f"the worker was meant to fall far behind, lag {lag:.1f} s"
    assert verdicts == [], verdicts


def test_without_either_rule_the_same_overload_makes_false_hangs() -> None:
    """The tests above can fail: silence counted by wall time while the worker lags opens hangs."""
    jobs = [job("busy-a", 1), job("busy-b", 2)]
    n = sum(1 for sc in jobs for _ in simulate(sc))
    verdicts, _ = run(jobs, cost_s=1.5 * 70.0 / n, lag_rule=False, cut_rule=False)
    assert any("/H" in v for v in verdicts), verdicts


@pytest.mark.parametrize("cost_factor", [0.0, 1.5])
def test_a_real_hang_is_found_under_overload_too(cost_factor: float) -> None:
    jobs = [job("hang-a", 3, {"kind": "H1", "rank": 12, "onset_s": 30.0}), job("busy-b", 2)]
    n = sum(1 for sc in jobs for _ in simulate(sc))
    verdicts, _ = run(jobs, cost_s=cost_factor * 70.0 / n)
    assert [v for v in verdicts if v.startswith("open/")] == ["open/H1/hang-a/(12,)"], verdicts
