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

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import Verdict
from ccld.schemas.codec import encode_batch
from ccld.settings import AnalyzerSettings
from ccld.streams.processor import PartitionProcessor

T0 = 1_800_000_000.0
#: the soak's job soak-1-00010: two tensor groups of four in a two-stage pipeline, healthy, for a minute
JOB = {"id": "soak-1-00010", "seed": 100_010, "ranks": 8, "layout": {"tp": 4, "pp": 2, "dp": 1}, "channels": 2,
       "step_time_s": 1.0, "duration_s": 60.0, "faults": [], "expect": []}


def run(behind_at_s: float | None, job: dict[str, object] = JOB) -> list[Verdict]:
    """The job's messages and the timer's ticks (1 s) in wall-time order, 70 s past the end; from
    ``behind_at_s`` after the end two ticks are told the worker is behind."""
    sc = Scenario.from_dict(job)
    proc = PartitionProcessor(0, AnalyzerSettings())
    out: list[Verdict] = []

    def keep(vs: list[tuple[Verdict, bytes]]) -> None:
        for v, _ in vs:
            proc.mark_sent(v)
            out.append(v)

    tick = T0 + 1.0
    end = T0
    for off, (t, b) in enumerate(simulate(sc, job=sc.id)):
        while T0 + t >= tick:
            keep(proc.tick(tick, caught_up=True))
            tick += 1.0
        keep(proc.handle(encode_batch(b), topic="m", offset=off, timestamp_s=T0 + t, recv_s=T0 + t).verdicts)
        end = T0 + t
    while tick < end + 70.0:
        behind = behind_at_s is not None and end + behind_at_s <= tick < end + behind_at_s + 2.0
        keep(proc.tick(tick, caught_up=not behind))
        tick += 1.0
    return out


@pytest.mark.parametrize("behind_at_s", [None, 5.0, 30.0, 50.0])
def test_an_ended_job_stays_quiet_when_the_worker_falls_behind_after_its_end(behind_at_s: float | None) -> None:
    opened = [v.describe() for v in run(behind_at_s) if v.state.value == "open"]
    assert opened == []


def test_a_hang_is_still_found_when_the_worker_falls_behind_during_it() -> None:
    hung = {**JOB, "id": "hung", "faults": [{"kind": "H1", "rank": 5, "onset_s": 20.0}],
            "expect": [{"kind": "H1", "rank": 5}]}
    opened = [(v.kind.value, v.root_cause_ranks) for v in run(10.0, hung) if v.state.value == "open"]
    assert opened == [("H1", (5,))]
