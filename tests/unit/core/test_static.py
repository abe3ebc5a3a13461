"""Lint and type checks run with the suite, so the README's one test command covers them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CODE = ["ccld", "schemas", "probe", "producers", "streams", "sinks", "stack"]


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is not installed (it comes with the [test] extra)"
    return found


def test_ruff_is_clean() -> None:
    res = subprocess.run([tool("ruff"), "check", *CODE, "tests", "benchmarks"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


def test_mypy_is_clean() -> None:
    res = subprocess.run([tool("mypy"), *CODE], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
