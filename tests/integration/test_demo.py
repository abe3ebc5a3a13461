"""`ccld demo`, the README's first command, end to end in a real process."""

from __future__ import annotations

import os
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
