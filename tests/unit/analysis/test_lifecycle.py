"""Every incident ends (issue 17, item 2): resolved when progress resumes, closed when its job goes silent.

The state machine (docs/wire-format.md): ``open`` -> ``update``* -> ``resolved`` | ``closed``. A hung
job that is killed never makes progress again; before, its incident stayed open forever and an
alert fed from it paged forever.
"""

from __future__ import annotations

import dataclasses

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import Verdict
from ccld.settings import AnalyzerSettings
from ccld.streams.analysis.analyzer import Analyzer


def hung_job(duration_s: float) -> Scenario:
    return Scenario.from_dict({
        "id": "life", "seed": 5, "ranks": 8, "layout": {"tp": 4, "pp": 1, "dp": 2}, "channels": 2,
        "step_time_s": 1.0, "duration_s": duration_s, "clock_skew_s": 1.0, "jitter": 0.02,
        "faults": [{"kind": "H1", "rank": 5, "onset_s": 10.0}], "expect": [{"kind": "H1", "rank": 5}],
    })


def run(a: Analyzer, sc: Scenario, until_s: float) -> list[Verdict]:
    """The job's records in time order, an evaluation every second, then the clock runs on to ``until_s``."""
    out: list[Verdict] = []
    tick = 1.0
    for t, b in simulate(sc):
        while t >= tick:
            out += a.evaluate(tick)
            tick += 1.0
        a.ingest(b, t)
    while tick <= until_s:
        out += a.evaluate(tick)
        tick += 1.0
    return out


def test_a_hung_job_that_is_killed_has_its_incident_closed_with_the_reason() -> None:
    # the job hangs at 10 s, is reported at about 30 s, and is killed at 45 s: nothing more comes
    s = dataclasses.replace(AnalyzerSettings(), incident_close_silent_s=30.0)
    got = run(Analyzer(s), hung_job(45.0), until_s=120.0)
    states = [(v.state.value, v.kind.value, v.root_cause_ranks) for v in got]
    assert states == [("open", "H1", (5,)), ("closed", "H1", (5,))], states
    closed = got[-1]
    assert got[0].incident_id == closed.incident_id
    assert 45.0 + 30.0 <= closed.detected_time <= 45.0 + 30.0 + 2.0, closed.detected_time
    assert "job silent for" in closed.details["closed"]


def test_a_job_that_goes_on_reporting_keeps_its_incident_open() -> None:
    s = dataclasses.replace(AnalyzerSettings(), incident_close_silent_s=30.0)
    got = run(Analyzer(s), hung_job(110.0), until_s=110.0)
    assert [v.state.value for v in got] == ["open"], [v.describe() for v in got]


def test_a_job_that_ends_before_its_hang_is_called_opens_no_incident_after_its_end() -> None:
    # the job hangs at 10 s and every rank goes silent 2 s later, long before the hang's threshold: once it
    # has been silent incident_close_silent_s it has ended, and the stall standing then is no new fault
    # (before, it was opened and closed in one evaluation: a page about a job already gone)
    s = dataclasses.replace(AnalyzerSettings(), incident_close_silent_s=5.0)
    got = run(Analyzer(s), hung_job(12.0), until_s=120.0)
    assert got == [], [v.describe() for v in got]
