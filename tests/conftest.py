"""Test-session wiring shared by every tier: makes tests/factories.py importable, marks the slow tiers.

``pytest -m "not slow"`` is the fast tier for the edit-test loop (tests/README.md says what it
costs); the README's test command runs everything, as CI does.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

#: tiers that start processes (a broker, workers, training ranks) or need a device: slow by definition
SLOW_TIERS = ("integration", "chaos", "gpu")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            tier = Path(str(item.fspath)).resolve().relative_to(HERE).parts[0]
        except ValueError:
            continue
        if tier in SLOW_TIERS:
            item.add_marker(pytest.mark.slow)
