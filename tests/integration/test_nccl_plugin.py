"""``ccld run --nccl-plugin`` end to end: NCCL's calls into the plugin, the host aggregator, the broker, the worker.

``ccld run --nccl-plugin`` builds the plugin, names it to every process it starts (``NCCL_PROFILER_PLUGIN``,
``CCLD_NCCL_DIR``) and polls their tables from its host aggregator. The command it runs launches the ranks
of five 4-rank jobs at once, each rank a process that loads the library ``NCCL_PROFILER_PLUGIN`` names and
calls it as NCCL does while its ring all-reduces run (``ccld.probe.nccl_replay``): one job hangs on a rank
(H1), one on a link's channel (H3), one has a rank computing 3x longer (S1), one a link at a third of its
speed (S2), one is healthy. The worker must name each on the right rank or link, and nothing on the last.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ccld.probe.nccl_replay import RingJob, job_json
from ccld.records import AnomalyKind, Link, Verdict, VerdictState
from ccld.settings import Settings
from harness import WorkerProcess, collect_verdicts, kill_tree

pytestmark = [pytest.mark.integration]

ONSET_S = 12.0
DURATION_S = 45.0


def test_every_fault_through_the_plugin_the_aggregator_the_broker_and_the_worker(
    tmp_path: Path, fast: Settings, worker_factory: Callable[[Settings], WorkerProcess]
) -> None:
    # ops of 0.3 s (0.9 s on the slow link) against the aggregator's 0.1-s polls, one channel, two ring rounds:
    # twenty rank processes on two busy cores fall behind their schedule at times, and a poll must still
    # catch the slow link's source inside its op (its backlog names the link)
    base = dict(nranks=4, channels=1, rounds=2, compute_s=0.5, op_s=0.3, duration_s=DURATION_S, onset_s=ONSET_S)
    jobs = {
        "h1": RingJob(name=f"{fast.job}-h1", fault="H1", rank=2, comm_hash=0x11, **base),  # type: ignore[arg-type]
        "h3": RingJob(name=f"{fast.job}-h3", fault="H3", rank=1, channel=0, comm_hash=0x33, **base),  # type: ignore[arg-type]
        "s1": RingJob(name=f"{fast.job}-s1", fault="S1", rank=3, factor=3.0, comm_hash=0x51, **base),  # type: ignore[arg-type]
        "s2": RingJob(name=f"{fast.job}-s2", fault="S2", rank=0, factor=3.0, comm_hash=0x52, **base),  # type: ignore[arg-type]
        "ok": RingJob(name=f"{fast.job}-ok", comm_hash=0x99, **base),  # type: ignore[arg-type]
    }
    want = {
        jobs["h1"].name: lambda v: (v.kind, v.root_cause_ranks) == (AnomalyKind.H1, (2,)),
        jobs["h3"].name: lambda v: (v.kind, v.link, v.channel) == (AnomalyKind.H3, Link(1, 2), 0),
        jobs["s1"].name: lambda v: (v.kind, v.root_cause_ranks) == (AnomalyKind.S1, (3,)),
        jobs["s2"].name: lambda v: (v.kind, v.link) == (AnomalyKind.S2, Link(0, 1)),
    }
    cmd = [sys.executable, "-m", "ccld.cli", "run", "--nccl-plugin", "--bootstrap", fast.bootstrap,
           "--topic-prefix", fast.topic_prefix, "--job", fast.job, "--",
           sys.executable, "-m", "ccld.probe.nccl_replay"]  # fmt: skip
    for job in jobs.values():
        cmd += ["--job", job_json(job)]
    log_path = tmp_path / "run.log"
    with open(log_path, "wb") as log:
        worker_factory(fast).start()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            def opened(vs: list[Verdict]) -> list[Verdict]:
                return [v for v in vs if v.state == VerdictState.OPEN]

            got = collect_verdicts(fast, DURATION_S + 60, until=lambda vs: all(
                any(v.job == name and ok(v) for v in opened(vs)) for name, ok in want.items()))  # fmt: skip
            rc = proc.wait(timeout=DURATION_S + 30)
            # the jobs have ended: what the worker says in the silence after them counts too
            got = collect_verdicts(fast, 15.0)
        finally:
            kill_tree(proc)
    run_log = log_path.read_text(errors="replace")[-4000:]
    seen = "\n".join(v.describe() for v in got)
    for name, ok in want.items():
        mine = [v for v in opened(got) if v.job == name]
        assert len(mine) == 1 and ok(mine[0]), f"{name}:\n{seen}\n{run_log}"
        assert len({v.incident_id for v in got if v.job == name}) == 1, f"{name}:\n{seen}"  # one incident each
    assert not [v for v in got if v.job == jobs["ok"].name], f"{seen}\n{run_log}"
    assert rc == 0, run_log
    assert "ccld-nccl:" not in run_log, run_log  # no rank refused the plugin
