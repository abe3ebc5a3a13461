"""Golden end-to-end scenarios: simulator -> analyzer, one folder per scenario.

Each ``tests/golden/<id>/`` holds ``scenario.json`` (the job and its injected faults) and
``expected.json`` (the incidents the analyzer must raise: kind and root-cause rank, the
largest acceptable time-to-verdict, and how many other incidents are tolerated). The analyzer
only ever sees the simulated records, never the scenario's faults or expectations.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ccld.producers.simulator.scenario import Expectation, Scenario
from ccld.producers.simulator.sim import simulate
from ccld.stack.bench import incidents, onset_of
from ccld.streams.analysis.replay import analyze_batches

HERE = Path(__file__).parent
CASES = sorted(p.name for p in HERE.iterdir() if (p / "scenario.json").is_file())


def test_there_are_golden_cases() -> None:
    assert len(CASES) >= 6


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str) -> None:
    sc = Scenario.from_dict(json.loads((HERE / case / "scenario.json").read_text()))
    want = json.loads((HERE / case / "expected.json").read_text())
    verdicts = list(analyze_batches(simulate(sc), settings=None, tick_s=1.0))
    incs = incidents(verdicts)
    shown = "\n".join(v.describe() for v in verdicts)
    matched: set[str] = set()
    for exp in want["incidents"]:
        e = Expectation(exp["kind"], exp["root_cause_rank"])
        hits = [i for i in incs if i.matches(e)]
        assert hits, f"{case}: no {e.kind} incident naming rank {e.rank}; verdicts:\n{shown}"
        if "link" in exp:  # a slow link must be named as well as its rank (S2, and S3's second cause)
            links = {(i.final.link.src, i.final.link.dst) for i in hits if i.final.link is not None}
            assert tuple(exp["link"]) in links, f"{case}: link {exp['link']} not named; verdicts:\n{shown}"
        matched.update(i.incident_id for i in hits)
        ttv = min(i.first_correct_time(e) for i in hits) - onset_of(sc, e)
        assert 0 <= ttv <= want["max_ttv_s"], f"{case}: time to verdict {ttv:.1f} s"
    others = [i for i in incs if i.incident_id not in matched]
    assert len(others) <= want["other_incidents"], f"{case}: unexpected incidents:\n{shown}"
