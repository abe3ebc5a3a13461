"""Test-session wiring shared by every tier: makes tests/factories.py importable, marks the slow tiers.

``pytest -m "not slow"`` is the fast tier for the edit-test loop (tests/README.md says what it
costs); the README's test command runs everything, as CI does, on two pytest-xdist workers
(``-n 2``): every test of the tiers that start processes goes to one of them, in order, so those
tests never run beside each other (real-time jobs, frozen brokers and CPU-pressure readings would
disturb one another), while the pure tiers spread over both (``pytest_xdist_make_scheduler``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

#: tiers that start processes (a broker, workers, training ranks) or need a device: slow by definition
SLOW_TIERS = ("integration", "chaos", "gpu")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the process tiers first, their real training jobs (marked torch) last among them: under -n 2 the
    # unit tests run beside the first of the process tests, and a real job's slow and starved rules read
    # the host's CPU (a busy neighbour has made healthy gloo jobs look slow before: benchmarks/RESULTS.md)
    order: dict[str, int] = {}
    for item in items:
        if _tier(item.nodeid) in SLOW_TIERS:
            item.add_marker(pytest.mark.slow)
            order[item.nodeid] = 1 if item.get_closest_marker("torch") is not None else 0
        else:
            order[item.nodeid] = 2
    items.sort(key=lambda it: order[it.nodeid])


def _tier(nodeid: str) -> str:
    """The tier (folder under tests/) of a test's node id, which is relative to the repository root
    (pyproject.toml's folder); the one reading both the marks and the xdist scheduler use."""
    parts = nodeid.split("/", 2)
    return parts[1] if len(parts) > 2 and parts[0] == HERE.name else ""


if importlib.util.find_spec("xdist") is not None:  # the test extra installs it; a bare pytest runs on without

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        """xdist's scope scheduler with one scope for all of ``SLOW_TIERS`` and one per test elsewhere.

        The process tiers are one unit of work, sent whole to one worker in collection order; each
        unit test is a unit of its own, handed to whichever worker is free. (xdist's ``loadgroup``
        would do this from marks, but it renames node ids, which pytest 9.2 no longer lets it do.)
        """
        from xdist.scheduler import LoadScopeScheduling

        class LiveTogether(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return "live" if _tier(nodeid) in SLOW_TIERS else nodeid

        return LiveTogether(config, log)
