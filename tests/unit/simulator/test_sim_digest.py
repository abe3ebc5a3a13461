"""The simulator's records stay byte for byte what they were: a few small scenarios of
``benchmarks/sim_digest.py``'s list against the digests recorded in the repository.

A change that moves records on purpose (a modelling fix) re-records them with
``python benchmarks/sim_digest.py --write`` and says why in its commit; a speed-up never does.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from ccld.producers.simulator.sim import simulate
from ccld.records import KernelBatch

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "sim_digest.py"
# cheap ones that take the op model's rarer paths: an H2 mismatch, a dead link (H3) freezing a
# collective, a restart (a new incarnation inside a window), communicators created again (new hashes)
CASES = ("H2-8-050", "H3-8-095", "restart-8-369", "recreate-16-368")


@pytest.fixture(scope="module")
def sd() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sim_digest_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("case", CASES)
def test_records_match_the_recorded_digest(sd: ModuleType, case: str) -> None:
    want = json.loads(sd.DEFAULT_FILE.read_text())["scenarios"][case]
    sc = next(s for s in sd.scenarios() if s.id == case)
    checked: list[tuple[float, KernelBatch]] = []

    def rebuilt() -> Iterator[tuple[float, KernelBatch]]:
        # the simulator builds its batches unchecked (KernelBatch.prebuilt): each must pass the checks
        for t, b in simulate(sc):
            fields = {f.name: getattr(b, f.name) for f in dataclasses.fields(KernelBatch)}
            checked.append((t, KernelBatch(**fields)))
            yield t, b

    dig, batches, records, rec = sd.stream_digest(rebuilt())
    assert (batches, records) == (want["batches"], want["records"])
    assert rec == want["records_sha256"], f"{case}: records changed (benchmarks/sim_digest.py --check names them all)"
    assert dig == want["sha256"], f"{case}: the records are the same, their batches changed"
    assert len(checked) == batches
