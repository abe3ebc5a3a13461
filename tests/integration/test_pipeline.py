"""The pipeline end to end on the real broker with real worker processes (no Kafka mocks)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from confluent_kafka import Producer

from ccld.producers.kafka import MetricsProducer
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import KernelBatch
from ccld.schemas.codec import decode_dead_letter, decode_verdict, encode, encode_batch
from ccld.settings import Settings
from ccld.sinks.archiver import Archiver
from ccld.sinks.catalog import has_topic, scan
from ccld.sinks.layout import topic_dir
from factories import make_kernel_record
from harness import WorkerProcess, collect_verdicts, raw_messages, raw_records

pytestmark = pytest.mark.integration


def scenario(sid: str, fault: dict[str, Any] | None, duration_s: float = 110.0) -> Scenario:
    return Scenario.from_dict({
        "id": sid, "seed": 5, "ranks": 16, "layout": {"tp": 8, "pp": 1, "dp": 2}, "channels": 2,
        "step_time_s": 1.0, "duration_s": duration_s, "clock_skew_s": 2.0, "jitter": 0.02,
        "faults": [fault] if fault else [],
        "expect": [{"kind": fault["kind"], "rank": fault["rank"]}] if fault else [],
    })


def publish(settings: Settings, batches: list[tuple[float, KernelBatch]]) -> int:
    with MetricsProducer(settings, background=False) as producer:
        for t, batch in batches:
            assert producer.send_batch(batch, timestamp_ms=int(t * 1000))
        assert producer.flush(20) == 0
        assert producer.stats["delivery_failures"] == 0
    return sum(b.n for _, b in batches)


@pytest.fixture
def archiver(ccld_settings: Settings) -> Iterator[Archiver]:
    arch = Archiver(ccld_settings)
    stop = threading.Event()
    thread = threading.Thread(target=arch.run, args=(stop,), daemon=True)
    thread.start()
    yield arch
    stop.set()
    thread.join(30)


def wait_for(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


def test_batches_become_parquet_rows_and_a_verdict(
    ccld_settings: Settings, running_worker: WorkerProcess, archiver: Archiver
) -> None:
    sc = scenario("it-h1", {"kind": "H1", "rank": 5, "onset_s": 50.0})
    sent = publish(ccld_settings, list(simulate(sc)))

    verdicts = collect_verdicts(ccld_settings, 45, until=lambda vs: any(5 in v.root_cause_ranks for v in vs))
    assert [v.kind.value for v in verdicts if 5 in v.root_cause_ranks][:1] == ["H1"], running_worker.log()
    assert all(v.job == "it-h1" for v in verdicts)

    root = Path(ccld_settings.archive_dir)
    metrics_dir = topic_dir(root, ccld_settings.metrics_topic)
    assert wait_for(lambda: sum(f.rows for f in scan(root) if f.topic == ccld_settings.metrics_topic) == sent, 30)
    df = pd.read_parquet(metrics_dir)  # the Hive layout: job and date come back as columns
    assert len(df) == sent and set(df["job"]) == {"it-h1"} and df["rank"].nunique() == 16
    assert set(df["date"]) == {d.strftime("%Y-%m-%d") for d in df["kafka_ts"]}, "rows in another day's folder"
    assert wait_for(lambda: has_topic(root, ccld_settings.verdicts_topic), 20)
    archived = pd.read_parquet(topic_dir(root, ccld_settings.verdicts_topic))
    assert 5 in set(archived["root_cause_ranks"].explode())


def test_corrupt_messages_are_dead_letters_and_the_worker_keeps_going(
    ccld_settings: Settings, running_worker: WorkerProcess
) -> None:
    good = encode_batch(KernelBatch.from_records([make_kernel_record()]))
    bad = {
        b"not avro at all": "bad-marker",
        b"\xc3\x01" + bytes(8) + b"\x00": "unknown-fingerprint",
        good[:-9]: "corrupt-body",
        encode("KernelRecord", make_kernel_record().to_dict())[:-1] + b"\xff\xff": "corrupt-body",
    }
    p = Producer({"bootstrap.servers": ccld_settings.bootstrap})
    for value in bad:
        p.produce(ccld_settings.metrics_topic, value, partition=0)
    p.flush(10)
    sc = scenario("it-after-garbage", {"kind": "H1", "rank": 9, "onset_s": 50.0})
    publish(ccld_settings, list(simulate(sc)))

    verdicts = collect_verdicts(ccld_settings, 45, until=lambda vs: any(9 in v.root_cause_ranks for v in vs))
    assert any(v.kind.value == "H1" and 9 in v.root_cause_ranks for v in verdicts), running_worker.log()
    letters = [decode_dead_letter(m) for m in raw_messages(ccld_settings, ccld_settings.deadletter_topic)]
    assert sorted(d.reason for d in letters) == sorted(bad.values())
    assert {d.raw for d in letters} == set(bad) and {d.source_topic for d in letters} == {ccld_settings.metrics_topic}
    assert all(d.source_partition == 0 and d.source_offset >= 0 for d in letters)


def test_worker_restart_neither_loses_nor_duplicates_verdicts(
    ccld_settings: Settings, worker_factory: Callable[[Settings], WorkerProcess]
) -> None:
    # Job A hangs before the restart and stays hung after it; job B's fault happens after it.
    a = list(simulate(scenario("it-restart-a", {"kind": "H1", "rank": 3, "onset_s": 40.0}, duration_s=140.0)))
    b = list(simulate(scenario("it-restart-b", {"kind": "S1", "rank": 12, "onset_s": 50.0, "factor": 4.0})))
    cut = 95.0  # A's verdict (onset 40 s + ~20 s) is out well before this point of A's stream
    worker = worker_factory(ccld_settings).start()
    publish(ccld_settings, [x for x in a if x[0] < cut])
    first = collect_verdicts(ccld_settings, 45, until=lambda vs: any(3 in v.root_cause_ranks for v in vs))
    assert any(v.kind.value == "H1" and 3 in v.root_cause_ranks for v in first), worker.log()
    time.sleep(2 * ccld_settings.worker_tick_s + 1)  # the snapshot after the verdict reaches the changelog
    assert worker.stop() == 0

    worker.start()  # same app id: resumes the committed offsets and the snapshot
    # A stop right after new records: offsets committed at shutdown must not run ahead of the state.
    publish(ccld_settings, [x for x in a if cut <= x[0] < cut + 10])
    time.sleep(1.5)
    assert worker.stop() == 0
    worker.start()
    publish(ccld_settings, [x for x in a if x[0] >= cut + 10] + b)
    collect_verdicts(ccld_settings, 60, until=lambda vs: any(12 in v.root_cause_ranks for v in vs))
    time.sleep(3)  # anything a duplicate would need to show up
    raw = [decode_verdict(m) for m in raw_messages(ccld_settings, ccld_settings.verdicts_topic)]
    assert any(v.kind.value == "S1" and 12 in v.root_cause_ranks for v in raw), worker.log()
    opened = Counter((v.job, v.incident_id) for v in raw if v.state.value == "open")
    assert opened[("it-restart-a", next(v.incident_id for v in first if 3 in v.root_cause_ranks))] == 1
    assert all(n == 1 for n in opened.values()), f"duplicated verdicts after restart: {opened}"
    assert "resumed from a" in worker.log(), "the restarted worker did not restore its snapshot"
    assert "were not analyzed" not in worker.log(), "offsets were committed ahead of the saved state"


def test_archiver_commits_after_write_and_a_restart_rewrites_nothing(ccld_settings: Settings) -> None:
    sc = scenario("it-sink", None, duration_s=30.0)
    sent = publish(ccld_settings, list(simulate(sc)))
    root = Path(ccld_settings.archive_dir)

    def run_once() -> Archiver:
        arch = Archiver(ccld_settings)
        stop = threading.Event()
        t = threading.Thread(target=arch.run, args=(stop,), daemon=True)
        t.start()
        wait_for(lambda: arch.counters["rows"] >= sent, 30)
        time.sleep(1.0)
        stop.set()
        t.join(30)
        return arch

    first = run_once()
    assert first.counters["rows"] == sent and first.counters["undecodable"] == 0
    files = {f.path: f.path.stat().st_mtime_ns for f in scan(root)}
    second = Archiver(ccld_settings)  # same group: everything is committed, nothing to re-read
    stop = threading.Event()
    t = threading.Thread(target=second.run, args=(stop,), daemon=True)
    t.start()
    assert second.assigned.wait(30), "the second archiver never joined its group"
    time.sleep(3)  # time to fetch anything that was not committed
    stop.set()
    t.join(30)
    assert second.counters["messages"] == 0
    assert {f.path: f.path.stat().st_mtime_ns for f in scan(root)} == files
    assert sum(f.rows for f in scan(root)) == sent



def test_an_idle_partition_writes_no_snapshot(ccld_settings: Settings, running_worker: WorkerProcess) -> None:
    """The worker snapshots a partition's state to its changelog (at most once a second, and at the end of
    each burst of messages); an idle one, its job over and nothing changing, must not be written again each
    second (on a broker that never compacts, a day of that is 86,400 copies per partition). Its last
    snapshot still covers every message."""
    import json
    import zlib

    n = len(batches := list(simulate(scenario("it-idle", None, duration_s=20.0))))
    publish(ccld_settings, batches)
    changelog = f"{ccld_settings.worker_app_id}-analyzer-state-changelog"

    def written() -> list[bytes]:
        return [v for _, _, v in raw_records(ccld_settings, changelog, idle_s=1.0)]

    # the job's end is judged for some seconds after its last record (silence, the cut rule): then still
    deadline, counts = time.monotonic() + 60, [len(written())]
    while time.monotonic() < deadline and (len(counts) < 5 or counts[-1] != counts[-5]):
        time.sleep(2.5)  # the worker ticks every second: each tick would have written one before
        counts.append(len(written()))
    assert len(counts) >= 5 and counts[-1] == counts[-5] > 0, (counts, running_worker.log())
    last = json.loads(zlib.decompress(written()[-1]))
    assert last["next_offset"] == n, (last["next_offset"], n)


def test_a_snapshot_over_the_message_limit_is_refused_loudly_and_the_verdicts_still_go_out(
    ccld_settings: Settings, worker_factory: Callable[[Settings], WorkerProcess]
) -> None:
    """A snapshot is one changelog message; one the broker would refuse (over its message.max.bytes) made every
    verdict queued behind it wait for ever. With the limit set below a 16-rank job's state, the hang of that
    job is still reported, the worker says once why its snapshots stop, and none over the limit is written."""
    limit = 2_000
    s = ccld_settings.replace(worker_snapshot_max_bytes=limit)
    worker = worker_factory(s).start()
    publish(s, list(simulate(scenario("it-big-state", {"kind": "H1", "rank": 5, "onset_s": 30.0}, duration_s=60.0))))
    verdicts = collect_verdicts(s, 60, until=lambda vs: any(5 in v.root_cause_ranks for v in vs))
    assert any(v.kind.value == "H1" and v.root_cause_ranks == (5,) for v in verdicts), worker.log()
    assert worker.log().count("over worker_snapshot_max_bytes") == 1, worker.log()[-3000:]
    sizes = [len(v) for _, _, v in raw_records(s, f"{s.worker_app_id}-analyzer-state-changelog", idle_s=1.0)]
    assert max(sizes, default=0) <= limit, sizes
