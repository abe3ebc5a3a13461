"""The cluster's view: a host is a drain candidate after enough incidents of enough jobs, victims never count."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccld.records import AnomalyKind, Verdict, VerdictState
from ccld.sinks.fleet import DAY_S, FleetSettings, HostTracker, describe
from factories import make_verdict

H = 3600.0
#: the rule these tests read most easily: 3 incidents of one part in 2 jobs within a week (the defaults: below)
WEEK3 = FleetSettings(min_incidents=3, min_jobs=2, window_s=7 * DAY_S)


def incident(iid: str, job: str, host: str | tuple[str, ...], t: float, kind: AnomalyKind = AnomalyKind.S1,
             state: VerdictState = VerdictState.OPEN) -> Verdict:
    hosts = (host,) if isinstance(host, str) else host
    return make_verdict(incident_id=iid, job=job, kind=kind, state=state, root_cause_hosts=hosts, detected_time=t,
                        evidence=f"{kind.value} on {hosts[0]}")


def test_three_incidents_of_two_jobs_make_a_candidate_and_one_jobs_restarts_do_not() -> None:
    tr = HostTracker(WEEK3)
    tr.observe_all([incident("a1", "job-a", "bad", 1 * H), incident("a2", "job-a", "bad", 2 * H)])
    assert tr.candidates(3 * H) == []
    tr.observe(incident("b1", "job-b", "bad", 4 * H, AnomalyKind.H1))
    (h,) = tr.candidates(5 * H)
    assert (h.host, h.incidents, h.jobs, h.by_kind, h.part) == ("bad", 3, 2, {"S1": 2, "H1": 1}, "gpu")
    assert "DRAIN CANDIDATE" in describe(h) and "3 incidents" in describe(h)
    # one job restarted on the same host, hitting the same rank every time: its own bug, one job
    tr2 = HostTracker(WEEK3).observe_all([incident(f"r{i}", "job-r", "h", i * H) for i in range(5)])
    assert tr2.candidates(6 * H) == [] and tr2.standings(6 * H)[0].incidents == 5


@pytest.mark.parametrize(("kinds", "part"), [
    ((AnomalyKind.S2, AnomalyKind.H3, AnomalyKind.S3), "network"),
    ((AnomalyKind.S1, AnomalyKind.S3, AnomalyKind.H1), "gpu"),
    ((AnomalyKind.H2, AnomalyKind.H2, AnomalyKind.H2), "software"),
    ((AnomalyKind.S1, AnomalyKind.S2, AnomalyKind.H2), None),  # three unrelated faults: no part failed twice
    ((AnomalyKind.H1, AnomalyKind.H3, AnomalyKind.S1), None),
])  # fmt: skip
def test_a_candidate_is_one_part_of_the_machine_failing_again(kinds: tuple[AnomalyKind, ...], part: str | None) -> None:
    tr = HostTracker(WEEK3).observe_all([incident(f"i{n}", f"job-{n}", "h", n * H, k) for n, k in enumerate(kinds)])
    (h,) = tr.standings(4 * H)
    assert (h.part if h.candidate else None) == part and h.incidents == 3


def test_every_state_of_an_incident_is_one_incident_at_its_first_report_with_its_newest_claim() -> None:
    tr = HostTracker()
    tr.observe(incident("i", "j", "h1", 10.0, AnomalyKind.S1))
    tr.observe(incident("i", "j", "h2", 30.0, AnomalyKind.S3, VerdictState.UPDATE))  # a better root cause
    tr.observe(make_verdict(incident_id="i", job="j", state=VerdictState.CLOSED, detected_time=90.0))  # no hosts
    tr.observe(incident("i", "j", "h2", 5.0, AnomalyKind.S3, VerdictState.UPDATE))  # read out of order
    (h,) = tr.standings(100.0)
    assert (h.host, h.incidents, h.by_kind, h.first_s) == ("h2", 1, {"S3": 1}, 5.0)


def test_victims_never_count_and_an_incident_naming_many_hosts_blames_no_one() -> None:
    v = make_verdict(incident_id="x", job="j", root_cause_hosts=("root",), affected_ranks=tuple(range(64)),
                     detected_time=1.0)
    tr = HostTracker().observe_all([v])
    assert [h.host for h in tr.standings(2.0)] == ["root"]
    wide = HostTracker(FleetSettings(min_incidents=1, min_jobs=1))
    wide.observe_all([incident(f"w{i}", f"j{i}", ("a", "b", "c"), float(i)) for i in range(4)])
    assert all(h.incidents == 0 and h.spread == 4 and not h.candidate for h in wide.standings(10.0))
    pair = HostTracker(FleetSettings(min_incidents=1, min_jobs=1)).observe_all([incident("p", "j", ("a", "b"), 1.0)])
    assert {h.host: h.score for h in pair.standings(1.0)} == pytest.approx({"a": 0.5, "b": 0.5})  # a link: both ends


def test_the_score_halves_each_half_life_and_the_window_forgets() -> None:
    st = FleetSettings(window_s=2 * DAY_S, half_life_s=DAY_S, min_incidents=3)
    tr = HostTracker(st).observe_all([incident("a", "j1", "h", 0.0), incident("b", "j2", "h", 0.0),
                                      incident("c", "j3", "h", 0.0)])
    assert tr.standings(0.0)[0].score == pytest.approx(3.0)
    assert tr.standings(DAY_S)[0].score == pytest.approx(1.5) and tr.standings(DAY_S)[0].candidate
    assert tr.standings(2 * DAY_S + 1) == []  # out of the window: not a candidate any more
    tr.forget_before(1.0)
    assert tr.incidents == {}


def test_the_default_rule_four_incidents_of_one_part_in_two_jobs_within_a_day() -> None:
    """The defaults benchmarks/fleet.py chose (RESULTS.md): a host that fails three times a day, or four times
    over two days, is watched, not drained."""
    three = HostTracker().observe_all([incident(f"a{n}", f"j{n}", "h", n * H) for n in range(3)])
    assert three.candidates(3 * H) == []
    four = HostTracker().observe_all([incident(f"a{n}", f"j{n % 2}", "h", n * H) for n in range(4)])
    assert [h.host for h in four.candidates(4 * H)] == ["h"]
    slow = HostTracker().observe_all([incident(f"a{n}", f"j{n}", "h", n * 12 * H) for n in range(4)])
    assert slow.candidates(36 * H) == [] and slow.standings(36 * H)[0].incidents == 3  # the first left the window


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        FleetSettings(min_jobs=0)


def test_the_sink_keeps_the_view_over_what_it_archives_and_seeds_it_from_the_archive_at_start(
        tmp_path: Path) -> None:
    """The sink (always a service of ccld up) feeds every verdict it takes to its tracker; a restarted sink
    starts from the verdicts its archive holds, so its ccld_host_suspect_score survives the restart."""
    import time as _time

    from ccld.metrics import render
    from ccld.schemas.codec import encode_verdict
    from ccld.settings import Settings
    from ccld.sinks.archiver import Archiver
    from ccld.sinks.sink_metrics import archiver_families
    from report_archive import write_fleet_archive

    now = _time.time()
    s = Settings.load({}, bootstrap="127.0.0.1:1", archive_dir=str(tmp_path))
    write_fleet_archive(tmp_path, now, s.verdicts_topic)
    arch = Archiver(s)
    arch._seed_fleet()
    arch._update_hosts()
    assert [h.host for h in arch.hosts if h.candidate] == ["gpu-bad"]

    class Ids:
        def labels(self, topics: object, timeout_s: float) -> dict[str, str]:
            return {s.verdicts_topic: "id-" + "f" * 32}

    arch._ids = Ids()
    for n, job in enumerate(("n1", "n2", "n3")):
        v = make_verdict(incident_id=f"new-{n}", job=job, kind=AnomalyKind.S2, root_cause_hosts=("gpu-nic",),
                         detected_time=now - 60)
        arch._take(None, s.verdicts_topic, 0, 100 + n, int(now * 1000), encode_verdict(v))
    arch._hosts_at = 0.0
    arch._update_hosts()
    assert sorted(h.host for h in arch.hosts if h.candidate) == ["gpu-bad", "gpu-nic"]
    text = render(archiver_families(arch))
    assert 'ccld_host_drain_candidate{host="gpu-nic"} 1' in text and 'ccld_host_incidents{host="gpu-nic"} 5' in text
