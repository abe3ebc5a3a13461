"""A rank hangs while the broker is down: with the spool on, no record is lost and the verdict still arrives once.

The end-to-end version of the producer outage tests: a real-time ``ccld simulate`` (8 ranks) with
the on-disk spool, a real ``ccld worker``, and the broker frozen (SIGSTOP) from before the fault's
onset until well after it. The worker sees nothing of the fault until the producer replays its
spool; it must then name the hung rank, once. ``benchmarks/chaos.py --fault-verdict`` runs the same
function with a 60-s outage.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from ccld.settings import Settings
from chaoslib import ChaosBroker, fault_during_outage, record_result, worker_counters
from harness import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_a_hang_during_a_broker_outage_is_found_once_and_nothing_is_lost(
    chaos_broker: ChaosBroker, chaos_settings: Settings, chaos_worker: WorkerProcess, tmp_path: Path
) -> None:
    worker = chaos_worker.start()
    # Frozen 3-15 s, the hang begins at 6 s: every record of its onset goes through the spool.
    r = fault_during_outage(chaos_broker, chaos_settings, worker, tmp_path / "spool", outage_at_s=3.0,
                            outage_s=12.0, onset_s=6.0, duration_s=40.0, rank=5)
    assert r["returncode"] == 0, (r["stdout"], r["stderr"])
    assert " 0 lost " in r["stdout"] and "spooled 0" in r["stdout"], r["stdout"]
    assert "replayed 0," not in r["stdout"], f"the outage spooled nothing: the test proves nothing\n{r['stdout']}"
    assert r["records_on_broker"] == r["expected_records"], r
    assert r["verdict"] is not None, f"no H1 verdict naming rank 5\n{worker.log()}"
    opened = Counter(v.incident_id for v in r["verdicts_raw"])
    assert len(opened) == 1 and all(n == 1 for n in opened.values()), f"lost or repeated verdicts: {opened}"
    assert worker.stop() == 0
    c = worker_counters(worker)
    assert c.get("analyzed_records") == r["expected_records"], c
    record_result("broker frozen while a rank hangs, producer spooling", "SIGSTOP 12 s from 3 s, H1 onset at 6 s; "
                  f"verdict {r['verdict_after_thaw_s']:.0f} s after SIGCONT", produced=r["expected_records"],
                  delivered=r["records_on_broker"], verdicts_expected=1, verdicts_received=len(opened),
                  verdicts_raw=len(r["verdicts_raw"]))
