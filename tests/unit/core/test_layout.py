"""The package layout: every folder with an __init__.py is an installed ccld package."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_every_package_folder_is_listed_in_pyproject() -> None:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    mapping = conf["package-dir"]
    found = set()
    for pkg, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([pkg, *rel.parts]))
    # sub-folders of a mapped folder that are themselves mapped (ccld -> ccld/) count once
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"
    assert listed - found == set(), f"listed packages without an __init__.py: {sorted(listed - found)}"


def test_every_module_opens_with_a_docstring() -> None:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    missing = []
    for folder in set(conf["package-dir"].values()):
        for py in (ROOT / folder).rglob("*.py"):
            head = py.read_text().lstrip()
            if not head.startswith(('"""', "'''")) and py.stat().st_size > 0:
                missing.append(str(py.relative_to(ROOT)))
    assert not missing, f"modules without a docstring on top: {missing}"
