"""`ccld import-fr` on random single-fault NCCL-format dump sets (benchmarks/fr/synth.py --random), not committed.

Each case breaks one random rank at a random op (stops enqueueing, stalls inside a collective
its peers complete, or calls it with another dtype), writes the dumps in a random format
version, with or without timing, every entry or only active ones, pickle or JSON, and for a
quarter of them drops one rank's dump. The exact root set must come out in at least 95 %.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from ccld.streams.flight_recorder.import_fr_command import analyse

SYNTH = Path(__file__).resolve().parents[3] / "benchmarks" / "fr" / "synth.py"


def load_synth() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fr_synth", SYNTH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fr_synth"] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def test_random_single_faults_are_named(tmp_path: Path) -> None:
    synth = load_synth()
    cases = synth.random_cases(40, seed=2024)
    hits, misses = 0, []
    for case in cases:
        synth.write(case, tmp_path)
        result = analyse(tmp_path / case["name"], world_size=synth.WORLD)
        assert result.diagnosis is not None
        named = [r for v in result.diagnosis.verdicts for r in v.root_cause_ranks]
        assert len(named) == len(set(named))  # one incident per root cause
        if sorted(set(named)) == case["truth"]["roots"]:
            hits += 1
        else:
            misses.append((case["name"], named))
    assert hits >= 0.95 * len(cases), misses


def test_random_single_faults_in_megatron_style_dumps_are_named(tmp_path: Path) -> None:
    # the same kind of faults, with unused groups taking local pg ids, pg_config written lazily
    # and counter or hashed group names: pg_status keys are no positions in pg_config
    synth = load_synth()
    cases = synth.random_cases(40, seed=2024, megatron=True)
    hits, misses = 0, []
    for case in cases:
        synth.write(case, tmp_path)
        result = analyse(tmp_path / case["name"], world_size=synth.WORLD)
        assert result.diagnosis is not None
        named = [r for v in result.diagnosis.verdicts for r in v.root_cause_ranks]
        if sorted(set(named)) == case["truth"]["roots"] and len(named) == len(set(named)):
            hits += 1
        else:
            misses.append((case["name"], named))
    assert hits >= 0.95 * len(cases), misses
