"""Make docs/report-h1.png and docs/report-s2.png: `ccld report` pages of real verdicts, as Chromium shows them.

Usage: python benchmarks/make_report_screenshots.py [--out-dir docs] [--keep DIR]

For each golden scenario (tests/golden/h1-16, tests/golden/s2-32) the simulator's batches go through
the offline analyzer (``analyze_batches``, the worker's pure core), and both, batches and verdicts,
are written into an archive with the sink's own writers (``sinks/parquet.py``, ``sinks/layout.py``), stamped with a real
Unix time so the page shows UTC times as it would in production. ``ccld report`` then makes the
page and headless Chromium screenshots it. Needs ``chromium`` on PATH (``apt-get install chromium``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from ccld.cli import main as ccld_main
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import KernelBatch, Verdict
from ccld.settings import Settings
from ccld.sinks.layout import write_offsets
from ccld.sinks.parquet import metrics_table, verdicts_table
from ccld.streams.analysis.replay import analyze_batches

ROOT = Path(__file__).resolve().parents[1]
#: the simulator's clock starts at 0; the archive's timestamps start here (2025-06-15 15:06:40 UTC)
BASE_S = 1_750_000_000.0
#: messages per metrics file, as a sink flushing every few seconds would write them
FILE_MESSAGES = 500
SHOTS = {"h1": "h1-16", "s2": "s2-32"}


def archive(root: Path, batches: list[tuple[float, KernelBatch]], verdicts: list[Verdict]) -> None:
    """Write the batches and verdicts as the sink would: one partition, consecutive offsets."""
    s = Settings.load()
    label = "sink-0000000000000001"
    for start in range(0, len(batches), FILE_MESSAGES):
        chunk = [(start + i, int(round(t * 1e3)), b) for i, (t, b) in enumerate(batches[start:start + FILE_MESSAGES])]
        write_offsets(root, s.metrics_topic, 0, label, start, chunk[-1][0], metrics_table(chunk))
    rows = [(i, int(round(v.detected_time * 1e3)), v) for i, v in enumerate(verdicts)]
    write_offsets(root, s.verdicts_topic, 0, label, 0, len(rows) - 1, verdicts_table(rows))


def screenshot(page: Path, png: Path, height: int) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                    f"--screenshot={png}", f"--window-size=1200,{height}", page.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    # The window is taller than any page; cut the blank below the page's end (keep a margin).
    with Image.open(png) as im:
        rgb = im.convert("RGB")
    rows = np.flatnonzero((np.asarray(rgb) < 250).any(axis=(1, 2)))
    if rows.size:
        rgb.crop((0, 0, rgb.width, min(rgb.height, int(rows[-1]) + 24))).save(png, optimize=True)


def make(tag: str, golden: str, work: Path, out_dir: Path, height: int) -> Path:
    sc = Scenario.from_dict(json.loads((ROOT / "tests" / "golden" / golden / "scenario.json").read_text()))
    batches = [(t + BASE_S, b) for t, b in simulate(sc)]
    verdicts = analyze_batches(batches, then=[batches[-1][0] + 120.0])
    if not verdicts:
        raise SystemExit(f"{golden}: the analyzer gave no verdict")
    root = work / f"archive-{tag}"
    archive(root, batches, verdicts)
    page = work / f"report-{tag}.html"
    rc = ccld_main(["report", verdicts[0].incident_id, "--archive", str(root), "--out", str(page)])
    if rc != 0:
        raise SystemExit(f"ccld report exited {rc}")
    png = out_dir / f"report-{tag}.png"
    screenshot(page, png, height)
    print(f"{golden}: {len(verdicts)} verdicts, page {page}, screenshot {png}")
    return png


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=ROOT / "docs")
    ap.add_argument("--keep", type=Path, help="keep the archives and pages in this folder")
    ap.add_argument("--height", type=int, default=6000,
                    help="window height in pixels (the blank below the page is cut)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for tag, golden in SHOTS.items():
            make(tag, golden, work, args.out_dir, args.height)
    return 0


if __name__ == "__main__":
    sys.exit(main())
