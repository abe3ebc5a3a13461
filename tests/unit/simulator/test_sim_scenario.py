"""Scenario validation: defaults, and every malformed input rejected with a message naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ccld.errors import ScenarioError
from ccld.producers.simulator.scenario import Scenario, load_scenarios


def base(**kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"id": "t", "ranks": 16, "layout": {"tp": 4, "pp": 2, "dp": 2}, "duration_s": 120}
    d.update(kw)
    return d


def test_defaults_are_documented_values() -> None:
    sc = Scenario.from_dict({"id": "d", "ranks": 32, "faults": [{"kind": "S2", "rank": 7}]})
    assert (sc.layout.tp, sc.layout.pp, sc.layout.dp) == (8, 1, 4)
    assert sc.channels == 4 and sc.step_time_s == 2.0 and sc.duration_s == 180.0
    f = sc.faults[0]
    assert f.peer == 0  # the next rank of the tensor group, wrapping
    assert f.onset_s == 60.0 and f.factor == 0.25
    assert sc.is_healthy  # no expectation given


def test_checkpoint_and_h2_defaults() -> None:
    sc = Scenario.from_dict(base(faults=[{"kind": "checkpoint"}, {"kind": "H2", "rank": 3}]))
    ck, h2 = sc.faults
    assert ck.pause_s == 10.0 and ck.writer_rank == 0 and ck.every_s is None
    assert h2.mismatch == "dtype"


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"faults": [{"kind": "S2", "rank": 1, "peer": 3}]}, "link 1->3 does not exist"),
        ({"faults": [{"kind": "H3", "rank": 3, "peer": 4}]}, "link 3->4 does not exist"),
        ({"faults": [{"kind": "H9", "rank": 1}]}, "unknown kind 'H9'"),
        ({"faults": [{"kind": "H1", "rank": 1, "when": 3}]}, "unknown keys ['when']"),
        ({"faults": [{"kind": "H1"}]}, "'rank' is required"),
        ({"faults": [{"kind": "H1", "rank": 16}]}, "'rank' = 16 out of range"),
        ({"faults": [{"kind": "S1", "rank": 1, "factor": 0.5}]}, "'factor' = 0.5 out of range"),
        ({"faults": [{"kind": "S2", "rank": 1, "factor": 2}]}, "'factor' = 2.0 out of range"),
        ({"faults": [{"kind": "H2", "rank": 1, "mismatch": "root"}]}, "mismatch must be one of"),
        ({"faults": [{"kind": "H1", "rank": 1, "onset_s": 500}]}, "not before duration_s"),
        ({"layout": {"tp": 4, "pp": 2, "dp": 3}}, "!= ranks 16"),
        ({"layout": {"tp": 16, "pp": 1, "dp": 1}}, "must fit a node"),
        ({"colour": "red"}, "unknown keys ['colour']"),
        ({"channels": 65}, "'channels' = 65 out of range"),
        ({"expect": [{"kind": "S7", "rank": 1}]}, "kind must be one of"),
        ({"expect": [{"kind": "S1"}]}, "exactly the keys kind and rank"),
        ({"ranks": "many"}, "'ranks' must be an integer"),
    ],
)
def test_bad_scenarios_are_rejected_with_a_clear_message(patch: dict[str, Any], needle: str) -> None:
    with pytest.raises(ScenarioError) as err:
        Scenario.from_dict(base(**patch))
    assert needle in str(err.value)


def test_link_fault_without_tensor_groups_is_rejected() -> None:
    with pytest.raises(ScenarioError, match="no links"):
        Scenario.from_dict({"id": "x", "ranks": 8, "layout": {"tp": 1, "pp": 1, "dp": 8},
                            "faults": [{"kind": "S2", "rank": 1}]})


def test_file_errors_name_the_line(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    good = json.dumps(base())
    p.write_text(good + "\n\n# comment\n" + json.dumps(base(id="u")) + "\n")
    assert [s.id for s in load_scenarios(p)] == ["t", "u"]
    p.write_text(good + "\n" + good + "\n")
    with pytest.raises(ScenarioError, match=r"s.jsonl:2: duplicate scenario id 't'"):
        load_scenarios(p)
    p.write_text(good + "\n{oops\n")
    with pytest.raises(ScenarioError, match=r"s.jsonl:2: not JSON"):
        load_scenarios(p)


def test_a_scenario_names_its_hosts_and_its_records_carry_them() -> None:
    """``hosts``: one distinct name per node (jobs of a fleet share machines); a nic may be named by it."""
    from ccld.errors import ScenarioError
    from ccld.producers.simulator.sim import simulate

    base = {"id": "h", "ranks": 16, "gpus_per_node": 8, "layout": {"tp": 8, "pp": 1, "dp": 2}, "duration_s": 5}
    sc = Scenario.from_dict({**base, "hosts": ["gpu-a", "gpu-b"]})
    assert sc.host_name(1) == "gpu-b" and Scenario.from_dict(base).host_name(1) == "node-0001"
    _, batch = next(iter(simulate(sc)))
    assert set(batch.hosts) <= {"gpu-a", "gpu-b"} and batch.hosts
    for bad, why in ((["gpu-a"], "needs 2 distinct names"), (["gpu-a", "gpu-a"], "needs 2 distinct names"),
                     ("gpu-a", "must be a list"), (["gpu-a", ""], "must be a list")):
        with pytest.raises(ScenarioError, match=why):
            Scenario.from_dict({**base, "hosts": bad})
    wl = {"microbatches": 2, "layers": 2, "layer_ms": 5.0}
    nic = Scenario.from_dict({**base, "hosts": ["gpu-a", "gpu-b"], "workload": wl,
                              "faults": [{"kind": "S2", "nic": "gpu-b", "onset_s": 1.0, "factor": 0.5}]})
    assert all(nic.node_of(src) == 1 for _, src, _ in nic.faults[0].links)
