"""The fleet benchmark's own parts: its draw puts each bad host's fault in the jobs placed on it and nowhere
else, and its timeline flags a host when the tracker's rule is met (synthetic events: no job analyzed)."""

from __future__ import annotations

from types import ModuleType

import pytest

from ccld.producers.simulator.scenario import Scenario
from factories import load_benchmark

H = 3600.0


@pytest.fixture(scope="module")
def fl() -> ModuleType:
    return load_benchmark("fleet", "fleet_bench")


def test_the_draw_places_jobs_on_named_hosts_and_the_bad_hosts_faults_only_where_they_are(fl: ModuleType) -> None:
    day = fl.draw_fleet(7, 24, 64, 120.0, 0.25, days=2)
    assert day == fl.draw_fleet(7, 24, 64, 120.0, 0.25, days=2), "the same seed draws the same days"
    assert len(day["jobs"]) == 48 and len(set(day["bad"].values())) == 3
    for j in day["jobs"]:
        sc = Scenario.from_dict(j["scenario"])
        assert list(sc.hosts) == j["hosts"] and len(sc.hosts) == sc.nodes
        assert 0 <= j["start_s"] <= 2 * fl.DAY_S - sc.duration_s
        for role in j["bad_roles"]:
            host = day["bad"][role]
            assert host in j["hosts"]
            kinds = {f["kind"] for f in j["scenario"]["faults"]}
            assert {"slow-gpu": "S1", "flaky-nic": "S2", "hanging-gpu": "H1"}[role] in kinds
    on_bad = [j for j in day["jobs"] if set(j["hosts"]) & set(day["bad"].values())]
    assert any(j["bad_roles"] for j in on_bad), "no job on a bad host got its fault"


def test_the_timeline_flags_a_host_when_the_rule_is_met_and_counts_the_jobs_before(fl: ModuleType) -> None:
    bad = {"slow-gpu": "b1", "flaky-nic": "b2", "hanging-gpu": "b3"}
    placed = [(0.0, ["b1", "g1"]), (1 * H, ["b1"]), (2 * H, ["b1", "g2"]), (3 * H, ["b1"]), (5 * H, ["b1"])]
    events = [[n * H + 60, f"i{n}", f"job-{n}", "S1", ["b1"]] for n in range(4)]
    events += [[n * H + 90, f"g{n}", f"job-{n}", kind, ["g1"]] for n, kind in enumerate(("S1", "S2", "H2", "H3"))]
    res = fl.timeline(bad, placed, events, (4, 2), fl.DAY_S, fl.DAY_S)
    assert res["flagged_bad"] == ["b1"] and res["flagged_good"] == [], res
    assert res["bad_hosts"]["slow-gpu"] == {"host": "b1", "flagged_h": round((3 * H + 60) / H, 2),
                                            "jobs_placed_before": 4, "jobs_placed": 5}
    assert res["recall"] == pytest.approx(1 / 3) and res["precision"] == 1.0
    assert fl.timeline(bad, placed, events, (5, 2), fl.DAY_S, fl.DAY_S)["flagged_bad"] == []
