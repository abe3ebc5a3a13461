"""The worker's per-partition processing without Faust: decode, analyze, dedupe, snapshot."""

from __future__ import annotations

import dataclasses
import time
import zlib

import pytest

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.schemas.codec import decode_dead_letter, encode_batch, load_schema
from ccld.settings import AnalyzerSettings
from ccld.streams.processor import PartitionProcessor, ProcessorOptions
from harness import impossible_batches

SCENARIO = Scenario.from_dict({
    "id": "proc-h1", "seed": 3, "ranks": 16, "layout": {"tp": 8, "pp": 1, "dp": 2}, "channels": 2,
    "step_time_s": 1.0, "duration_s": 100.0, "clock_skew_s": 2.0,
    "faults": [{"kind": "H1", "rank": 6, "onset_s": 40.0}], "expect": [{"kind": "H1", "rank": 6}],
})
MESSAGES = [(t, encode_batch(b)) for t, b in simulate(SCENARIO)]


def feed(proc: PartitionProcessor, messages: list[tuple[float, bytes]], first_offset: int = 0) -> list[str]:
    out = []
    for i, (t, raw) in enumerate(messages):
        res = proc.handle(raw, topic="m", offset=first_offset + i, timestamp_s=t, evaluate=True)
        for v, _ in res.verdicts:
            proc.mark_sent(v)
            out.append(f"{v.incident_id}/{v.state.value}/{v.kind.value}/{v.root_cause_ranks}")
    return out


def test_verdict_found_once_even_when_every_message_is_delivered_twice() -> None:
    once = feed(PartitionProcessor(0, AnalyzerSettings()), MESSAGES)
    assert any("/H1/" in v and "(6,)" in v for v in once), once
    twice = feed(PartitionProcessor(0, AnalyzerSettings()), [m for m in MESSAGES for _ in range(2)])
    assert twice == once


def test_snapshot_restore_and_replay_from_an_older_offset_sends_nothing_twice() -> None:
    half = len(MESSAGES) * 3 // 4
    proc = PartitionProcessor(0, AnalyzerSettings())
    before = feed(proc, MESSAGES[:half])
    assert before, "the hang should be reported within the first three quarters of the run"
    snap = proc.snapshot()
    restored = PartitionProcessor.restore(0, AnalyzerSettings(), snap)
    # at-least-once: the restarted worker re-reads the last 50 messages before it gets new ones
    after = feed(restored, MESSAGES[half - 50 :], first_offset=half - 50)
    assert not set(after) & set(before), "a verdict sent before the restart was sent again"


def test_the_topic_identity_survives_a_snapshot_so_an_unfinished_re_read_is_redone() -> None:
    proc = PartitionProcessor(0, AnalyzerSettings())
    feed(proc, MESSAGES[:10])
    proc.topic_id = "old-topic"  # the re-read of a recreated topic had not finished when this was saved
    restored = PartitionProcessor.restore(0, AnalyzerSettings(), proc.snapshot())
    assert (restored.topic_id, restored.next_offset) == ("old-topic", 10)  # what to re-read
    assert PartitionProcessor.restore(0, AnalyzerSettings(), None).topic_id is None


def test_undecodable_message_is_a_dead_letter_with_its_origin() -> None:
    proc = PartitionProcessor(3, AnalyzerSettings())
    out = proc.handle(b"\xc3\x01garbage!", topic="m", offset=42, timestamp_s=1.0, evaluate=True)
    (dl, raw), = out.dead_letters
    assert (dl.reason, dl.source_partition, dl.source_offset, dl.raw) == ("unknown-fingerprint", 3, 42,
                                                                        b"\xc3\x01garbage!")
    assert proc.counters["dead_letters"] == 1 and not out.verdicts and raw.startswith(b"\xc3\x01")


def test_unreadable_snapshot_starts_empty_instead_of_crashing() -> None:
    proc = PartitionProcessor.restore(1, AnalyzerSettings(), b"{not json")
    assert proc.counters["messages"] == 0 and proc.clock_s == 0.0


def test_a_verdict_whose_send_failed_is_handed_out_again() -> None:
    proc = PartitionProcessor(0, AnalyzerSettings())
    first = None
    for i, (t, raw) in enumerate(MESSAGES):
        res = proc.handle(raw, topic="m", offset=i, timestamp_s=t, evaluate=True)
        if res.verdicts and first is None:
            first = res.verdicts[0][0]  # the send "fails": not marked
            continue
        if first is not None:
            assert first in [v for v, _ in res.verdicts], "an unsent verdict was forgotten"
            proc.mark_sent(first)
            break
    assert first is not None
    assert all(v != first for v, _ in proc.evaluate(MESSAGES[-1][0])), "a sent verdict came back"


def test_restored_processor_reports_offsets_it_never_analyzed() -> None:
    proc = PartitionProcessor(0, AnalyzerSettings())
    feed(proc, MESSAGES[:10])
    restored = PartitionProcessor.restore(0, AnalyzerSettings(), proc.snapshot())
    feed(restored, MESSAGES[25:26], first_offset=25)  # committed offsets ran 15 messages ahead
    assert restored.counters.get("skipped_by_restart") == 15
    again = PartitionProcessor.restore(0, AnalyzerSettings(), proc.snapshot())
    feed(again, MESSAGES[8:12], first_offset=8)  # a replay from before the snapshot is fine
    assert "skipped_by_restart" not in again.counters


# --- issue 11: nothing lost, nothing silent ------------------------------------------------------------


def test_a_verdict_stays_pending_until_acknowledged_and_survives_a_restart() -> None:
    proc = PartitionProcessor(0, AnalyzerSettings())
    found = None
    for i, (t, raw) in enumerate(MESSAGES):
        res = proc.handle(raw, topic="m", offset=i, timestamp_s=t, evaluate=True)
        if res.verdicts:
            found = res.verdicts[0][0]  # sent, but the broker never acknowledged it
            break
    assert found is not None
    restored = PartitionProcessor.restore(0, AnalyzerSettings(), proc.snapshot())
    assert [v for v, _ in restored.pending()] == [found], "an unacknowledged verdict was lost by the restart"
    assert restored.restored_pending and not proc.restored_pending  # the worker checks the topic before resending
    restored.mark_sent(found)
    again = PartitionProcessor.restore(0, AnalyzerSettings(), restored.snapshot())
    assert again.pending() == [] and all(v != found for v, _ in again.evaluate(MESSAGES[-1][0]))
    assert again.counters["verdicts"] == 1, "counters carry on across restarts"


def test_an_oversized_undecodable_message_is_a_truncated_dead_letter() -> None:
    proc = PartitionProcessor(2, AnalyzerSettings(), options=ProcessorOptions(dead_letter_raw_max=1024))
    big = load_schema("KernelBatch").header + bytes(5 * 1024 * 1024)
    (dl, encoded), = proc.handle(big, topic="m", offset=7, timestamp_s=1.0).dead_letters
    assert (dl.reason, dl.source_topic, dl.source_partition, dl.source_offset) == ("corrupt-body", "m", 2, 7)
    assert dl.raw == big[:1024] and f"raw truncated to 1024 of {len(big)} bytes" in dl.detail
    assert len(encoded) < 4096 and decode_dead_letter(encoded) == dl
    assert (proc.counters["dead_letters"], proc.counters["dead_letters_truncated"]) == (1, 1)


def test_nothing_on_input_raises_out_of_handle() -> None:
    proc = PartitionProcessor(0, AnalyzerSettings())
    assert proc.handle(None, topic="m", offset=0, timestamp_s=None).dead_letters[0][0].reason == "bad-marker"

    def broken(*args: object) -> None:
        raise RuntimeError("analyzer bug")

    proc.handle(MESSAGES[0][1], topic="m", offset=1, timestamp_s=MESSAGES[0][0])  # the job exists now
    proc.jobs["proc-h1"].analyzer.ingest = broken
    (dl, _), = proc.handle(MESSAGES[1][1], topic="m", offset=2, timestamp_s=MESSAGES[1][0]).dead_letters
    assert (dl.reason, dl.source_offset) == ("analyzer-error", 2) and "analyzer bug" in dl.detail
    assert proc.counters["dead_letters"] == 2


@pytest.mark.parametrize("name", sorted(impossible_batches()))
def test_impossible_values_are_bad_value_dead_letters_and_never_analyzed(name: str) -> None:
    proc = PartitionProcessor(0, AnalyzerSettings())
    out = proc.handle(encode_batch(impossible_batches()[name]), topic="m", offset=3, timestamp_s=5.0)
    (dl, _), = out.dead_letters
    assert dl.reason == "bad-value" and dl.detail, dl
    assert (proc.counters["bad_value"], proc.counters["records"], proc.jobs) == (1, 0, {})
    assert proc.clock_s == 0.0, "a dead letter moved the clock"


def test_a_skewed_job_does_not_move_another_jobs_clock() -> None:
    proc = PartitionProcessor(0, AnalyzerSettings())
    other = [(t, encode_batch(dataclasses.replace(b, job="other", producer="other-p"))) for t, b in simulate(SCENARIO)]
    for i, ((t, raw), (_, raw2)) in enumerate(zip(MESSAGES[:40], other[:40], strict=True)):
        proc.handle(raw, topic="m", offset=2 * i, timestamp_s=t, evaluate=False, recv_s=1000.0 + i)
        proc.handle(raw2, topic="m", offset=2 * i + 1, timestamp_s=t + 3600.0, evaluate=False, recv_s=1000.0 + i)
    assert proc.job_clock("proc-h1") == MESSAGES[39][0]
    assert proc.job_clock("other") == MESSAGES[39][0] + 3600.0
    assert proc.counters.get("clock_rejected", 0) == 0  # each job's only producer is its own consensus


def test_evaluation_follows_the_jobs_clock_when_not_told() -> None:
    proc = PartitionProcessor(0, AnalyzerSettings(), options=ProcessorOptions(eval_every_s=10.0))
    for i, (t, raw) in enumerate(MESSAGES):
        proc.handle(raw, topic="m", offset=i, timestamp_s=t)
    span = MESSAGES[-1][0] - MESSAGES[0][0]
    # once per 10 s of the job's clock, however many messages arrived in between
    assert proc.jobs["proc-h1"].analyzer.stats["evaluations"] in (int(span // 10), int(span // 10) + 1)


def test_snapshots_are_compressed_and_plain_json_ones_still_restore() -> None:
    proc = PartitionProcessor(0, AnalyzerSettings())
    feed(proc, MESSAGES[:60])
    snap = proc.snapshot()
    plain = zlib.decompress(snap)
    assert plain.startswith(b"{") and len(snap) < len(plain) / 2
    for raw in (snap, plain):
        back = PartitionProcessor.restore(0, AnalyzerSettings(), raw)
        assert back.job_clock("proc-h1") == proc.job_clock("proc-h1") and back.counters == proc.counters


def test_a_job_silent_since_its_hang_is_found_after_a_restart_from_the_snapshot_alone() -> None:
    """Rank 5 never enters the op of 20 s and the whole job goes silent at 23 s; the worker commits that and
    snapshots a moment later, then dies. Its successor re-reads nothing: the snapshot alone must carry the
    hang, with the onset, op and id the worker that never stopped reports."""
    sc = Scenario.from_dict({
        "id": "silent", "seed": 5, "ranks": 8, "layout": {"tp": 4, "pp": 1, "dp": 2}, "channels": 2,
        "step_time_s": 1.0, "duration_s": 60.0, "clock_skew_s": 2.0, "jitter": 0.02,
        "faults": [{"kind": "H1", "rank": 5, "onset_s": 20.0}], "expect": [{"kind": "H1", "rank": 5}],
    })
    msgs = [(t, encode_batch(b)) for t, b in simulate(sc) if t < 23.0]
    wall = 1_000_000.0  # the worker's wall clock at the job's time 0 (records arrive as they are stamped)

    def run(proc: PartitionProcessor, start: float) -> list[tuple[str, float, int, tuple[int, ...]]]:
        out = []
        for k in range(60):
            for v, _ in proc.tick(recv_s=start + k):
                proc.mark_sent(v)
                if v.state.value == "open":
                    out.append((v.incident_id, v.onset_time, v.op_seq, v.root_cause_ranks))
        return out

    proc = PartitionProcessor(0, AnalyzerSettings())
    for i, (t, raw) in enumerate(msgs):
        assert not proc.handle(raw, topic="m", offset=i, timestamp_s=t, recv_s=wall + t).verdicts
    last = msgs[-1][0]
    proc.tick(recv_s=wall + last + 0.2)  # the timer applies the burst; the snapshot covering it follows
    snap = proc.snapshot()
    ref = run(proc, wall + last + 1.0)
    assert [r[3] for r in ref] == [(5,)], ref
    restored = PartitionProcessor.restore(0, AnalyzerSettings(), snap)
    assert run(restored, time.time()) == ref
