"""The state-log and soak benchmarks' own parts: the state-log run on a few jobs shows what it reports (the
per-job layout writes fewer bytes and smaller messages than one blob), and the soak's day draws what it says."""

from __future__ import annotations

import argparse

from ccld.producers.simulator.scenario import Scenario
from factories import load_benchmark


def test_the_state_log_run_compares_both_layouts_on_the_same_stream() -> None:
    bench = load_benchmark("state_log", "state_log_bench")
    res = bench.run(argparse.Namespace(jobs=4, job_s=40.0, every_s=15.0, expiry_s=30.0, seed=3, repeat=1))
    assert res["jobs_held_max"] >= 2 and res["jobs_held_end"] == 0
    blob, parts = res["one_blob"], res["parts"]
    assert parts["tombstones"] == 4, "every forgotten job's part is deleted"
    assert parts["largest"] < blob["largest"] and parts["bytes"] < blob["bytes"]
    assert res["compacted_end"]["messages"] == 1, "once every job is forgotten a compacted log holds the head"
    assert res["compacted_busiest"]["messages"] == res["jobs_held_max"] + 1


def test_the_soak_day_is_valid_scenarios_with_a_fault_in_every_third() -> None:
    soak = load_benchmark("soak", "soak_bench")
    day = soak.scenarios(30, 5)
    assert day == soak.scenarios(30, 5)
    scs = [Scenario.from_dict(d) for d in day]
    assert {sc.ranks for sc in scs} <= set(soak.RANKS) and len({sc.id for sc in scs}) == 30
    faulty = [sc for sc in scs if sc.faults]
    assert len(faulty) == 10 and all(len(sc.expect) == 1 and sc.expect[0].rank == sc.faults[0].rank for sc in faulty)


def test_the_soak_schedule_leaves_its_idle_time_after_each_wave_s_last_job() -> None:
    soak = load_benchmark("soak", "soak_bench")
    scs = [Scenario.from_dict(d) for d in soak.scenarios(7, 2)]
    starts = soak.schedule(scs, 3, 1.5, 30.0)
    assert starts[:3] == [0.0, 1.5, 3.0]
    first_end = max(st + sc.duration_s for sc, st in zip(scs[:3], starts[:3], strict=True))
    assert starts[3] == first_end + 30.0 and starts[4] == starts[3] + 1.5
    running = [(st, st + sc.duration_s) for sc, st in zip(scs, starts, strict=True)]
    assert not any(a < starts[3] < b for a, b in running[:3]), "no job of the first wave runs into the idle time"


def test_the_soak_timeline_sends_every_batch_of_every_job_in_time_order() -> None:
    from ccld.producers.simulator.sim import simulate

    soak = load_benchmark("soak", "soak_bench")
    scs = [Scenario.from_dict({**d, "ranks": 8, "layout": {"tp": 2, "pp": 2, "dp": 2}, "duration_s": 12.0,
                               "faults": [], "expect": []})
           for d in soak.scenarios(5, 4)]
    starts = [0.0, 3.0, 3.0, 20.0, 21.5]
    got = list(soak._timeline(scs, starts))
    assert [ts for ts, _, _ in got] == sorted(ts for ts, _, _ in got)
    for i, sc in enumerate(scs):
        mine = [b.n for _, j, b in got if j == i]
        assert mine == [b.n for _, b in simulate(sc, job=sc.id)], sc.id
