"""SIGTERM to a worker or a sink whose broker was killed: each exits at once instead of waiting on the broker.

`ccld up` stops its worker and sink when its embedded broker dies, and restarts them once the
broker is back; a stop that waits on the dead broker (a commit that times out after about 7 s,
Faust's stop up to its grace) made it kill them after 5 s. Real processes, a real broker killed
with SIGKILL; the sink holds an unwritten file when the signal comes (it must still write it).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from ccld.settings import Settings
from chaoslib import ChaosBroker, archived, produce, scenario_batches, wait_for
from harness import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.integration]

#: How soon after SIGTERM the process must be gone (the broker is dead: nothing to wait for).
PROMPT_S = 3.0


def stop_timed(proc: WorkerProcess) -> tuple[int, float]:
    t0 = time.monotonic()
    code = proc.stop(signal.SIGTERM, timeout_s=40)
    return code, time.monotonic() - t0


def test_sink_exits_promptly_on_sigterm_with_its_broker_dead(
    chaos_broker: ChaosBroker, chaos_settings: Settings, tmp_path: Path
) -> None:
    # 200 rows make a file: the first 240 rows are written at once, the next 100 or so wait (60 s) in the buffer.
    s = chaos_settings.replace(sink_max_rows=200, sink_max_age_s=60.0)
    root = Path(s.archive_dir)
    sink = WorkerProcess(s, tmp_path / "sink.log", command="sink", ready="archiving").start()
    try:
        produced = produce(s, scenario_batches("stop", None, 5.0))
        assert wait_for(lambda: sum(archived(root, s.metrics_topic).values()) >= produced, 30), sink.log()
        produced += produce(s, scenario_batches("stop", None, 2.0), offset_s=100.0)
        time.sleep(1.0)  # fetched (the sink polls every 0.2 s), not written
        assert sum(archived(root, s.metrics_topic).values()) < produced
        chaos_broker.kill()
        code, took = stop_timed(sink)
    finally:
        sink.stop(signal.SIGKILL)
    rows = sum(archived(root, s.metrics_topic).values())
    print(f"CHAOS sink stopped (SIGTERM) with its broker dead: exited {code} in {took:.1f} s; "
          f"{rows} of {produced} rows archived", flush=True)
    assert took < PROMPT_S, f"the sink took {took:.1f} s to stop"
    assert code == 0 and rows == produced, sink.log()


def test_worker_exits_promptly_on_sigterm_with_its_broker_dead(
    chaos_broker: ChaosBroker, chaos_settings: Settings, chaos_worker: WorkerProcess
) -> None:
    worker = chaos_worker.start()
    produce(chaos_settings, scenario_batches("stop", None, 10.0))
    time.sleep(2.0)  # taken in, state changing
    chaos_broker.kill()
    time.sleep(0.5)
    code, took = stop_timed(worker)
    print(f"CHAOS worker stopped (SIGTERM) with its broker dead: exited {code} in {took:.1f} s "
          f"(grace {chaos_settings.worker_shutdown_grace_s:.0f} s)", flush=True)
    assert took < PROMPT_S, f"the worker took {took:.1f} s to stop:\n{worker.log()[-2000:]}"
