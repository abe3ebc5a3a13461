"""Malformed, oversized and impossible messages: each one a dead letter with its reason; the worker goes on.

A real broker and a real ``ccld worker`` process. The bad messages sit in the metrics topic
before a hung job's records, so the hang's verdict proves the worker kept going.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from ccld.records import KernelBatch
from ccld.schemas.codec import decode_dead_letter, encode, encode_batch, load_schema
from ccld.settings import Settings
from chaoslib import produce, produce_raw, raw_verdicts, record_result, scenario_batches, worker_counters
from factories import make_kernel_record
from harness import WorkerProcess, collect_verdicts, impossible_batches, raw_messages

pytestmark = [pytest.mark.slow, pytest.mark.integration]

BIG = 5 * 1024 * 1024


def test_bad_messages_become_dead_letters_with_reasons_and_the_worker_goes_on(
    chaos_settings: Settings, chaos_worker: WorkerProcess
) -> None:
    s = chaos_settings
    good = encode_batch(KernelBatch.from_records([make_kernel_record()]))
    bad: list[tuple[bytes, str]] = [
        (b"not avro at all", "bad-marker"),
        (b"", "bad-marker"),  # an empty value (what a tombstone reads as)
        (b"\xc3\x01" + bytes(8) + b"\x00", "unknown-fingerprint"),
        (good[:-9], "corrupt-body"),
        # 5 MB behind a real KernelBatch header: undecodable, and far over the broker's ~1 MB message limit
        (load_schema("KernelBatch").header + os.urandom(BIG), "corrupt-body"),
        (encode("KernelRecord", {**make_kernel_record(rank=9, world_size=4).to_dict()}), "bad-value"),
    ]
    bad += [(encode_batch(b), "bad-value") for b in impossible_batches().values()]
    worker = chaos_worker.start()
    produce_raw(s, [v for v, _ in bad], extra={"message.max.bytes": 8 * 1024 * 1024})
    sent = produce(s, scenario_batches("after-bad", {"kind": "H1", "rank": 2, "onset_s": 15.0}, 45.0))
    verdicts = collect_verdicts(s, 45, until=lambda vs: any(2 in v.root_cause_ranks for v in vs))
    assert any(v.kind.value == "H1" and 2 in v.root_cause_ranks for v in verdicts), worker.log()

    letters = sorted((decode_dead_letter(m) for m in raw_messages(s, s.deadletter_topic)),
                     key=lambda d: d.source_offset)
    assert [d.reason for d in letters] == [r for _, r in bad], worker.log()
    assert [d.source_offset for d in letters] == list(range(len(bad)))
    assert {(d.source_topic, d.source_partition) for d in letters} == {(s.metrics_topic, 0)}
    big = letters[4]
    assert len(big.raw) == s.worker_deadletter_raw_max_bytes and big.raw == bad[4][0][: len(big.raw)]
    assert f"of {len(bad[4][0])} bytes" in big.detail
    assert all(d.raw == v for d, (v, _) in zip(letters, bad, strict=True) if d is not big)
    assert all(d.detail for d in letters if d.reason == "bad-value")
    assert worker.stop() == 0, "the worker did not survive its input"
    c = worker_counters(worker)
    reasons = Counter(r for _, r in bad)
    assert (c.get("dead_letters"), c.get("bad_value"), c.get("dead_letters_truncated")) == (
        len(bad), reasons["bad-value"], 1), c
    assert c.get("analyzed_records") == sent, c
    record_result("malformed, oversized and impossible input", f"{len(bad)} bad messages ({reasons['bad-value']} "
                  f"impossible values, one of 5 MB) before a hung job", produced=sent,
                  delivered=c.get("analyzed_records", 0), verdicts_expected=1,
                  verdicts_received=sum(1 for v in verdicts if 2 in v.root_cause_ranks),
                  verdicts_raw=sum(1 for v in raw_verdicts(s) if 2 in v.root_cause_ranks and v.state.value == "open"),
                  dead_letters=len(letters), dead_letters_expected=len(bad))
