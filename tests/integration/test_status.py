"""``ccld status`` on a running 64-rank simulated job with a hang, answered by a real worker (issue 17, item 4)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from ccld.producers.kafka import MetricsProducer
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import AnomalyKind
from ccld.settings import Settings
from ccld.stack.broker import free_port
from harness import WorkerProcess, collect_verdicts

pytestmark = pytest.mark.integration


def status(s: Settings, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "status", "--job", s.job, "--worker", url, *extra],
                          capture_output=True, text=True, timeout=30)


def test_status_of_a_hung_64_rank_job_names_the_rank_in_no_collective_and_who_waits(
        ccld_settings: Settings, tmp_path: object) -> None:
    port = free_port()
    s = ccld_settings.replace(job=f"status-{time.time_ns() % 10**6}", worker_web_port=port, analyzer_hang_min_s=10.0)
    sc = Scenario.from_dict({
        "id": s.job, "seed": 3, "ranks": 64, "gpus_per_node": 8, "layout": {"tp": 8, "pp": 2, "dp": 4},
        "channels": 2, "duration_s": 45.0, "clock_skew_s": 1.0, "jitter": 0.05,
        "workload": {"microbatches": 4, "layers": 2, "layer_ms": 4.0},
        "faults": [{"kind": "H1", "rank": 13, "onset_s": 15.0}], "expect": [],
    })
    worker = WorkerProcess(s, tmp_path / "worker.log")  # type: ignore[operator]
    try:
        worker.start()
        t0 = time.time() - 45.0  # the job ran the last 45 s: its records are stamped so
        with MetricsProducer(s, background=False) as p:
            for t, b in simulate(sc):
                p.send_batch(b, timestamp_ms=int((t0 + t) * 1000))
        got = collect_verdicts(s, 60, until=lambda vs: any(v.kind is AnomalyKind.H1 for v in vs))
        assert any(v.kind is AnomalyKind.H1 and v.root_cause_ranks == (13,) for v in got), worker.log()
        url = f"http://127.0.0.1:{port}"
        t1 = time.monotonic()
        res = status(s, url)
        took = time.monotonic() - t1
        assert res.returncode == 0, res.stdout + res.stderr + worker.log()
        out = res.stdout
        assert "64 ranks" in out and "1 ranks (13): in no collective" in out, out
        assert "wait for ranks 13 (H1)" in out and "H1 ranks 13 on node-0001" in out, out
        assert len(out.splitlines()) < 60, "it must fit a screen"
        as_json = json.loads(status(s, url, "--json").stdout)
        assert as_json["ranks"] == 64 and [i["roots"] for i in as_json["incidents"]] == ["13"]
        idle = [d["ranks"] for d in as_json["doing"] if d["state"] == "in no collective"]
        waiting = sum(d["n"] for d in as_json["doing"] if d["state"] == "waiting in a stalled op")
        assert idle == ["13"] and waiting == 63, as_json["doing"]
        print(f"STATUS answered in {took:.2f} s (the command, Python start included)")
        bad = subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "status", "--job", s.job, "--worker",
                              f"http://127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=30)
        assert bad.returncode == 2 and "no worker answered" in bad.stderr and "Traceback" not in bad.stderr
    finally:
        worker.stop()
