"""`ccld nodes --archive DIR`: the hosts that keep breaking jobs, read from the verdicts the sink archived."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ccld.cli import main
from ccld.records import AnomalyKind, Verdict, VerdictState
from ccld.settings import Settings
from ccld.sinks.layout import write_offsets
from ccld.sinks.parquet import verdicts_table
from factories import make_verdict

INC = "id-" + "e" * 32


def archive(root: Path, now: float) -> None:
    """bad-1's GPU root cause in four jobs (one incident with its RESOLVED), good-7 once, one 3 days old."""
    s = Settings.load({})
    def v(iid: str, job: str, kind: AnomalyKind, host: str, ago_s: float,
          state: VerdictState = VerdictState.OPEN) -> Verdict:
        return make_verdict(incident_id=iid, job=job, kind=kind, state=state, root_cause_hosts=(host,),
                            affected_ranks=(0, 1), detected_time=now - ago_s)

    vs = [v("a", "j1", AnomalyKind.S1, "bad-1", 7200), v("a2", "j4", AnomalyKind.H1, "bad-1", 9000),
          v("a", "j1", AnomalyKind.S1, "bad-1", 7000, VerdictState.RESOLVED),
          v("b", "j2", AnomalyKind.H1, "bad-1", 3600), v("c", "j3", AnomalyKind.S3, "bad-1", 600),
          v("d", "j3", AnomalyKind.H3, "good-7", 500), v("e", "j0", AnomalyKind.H1, "old-2", 3 * 86_400)]
    for o, x in enumerate(vs):
        write_offsets(root, s.verdicts_topic, 0, INC, o, o, verdicts_table([(o, int(x.detected_time * 1000), x)]))


def test_the_archive_names_the_drain_candidate_and_leaves_the_rest_as_watch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive(tmp_path, time.time())
    assert main(["nodes", "--archive", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    hosts = {h["host"]: h for h in out["hosts"]}
    assert set(hosts) == {"bad-1", "good-7"}, "the 3-day-old incident is outside the 1-day window"
    assert hosts["bad-1"]["candidate"] and hosts["bad-1"]["incidents"] == 4 and hosts["bad-1"]["jobs"] == 4
    assert hosts["bad-1"]["by_kind"] == {"H1": 2, "S1": 1, "S3": 1} and not hosts["good-7"]["candidate"]
    assert hosts["bad-1"]["part"] == "gpu"
    assert main(["nodes", "--archive", str(tmp_path), "--since", "90m"]) == 0
    text = capsys.readouterr().out
    assert "drain candidates (4+ incidents in 2+ jobs): none" in text and "bad-1: watch" in text, text
    assert main(["nodes", "--archive", str(tmp_path), "--since", "6d", "--set", "fleet_min_incidents=1",
                 "--set", "fleet_min_jobs=1"]) == 0
    assert "drain candidates (1+ incidents in 1+ jobs): bad-1, good-7, old-2" in capsys.readouterr().out


def test_a_bad_span_or_a_missing_archive_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["nodes", "--archive", str(tmp_path), "--since", "a week"])
    assert "not a span of time" in capsys.readouterr().err
    assert main(["nodes", "--archive", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err
