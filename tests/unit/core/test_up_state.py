"""`ccld status` finds the workers of a `ccld up` on the same machine through the file `ccld up` writes."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ccld import up_state
from ccld.settings import Settings
from ccld.streams.status_command import worker_urls


@pytest.fixture(autouse=True)
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path / "ccld"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_live_ups_of_the_same_topics_are_found_and_dead_ones_removed(runtime: Path) -> None:
    me = up_state.write(up_state.UpState(os.getpid(), "127.0.0.1:9092", "ccl-d.", ("http://127.0.0.1:7001",)))
    dead = up_state.write(up_state.UpState(_dead_pid(), "127.0.0.1:9093", "ccl-d.", ("http://127.0.0.1:7002",)))
    other = up_state.write(up_state.UpState(os.getppid(), "127.0.0.1:9094", "x.", ("http://127.0.0.1:7003",)))
    (runtime / "up-1.json").write_text("{not json")
    assert [u.workers for u in up_state.running("ccl-d.")] == [("http://127.0.0.1:7001",)]
    assert not dead.exists() and other.exists() and me.exists()
    assert up_state.running("ccl-d.", "127.0.0.1:9999") == []  # another broker named: not that one
    assert [u.pid for u in up_state.running("x.")] == [os.getppid()]
    up_state.remove(me)
    assert up_state.running("ccl-d.") == []


def test_ccld_status_asks_the_workers_of_ccld_up_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(worker=[])
    s = Settings.load({})
    assert worker_urls(args, s) == ["http://127.0.0.1:6066"]  # nothing running: this machine's default port
    path = up_state.write(up_state.UpState(os.getpid(), "127.0.0.1:9092", s.topic_prefix,
                                           ("http://127.0.0.1:7001", "http://127.0.0.1:7002")))
    try:
        assert worker_urls(args, s) == ["http://127.0.0.1:7001", "http://127.0.0.1:7002"]
        assert f"the workers of `ccld up` (pid {os.getpid()}, broker 127.0.0.1:9092)" in capsys.readouterr().err
        assert worker_urls(argparse.Namespace(worker=["http://h:1"]), s) == ["http://h:1"]  # a given worker wins
    finally:
        up_state.remove(path)
