"""`ccld bench accuracy --through-kafka`: scenarios through the real broker and worker, scored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ccld.cli import main

pytestmark = pytest.mark.integration

SCENARIOS = [
    {"id": "k-h3", "seed": 4, "ranks": 8, "layout": {"tp": 4, "pp": 1, "dp": 2}, "channels": 2,
     "step_time_s": 1.0, "duration_s": 100.0, "faults": [{"kind": "H3", "rank": 1, "peer": 2, "onset_s": 60.0}],
     "expect": [{"kind": "H3", "rank": 1}]},
    {"id": "k-healthy", "seed": 5, "ranks": 8, "layout": {"tp": 4, "pp": 1, "dp": 2}, "channels": 2,
     "step_time_s": 1.0, "duration_s": 90.0, "faults": [], "expect": []},
]


def test_through_kafka_scores_like_in_process(bootstrap: str, tmp_path: Path) -> None:
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps(s) + "\n" for s in SCENARIOS))
    reports = {}
    for mode in ("in-process", "kafka"):
        out = tmp_path / f"{mode}.json"
        argv = ["bench", "accuracy", "--scenarios", str(suite), "--out", str(out)]
        if mode == "kafka":
            argv += ["--through-kafka", "--bootstrap", bootstrap]
        assert main(argv) == 0
        reports[mode] = json.loads(out.read_text())
        assert (tmp_path / f"{mode}.png").is_file()
    for mode, rep in reports.items():
        overall = rep["overall"]
        assert (overall["recall"], overall["precision"], overall["false_alarms"]) == (1.0, 1.0, 0), (mode, rep)
    kafka = {s["id"]: s for s in reports["kafka"]["scenarios"]}
    local = {s["id"]: s for s in reports["in-process"]["scenarios"]}
    assert kafka["k-h3"]["ok"] and kafka["k-healthy"]["ok"] and not kafka["k-healthy"]["verdicts"]
    # the same analyzer on the same records: the same root cause, whichever path carried them
    assert [v["root_cause_ranks"] for v in kafka["k-h3"]["verdicts"]] == \
        [v["root_cause_ranks"] for v in local["k-h3"]["verdicts"]]


def test_a_job_that_ends_mid_slowdown_gets_no_verdict_in_the_silence_after_it(bootstrap: str, tmp_path: Path) -> None:
    """Rank 6 is 3x slower until the job ends; then the worker's clock runs on for 35 s with no record (its
    peers were waiting for rank 6 inside an all-reduce when the records stopped). Before the cut rule knew
    how long its ops had lasted, a real worker reported the S1 and then ``H1 rank 6`` 18 s into the silence."""
    sc = {"id": "k-end-slow", "ranks": 32, "layout": {"tp": 4, "pp": 2, "dp": 4}, "channels": 8, "duration_s": 60,
          "faults": [{"kind": "S1", "rank": 6, "onset_s": 18, "factor": 3.0}], "expect": [{"kind": "S1", "rank": 6}]}
    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps(sc) + "\n")
    out = tmp_path / "kafka.json"
    assert main(["bench", "accuracy", "--scenarios", str(suite), "--out", str(out), "--through-kafka",
                 "--past-end-s", "35", "--bootstrap", bootstrap]) == 0
    row = json.loads(out.read_text())["scenarios"][0]
    assert row["ok"] and row["after_end"] == [], row
    assert [(v["kind"], v["root_cause_ranks"]) for v in row["verdicts"]] == [("S1", [6])], row["verdicts"]
