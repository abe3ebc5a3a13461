"""A job's verdicts must not depend on how unevenly its messages are delivered.

The soak of a day of jobs through ``ccld up`` named, besides the slow rank of 3 of its 167 S1 jobs, 1 to 4
ranks that only waited behind it (pipeline neighbours, arriving last at their own data-parallel
reduce_scatter), 1-15 s after the right S1. In process the same jobs give the one S1. Here one of them
through a real ``PartitionProcessor``: every message delivered at once, or all a fixed second late, gives the
one S1; delivered up to half a second late at random (each producer's messages still in order, as Kafka
keeps them), the waiting ranks 5 and 6 are named S1 as well. The simulator sends a window as one message
per communicator; delivered unevenly, the timer evaluates between two of them, and a rank's reduce_scatter is
taken before the pipeline recv it had waited in (the other message): its compute gap (``JobState.gaps``) is
measured from the exit before that recv, 0.6 s of "compute" that was a wait, and the waiting rank reads as
slow. Every real source (probe, attachment) says where a rank's previous op ended (``t_prev_exit_ns``), and
so now does the simulator: the gap no longer depends on which message the analyzer read first.
"""

from __future__ import annotations

import pytest
from live_replay import live_replay

#: the soak's job soak-1-00683: a four-stage pipeline, two data-parallel replicas, rank 4 3x slower from 20 s
JOB = {"id": "soak-1-00683", "seed": 100_683, "ranks": 8, "layout": {"tp": 1, "pp": 4, "dp": 2}, "channels": 2,
       "step_time_s": 1.0, "duration_s": 60.0, "faults": [{"kind": "S1", "rank": 4, "onset_s": 20.0, "factor": 3.0}],
       "expect": [{"kind": "S1", "rank": 4}]}


def opened(jitter_s: float, fixed: bool) -> list[tuple[str, tuple[int, ...]]]:
    """The job delivered ``jitter_s`` late (``fixed``) or up to that at random; the worker's timer ticking every
    second half-way between the job's windows, 90 s past the end: the incidents opened."""
    return [(v.kind.value, v.root_cause_ranks)
            for v in live_replay(JOB, jitter_s=jitter_s, fixed=fixed, first_tick_s=0.5, past_end_s=90.0)
            if v.state.value == "open"]


@pytest.mark.parametrize(("jitter_s", "fixed"), [(0.0, True), (1.0, True)], ids=["at-once", "a-second-late"])
def test_evenly_delivered_the_slow_rank_alone_is_named(jitter_s: float, fixed: bool) -> None:
    assert opened(jitter_s, fixed) == [("S1", (4,))]


@pytest.mark.parametrize("jitter_s", [0.5, 2.0])
def test_unevenly_delivered_the_slow_rank_alone_is_named(jitter_s: float) -> None:
    assert opened(jitter_s, fixed=False) == [("S1", (4,))]
