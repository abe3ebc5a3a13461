"""The Megatron-style workload: real collective rates come out of the model, and what it sends is
the bounded record format (state per interval, sampled detail that every rank agrees on)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np
import pytest

from ccld.errors import ScenarioError
from ccld.producers.simulator.megatron import EPOCH_NS, MegatronSim
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.producers.simulator.topology import Topology
from ccld.records import KernelBatch, Status


def scenario(**over: Any) -> Scenario:
    d: dict[str, Any] = {"id": "m", "seed": 5, "ranks": 16, "layout": {"tp": 4, "pp": 2, "dp": 2}, "channels": 4,
                         "duration_s": 20, "jitter": 0.03, "workload": {}}
    d.update(over)
    return Scenario.from_dict(d)


def play(sc: Scenario) -> tuple[MegatronSim, list[tuple[float, KernelBatch]]]:
    topo = Topology.build(sc)
    sim = MegatronSim(sc, topo, job=sc.id, producer="p", skew_s=np.zeros(len(topo.hosts)))
    return sim, list(sim.run())


def test_rates_and_durations_come_out_of_the_model() -> None:
    sim, out = play(scenario())
    ops_per_s = sim.ops_per_rank / 20
    assert 100 <= ops_per_s <= 1000, ops_per_s
    kernel = [
        (b.columns["t_exit_ns"][i] - b.columns["t_enter_ns"][i]) * 1e-9
        for _, b in out for i in np.flatnonzero(b.columns["status"] == int(Status.DONE)).tolist()
    ]
    assert min(kernel) >= 40e-6 and np.median(kernel) < 10e-3, (min(kernel), np.median(kernel))


def test_records_per_rank_do_not_grow_with_the_collective_rate() -> None:
    rates, records = [], []
    for wl in ({"microbatches": 2, "layers": 1, "layer_ms": 8.0}, {"microbatches": 8, "layers": 4, "layer_ms": 1.0}):
        sim, out = play(scenario(workload=wl))
        rates.append(sim.ops_per_rank / 20)
        records.append(sum(b.n for _, b in out) / 16 / 20)
    assert rates[1] > 2.5 * rates[0]  # the second job issues several times more collectives ...
    assert records[1] < 1.5 * records[0]  # ... and sends about as many records


def test_every_rank_details_the_same_ops_and_each_member_sends_its_state() -> None:
    _, out = play(scenario(duration_s=15))
    done: dict[tuple[int, int], set[int]] = defaultdict(set)
    size: dict[int, int] = {}
    states: Counter[tuple[int, int, int]] = Counter()
    prev: list[int] = []
    for _, b in out:
        st, comm = b.columns["status"], b.columns["comm"]  # a batch is one host's: several communicators
        for i in range(b.n):
            c = int(comm[i])
            size[c] = int(b.columns["comm_size"][i])
            if st[i] == Status.DONE:
                done[(c, int(b.columns["op_seq"][i]))].add(int(b.columns["comm_rank"][i]))
            else:
                assert st[i] in (Status.PROGRESS, Status.IDLE)
                ts = (b.columns["t_sample_ns"][i] - EPOCH_NS) / 1e9  # this test's hosts have no clock skew
                states[(c, int(b.columns["comm_rank"][i]), int(ts))] += 1
        prev.extend(b.columns["t_prev_exit_ns"][st == Status.DONE].tolist())
    assert done and np.mean(np.asarray(prev) > 0) > 0.9  # a sampled op says where the one before it ended
    complete = [len(r) == size[c] for (c, _), r in done.items()]
    assert np.mean(complete) > 0.99  # only ops cut by the end of the run are partial
    # per member and interval: the state at the poll, and at most one sample caught in flight
    assert max(states.values()) <= 2


def test_channels_beyond_eight_fold_onto_the_frame() -> None:
    _, out = play(scenario(channels=32, duration_s=8))
    b = next(b for _, b in out if b.n and b.channels)
    assert b.channels == 8
    done = b.columns["status"] == int(Status.DONE)
    assert done.any() and (b.send[done] % 4 == 0).all()  # four hardware channels add into each slot


def test_old_scenarios_keep_the_simple_model_and_bad_workloads_are_refused() -> None:
    sc = Scenario.from_dict({"id": "old", "ranks": 8, "duration_s": 10})
    assert sc.workload is None and sum(1 for _ in simulate(sc)) > 0
    with pytest.raises(ScenarioError, match="layers"):
        scenario(workload={"layers": 0})
    with pytest.raises(ScenarioError, match="unknown keys"):
        scenario(workload={"layerz": 2})
    with pytest.raises(ScenarioError, match="needs the Megatron-style workload"):
        Scenario.from_dict({"id": "r", "ranks": 8, "duration_s": 30, "faults": [{"kind": "restart", "onset_s": 5}]})
    with pytest.raises(ScenarioError, match="family"):
        scenario(faults=[{"kind": "recreate", "onset_s": 5, "family": "world"}])


def test_a_restart_starts_a_new_incarnation_from_op_zero() -> None:
    _, out = play(scenario(duration_s=30, faults=[{"kind": "restart", "onset_s": 10, "down_s": 5}]))
    incs = sorted({b.incarnation for _, b in out})
    assert incs == [0, 1]
    first_new = min(int(b.columns["op_seq"].min()) for _, b in out if b.incarnation == 1)
    assert first_new == 0
    gap = [t for t, b in out if b.incarnation == 1]
    assert min(gap) > 15.0  # nothing from the new incarnation before the job is back
