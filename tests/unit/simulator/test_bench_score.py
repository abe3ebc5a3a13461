"""Scoring math of ``ccld bench accuracy`` on hand-made verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ccld.producers.simulator.scenario import Scenario
from ccld.records import AnomalyKind, Verdict, VerdictState
from ccld.stack.bench import incidents, plot_confusion, score


def sc(sid: str, expect: list[tuple[str, int]], faults: list[dict[str, Any]] | None = None) -> Scenario:
    return Scenario.from_dict({"id": sid, "ranks": 16, "duration_s": 300,
                               "faults": faults if faults is not None else [
                                   {"kind": k, "rank": r, "onset_s": 100} for k, r in expect],
                               "expect": [{"kind": k, "rank": r} for k, r in expect]})


def v(iid: str, kind: str, ranks: tuple[int, ...], t: float, state: str = "open") -> Verdict:
    return Verdict(incident_id=iid, state=VerdictState(state), kind=AnomalyKind(kind), job="j",
                   communicator="0" * 16, op_seq=1, op_type="ALL_REDUCE", root_cause_ranks=ranks,
                   affected_ranks=(), confidence=0.9, evidence="", onset_time=t - 5, detected_time=t)


def test_updates_of_one_incident_count_once_and_the_latest_decides() -> None:
    incs = incidents([v("a", "S2", (3,), 110), v("a", "S3", (3,), 120, "update"), v("a", "S3", (3,), 130, "resolved")])
    assert len(incs) == 1 and incs[0].final.kind == AnomalyKind.S3 and incs[0].resolved


def test_overall_metrics() -> None:
    scenarios = [
        sc("h1", [("H1", 3)]),
        sc("s2", [("S2", 5)]),
        sc("s1", [("S1", 7)]),
        sc("two", [("H3", 1), ("S1", 9)]),
        sc("healthy", []),
    ]
    verdicts = {
        "h1": [v("i1", "H1", (3,), 125), v("i1", "H1", (3,), 140, "update")],  # correct, TTV 25
        "s2": [v("i2", "S3", (5,), 112)],  # rank right, class wrong
        "s1": [v("i3", "S1", (8,), 110)],  # wrong rank
        "two": [v("i4", "S1", (9,), 105), v("i5", "H3", (1, 2), 160)],  # both correct: TTV 5 and 60
        "healthy": [v("i6", "S2", (0,), 50), v("i7", "S2", (0,), 60)],  # two false alarms
    }
    r = score(scenarios, verdicts)
    o = r["overall"]
    assert o["expected"] == 5 and o["incidents"] == 7
    assert o["recall"] == pytest.approx(3 / 5)
    assert o["precision"] == pytest.approx(3 / 7)
    assert o["rank_accuracy"] == pytest.approx(4 / 5)
    assert o["class_accuracy"] == pytest.approx(3 / 4)
    assert o["false_alarms"] == 2
    assert o["ttv_p50_s"] == pytest.approx(25) and o["ttv_p95_s"] == pytest.approx(60)
    assert o["hang_ttv_p95_s"] == pytest.approx(60) and o["slow_ttv_p95_s"] == pytest.approx(5)
    assert [row["ok"] for row in r["scenarios"]] == [True, False, False, True, False]
    assert r["per_class"]["S2"] == {"expected": 1, "matched": 0, "recall": 0.0, "incidents": 2, "precision": 0.0,
                                    "ttv_p50_s": None, "ttv_p95_s": None}
    conf = r["confusion"]
    row = conf["rows"].index("S2")
    assert conf["counts"][row][conf["cols"].index("S3")] == 1
    assert conf["counts"][conf["rows"].index("S1")][conf["cols"].index("missed")] == 1
    assert conf["counts"][conf["rows"].index("none")][conf["cols"].index("S2")] == 2


def test_ttv_uses_the_first_correct_update_and_the_matching_fault_onset() -> None:
    s = sc("x", [("S1", 2)], faults=[{"kind": "transient", "rank": 1, "onset_s": 30},
                                     {"kind": "S1", "rank": 2, "onset_s": 90}])
    r = score([s], {"x": [v("a", "S3", (2,), 100), v("a", "S1", (2,), 112, "update")]})
    assert r["scenarios"][0]["expectations"][0]["ttv_s"] == pytest.approx(22)


def test_no_verdicts_at_all() -> None:
    r = score([sc("h", []), sc("f", [("H2", 4)])], {})
    o = r["overall"]
    assert o["precision"] is None and o["recall"] == 0.0 and o["false_alarms"] == 0 and o["ttv_p95_s"] is None


def test_confusion_png(tmp_path: Path) -> None:
    r = score([sc("f", [("H2", 4)])], {"f": [v("a", "H2", (4,), 120)]})
    out = tmp_path / "c.png"
    plot_confusion(r["confusion"], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_accuracy_cli_writes_report_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ccld.streams.analysis.analyzer", reason="the analyzer is not merged yet")
    import json

    from ccld.cli import main

    suite = tmp_path / "s.jsonl"
    rows = [{"id": "h", "ranks": 8, "duration_s": 40, "step_time_s": 1.0},
            {"id": "f", "ranks": 8, "duration_s": 70, "step_time_s": 1.0,
             "faults": [{"kind": "H1", "rank": 5, "onset_s": 30}], "expect": [{"kind": "H1", "rank": 5}]}]
    suite.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "r" / "report.json"
    assert main(["bench", "accuracy", "--scenarios", str(suite), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["overall"]) >= {"precision", "recall", "rank_accuracy", "class_accuracy", "false_alarms",
                                      "ttv_p50_s", "ttv_p95_s", "hang_ttv_p95_s", "slow_ttv_p95_s"}
    assert [s["id"] for s in report["scenarios"]] == ["h", "f"]
    assert all({"id", "expected", "verdicts", "ok"} <= set(s) for s in report["scenarios"])
    assert out.with_suffix(".png").is_file()
    printed = capsys.readouterr().out
    assert "[1/2]" in printed and "[2/2]" in printed and "precision" in printed


def test_a_fault_reported_as_three_incidents_counts_two_extra() -> None:
    """A flapping link re-opened per episode: still matched (recall 1), but 3 incidents for 1 fault."""
    scenarios = [sc("flap", [("S2", 5)]), sc("once", [("H1", 3)])]
    verdicts = {
        "flap": [v("a", "S2", (5, 6), 110), v("b", "S2", (5, 6), 150), v("c", "S2", (5, 6), 190)],
        "once": [v("d", "H1", (3,), 125), v("d", "H1", (3,), 130, "update")],
    }
    o = score(scenarios, verdicts)["overall"]
    assert o["recall"] == 1.0 and o["precision"] == 1.0
    assert (o["incidents_per_fault_mean"], o["incidents_per_fault_max"], o["extra_incidents"]) == (2.0, 3, 2)
