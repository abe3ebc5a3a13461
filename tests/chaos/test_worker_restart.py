"""The worker killed with SIGKILL mid-stream and started again: no verdict lost, none repeated, no record skipped.

A real broker and a real ``ccld worker`` process. The kill lands while the worker is busy with
records of two jobs, between snapshots; the restarted worker resumes from its changelog snapshot
and from offsets that were committed only once a snapshot covered them.
"""

from __future__ import annotations

import functools
import json
import signal
import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ccld.records import AnomalyKind, Verdict, VerdictState
from ccld.schemas.codec import encode_verdict
from ccld.settings import Settings
from chaoslib import (
    committed,
    produce,
    raw_verdicts,
    record_result,
    republish_snapshot,
    scenario_batches,
    snapshots,
    wait_for,
    worker_counters,
)
from harness import WorkerProcess, collect_verdicts

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_worker_killed_with_sigkill_loses_and_repeats_nothing(
    chaos_settings: Settings, chaos_worker: WorkerProcess
) -> None:
    s = chaos_settings
    a = scenario_batches("kill9-a", {"kind": "H1", "rank": 3, "onset_s": 20.0}, 80.0)
    b = scenario_batches("kill9-b", {"kind": "H1", "rank": 6, "onset_s": 15.0}, 45.0)
    worker = chaos_worker.start()
    sent = produce(s, [x for x in a if x[0] < 50.0])
    first = collect_verdicts(s, 40, until=lambda vs: any(3 in v.root_cause_ranks for v in vs))
    assert any(v.kind.value == "H1" and 3 in v.root_cause_ranks for v in first), worker.log()
    # More of A and the start of B, then SIGKILL while the worker is still taking them in.
    sent += produce(s, sorted([x for x in a if 50.0 <= x[0] < 65.0] + [x for x in b if x[0] < 20.0],
                              key=lambda x: x[0]))
    time.sleep(0.7)
    assert worker.stop(signal.SIGKILL) == -signal.SIGKILL
    t0 = time.monotonic()
    worker.start()  # same app id: the snapshot from the changelog, offsets from the group
    sent += produce(s, sorted([x for x in a if x[0] >= 65.0] + [x for x in b if x[0] >= 20.0], key=lambda x: x[0]))
    got = collect_verdicts(s, 50, until=lambda vs: any(6 in v.root_cause_ranks for v in vs))
    recovered_s = time.monotonic() - t0
    assert any(v.kind.value == "H1" and 6 in v.root_cause_ranks and v.job == "kill9-b" for v in got), worker.log()
    time.sleep(2)  # time for a repeat to show up
    raw = raw_verdicts(s)
    per_key = Counter((v.incident_id, v.state.value) for v in raw)
    opened = Counter(v.job for v in raw if v.state.value == "open")
    assert opened == Counter({"kill9-a": 1, "kill9-b": 1}), f"lost or repeated verdicts: {per_key}"
    assert all(n == 1 for n in per_key.values()), f"repeated verdicts: {per_key}"
    assert "were not analyzed" not in worker.log(), "offsets were committed ahead of the saved state"
    assert worker.stop() == 0
    assert wait_for(lambda: bool(worker_counters(worker)), 5)
    c = worker_counters(worker)
    assert c.get("analyzed_records") == sent, c  # every record analyzed once, replays de-duplicated
    record_result("worker killed (SIGKILL) mid-stream, restarted", f"SIGKILL during intake of 2 jobs; second verdict "
                  f"{recovered_s:.0f} s after the restart", produced=sent, delivered=c.get("analyzed_records", 0),
                  verdicts_expected=2, verdicts_received=sum(opened.values()),
                  verdicts_raw=sum(1 for v in raw if v.state.value == "open"))


def _analysed(s: Settings, worker: WorkerProcess, batches: list[Any], job: str, rank: int) -> int:
    """Produce ``batches``; wait for the verdict naming ``rank`` (of ``job``) and for all of them committed."""
    sent = produce(s, batches)
    first = collect_verdicts(s, 40, until=lambda vs: any(rank in v.root_cause_ranks for v in vs))
    assert any(v.job == job for v in first), worker.log()
    assert wait_for(lambda: committed(s) >= len(batches), 30), worker.log()
    return sent


def _opened_once(s: Settings, *jobs: str) -> Counter[str]:
    """The jobs' OPEN verdicts on the topic, after time for a repeat to show up: one each, or fail."""
    time.sleep(2)
    opened = Counter(v.job for v in raw_verdicts(s) if v.state.value == "open")
    assert opened == Counter({j: 1 for j in jobs}), f"lost or repeated verdicts: {opened}"
    return opened


def test_a_worker_resumed_past_its_snapshot_reads_the_offsets_between_back(
    chaos_settings: Settings, chaos_worker: WorkerProcess
) -> None:
    """A worker can resume at a committed offset past what its snapshot saw: Faust acks, so may commit,
    messages it drops unseen (an old consumer generation, a flow paused by a rebalance or a recovery).
    Made certain here by restoring an older snapshot than the committed offset. The restarted worker
    must read the offsets between back (not skip them) and must not repeat the verdict it had sent."""
    s = chaos_settings
    a = scenario_batches("behind-a", {"kind": "H1", "rank": 3, "onset_s": 15.0}, 45.0)
    b = scenario_batches("behind-b", {"kind": "H1", "rank": 2, "onset_s": 10.0}, 45.0)
    worker = chaos_worker.start()
    sent = _analysed(s, worker, a, "behind-a", 3)
    assert worker.stop(signal.SIGKILL) == -signal.SIGKILL
    at = committed(s)
    older = [(n, raw) for n, raw in snapshots(s) if 0 <= n < at - 20]
    assert older, f"no snapshot older than the committed offset {at}: {[n for n, _ in snapshots(s)]}"
    republish_snapshot(s, older[0][1])
    worker.start()
    sent += produce(s, b)
    got = collect_verdicts(s, 50, until=lambda vs: any(2 in v.root_cause_ranks for v in vs))
    assert any(v.kind.value == "H1" and 2 in v.root_cause_ranks and v.job == "behind-b" for v in got), worker.log()
    opened = _opened_once(s, "behind-a", "behind-b")
    assert "without delivering them; read back" in worker.log(), worker.log()
    assert "were not analyzed" not in worker.log()
    assert worker.stop() == 0
    assert wait_for(lambda: bool(worker_counters(worker)), 5)
    c = worker_counters(worker)
    assert c.get("analyzed_records") == sent and c.get("caught_up_messages") == at - older[0][0], (c, at, older[0][0])
    record_result("worker resumed past its snapshot", f"restart from a snapshot {at - older[0][0]} messages older than "
                  "the committed offset (what Faust's ack of messages it drops unseen causes)", produced=sent,
                  delivered=c.get("analyzed_records", 0), verdicts_expected=2, verdicts_received=len(opened),
                  verdicts_raw=sum(opened.values()))


def test_messages_delivered_again_below_the_snapshot_are_analysed_once(
    chaos_settings: Settings, chaos_worker: WorkerProcess
) -> None:
    """The group's committed offset rewound to 0 under a snapshot that covers every message: the restarted
    worker is handed all of them again. Each record must be analysed once (the counters persist in the
    snapshot) and the verdict must not be repeated: re-deliveries are skipped, and counted."""
    s = chaos_settings
    a = scenario_batches("again-a", {"kind": "H1", "rank": 1, "onset_s": 12.0}, 40.0)
    b = scenario_batches("again-b", {"kind": "H1", "rank": 5, "onset_s": 10.0}, 40.0)
    worker = chaos_worker.start()
    sent = _analysed(s, worker, a, "again-a", 1)
    assert worker.stop() == 0
    # Faust may drop a whole fetch of re-delivered messages unseen (one that lands while a rebalance or the
    # recovery pauses the flow: 212 of 213 came back in one CI run, none in another), harmless below the
    # snapshot. The worker logs the first of each run of re-deliveries it skips: restart until it has one.
    restarts = 0
    while True:
        _rewind(s)
        seen = _redelivery_runs(worker)
        worker.start()
        restarts += 1
        if wait_for(functools.partial(_more_redelivery_runs, worker, seen), 20):
            break
        assert restarts < 3, f"no re-delivery reached the worker in {restarts} restarts from offset 0:\n{worker.log()}"
        assert worker.stop() == 0
    sent += produce(s, b)
    got = collect_verdicts(s, 50, until=lambda vs: any(5 in v.root_cause_ranks for v in vs))
    assert any(v.kind.value == "H1" and 5 in v.root_cause_ranks and v.job == "again-b" for v in got), worker.log()
    _opened_once(s, "again-a", "again-b")
    assert worker.stop() == 0
    counters = worker_counters(worker)
    assert counters.get("analyzed_records") == sent, (counters, sent)
    # every message handled once: a's first time, b's now; a's re-deliveries skipped and counted (at most
    # once per restart: some of them may have been dropped unseen)
    assert counters.get("messages") == len(a) + len(b), (counters, len(a), len(b))
    assert 0 < counters.get("redelivered_skipped", 0) <= restarts * len(a), (counters, len(a), restarts)


def _more_redelivery_runs(worker: WorkerProcess, than: int) -> bool:
    return _redelivery_runs(worker) > than


def _redelivery_runs(worker: WorkerProcess) -> int:
    """Runs of re-delivered messages the worker has logged skipping, over the whole log (every start)."""
    return worker.log_path.read_text(errors="replace").count("delivered again below the snapshot's next offset")


def _rewind(s: Settings) -> None:
    """Commit offset 0 of the metrics topic for the worker's (stopped) group."""
    from confluent_kafka import Consumer, TopicPartition

    # The broker takes commits from members only: join the group, then rewind it.
    c = Consumer({"bootstrap.servers": s.bootstrap, "group.id": s.worker_app_id, "enable.auto.commit": False})
    try:
        c.subscribe([s.metrics_topic])
        assert wait_for(lambda: c.poll(0.5) is not None or bool(c.assignment()), 60), "never joined the group"
        c.commit(offsets=[TopicPartition(s.metrics_topic, 0, 0)], asynchronous=False)
    finally:
        c.close()
    assert committed(s) == 0


def test_pending_verdicts_of_a_snapshot_are_sent_once_after_a_restart(
    chaos_settings: Settings, chaos_worker: WorkerProcess
) -> None:
    """The window SIGKILL can only hit by chance, made certain: a worker died with two verdicts pending in its
    snapshot, one of which the broker had already acknowledged. The restarted worker sends the other, once,
    and does not repeat the first, with no new metrics message to wake it."""
    s = chaos_settings
    p = Producer({"bootstrap.servers": s.bootstrap})
    _snapshot_with_pending_verdicts(s, p)
    assert p.flush(10) == 0

    worker = chaos_worker.start()
    assert wait_for(lambda: any(v.incident_id == "chaos-2" for v in raw_verdicts(s, idle_s=0.5)), 30), worker.log()
    time.sleep(2)  # time for a repeat to show up
    raw = raw_verdicts(s)
    assert Counter(v.incident_id for v in raw) == Counter({"chaos-1": 1, "chaos-2": 1}), worker.log()
    assert worker.stop() == 0
    c = worker_counters(worker)
    assert (c.get("verdicts_reconciled"), c.get("pending_verdicts")) == (1, 0), c
    record_result("worker died with verdicts pending, one already acknowledged", "snapshot with 2 pending verdicts, "
                  "1 of them already on the topic; restart with no new metrics", produced=0, delivered=0,
                  verdicts_expected=2, verdicts_received=len({v.incident_id for v in raw}), verdicts_raw=len(raw))


def _snapshot_with_pending_verdicts(s: Settings, p: Producer) -> None:
    """Write a changelog snapshot with two pending H1 verdicts (chaos-1, chaos-2) through ``p`` (not flushed), and
    chaos-1 to the verdicts topic as if acknowledged before the worker died."""
    acked, unsent = (Verdict(incident_id=f"chaos-{n}", state=VerdictState.OPEN, kind=AnomalyKind.H1, job="gone",
                             communicator="00000000000000aa", op_seq=7, op_type="ALL_REDUCE", root_cause_ranks=(n,),
                             affected_ranks=(0, 1, 2, 3), confidence=0.9, evidence="test", onset_time=10.0,
                             detected_time=30.0) for n in (1, 2))
    snapshot = {"jobs": {}, "sent": [], "pending": [acked.to_dict(), unsent.to_dict()], "next_offset": -1,
                "counters": {}}
    changelog = f"{s.worker_app_id}-analyzer-state-changelog"
    admin = AdminClient({"bootstrap.servers": s.bootstrap})
    admin.create_topics([NewTopic(changelog, num_partitions=1, replication_factor=1)])[changelog].result(10)
    p.produce(changelog, json.dumps(snapshot).encode(), key=f"{s.metrics_topic}:0".encode(), partition=0)
    p.produce(s.verdicts_topic, encode_verdict(acked), key=acked.incident_id.encode(), partition=0)


def test_a_changelog_whose_high_watermark_names_an_offset_no_message_holds_is_recovered(
    chaos_settings: Settings, chaos_worker: WorkerProcess
) -> None:
    """Faust's table recovery waits until it has read up to the changelog's high watermark. Here the snapshot
    was written in a committed transaction, so the log ends with the commit marker, an offset that holds no
    message a consumer is ever given: the watermark names offset 1, the recovery reads offset 0 and waits for
    offset 1 for ever (as CI saw it wait after a broker restarted empty), restoring nothing and sending nothing.
    The worker's recovery watch re-arms the consumer after 20 s with nothing delivered, then reads the
    partition by another path, finds no message at offset 1, and ends the recovery: the pending verdict goes
    out, once."""
    s = chaos_settings
    p = Producer({"bootstrap.servers": s.bootstrap, "transactional.id": f"{s.worker_app_id}-writer"})
    p.init_transactions(10)
    p.begin_transaction()
    _snapshot_with_pending_verdicts(s, p)
    p.commit_transaction(10)
    t0 = time.monotonic()
    worker = chaos_worker.start(ready_timeout_s=120)  # ready once the recovery has ended
    assert wait_for(lambda: any(v.incident_id == "chaos-2" for v in raw_verdicts(s, idle_s=0.5)), 30), worker.log()
    recovered_s = time.monotonic() - t0
    log = worker.log()
    assert "holds no message at offsets 1 to 1" in log, log
    time.sleep(2)  # time for a repeat to show up
    assert Counter(v.incident_id for v in raw_verdicts(s)) == Counter({"chaos-1": 1, "chaos-2": 1}), worker.log()
    assert worker.stop() == 0
    c = worker_counters(worker)
    assert (c.get("verdicts_reconciled"), c.get("pending_verdicts")) == (1, 0), c
    record_result("changelog's high watermark names an offset no message holds", "snapshot written in a committed "
                  f"transaction (log ends with its marker); pending verdict sent {recovered_s:.0f} s after the start",
                  produced=0, delivered=0, verdicts_expected=2, verdicts_received=2, verdicts_raw=2)
