"""`ccld report`: the incident model from a hand-made archive, the page it makes, and its one-line errors."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from ccld.anomaly import CLASSES, AnomalyKind
from ccld.cli import main
from ccld.records import VerdictState
from ccld.sinks.report_model import MAX_RANKS, load_incident, pick_ranks, rank_ranges
from factories import make_verdict
from report_archive import H1_EVIDENCE, H1_ID, HANG_AT, S2_EVIDENCE, S2_ID, SKEW_S, write_archive

TOPICS = {"verdicts_topic": "ccl-d.verdicts", "metrics_topic": "ccl-d.metrics"}


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    return write_archive(tmp_path / "archive")


def test_h1_model_has_every_state_once_and_aligns_each_rank_clock(archive: Path) -> None:
    inc = load_incident(archive, H1_ID, **TOPICS)
    assert [v.state for v in inc.verdicts] == [VerdictState.OPEN, VerdictState.UPDATE, VerdictState.CLOSED]
    assert inc.current.kind is AnomalyKind.H1 and inc.culprits == (3,) and inc.current.affected_ranks == (0, 1, 2)
    # ranks 2 and 3 run SKEW_S ahead; every sample left 0.2 s before its message at the earliest
    assert inc.clock_offsets_s[0] == pytest.approx(0.2, abs=1e-3)
    assert inc.clock_offsets_s[2] == pytest.approx(0.2 - SKEW_S, abs=1e-3)
    assert inc.ranks_shown == (0, 1, 2, 3) and inc.ranks_hidden == ()
    waiting = [b for b in inc.bars if b.op_seq == HANG_AT]
    # the skewed rank 2 lines up with ranks 0 and 1: all entered at the onset (+ the 0.2 s shipping bias)
    assert sorted(b.rank for b in waiting) == [0, 1, 2]
    assert all(not b.done and b.verdict_op and b.start_s == pytest.approx(0.2, abs=1e-3) for b in waiting)
    assert all(b.end_s == pytest.approx(29.3, abs=1e-3) for b in waiting), "to the last sample inside the op"
    assert max(b.end_s for b in inc.bars if b.rank == 3) == pytest.approx(-0.6, abs=1e-3)
    assert not [s for s in inc.samples if s.rank == 3 and s.t_s > 0], "rank 3 is silent after the onset"


def test_s2_model_has_kernel_times_and_the_link_source_backlog(archive: Path) -> None:
    inc = load_incident(archive, S2_ID, **TOPICS)
    assert [v.state for v in inc.verdicts] == [VerdictState.OPEN, VerdictState.RESOLVED]
    assert inc.current.link == (1, 2) and inc.current.p == pytest.approx(0.05)
    assert {k.rank for k in inc.kernel_times} == {0, 1, 2, 3}
    assert all(k.duration_s == pytest.approx(0.2, abs=1e-3) for k in inc.kernel_times)
    grows = [b for b in inc.backlog if b.rank == 1 and b.channels[0] > 0]
    assert grows and max(b.channels[0] for b in grows) >= 15
    assert not [b for b in inc.backlog if b.rank != 1 and max(b.channels) > 0]


def test_pick_ranks_shows_culprits_and_peers_first_and_at_most_the_limit() -> None:
    v = make_verdict(root_cause_ranks=(97,), affected_ranks=tuple(range(200, 300)))
    shown, hidden = pick_ranks(v, range(400), comm_members=range(90, 100))
    assert len(shown) == MAX_RANKS and 97 in shown and set(range(200, 200 + MAX_RANKS - 1)) <= set(shown)
    assert len(hidden) == 400 - MAX_RANKS and not set(shown) & set(hidden)
    assert rank_ranges([0, 1, 2, 5, 7, 8, 10, 11, 12, 13]) == "0-2,5,7,8,10-13"


def _report(archive: Path, incident: str, out: Path) -> str:
    assert main(["report", incident, "--archive", str(archive), "--out", str(out)]) == 0
    return out.read_text()


def _self_contained(page: str) -> None:
    assert not re.search(r"<script|<link|@import|url\(", page, re.I), "no script, no stylesheet to fetch"
    assert not re.search(r'\b(src|href)="(?!data:)', page), "every resource inlined"


def test_h1_page_has_the_evidence_the_action_the_culprit_and_inline_images(archive: Path, tmp_path: Path) -> None:
    page = _report(archive, H1_ID, tmp_path / "h1.html")
    assert html.escape(H1_EVIDENCE) in page
    assert html.escape(CLASSES[AnomalyKind.H1].action) in page and "not-entered hang" in page
    assert '<span class="culprit">rank 3</span>' in page
    assert page.count('src="data:image/png;base64,') == 2  # timeline, wait-for
    for state in ("open", "update", "closed"):
        assert f'class="state-{state}">{state}</td>' in page
    assert "2025-06-15 15:07:10.1 UTC" in page, "the onset, in UTC"
    assert html.escape("seconds from the onset on the analyzer's clock") in page, "the page says what the x axis is"
    _self_contained(page)


def test_s2_page_adds_the_slowdown_picture_and_names_the_link(archive: Path, tmp_path: Path) -> None:
    page = _report(archive, S2_ID, tmp_path / "s2.html")
    assert html.escape(S2_EVIDENCE) in page and html.escape(CLASSES[AnomalyKind.S2].action) in page
    assert "link 1 -&gt; 2, channel 0" in page and "P (the slow ratio) per verdict: open 0.05, resolved 0.05" in page
    assert page.count('src="data:image/png;base64,') == 3
    _self_contained(page)


@pytest.mark.parametrize("case", ["unknown-id", "no-archive", "no-verdicts"])
def test_unknown_incident_or_archive_exits_2_with_one_line(
        case: str, archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = {"unknown-id": archive, "no-archive": tmp_path / "nowhere", "no-verdicts": tmp_path}[case]
    out = tmp_path / "x.html"
    rc = main(["report", "h-not-there" if case == "unknown-id" else H1_ID, "--archive", str(root), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert {"unknown-id": "is not in the archive", "no-archive": "does not exist",
            "no-verdicts": "holds no verdicts"}[case] in err
    assert not out.exists()
