"""Link faults on any communicator and on a host's NIC: the scenario format, and the model following.

A link fault sits on one directed link of a family (``comm``: tp, dp, pp) or on every network link
that leaves one node (``nic``); the Megatron-style model slows (or stops) exactly the ops that use
those links, and the kernels on a slow link's source keep the backlog peak its counters show.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ccld.errors import ScenarioError
from ccld.producers.simulator.megatron import EPOCH_NS, MegatronSim
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.topology import Topology
from ccld.records import COMM_COLUMN, Status

# 16 ranks, 4 GPUs per node: node n holds one stage of one data-parallel replica, so the dp ring
# (rank + 8) and the pipeline pairs (rank +- 4) are network links and the tp rings are NVLink
LAYOUT = {"ranks": 16, "gpus_per_node": 4, "layout": {"tp": 4, "pp": 2, "dp": 2}}


def scenario(faults: list[dict[str, Any]], **over: Any) -> Scenario:
    d: dict[str, Any] = {"id": "l", "seed": 3, **LAYOUT, "channels": 4, "duration_s": 90, "jitter": 0.02,
                         "workload": {}, "faults": faults}
    d.update(over)
    return Scenario.from_dict(d)


def test_a_link_names_its_family_and_defaults_keep_the_tensor_ring() -> None:
    tp, dp, pp, back = scenario([
        {"kind": "S2", "rank": 1}, {"kind": "S2", "comm": "dp", "rank": 5},
        {"kind": "H3", "comm": "pp", "rank": 2}, {"kind": "S3", "comm": "pp", "rank": 6, "peer": 2},
    ]).faults
    assert (tp.comm, tp.peer, tp.links) == ("tp", 2, (("tp", 1, 2),))
    assert (dp.peer, dp.links) == (13, (("dp", 5, 13),))  # the next replica's rank of the same stage
    assert (pp.peer, pp.links) == (6, (("pp", 2, 6),))  # forward to the next stage by default
    assert back.links == (("pp", 6, 2),)  # the backward send of the gradients


def test_a_nic_is_every_network_link_leaving_its_node() -> None:
    (f,) = scenario([{"kind": "S2", "nic": "node-0001", "factor": 0.3}]).faults
    assert f.nic == 1 and f.rank == 4  # node 1: ranks 4..7, stage 1 of replica 0
    assert set(f.links) == {("dp", r, r + 8) for r in range(4, 8)} | {("pp", r, r - 4) for r in range(4, 8)}
    (g,) = scenario([{"kind": "H3", "nic": 0}]).faults
    assert set(g.links) == {("dp", r, r + 8) for r in range(4)} | {("pp", r, r + 4) for r in range(4)}


@pytest.mark.parametrize(
    ("fault", "over", "needle"),
    [
        ({"kind": "S2", "comm": "dp", "rank": 5, "peer": 6}, {}, "a dp link fault needs peer = the next rank of "
         "the same data-parallel ring (rank + tp*pp, wrapping) (dp=2, so peer 13)"),
        ({"kind": "S2", "comm": "pp", "rank": 1, "peer": 9}, {}, "link 1->9 does not exist; a pp link fault"),
        ({"kind": "S2", "comm": "xp", "rank": 1}, {}, "comm must be one of ('tp', 'dp', 'pp', 'ep')"),
        ({"kind": "S2", "comm": "ep", "rank": 1}, {}, "an ep link fault needs peer = another member of the same "
         "expert group (ep consecutive data-parallel replicas) (ep=1, no links)"),
        ({"kind": "S2", "comm": "dp", "rank": 1}, {"workload": None}, "needs the Megatron-style workload"),
        ({"kind": "S2", "nic": 1, "rank": 4}, {}, "a NIC fault names its node only ('nic'), not ['rank']"),
        ({"kind": "S2", "nic": 4}, {}, "nic must be a node index 0..3, 'node-NNNN' or a name of 'hosts', got 4"),
        ({"kind": "S2", "nic": 0}, {"gpus_per_node": 16}, "node 0 has no network link"),
        ({"kind": "S3", "nic": 0}, {}, "unknown keys ['nic']"),
    ],
)
def test_bad_link_targets_are_rejected_with_a_clear_message(fault: dict[str, Any], over: dict[str, Any],
                                                            needle: str) -> None:
    with pytest.raises(ScenarioError) as e:
        scenario([fault], **over)
    assert needle in str(e.value)


def _done_kernel_s(sc: Scenario) -> dict[tuple[str, int], list[float]]:
    """DONE kernel times after the onset, per (communicator family, comm size) of the rank's op."""
    topo = Topology.build(sc)
    sim = MegatronSim(sc, topo, job=sc.id, producer="p", skew_s=np.zeros(len(topo.hosts)))
    fam = dict(zip(sim.c.hashes, sim.c.family, strict=True))
    out: dict[tuple[str, int], list[float]] = {}
    for _, b in sim.run():
        c = b.columns
        for i in np.flatnonzero(c["status"] == int(Status.DONE)).tolist():
            if c["t_enter_ns"][i] - EPOCH_NS > 15e9:  # after the onset (10 s) and the clock skew
                out.setdefault((fam[int(c[COMM_COLUMN][i])], int(c["rank"][i])), []).append(
                    (c["t_exit_ns"][i] - c["t_enter_ns"][i]) * 1e-9)
    return out


def test_a_slow_dp_link_slows_its_ring_only_and_a_slow_nic_every_ring_through_it() -> None:
    healthy = _done_kernel_s(scenario([], duration_s=30))
    one = _done_kernel_s(scenario([{"kind": "S2", "comm": "dp", "rank": 5, "onset_s": 10, "factor": 0.25}],
                                  duration_s=30))
    nic = _done_kernel_s(scenario([{"kind": "S2", "nic": 1, "onset_s": 10, "factor": 0.25}], duration_s=30))

    def med(d: dict[tuple[str, int], list[float]], fam: str, rank: int) -> float:
        return float(np.median(d[(fam, rank)]))

    assert med(one, "dp", 5) > 2.5 * med(healthy, "dp", 5)  # the ring of 5 -> 13
    assert med(one, "dp", 4) == pytest.approx(med(healthy, "dp", 4), rel=0.3)  # another ring of the stage
    for r in range(4, 8):  # every dp ring of node 1 crosses its NIC
        assert med(nic, "dp", r) > 2.5 * med(healthy, "dp", r), r
    assert med(nic, "dp", 0) == pytest.approx(med(healthy, "dp", 0), rel=0.3)  # stage 0 does not
