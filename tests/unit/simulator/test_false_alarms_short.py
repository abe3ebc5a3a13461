"""The false-alarm benchmark, short: its own functions on a few small healthy jobs of a few simulated
minutes (no verdict), one late fault (found), and its counting and bound on planted verdicts."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from ccld.producers.simulator.scenario import Scenario
from ccld.records import AnomalyKind, Verdict, VerdictState
from factories import load_benchmark

pytestmark = pytest.mark.slow

SEED = 19


@pytest.fixture(scope="module")
def fa() -> ModuleType:
    return load_benchmark("false_alarms", "false_alarms_bench")  # pickling JobResult needs the module registered


def planted(kind: str, state: str, t: float, iid: str = "i1") -> Verdict:
    return Verdict(incident_id=iid, state=VerdictState(state), kind=AnomalyKind(kind), job="j",
                   communicator="0" * 16, op_seq=1, op_type="ALL_REDUCE", root_cause_ranks=(3,),
                   affected_ranks=(3,), confidence=0.9, evidence="planted", onset_time=t - 5, detected_time=t)


def test_poisson_bound_is_the_exact_chi_square_one(fa: ModuleType) -> None:
    # chi2.ppf(0.975, 2k + 2) / 2 for k = 0, 1, 2, 10
    for k, want in ((0, 3.6889), (1, 5.5716), (2, 7.2247), (10, 18.3904)):
        assert fa.poisson_upper(k) == pytest.approx(want, abs=1e-3)
    row = fa.rate_row(0, 48.0)  # the 48 job-hours without an alarm: at most 1.84 per job-day
    assert row["upper95_per_job_day"] == pytest.approx(3.6889 / 2, abs=1e-3)


def test_the_counting_sees_a_planted_verdict(fa: ModuleType) -> None:
    raw = fa.draw_job(SEED, 0, duration_s=600.0)
    raw["faults"] = [{"kind": "transient", "rank": 1, "onset_s": 300.0, "delay_s": 2.0}]
    raw["clock_skew_s"], raw["clock_drift_ppm"] = 0.0, 0.0
    raw["workload"].pop("pause_rate", None)
    raw["workload"].pop("eval_every", None)
    vs = [planted("S1", "open", 320.0), planted("S1", "update", 330.0), planted("S1", "resolved", 340.0),
          planted("H1", "open", 590.0, "i2")]
    res = fa.JobResult(0, raw, 1.0, 1, 1, 600.0, 1.0, [v.to_dict() for v in vs])
    clean = fa.JobResult(1, {**raw, "id": "other"}, 1.0, 1, 1, 600.0, 1.0, [])
    s = fa.summarize([res, clean])
    assert s["overall"]["false_alarms"] == 2  # OPENs only: the update and the resolution are the same incident
    assert s["overall"]["job_hours"] == pytest.approx(1200 / 3600, abs=1e-3)
    assert s["by_class"]["S1"] == 1 and s["by_class"]["H1"] == 1
    assert s["by_noise"]["transient"]["false_alarms"] == 1  # the S1 began 15 s after the transient
    assert s["by_noise"]["jitter"]["false_alarms"] == 2
    assert s["false_alarms_without_event"] == 1  # the H1: nothing but jitter around it
    assert s["false_alarms_list"][0]["noise"] == ["jitter", "transient"]


def test_a_late_faults_healthy_time_is_exposure_and_its_early_verdicts_false_alarms(fa: ModuleType) -> None:
    raw = fa.add_late_fault(fa.draw_job(SEED, 0, duration_s=600.0), 0, SEED)
    onset = Scenario.from_dict(raw).faults[-1].onset_s
    assert onset >= 0.8 * 600 and raw["expect"] == [{"kind": "H1", "rank": raw["faults"][-1]["rank"]}]
    res = fa.JobResult(0, raw, 1.0, 1, 1, 600.0, 1.0,
                       [planted("S2", "open", onset - 50).to_dict(), planted("H1", "open", onset + 30, "i2").to_dict()])
    s = fa.summarize([res])
    assert s["overall"]["false_alarms"] == 1 and s["overall"]["job_hours"] == pytest.approx(onset / 3600)


def test_drawn_jobs_are_reproducible_and_carry_every_noise_kind(fa: ModuleType) -> None:
    jobs = [fa.draw_job(SEED, i) for i in range(300)]
    assert jobs[7] == fa.draw_job(SEED, 7)
    assert {j["ranks"] for j in jobs} == set(fa.SIZES)
    assert min(j["duration_s"] for j in jobs) >= 600 and max(j["duration_s"] for j in jobs) > 3 * 3600
    kinds = {k for j in jobs for k in fa.noise_windows(Scenario.from_dict(j))}
    assert kinds == set(fa.NOISE_KINDS)
    assert max(f["delay_s"] for j in jobs for f in j["faults"] if f["kind"] == "transient") > 3.0


def test_short_healthy_jobs_give_no_verdict(fa: ModuleType) -> None:
    played = [fa.play(i, fa.draw_job(SEED, i, duration_s=240.0, max_ranks=32)) for i in range(4)]
    assert {k for r in played for k in fa.noise_windows(Scenario.from_dict(r.scenario))} >= {
        "jitter", "pauses", "checkpoint", "transient"}
    for r in played:
        assert r.batches > 0 and r.sim_s > 200
        assert r.verdicts == [], (r.scenario["id"], [Verdict.from_dict(v).describe() for v in r.verdicts])
    assert fa.summarize(played)["overall"]["false_alarms"] == 0


def test_the_any_shape_draws_noisy_pipeline_job_gives_no_verdict(fa: ModuleType) -> None:
    """Job 2 of the any-shape draw of seed 35 (64 ranks, tp 8 x pp 4 x dp 2, jitter 0.077, 760-ms pauses
    at 4.7 % a second), its first 1,080 s: healthy throughout. Before the rules it met, an S2 on a
    pipeline send 1.3-1.4x its baseline in 2 ops of 5 (a link named on ops some rank was merely late in)
    and an S1 on a stage whose two late recvs in the window were one 652-ms pause and one normal gap
    (their mean passed for slowness)."""
    raw = fa.draw_job(35, 2, any_shape=True)
    raw["duration_s"] = 1080.0  # past both, a quarter of the job's time cut
    raw["faults"] = [f for f in raw["faults"] if f["onset_s"] < raw["duration_s"]]
    assert raw["layout"] == {"tp": 8, "pp": 4, "dp": 2} and raw["workload"]["pause_ms"] > 500
    r = fa.play(2, raw)
    assert r.sim_s > 1000
    assert r.verdicts == [], [Verdict.from_dict(v).describe() for v in r.verdicts]


def test_one_late_fault_is_found(fa: ModuleType) -> None:
    raw = fa.add_late_fault(fa.draw_job(SEED, 0, duration_s=240.0, max_ranks=16), 0, SEED)
    rep = fa.late_fault_report([fa.play(0, raw)])
    assert rep["overall"]["recall"] == 1.0 and rep["overall"]["precision"] == 1.0
    assert rep["overall"]["hang_ttv_p95_s"] < 60


def test_cli_writes_its_report(fa: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fa.json"
    assert fa.main(["--seed", str(SEED), "--jobs", "1", "--max-ranks", "8", "--max-duration-s", "90",
                    "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["false_alarms"]["jobs"] == 1 and rep["jobs"][0]["scenario"]["duration_s"] == 90
    assert "job-h" in capsys.readouterr().out


def test_cli_with_worker_processes(fa: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "fa.json"
    assert fa.main(["--seed", str(SEED), "--jobs", "2", "--workers", "2", "--max-ranks", "8",
                    "--max-duration-s", "60", "--out", str(out)]) == 0
    assert [j["index"] for j in json.loads(out.read_text())["jobs"]] == [0, 1]


def test_runs_continued_with_start_merge_into_the_one_run_of_both(fa: ModuleType, tmp_path: Path) -> None:
    common = ["--seed", str(SEED), "--max-ranks", "8", "--max-duration-s", "60"]
    whole, first, rest, merged = (tmp_path / f"{n}.json" for n in ("whole", "first", "rest", "merged"))
    assert fa.main([*common, "--jobs", "2", "--out", str(whole)]) == 0
    assert fa.main([*common, "--jobs", "1", "--out", str(first)]) == 0
    assert fa.main([*common, "--jobs", "1", "--start", "1", "--out", str(rest)]) == 0
    assert fa.main(["--merge", str(first), str(rest), "--out", str(merged)]) == 0
    one, two = json.loads(whole.read_text()), json.loads(merged.read_text())
    assert two["false_alarms"] == one["false_alarms"]
    assert [j["index"] for j in two["jobs"]] == [0, 1]
    with pytest.raises(SystemExit, match="more than one report"):  # a job counted twice is refused
        fa.main(["--merge", str(first), str(whole)])
    other = json.loads(first.read_text()) | {"seed": SEED + 1}
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="different draws"):
        fa.main(["--merge", str(rest), str(tmp_path / "other.json")])


def test_a_replayed_job_replaces_its_first_play_in_the_merge(fa: ModuleType, tmp_path: Path) -> None:
    """A job played again (on a newer analyzer) replaces its first play; one no report played first is refused."""
    common = ["--seed", str(SEED), "--max-ranks", "8", "--max-duration-s", "60"]
    both, again, merged = (tmp_path / f"{n}.json" for n in ("both", "again", "merged"))
    assert fa.main([*common, "--jobs", "2", "--out", str(both)]) == 0
    assert fa.main([*common, "--jobs", "1", "--start", "1", "--out", str(again)]) == 0
    first = json.loads(both.read_text())
    first["jobs"][1]["verdicts"] = [{"marker": "the first play's"}]  # told apart from the replay
    both.write_text(json.dumps(first))
    assert fa.main(["--merge", str(both), "--replayed", str(again), "--out", str(merged)]) == 0
    out = json.loads(merged.read_text())
    assert [j["index"] for j in out["jobs"]] == [0, 1]
    assert out["jobs"][1]["verdicts"] == json.loads(again.read_text())["jobs"][0]["verdicts"]
    assert out["jobs"][1]["replayed_from"] == str(again) and out["replayed"] == {str(again): [1]}
    assert out["commits"] and "unknown" not in out["commits"][0]
    only_one = tmp_path / "one.json"
    assert fa.main([*common, "--jobs", "1", "--out", str(only_one)]) == 0
    with pytest.raises(SystemExit, match="no report played first"):
        fa.main(["--merge", str(only_one), "--replayed", str(again)])
