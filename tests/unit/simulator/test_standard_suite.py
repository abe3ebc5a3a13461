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
from ccld.producers.simulator import load_scenarios

ROOT = Path(__file__).resolve().parents[3]
SUITE = ROOT / "benchmarks" / "scenarios" / "standard.jsonl"


def test_standard_suite_is_valid_and_complete() -> None:
    scs = load_scenarios(SUITE)
    assert len(scs) >= 300
    kinds = Counter(e.kind for s in scs for e in s.expect)
    assert all(kinds[k] >= 30 for k in ("H1", "H2", "H3", "S1", "S2", "S3"))
    benign = Counter(f.kind for s in scs for f in s.faults if f.is_benign)
    assert benign["transient"] >= 10 and benign["checkpoint"] >= 10
    assert any(f.every_s for s in scs for f in s.faults if f.kind == "checkpoint")
    assert sum(1 for s in scs if not s.faults) >= 30
    assert sum(1 for s in scs if len(s.expect) == 2) >= 10
    sizes = {s.ranks for s in scs}
    assert min(sizes) == 8 and max(sizes) == 4096
    assert all(f.onset_s >= 60 for s in scs for f in s.faults)


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("make_standard", SUITE.with_name("make_standard.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("suite", ["standard", "wide"])
def test_generator_reproduces_the_file(suite: str) -> None:
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
