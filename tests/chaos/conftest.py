"""Chaos fixtures: a broker of the test's own (it is frozen, killed and restarted), a real worker.

Every test here gets its own Tansu process on a free loopback port, so stopping or killing it
disturbs nobody else, and its own topics and app id. Nothing is mocked: the worker is a real
``ccld worker`` process and the clients are the real confluent-kafka ones. The helpers live in
``chaoslib.py`` beside this file.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ccld.settings import Settings
from ccld.stack.broker import EmbeddedBroker
from ccld.topics import ensure_topics
from harness import WorkerProcess

sys.path.insert(0, str(Path(__file__).parent))  # chaoslib, importable by the tests of this folder

from chaoslib import ChaosBroker  # noqa: E402


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    """A plain embedded broker of the test's own, for the producer-side tests (they freeze it by pid)."""
    b = EmbeddedBroker(0).start()
    try:
        yield b
    finally:
        if b.pid is not None:
            os.kill(b.pid, signal.SIGCONT)  # a frozen broker ignores SIGTERM until it runs again
        b.stop()


@pytest.fixture
def chaos_broker() -> Iterator[ChaosBroker]:
    b = ChaosBroker()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def chaos_settings(chaos_broker: ChaosBroker, tmp_path: Path) -> Settings:
    """One metrics partition (every producer of a test shares one analyzer clock), fast ticks and commits."""
    tag = uuid.uuid4().hex[:10]
    s = Settings.load(
        {},
        bootstrap=chaos_broker.bootstrap,
        topic_prefix=f"c{tag}.",
        metrics_partitions=1,
        worker_app_id=f"ccld-chaos-{tag}",
        sink_group=f"ccld-sink-{tag}",
        archive_dir=str(tmp_path / "archive"),
        worker_tick_s=0.5,
        worker_commit_interval_s=0.5,
        worker_shutdown_grace_s=10.0,
        log_level="INFO",
    )
    ensure_topics(s)
    return s


@pytest.fixture
def chaos_worker(chaos_settings: Settings, tmp_path: Path) -> Iterator[WorkerProcess]:
    w = WorkerProcess(chaos_settings, tmp_path / "worker.log")
    try:
        yield w
    finally:
        w.stop(signal.SIGKILL)


