"""The worker across broker outages: a frozen broker (SIGSTOP) and a killed one restarted empty on its port.

A real Tansu broker per test and a real ``ccld worker`` process; the verdicts topic is read raw
(duplicates included), because "exactly once on the topic" is what is being tested.
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter

import pytest

from ccld.settings import Settings
from ccld.topics import ensure_topics
from chaoslib import (
    ChaosBroker,
    committed,
    produce,
    raw_verdicts,
    record_result,
    scenario_batches,
    wait_for,
    worker_counters,
)
from harness import WorkerProcess, collect_verdicts

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_a_verdict_found_while_the_broker_is_frozen_arrives_exactly_once(
    chaos_broker: ChaosBroker, chaos_settings: Settings, chaos_worker: WorkerProcess
) -> None:
    s = chaos_settings
    # Rank 5 never enters the op of t=20 s; records stop at 23 s, so the hang (20 s of stall) is found by
    # the worker's timer about 17 s later, while the broker is frozen, and can only be sent after the thaw.
    before = [x for x in scenario_batches("frozen-h1", {"kind": "H1", "rank": 5, "onset_s": 20.0}, 60.0)
              if x[0] < 23.0]
    worker = chaos_worker.start()
    sent = produce(s, before)
    assert wait_for(lambda: committed(s) >= len(before), 30), worker.log()
    assert not raw_verdicts(s, idle_s=0.5), "the hang was reported before the outage: the test proves nothing"
    chaos_broker.freeze()
    t0 = time.monotonic()
    try:
        found = wait_for(lambda: "verdict found, pending" in worker.log_path.read_text(errors="replace"), 40)
        time.sleep(3)  # the send waits on the frozen broker
        frozen_s = time.monotonic() - t0
    finally:
        chaos_broker.thaw()
    assert found, f"no verdict was found during the outage:\n{worker.log()}"
    got = collect_verdicts(s, 40, until=lambda vs: any(5 in v.root_cause_ranks for v in vs))
    assert any(v.kind.value == "H1" and 5 in v.root_cause_ranks for v in got), worker.log()
    time.sleep(2)  # time for a duplicate to show up
    raw = raw_verdicts(s)
    per_key = Counter((v.incident_id, v.state.value) for v in raw)
    assert per_key and all(n == 1 for n in per_key.values()), f"duplicated verdicts: {per_key}"
    assert worker.stop() == 0
    c = worker_counters(worker)
    assert c.get("analyzed_records") == sent, c
    record_result("broker frozen (SIGSTOP) while a verdict is due", f"SIGSTOP {frozen_s:.0f} s, then SIGCONT",
                  produced=sent, delivered=c.get("analyzed_records", 0), verdicts_expected=1,
                  verdicts_received=len(per_key), verdicts_raw=len(raw))


def test_broker_killed_and_restarted_empty_the_worker_goes_on(
    chaos_broker: ChaosBroker, chaos_settings: Settings, chaos_worker: WorkerProcess
) -> None:
    s = chaos_settings
    healthy = scenario_batches("killed-a", None, 20.0)
    worker = chaos_worker.start()
    sent_before = produce(s, healthy)
    assert wait_for(lambda: committed(s) >= len(healthy), 30), worker.log()
    chaos_broker.kill()
    time.sleep(2)
    t0 = time.monotonic()
    chaos_broker.restart()
    ensure_topics(s)  # the broker keeps topics in memory only: an operator (or `ccld up`) recreates them
    hung = scenario_batches("killed-b", {"kind": "H1", "rank": 3, "onset_s": 15.0}, 50.0)
    sent_after = produce(s, hung)
    # up to 90 s: a table recovery that waits on an offset no message holds ends only by the worker's recovery
    # watch, about 30 s in (streams/recovery_watch.py); the verdict itself comes 4-7 s after the restart
    got = collect_verdicts(s, 90, until=lambda vs: any(3 in v.root_cause_ranks for v in vs))
    recovered_s = time.monotonic() - t0
    assert any(v.kind.value == "H1" and 3 in v.root_cause_ranks and v.job == "killed-b" for v in got), worker.log()
    time.sleep(2)
    raw = raw_verdicts(s)
    per_key = Counter((v.incident_id, v.state.value) for v in raw)
    assert all(n == 1 for n in per_key.values()), f"duplicated verdicts: {per_key}"
    # The new log's first offsets come back through the worker's re-read, which a rebalance (the group
    # is new to the restarted broker) may interrupt and hand to the restored state: wait for all of it.
    wait_for(lambda: worker_counters(worker).get("analyzed_records") == sent_before + sent_after, 30)
    assert worker.stop(signal.SIGTERM) == 0
    c = worker_counters(worker)
    assert c.get("analyzed_records") == sent_before + sent_after, f"{c}\n{worker.log()}"
    record_result("broker killed, restarted empty on its port", f"SIGKILL, restart after 2 s, topics recreated; "
                  f"first verdict {recovered_s:.0f} s after the restart", produced=sent_before + sent_after,
                  delivered=c.get("analyzed_records", 0), verdicts_expected=1, verdicts_received=len(per_key),
                  verdicts_raw=len(raw))


@pytest.mark.parametrize("silent", [False, True], ids=["job-goes-on", "job-silent"])
def test_a_verdict_pending_on_a_frozen_broker_survives_a_worker_kill(
    chaos_broker: ChaosBroker, chaos_settings: Settings, chaos_worker: WorkerProcess, silent: bool
) -> None:
    """Found while the broker is frozen, so never acknowledged; the worker is killed before the thaw. The
    verdict counts as sent only on the broker's ack, so the next worker must send it, once.

    ``job-goes-on``: the hung job goes on sending the state of its communicators every interval (the
    attachment and the probe do, from their own threads), and those records reach the broker after the
    thaw: the restarted worker finds the hang again from them. ``job-silent``: the whole job went silent
    at 23 s (its hosts died, or its network to the broker is cut) and nothing more ever comes; the
    restarted worker re-reads nothing (its offsets were committed) and finds the hang from its snapshot
    alone, which keeps the newest rows of stalled communicators (docs/operations.md, "What the worker guarantees"),
    with the same incident id, so the verdict is sent once."""
    s = chaos_settings
    job = scenario_batches("pending-kill", {"kind": "H1", "rank": 5, "onset_s": 20.0}, 60.0)
    before = [x for x in job if x[0] < 23.0]
    after = [x for x in job if x[0] >= 23.0]  # sent during the outage: delivered after the thaw
    worker = chaos_worker.start()
    sent = produce(s, before)
    assert wait_for(lambda: committed(s) >= len(before), 30), worker.log()
    assert not raw_verdicts(s, idle_s=0.5), "the hang was reported before the outage: the test proves nothing"
    chaos_broker.freeze()
    try:
        found = wait_for(lambda: "verdict found, pending" in worker.log_path.read_text(errors="replace"), 40)
        time.sleep(1)  # the courier is now waiting on the frozen broker
        assert worker.stop(signal.SIGKILL) == -signal.SIGKILL
    finally:
        chaos_broker.thaw()
    assert found, f"no verdict was found during the outage:\n{worker.log()}"
    assert "INFO ccld.streams.app: verdict [open]" not in worker.log_path.read_text(errors="replace"), \
        "the broker acknowledged the verdict before the kill: the test proves nothing"
    t0 = time.monotonic()
    worker.start()  # same app id
    if not silent:
        sent += produce(s, after)
    # Found again within hang_min_s (20 s) of the restart if it was not kept pending.
    got = collect_verdicts(s, 30, until=lambda vs: any(5 in v.root_cause_ranks for v in vs))
    recovered_s = time.monotonic() - t0
    assert any(v.kind.value == "H1" and 5 in v.root_cause_ranks for v in got), worker.log()
    time.sleep(2)  # time for a duplicate to show up
    raw = raw_verdicts(s)
    per_key = Counter(v.dedupe_key for v in raw)
    assert len(per_key) == 1 and all(n == 1 for n in per_key.values()), f"lost or duplicated verdicts: {per_key}"
    resumed = re.findall(r"resumed from a \d+-byte snapshot \((\d+) verdicts pending\)", worker.log())
    assert worker.stop() == 0
    c = worker_counters(worker)
    assert c.get("analyzed_records") == sent, c
    record_result("worker killed (SIGKILL) with a verdict pending on a frozen broker"
                  + (", the hung job silent since the outage" if silent else ""),
                  f"SIGSTOP; the H1 verdict found during the freeze; SIGKILL of the worker; SIGCONT; new worker "
                  f"(resumed with {resumed[-1] if resumed else '?'} pending), verdict {recovered_s:.0f} s after "
                  f"its start", produced=sent, delivered=c.get("analyzed_records", 0), verdicts_expected=1,
                  verdicts_received=len(per_key), verdicts_raw=len(raw))
