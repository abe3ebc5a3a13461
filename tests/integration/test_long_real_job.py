"""The long real job's short version: ``benchmarks/long_real_job.py`` for two minutes, as CI can afford.

The whole chain a user runs (``ccld up``, ``ccld run -- torchrun``, ``ccld verdicts``) with a real gloo
DDP job that evaluates, pauses for a checkpoint, runs for half a minute on a host whose CPUs six busy
processes take, and loses a rank to SIGKILL (torchrun restarts the group): no verdict at all, records
handled, and the worker saw the restarted group's incarnation. The 30-minute run is the benchmark's own
(benchmarks/RESULTS.md); CI never runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'ccl-d[torch]')")

pytestmark = [pytest.mark.integration, pytest.mark.torch]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "long_real_job.py"


def test_a_healthy_job_with_evaluation_checkpoint_and_a_restart_gets_no_verdict(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    # the busy processes only where the kernel measures CPU pressure (PSI): without it the attachment
    # cannot tell a loaded host, and a starved loopback reads as a slow link (docs/analyzer.md)
    hogs = 6 if os.path.exists("/proc/pressure/cpu") else 0
    cmd = [sys.executable, str(SCRIPT), "--minutes", "2", "--baseline-minutes", "0", "--ckpt-pause-s", "8",
           "--hogs", str(hogs), "--hog-at", "0.15", "--hog-s", "30",
           "--drain-s", "25", "--work-dir", str(tmp_path / "work"), "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    assert out.exists(), res.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["worker"]["records"] > 0 and result["worker"]["dead_letters"] == 0, result["worker"]
    restart = result["restart"]
    assert restart["kill"] and restart["kill"]["done"], restart
    assert set(restart["incarnations_seen_by_worker"]) == {"0", "1"}, restart
    assert restart["incarnations_in_step_logs"] == [0, 1] and restart["torchrun_exit_code"] == 0, restart
    phases = result["steps"]["attached"]["phases"]
    assert phases.get("ckpt") == 1 and phases.get("eval", 0) >= 3 and phases.get("train", 0) > 100, phases
    # last: everything above held, so a verdict here is about the analyzer, not a broken run
    verdicts = result["verdicts"]
    # While the busy processes hold the CPUs, gloo's send/recv and all-reduce really take several times
    # their healthy time on every rank: comm-slow to the analyzer, but the ranks said their host was
    # stalled for CPUs most of the time (Linux PSI, KernelBatch.cpu_wait), so no S2 is reported for it
    # (before that rule, S2 verdicts on the send/recv pairs and the broadcast here; with the process's own
    # run-queue wait, about 0.5 idle or starved, it held them only by chance; benchmarks/RESULTS.md)
    assert (result["hogs"] or {}).get("processes", 0) == hogs and "slow_held_starved" in result["worker"], result
    assert not verdicts["all"], json.dumps(verdicts["all"], indent=1)[:6000]
    assert res.returncode == 0, res.stderr[-4000:]
