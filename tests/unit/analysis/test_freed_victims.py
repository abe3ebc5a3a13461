"""A root that resumes frees its victims: they are not named roots of the ops they now hurry into.

Rank 5 stops for 25 s (over the H1 threshold) and then goes on. Ranks 4, 6 and 7 waited for it in
their tensor-parallel all-reduce, so they could not enter the data-parallel reduce-scatter their
peers 0, 2 and 3 entered 25 s ago. Evaluated a second after rank 5 resumed, that reduce-scatter
looked like "ranks 4, 6, 7 never entered": three false H1 incidents. They were waiting on a root
until a moment ago; a rank is judged stuck only from when it stopped waiting.
"""

from __future__ import annotations

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.streams.analysis.replay import analyze_batches


def test_victims_freed_by_a_resuming_root_are_not_named() -> None:
    sc = Scenario.from_dict({
        "id": "freed", "seed": 5, "ranks": 8, "layout": {"tp": 4, "pp": 1, "dp": 2}, "channels": 2,
        "step_time_s": 1.0, "duration_s": 90.0, "clock_skew_s": 1.0, "jitter": 0.02,
        "faults": [{"kind": "transient", "rank": 5, "onset_s": 20.0, "delay_s": 25.0}], "expect": [],
    })
    opened = [v for v in analyze_batches(list(simulate(sc))) if v.state.value == "open"]
    assert [(v.kind.value, v.root_cause_ranks) for v in opened] == [("H1", (5,))], [v.describe() for v in opened]
