"""``publish`` stamps a simulated job from an epoch: the benchmark's 0, or the wall clock as ``ccld simulate`` does."""

from __future__ import annotations

import numpy as np
import pytest

from ccld.producers.simulator.emit import EPOCH_NS
from ccld.producers.simulator.publish import publish
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import KernelBatch

SC = {"id": "ep", "seed": 1, "ranks": 8, "gpus_per_node": 8, "step_time_s": 0.5, "duration_s": 6,
      "faults": [], "expect": []}
#: the times on a rank's clock a batch carries, named here rather than taken from the code under test: a time left
#: on the simulator's epoch (the previous op's end) made every compute gap a year long, and no slow rank was named
CLOCK_COLUMNS = ("t_enter_ns", "t_exit_ns", "t_sample_ns", "t_prev_exit_ns")


class Sent:
    def __init__(self) -> None:
        self.got: list[tuple[KernelBatch, int | None]] = []

    def send_batch(self, batch: KernelBatch, timestamp_ms: int | None = None) -> bool:
        self.got.append((batch, timestamp_ms))
        return True


@pytest.mark.parametrize("workload", [None, {"microbatches": 2, "layers": 2}], ids=["simple", "megatron"])
def test_an_epoch_moves_every_clock_and_timestamp_and_leaves_none_as_none(workload: dict[str, int] | None) -> None:
    sc = Scenario.from_dict({**SC, "workload": workload} if workload else SC)
    plain, later = Sent(), Sent()
    publish(sc, plain)
    publish(sc, later, epoch_s=1_764_900_000.0)
    assert len(plain.got) == len(later.got) > 0
    off = 1_764_900_000 * 10**9 - EPOCH_NS  # the ranks' clocks read EPOCH_NS at time 0, epoch_s now
    for (a, ta), (b, tb) in zip(plain.got, later.got, strict=True):
        assert tb == ta + 1_764_900_000_000  # type: ignore[operator]
        for name in CLOCK_COLUMNS:
            x, y = np.asarray(a.col(name)), np.asarray(b.col(name))
            assert np.array_equal(y[x >= 0], x[x >= 0] + off) and np.array_equal(y[x < 0], x[x < 0])
    assert any((np.asarray(a.col("t_exit_ns")) < 0).any() for a, _ in plain.got), "no -1 to keep"
    assert any((np.asarray(a.col("t_prev_exit_ns")) > 0).any() for a, _ in plain.got), "no previous exit to move"
    first = [b for _, b in list(simulate(sc))[:1]][0]
    assert np.array_equal(np.asarray(first.col("t_enter_ns")), np.asarray(plain.got[0][0].col("t_enter_ns")))

