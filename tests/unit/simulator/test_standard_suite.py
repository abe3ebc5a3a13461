"""The shipped standard suite: valid, regenerated identically, and covering what issue 3 asks."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ccld.cli import main
from ccld.producers.simulator.scenario import load_scenarios

ROOT = Path(__file__).resolve().parents[3]
SUITES = ROOT / "benchmarks" / "scenarios"
SUITE = SUITES / "standard.jsonl"


def test_standard_suite_is_valid_and_complete() -> None:
    scs = load_scenarios(SUITE)
    assert len(scs) >= 400 and all(s.workload is not None for s in scs)  # the Megatron-style workload
    kinds = Counter(e.kind for s in scs for e in s.expect)
    assert all(kinds[k] >= 40 for k in ("H1", "H2", "H3", "S1", "S2", "S3"))
    benign = Counter(f.kind for s in scs for f in s.faults if f.is_benign)
    assert benign["transient"] >= 10 and benign["checkpoint"] >= 10
    assert any(f.every_s for s in scs for f in s.faults if f.kind == "checkpoint")
    assert sum(1 for s in scs if not s.faults) >= 30
    assert sum(1 for s in scs if len(s.expect) == 2) >= 20
    sizes = {s.ranks for s in scs}
    assert min(sizes) <= 8 and max(sizes) == 8192
    noise = [s.workload for s in scs if s.workload is not None]
    assert any(w.pause_rate > 0 for w in noise) and any(w.eval_every for w in noise)
    assert any(w.seq_parallel for w in noise)


def test_held_out_suite_is_wider_than_the_standard_one() -> None:
    # the Megatron-style families the held-out ranges widen (the any-shape tail draws its own, milder ones)
    std = [s for s in load_scenarios(SUITE) if not s.id.startswith("any-")]
    held = load_scenarios(SUITES / "heldout.jsonl")
    assert len(held) >= 200

    def span(scs: list[Any], kind: str, attr: str) -> tuple[float, float]:
        v = [getattr(f, attr) for s in scs for f in s.faults if f.kind == kind]
        return min(v), max(v)

    for kind, attr in (("S1", "factor"), ("S2", "factor"), ("S3", "link_factor")):
        lo_s, hi_s = span(std, kind, attr)
        lo_h, hi_h = span(held, kind, attr)
        assert lo_h < lo_s or hi_h > hi_s, (kind, (lo_s, hi_s), (lo_h, hi_h))
    assert max(s.channels for s in held) > max(s.channels for s in std)
    assert any(f.on_s for s in held for f in s.faults)  # intermittent slowdowns


def test_the_any_shape_family_covers_every_shape_and_joins_the_standard_suite() -> None:
    scs = load_scenarios(SUITES / "any-shape.jsonl")
    assert len(scs) >= 100
    lays = [s.layout for s in scs]
    assert any(x.tp == 1 and x.pp == 1 for x in lays)  # pure data parallel
    assert any(x.tp == 1 and x.pp > 1 for x in lays)  # pipeline only
    assert any(x.tp > 1 and x.pp == 1 and x.dp == 1 for x in lays)  # tensor only
    assert any(x.ep > 1 for x in lays) and any(x.tp > 1 and x.pp > 1 and x.dp > 1 for x in lays)
    assert {s.gpus_per_node for s in scs} >= {1, 2, 4, 8}
    kinds = Counter(e.kind for s in scs for e in s.expect)
    assert all(kinds[k] >= 3 for k in ("H1", "H2", "H3", "S1", "S2", "S3"))
    onsets = [f.onset_s for s in scs for f in s.faults if not f.is_benign]
    assert any(o == 0.0 for o in onsets) and any(o >= 20.0 for o in onsets)  # from the first step, and late
    comms = {f.comm for s in scs for f in s.faults if f.kind in ("S2", "S3", "H3") and f.nic < 0}
    assert comms >= {"tp", "dp", "pp", "ep"} and any(f.nic >= 0 for s in scs for f in s.faults)
    assert min(f.factor for s in scs for f in s.faults if f.kind == "S1") < 1.5  # mild: from 1.3x
    assert max(f.factor for s in scs for f in s.faults if f.kind == "S2") > 0.6  # mild: links up to 70 %
    benign = Counter(f.kind for s in scs for f in s.faults if f.is_benign)
    assert benign["transient"] and benign["checkpoint"] and sum(1 for s in scs if not s.faults) >= 5
    # the family is the standard suite's tail
    std = [json.loads(line) for line in SUITE.read_text().splitlines()]
    tail = [json.loads(line) for line in (SUITES / "any-shape.jsonl").read_text().splitlines()]
    assert std[-len(tail):] == tail


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("make_standard", SUITE.with_name("make_standard.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("suite", ["regression-v1", "heldout-v1"])
def test_generator_reproduces_the_file(suite: str) -> None:
    # the v1 suites (simple model) are cheap to rebuild; the Megatron-style suites check their pairs
    # by simulating them (a minute), which is the generator's job, not a unit test's
    mod = _generator()
    build, seed, path = mod.SUITES[suite]
    rows = build(seed, check=False)  # pairs are still checked; singles always take effect
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows


def test_simulate_cli_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", '{"id": "c", "ranks": 8, "duration_s": 12}', "--dry-run"])
    assert rc == 0
    row = json.loads(capsys.readouterr().out)
    assert row["id"] == "c" and row["records"] >= row["DONE"] > 0


def test_simulate_cli_rejects_a_bad_link(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", '{"id": "c", "ranks": 8, "faults": [{"kind": "H3", "rank": 0, "peer": 5}]}', "--dry-run"])
    assert rc == 2
    assert "link 0->5 does not exist" in capsys.readouterr().err


def test_standard_suite_has_the_network_link_family() -> None:
    scs = load_scenarios(SUITE)
    net = [s for s in scs if s.id.startswith("net-")]
    assert [s.to_dict() for s in net] == [s.to_dict() for s in load_scenarios(SUITES / "network.jsonl")]
    faults = [f for s in net for f in s.faults]
    targets = Counter((f.kind, "nic" if f.nic >= 0 else f.comm) for f in faults)
    for target in (("S2", "dp"), ("S2", "pp"), ("S2", "nic"), ("S3", "dp"), ("S3", "pp"), ("H3", "dp"), ("H3", "pp"),
                   ("H3", "nic")):
        assert targets[target] >= 6, target
    for s in net:  # every link of the family crosses nodes
        for f in s.faults:
            assert all(s.node_of(a) != s.node_of(b) for _, a, b in f.links), s.id
    assert max(s.ranks for s in net) == 4096 and min(s.ranks for s in net) == 8
    assert sum(1 for s in net if not s.faults) >= 3


def test_standard_suite_has_the_expert_parallel_family() -> None:
    scs = load_scenarios(SUITE)
    ep = [s for s in scs if s.id.startswith("ep-")]
    assert [s.to_dict() for s in ep] == [s.to_dict() for s in load_scenarios(SUITES / "expert.jsonl")]
    assert all(s.layout.ep > 1 and s.layout.dp % s.layout.ep == 0 for s in ep)
    assert {s.layout.ep for s in ep} == {2, 4, 8}
    faults = [f for s in ep for f in s.faults]
    kinds = Counter((f.kind, f.comm) for f in faults)
    for target in (("S1", ""), ("H1", ""), ("S2", "ep"), ("S3", "ep"), ("H3", "ep")):
        assert kinds[target] >= 5, target
    for s in ep:  # every expert link joins two members of one expert group; a NIC's include such links
        for f in s.faults:
            assert all(b in s.ep_members(a) for fam, a, b in f.links if fam == "ep"), s.id
            assert f.nic < 0 or any(fam == "ep" for fam, _, _ in f.links), s.id
    assert sum(1 for f in faults if f.nic >= 0 and f.kind == "S2") >= 2
    assert sum(1 for f in faults if f.nic >= 0 and f.kind == "H3") >= 2
    assert max(s.ranks for s in ep) >= 2048 and sum(1 for s in ep if not s.faults) >= 5
