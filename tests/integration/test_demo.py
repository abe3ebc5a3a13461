"""`ccld demo`, the README's first command, end to end in a real process."""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_demo_reports_every_injected_fault_and_archives(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_")}
    res = subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "demo", "--speed", "0", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "found  H1 on rank 13 of demo-hang" in out and "found  S2 on rank 21 of demo-slow" in out, out
    assert "every injected fault was reported" in out and "unexpected:" not in out, out
    assert list((tmp_path / "archive").rglob("*.parquet")), "the demo archived nothing"
    # the jobs start at the wall clock: the time to verdict is counted from the onset, the archive's days are today's
    ttv = [float(x) for x in re.findall(r"found  \S+ on rank \d+ of \S+: (-?[\d.]+) s after onset", out)]
    assert len(ttv) == 2 and all(0 < t < 120 for t in ttv), out
    today = dt.datetime.now(dt.UTC).date()
    days = {p.name for p in (tmp_path / "archive").rglob("date=*")}
    assert days and days <= {f"date={today}", f"date={today - dt.timedelta(days=1)}"}, days
