"""`ccld report --fleet`: the cluster's view as one page, from the verdicts in the archive."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ccld.cli import main
from report_archive import write_fleet_archive


def test_the_fleet_page_names_the_candidate_its_part_and_what_to_do(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    root = write_fleet_archive(tmp_path / "archive", time.time())
    out = tmp_path / "fleet.html"
    assert main(["report", "--fleet", "--archive", str(root), "--out", str(out)]) == 0
    assert "4 hosts root cause of an incident, drain candidates: gpu-bad" in capsys.readouterr().out
    page = out.read_text()
    assert "Fleet: 1 drain candidate among 4 hosts" in page and "drain (gpu)" in page
    assert "drain gpu-bad" in page and page.count("<img") == 1 and "data:image/png;base64," in page
    assert page.index("gpu-bad") < page.index("gpu-nic") < page.index("gpu-x2"), "candidates first, then by score"
    assert "gpu-x1" not in page, "30 h ago: outside the 1-day window"
    # a shorter window: gpu-bad's GPU failed only twice within 10 h
    assert main(["report", "--fleet", "--archive", str(root), "--out", str(out), "--since", "10h"]) == 0
    assert "drain candidates: none" in capsys.readouterr().out


def test_report_needs_an_incident_or_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--archive", str(tmp_path)]) == 2
    assert "needs an INCIDENT_ID" in capsys.readouterr().err
