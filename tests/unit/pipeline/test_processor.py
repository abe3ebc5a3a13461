"""The worker's per-partition processing without Faust: decode, analyze, dedupe, snapshot."""

from __future__ import annotations

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.schemas import encode_batch
from ccld.streams.analysis import AnalyzerSettings
from ccld.streams.processor import PartitionProcessor

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
