"""`ccld up` killed with SIGKILL: its broker, worker and sink die with it, and its port is free again.

Real processes only. `ccld up` starts its children in sessions of their own (a Ctrl-C in the
terminal must reach `ccld up` alone, which stops them in order), so nothing but the children
themselves can notice that their supervisor is gone: they must, within seconds, or they keep the
port and the next `ccld up --port <same>` fails with "port is busy".
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from ccld.stack.broker import free_port
from chaoslib import Lines, alive, children_of, wait_for
from harness import start_up as harness_start_up

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def start_up(port: int, tmp_path: Path, env: dict[str, str], name: str) -> tuple[subprocess.Popen[str], Lines]:
    up = harness_start_up(env, port, tmp_path / name, merged=True)
    return up, Lines(up.stdout)


def test_children_die_with_a_killed_up_and_the_port_can_be_used_again(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_")}
    env.update({"CCLD_TOPIC_PREFIX": f"k{tag}.", "CCLD_WORKER_APP_ID": f"up-{tag}", "CCLD_SINK_GROUP": f"sink-{tag}",
                "CCLD_ARCHIVE_DIR": str(tmp_path / "archive")})
    port = free_port()
    up, out = start_up(port, tmp_path, env, "logs")
    kids: dict[int, str] = {}
    again: subprocess.Popen[str] | None = None
    try:
        out.wait_for("Ctrl-C stops everything", 30)
        kids = children_of(up.pid)
        assert any("tansu" in cmd for cmd in kids.values()) and len(kids) >= 3, kids
        time.sleep(1.0)  # the worker and sink up and connected, not just spawned

        os.kill(up.pid, signal.SIGKILL)
        up.wait(10)
        t0 = time.monotonic()
        gone = wait_for(lambda: not any(alive(pid) for pid in kids), 5.0, every_s=0.05)
        died_s = time.monotonic() - t0
        left = {pid: cmd for pid, cmd in kids.items() if alive(pid)}
        assert gone and not left, f"children of the killed `ccld up` still running after 5 s: {left}"

        again, out2 = start_up(port, tmp_path, env, "logs-2")
        out2.wait_for("Ctrl-C stops everything", 30)
        assert again.poll() is None
    finally:
        for pid in kids:  # whatever outlived its supervisor, so that it does not outlive the test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if again is not None:
            again.send_signal(signal.SIGTERM)
            try:
                again.wait(40)
            except subprocess.TimeoutExpired:
                again.kill()
                raise
    assert again.returncode == 0
    print(f"CHAOS ccld up killed (SIGKILL): {len(kids)} children, all gone in {died_s:.2f} s; the port was "
          "taken again at once", flush=True)
