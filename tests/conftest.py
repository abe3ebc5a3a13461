"""Test-session wiring shared by every tier: makes tests/factories.py importable, marks the slow tiers.

``pytest -m "not slow"`` is the fast tier for the edit-test loop (tests/README.md says what it
costs); the README's test command runs everything, as CI does, on three pytest-xdist workers
(``-n 3``), three lanes (``pytest_xdist_make_scheduler``): the live lane, the tests whose verdicts hang
on real time and the host's CPUs (real training jobs, an overloaded worker, skewed producer clocks, a
broker outage in the middle of a hang), one after another on one worker; the rest, the pure tiers
first, then the other integration tests; and the other chaos tests (a broker frozen, a sink killed, a
CLI against a dead broker). The two lanes beside the live one mostly wait, and both end before it, so
its last real jobs run alone. No two live tests ever run side by side.
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

#: the live lane: test files whose verdicts hang on real time and the host's CPUs. Every process-tier file
#: with a test marked ``torch`` (a real training job) must be here; collection fails otherwise.
LIVE_FILES = frozenset({
    "tests/chaos/test_overload_live.py", "tests/chaos/test_clock_skew_live.py", "tests/chaos/test_outage_fault.py",
    "tests/integration/test_fr_live.py", "tests/integration/test_import_fr.py",
    "tests/integration/test_fr_dump_live.py", "tests/integration/test_long_real_job.py",
    "tests/integration/test_net_links.py",
    "tests/integration/test_torch_aggregate.py", "tests/integration/test_torch_faults.py",
    "tests/integration/test_nccl_plugin.py",  # twenty rank processes in real time: no neighbour for a real job
    "tests/gpu/test_gpu_probe.py",
})  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Each lane in this order. The live lane: the real-time chaos tests first, the real training jobs
    # (marked torch) last. The rest lane: the pure tiers first, beside the live lane's chaos tests (a
    # real job's slow and starved rules read the host's CPU, and a CPU-bound neighbour has made healthy
    # gloo jobs look slow before: benchmarks/RESULTS.md), then its process tests, mostly waiting, as are
    # the chaos lane's.
    order: dict[str, int] = {}
    stray = sorted({_file(it.nodeid) for it in items if _tier(it.nodeid) in SLOW_TIERS
                    and it.get_closest_marker("torch") is not None and _file(it.nodeid) not in LIVE_FILES})
    if stray:
        raise pytest.UsageError(f"real training jobs outside the live lane (tests/conftest.py LIVE_FILES): {stray}")
    for item in items:
        if _tier(item.nodeid) in SLOW_TIERS:
            item.add_marker(pytest.mark.slow)
            order[item.nodeid] = 1 if item.get_closest_marker("torch") is not None else 0
        else:
            order[item.nodeid] = -1
    items.sort(key=lambda it: order[it.nodeid])


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _tier(nodeid: str) -> str:
    """The tier (folder under tests/) of a test's node id, which is relative to the repository root
    (pyproject.toml's folder); the one reading both the marks and the xdist scheduler use."""
    parts = nodeid.split("/", 2)
    return parts[1] if len(parts) > 2 and parts[0] == HERE.name else ""


if importlib.util.find_spec("xdist") is not None:  # the test extra installs it; a bare pytest runs on without

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        """xdist's scope scheduler with three scopes: the live lane (``LIVE_FILES``), the other chaos tests, and
        the rest (the pure tiers and the other integration tests).

        Each is one unit of work, sent whole to one worker in collection order. (The scheduler runs in
        the controller, which collects nothing: node ids are all it has, hence the list of files. xdist's
        ``loadgroup`` would do this from marks, but it renames node ids, which pytest 9.2 no longer lets
        it do.) The live lane sets the wall time: about 22 minutes on this machine, the rest about 16 and
        the chaos lane about 10 (tests/README.md).
        """
        from xdist.scheduler import LoadScopeScheduling

        class Lanes(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                if _file(nodeid) in LIVE_FILES:
                    return "live"
                return "chaos" if _tier(nodeid) == "chaos" else "rest"

        return Lanes(config, log)
