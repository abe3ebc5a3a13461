"""`ccld report` pages in a real browser: headless Chromium renders them, shows the pictures, logs no error.

No broker: these start two real processes (`ccld report` and Chromium). They skip, saying why, only
where Chromium is not installed (`.ci/run` installs it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from report_archive import H1_ID, S2_ID, write_archive

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed: apt-get install chromium")
#: the timeline's bar colour (report_plots.DONE_COLOR, drawn at 75 % opacity, hence the tolerance below):
#: seen only if the inline PNG was decoded and drawn
DONE_RGB = (0x4C, 0x72, 0xB0)


def _chromium(page: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                           "--enable-logging=stderr", "--v=0", *flags, page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)


def _console(stderr: str) -> list[str]:
    """The page's own console messages (script errors, failed loads); Chromium's D-Bus noise is not the page's."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Failed to load resource" in line]


@needs_chromium
def test_console_check_sees_a_page_error(tmp_path: Path) -> None:
    """The check below is not vacuous: a page that logs an error is caught by it."""
    bad = tmp_path / "bad.html"
    bad.write_text('<html><body><script>console.error("boom")</script></body></html>')
    assert any("boom" in line for line in _console(_chromium(bad, "--dump-dom").stderr))


@needs_chromium
@pytest.mark.parametrize("incident", [H1_ID, S2_ID])
def test_report_renders_in_chromium_with_its_pictures_and_no_console_error(incident: str, tmp_path: Path) -> None:
    archive = write_archive(tmp_path / "archive")
    page = tmp_path / "report.html"
    run = subprocess.run([sys.executable, "-m", "ccld.cli", "report", incident, "--archive", str(archive),
                          "--out", str(page)], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    dom = _chromium(page, "--dump-dom")
    assert dom.returncode == 0 and "Who waits for whom" in dom.stdout and "<img" in dom.stdout
    assert not _console(dom.stderr), _console(dom.stderr)
    png = tmp_path / "shot.png"
    shot = _chromium(page, f"--screenshot={png}", "--window-size=1200,2000")
    assert shot.returncode == 0 and png.is_file(), shot.stderr[-2000:]
    assert not _console(shot.stderr), _console(shot.stderr)
    assert png.stat().st_size > 50_000, "a page of text and pictures, not a blank one"
    with Image.open(png) as im:
        px = np.asarray(im.convert("RGB")).reshape(-1, 3)
    colours = np.unique(px, axis=0).shape[0]
    inked = float((px < 240).any(axis=1).mean())
    assert colours > 200 and inked > 0.03, f"{colours} colours, {inked:.1%} of pixels not white"
    near_bar = (np.abs(px.astype(int) - np.array(DONE_RGB)) <= 40).all(axis=1).sum()
    assert near_bar > 2000, "the timeline picture was not drawn (its bar colour is missing)"


@needs_chromium
def test_the_fleet_page_renders_in_chromium_with_its_picture(tmp_path: Path) -> None:
    """`ccld report --fleet`: the hosts-by-time picture is drawn (the candidate's shaded row, the S1 and S2 dots)
    and the page logs no error."""
    import time

    from ccld.sinks.report_fleet import KIND_COLORS
    from report_archive import write_fleet_archive

    archive = write_fleet_archive(tmp_path / "archive", time.time())
    page = tmp_path / "fleet.html"
    run = subprocess.run([sys.executable, "-m", "ccld.cli", "report", "--fleet", "--archive", str(archive),
                          "--out", str(page)], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    png = tmp_path / "fleet.png"
    shot = _chromium(page, f"--screenshot={png}", "--window-size=1200,1400")
    assert shot.returncode == 0 and png.is_file(), shot.stderr[-2000:]
    assert not _console(shot.stderr), _console(shot.stderr)
    with Image.open(png) as im:
        px = np.asarray(im.convert("RGB")).reshape(-1, 3).astype(int)

    def near(hex_rgb: str, tol: int = 12) -> int:
        rgb = np.array([int(hex_rgb[i:i + 2], 16) for i in (1, 3, 5)])
        return int((np.abs(px - rgb) <= tol).all(axis=1).sum())

    assert near("#fbe3e4", 4) > 5000, "the drain candidate's shaded row is missing"
    assert near(KIND_COLORS["S1"]) > 100 and near(KIND_COLORS["S2"]) > 100, "the incidents' dots are missing"
