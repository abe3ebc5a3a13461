"""Lint and type checks run with the suite, so the README's one test command covers them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

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


@pytest.mark.slow  # about 30 s: mypy over the whole namespace; CI runs it
def test_mypy_is_clean(tmp_path: Path) -> None:
    """mypy over the installed ``ccld`` namespace, so imports across stages are checked too.

    The stage folders install as ``ccld.<stage>`` (pyproject's package-dir); run on the folders as they
    lie, mypy finds ``ccld/`` but no ``ccld/streams``, and every cross-stage import becomes ``Any``. A
    tree of links lays the namespace out as it is installed."""
    tree = tmp_path / "ccld"
    tree.mkdir()
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for entry in (ROOT / "ccld").iterdir():
        (tree / entry.name).symlink_to(entry)
    for pkg, folder in mapping.items():
        if pkg != "ccld":
            (tree / pkg.split(".", 1)[1]).symlink_to(ROOT / folder)
    (tmp_path / "pyproject.toml").symlink_to(ROOT / "pyproject.toml")
    res = subprocess.run([tool("mypy"), "-p", "ccld", "--cache-dir", str(tmp_path / ".mypy_cache")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
