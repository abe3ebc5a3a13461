"""The worker's snapshots as changelog messages: a head per partition and a part per job, written when changed.

``WorkerState`` runs here against the state-log benchmark's in-memory table, whose changelog records every
message sent, in order, so each test can read exactly what a broker would hold and what a compacted changelog
would keep.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import AnomalyKind
from ccld.schemas.codec import encode_batch
from ccld.settings import AnalyzerSettings, Settings
from ccld.streams.processor import PartitionProcessor
from ccld.streams.worker_state import WorkerState
from factories import load_benchmark, make_verdict

Table = load_benchmark("state_log", "state_log_bench").MemoryTable


def job_messages(job: str, ranks: int = 8, duration_s: float = 30.0, faults: list[dict[str, Any]] | None = None
                 ) -> list[tuple[float, bytes]]:
    sc = Scenario.from_dict({"id": job, "seed": 7, "ranks": ranks, "layout": {"tp": 4, "pp": 1, "dp": ranks // 4},
                             "channels": 2, "step_time_s": 1.0, "duration_s": duration_s, "faults": faults or []})
    return [(t, encode_batch(b)) for t, b in simulate(sc)]


def worker_state(table: Any, settings: Settings | None = None) -> WorkerState[PartitionProcessor]:
    return WorkerState(settings or Settings(), table, "m", restore=lambda p, raw, parts: PartitionProcessor.restore(
        p, AnalyzerSettings(), raw, parts=parts))


def checkpoint(st: WorkerState[PartitionProcessor], partition: int = 0) -> list[tuple[bytes, bytes | None]]:
    """One forced checkpoint; the changelog messages it wrote."""
    before = len(st.table.changelog_topic.sent)
    asyncio.run(st.checkpoint(partition, force=True))
    return st.table.changelog_topic.sent[before:]


def test_only_the_jobs_that_changed_are_written_and_the_head_comes_last() -> None:
    table = Table()
    st = worker_state(table)
    proc = st.processor(0)
    a, b = job_messages("job-a"), job_messages("job-b")
    offset = 0
    for (ta, ra), (tb, rb) in zip(a[:20], b[:20], strict=True):
        proc.handle(ra, topic="m", offset=offset, timestamp_s=ta, recv_s=ta)
        proc.handle(rb, topic="m", offset=offset + 1, timestamp_s=tb, recv_s=tb)
        offset += 2
    first = [k for k, _ in checkpoint(st)]
    assert sorted(first[:-1]) == [b"m:0/job-a", b"m:0/job-b"] and first[-1] == b"m:0", first
    for t, raw in a[20:25]:  # only job-a gets records
        proc.handle(raw, topic="m", offset=offset, timestamp_s=t, recv_s=t)
        offset += 1
    assert [k for k, _ in checkpoint(st)] == [b"m:0/job-a", b"m:0"]
    assert checkpoint(st) == [] and st.unchanged[0] == 1  # nothing changed: nothing written, counted
    assert st.snapshot_bytes(0) == sum(len(v) for v in table.data.values())


def test_a_partition_of_many_jobs_never_needs_a_message_near_the_limit() -> None:
    """Forty 32-rank jobs on one partition: the limit is half of what one blob of them would be, and every
    message (a job's part, the head) stays far under it; the restored processor holds every job."""
    proc = PartitionProcessor(0, AnalyzerSettings())
    offset = 0
    for j in range(40):
        for t, raw in job_messages(f"job-{j}", ranks=32, duration_s=12.0):
            proc.handle(raw, topic="m", offset=offset, timestamp_s=t, recv_s=t)
            offset += 1
    limit = len(proc.snapshot()) // 2
    table = Table()
    st = worker_state(table, Settings(worker_snapshot_max_bytes=limit))
    st.processors[0] = proc
    written = checkpoint(st)
    sizes = [len(v or b"") for _, v in written]
    assert len(written) == 41 and max(sizes) < limit / 3, (limit, max(sizes))
    assert not st.too_large
    back = worker_state(table)
    table.data = table.compacted()
    assert sorted(back.processor(0).jobs) == sorted(proc.jobs)


def test_a_forgotten_job_gets_a_tombstone_and_a_restart_does_not_bring_it_back() -> None:
    table = Table()
    st = worker_state(table)
    proc = st.processor(0)
    for i, (t, raw) in enumerate(job_messages("gone", duration_s=10.0)):
        proc.handle(raw, topic="m", offset=i, timestamp_s=t, recv_s=t)
    checkpoint(st)
    assert b"m:0/gone" in table.compacted()
    del proc.jobs["gone"]  # what tick() does to a job silent past its expiry with nothing open or pending
    assert checkpoint(st)[0] == (b"m:0/gone", None)
    assert b"m:0/gone" not in table.compacted() and b"m:0/gone" not in table.data
    table.data = table.compacted()
    assert worker_state(table).processor(0).jobs == {}


def test_a_job_is_kept_until_its_pending_verdicts_are_acknowledged() -> None:
    proc = PartitionProcessor(0, AnalyzerSettings())
    msgs = job_messages("quiet", duration_s=10.0)
    for i, (t, raw) in enumerate(msgs):
        proc.handle(raw, topic="m", offset=i, timestamp_s=t, recv_s=t)
    v = make_verdict(job="quiet", kind=AnomalyKind.S1)
    proc.found([v])
    later = msgs[-1][0] + AnalyzerSettings().job_expiry_s + 600
    proc.tick(recv_s=later, caught_up=True)
    assert "quiet" in proc.jobs, "forgotten with a verdict still to send: its part (and the verdict) would go"
    proc.mark_sent(v)
    proc.tick(recv_s=later + 1, caught_up=True)
    assert "quiet" not in proc.jobs


def test_a_worker_dead_between_a_jobs_part_and_the_head_analyses_nothing_twice_and_loses_no_verdict() -> None:
    """The changelog holds job-a's new part (records up to offset 40, a verdict pending) but the head of
    offset 20: the successor re-reads from 20; job-a skips what its part covers, job-b analyses it."""
    table = Table()
    st = worker_state(table)
    proc = st.processor(0)
    a, b = job_messages("job-a"), job_messages("job-b")
    stream = [m for pair in zip(a[:30], b[:30], strict=True) for m in pair]
    for i, (t, raw) in enumerate(stream[:20]):
        proc.handle(raw, topic="m", offset=i, timestamp_s=t, recv_s=t)
    checkpoint(st)
    old_head = table.data[b"m:0"]
    for i, (t, raw) in enumerate(stream[20:40], start=20):
        proc.handle(raw, topic="m", offset=i, timestamp_s=t, recv_s=t)
    v = make_verdict(job="job-a", kind=AnomalyKind.H1)
    proc.found([v])
    written = checkpoint(st)
    crashed = dict(table.compacted())
    crashed[b"m:0"] = old_head  # the head of this checkpoint never reached the broker
    crashed[b"m:0/job-b"] = next(val for k, val in table.changelog_topic.sent if k == b"m:0/job-b")  # nor b's
    assert [k for k, _ in written][-1] == b"m:0"
    table.data = crashed
    again = worker_state(table).processor(0)
    assert again.next_offset == 20 and [p.dedupe_key for p, _ in again.pending()] == [v.dedupe_key]
    for i, (t, raw) in enumerate(stream[20:], start=20):
        again.handle(raw, topic="m", offset=i, timestamp_s=t, recv_s=t)
    whole = PartitionProcessor(0, AnalyzerSettings())
    for i, (t, raw) in enumerate(stream):
        whole.handle(raw, topic="m", offset=i, timestamp_s=t, recv_s=t)
    for job in ("job-a", "job-b"):
        assert again.jobs[job].analyzer.stats["records"] == whole.jobs[job].analyzer.stats["records"], job
    assert again.counters["replayed_skipped"] == 10  # job-a's ten messages between offsets 20 and 40


def test_one_job_over_the_limit_writes_nothing_and_says_so() -> None:
    table = Table()
    st = worker_state(table, Settings(worker_snapshot_max_bytes=1_000))
    proc = st.processor(0)
    for i, (t, raw) in enumerate(job_messages("big", ranks=32, duration_s=10.0)):
        proc.handle(raw, topic="m", offset=i, timestamp_s=t, recv_s=t)
    assert checkpoint(st) == [] and st.too_large[0] == 1 and table.data == {}


def test_a_snapshot_of_the_single_message_layout_still_restores_through_the_worker_state() -> None:
    proc = PartitionProcessor(0, AnalyzerSettings())
    for i, (t, raw) in enumerate(job_messages("old", duration_s=10.0)):
        proc.handle(raw, topic="m", offset=i, timestamp_s=t, recv_s=t)
    table = Table()
    table.data[b"m:0"] = proc.snapshot()
    back = worker_state(table).processor(0)
    assert back.next_offset == proc.next_offset and back.job_clock("old") == proc.job_clock("old")
    assert zlib.decompress(table.data[b"m:0"]).startswith(b"{")


def test_a_recreated_topic_s_offsets_are_not_taken_for_replays_of_a_job_that_goes_on() -> None:
    """The broker lost its log: the job's next messages come at offsets its part already covers."""
    proc = PartitionProcessor(0, AnalyzerSettings())
    msgs = job_messages("on", duration_s=20.0)
    for i, (t, raw) in enumerate(msgs[:30]):
        proc.handle(raw, topic="m", offset=i, timestamp_s=t, recv_s=t)
    before = proc.jobs["on"].analyzer.stats["records"]
    proc.offsets_restart()
    for i, (t, raw) in enumerate(msgs[30:40]):
        proc.handle(raw, topic="m", offset=i, timestamp_s=t, recv_s=t)
    assert proc.jobs["on"].analyzer.stats["records"] > before and not proc.counters.get("replayed_skipped")
