"""A job that ended, and a worker that falls behind a moment later: no hang for the ended job.

The soak through ``ccld up`` (``benchmarks/soak.py``: 1,000 jobs, about 20 at once) opened 530 incidents on
jobs that had ended, most of them H3s on the ring links of tensor groups ("counters frozen for 54.8 s"),
all in bursts right after the worker had been behind for a second or two. While the worker is behind, a
job's clock is held (its silence is not evidence); the hold put every job's clock back to its last
message's time, a minute back for a job that had ended a minute before, and the silence it had already
been judged on became new silence, judged again from "just heard". Here the same job through a real
``PartitionProcessor``, in real time on the messages' own timestamps, ticked past its end as the worker's
timer ticks, with two ticks behind at the minute: nothing may open.
"""

from __future__ import annotations

import pytest
from live_replay import live_replay

#: the soak's job soak-1-00010: two tensor groups of four in a two-stage pipeline, healthy, for a minute
JOB = {"id": "soak-1-00010", "seed": 100_010, "ranks": 8, "layout": {"tp": 4, "pp": 2, "dp": 1}, "channels": 2,
       "step_time_s": 1.0, "duration_s": 60.0, "faults": [], "expect": []}


@pytest.mark.parametrize("behind_at_s", [None, 5.0, 30.0, 50.0])
def test_an_ended_job_stays_quiet_when_the_worker_falls_behind_after_its_end(behind_at_s: float | None) -> None:
    opened = [v.describe() for v in live_replay(JOB, behind_from_end_s=behind_at_s) if v.state.value == "open"]
    assert opened == []


def test_a_hang_is_still_found_when_the_worker_falls_behind_during_it() -> None:
    hung = {**JOB, "id": "hung", "faults": [{"kind": "H1", "rank": 5, "onset_s": 20.0}],
            "expect": [{"kind": "H1", "rank": 5}]}
    opened = [(v.kind.value, v.root_cause_ranks) for v in live_replay(hung, behind_from_end_s=10.0)
              if v.state.value == "open"]
    assert opened == [("H1", (5,))]
