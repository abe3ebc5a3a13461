"""Integration fixtures: one real broker per session, real worker processes, unique topics per test.

``CCLD_TEST_BOOTSTRAP=HOST:PORT`` points the suite at your own Kafka instead of the bundled
Tansu broker. An unreachable broker fails the tests loudly; nothing here is ever skipped.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ccld.records import Verdict
from ccld.settings import Settings
from ccld.stack.broker import EmbeddedBroker, wait_until_answers
from ccld.topics import ensure_topics
from harness import WorkerProcess, collect_verdicts


@pytest.fixture(scope="session")
def bootstrap() -> Iterator[str]:
    """HOST:PORT of a real Kafka-compatible broker for the whole session."""
    given = os.environ.get("CCLD_TEST_BOOTSTRAP")
    if given:
        wait_until_answers(given, timeout_s=15)
        yield given
        return
    with EmbeddedBroker(0) as broker:
        yield broker.bootstrap


@pytest.fixture
def ccld_settings(bootstrap: str, tmp_path: Path) -> Settings:
    """Settings with a unique topic prefix, app id and group, topics created."""
    tag = uuid.uuid4().hex[:10]
    s = Settings.load(
        {},
        bootstrap=bootstrap,
        topic_prefix=f"t{tag}.",
        metrics_partitions=2,
        worker_app_id=f"ccld-test-{tag}",
        sink_group=f"ccld-sink-{tag}",
        archive_dir=str(tmp_path / "archive"),
        sink_max_age_s=1.0,
        worker_tick_s=0.5,
        log_level="INFO",
    )
    ensure_topics(s)
    return s


@pytest.fixture
def worker_factory(tmp_path: Path) -> Iterator[Callable[[Settings], WorkerProcess]]:
    made: list[WorkerProcess] = []

    def make(settings: Settings) -> WorkerProcess:
        w = WorkerProcess(settings, tmp_path / "worker.log")
        made.append(w)
        return w

    yield make
    for w in made:
        w.stop()


@pytest.fixture
def running_worker(ccld_settings: Settings, worker_factory: Callable[[Settings], WorkerProcess]) -> WorkerProcess:
    return worker_factory(ccld_settings).start()


@pytest.fixture(name="collect_verdicts")
def collect_verdicts_fixture() -> Callable[..., list[Verdict]]:
    """The ``harness.collect_verdicts`` function, for tests that prefer a fixture."""
    return collect_verdicts


@pytest.fixture
def fast(ccld_settings: Settings, request: pytest.FixtureRequest) -> Settings:
    """Settings for real torch jobs through the broker: a unique job, and hang thresholds and the slow
    warm-up short enough for a test (these jobs live under a minute; a fault starts a second or two
    in, inside the default 10-s warm-up)."""
    module = request.node.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    return ccld_settings.replace(
        job=f"{module}-{request.node.name[:40]}",
        analyzer_baseline_warmup_s=1.0,
        analyzer_hang_min_s=5.0,
        analyzer_h2_min_s=4.0,
        analyzer_h3_min_s=5.0,
        producer_linger_ms=50,
    )
