"""``ccld status``'s pure part: ranks grouped by what they do, who waits for whom, merged across workers."""

from __future__ import annotations

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.streams.analysis.analyzer import Analyzer
from ccld.streams.status import job_status, merge, ranges, render, short_ranges


def test_ranges_and_short_ranges() -> None:
    assert ranges([5, 0, 1, 2, 9, 10, 3]) == "0-3,5,9-10"
    assert ranges([]) == ""
    strided = list(range(13, 4096, 32))
    assert short_ranges(strided, 4) == "13,45,77,109,... (128 ranks)"
    assert short_ranges([1, 2, 3], 4) == "1-3"


def hung(ranks: int = 16) -> tuple[Analyzer, float]:
    sc = Scenario.from_dict({
        "id": "st", "seed": 5, "ranks": ranks, "layout": {"tp": 4, "pp": 1, "dp": ranks // 4}, "channels": 2,
        "step_time_s": 1.0, "duration_s": 50.0, "clock_skew_s": 1.0, "jitter": 0.02,
        "faults": [{"kind": "H1", "rank": 6, "onset_s": 15.0}], "expect": [],
    })
    a = Analyzer()
    tick = 1.0
    for t, b in simulate(sc):
        while t >= tick:
            a.evaluate(tick)
            tick += 1.0
        a.ingest(b, t)
    a.evaluate(tick)
    return a, tick


def test_a_hung_job_status_names_the_idle_rank_the_waiters_and_the_incident() -> None:
    a, now = hung()
    st = job_status(a, "st", now)
    assert st["ranks"] == 16 and st["incarnation"] == 0
    idle = [d["ranks"] for d in st["doing"] if d["state"] == "in no collective"]
    assert idle == ["6"], st["doing"]
    assert sum(d["n"] for d in st["doing"] if d["state"] == "waiting in a stalled op") == 15
    assert [(w["kind"], w["roots"]) for w in st["waits"]] == [("H1", "6")]
    assert [(i["kind"], i["roots"]) for i in st["incidents"]] == [("H1", "6")]
    assert st["comms"] and all(c["stalled_s"] > 0 for c in st["comms"])
    text = render(st)
    assert "1 ranks (6): in no collective" in text and "wait for ranks 6 (H1)" in text


def test_an_unknown_job_and_the_merge_of_two_workers() -> None:
    a, now = hung()
    assert "no worker holds it" in render(job_status(a, "other", now))
    st = job_status(a, "st", now)
    half = dict(st, comms=st["comms"][:1], doing=[{"state": "inside a moving op", "op": "all_reduce",
                                                   "ranks": "6", "n": 1}])
    both = merge([half, st])
    # a rank is what its most telling part says: 6 is in no collective in one part, moving in the other
    # (its communicators are spread over the workers: inside one, it is not idle)
    assert [d["ranks"] for d in both["doing"] if d["state"] == "inside a moving op"] == ["6"]
    assert [d["ranks"] for d in both["doing"] if d["state"] == "in no collective"] == []
    assert len(both["comms"]) == len(st["comms"]) and both["incidents"] == st["incidents"]
