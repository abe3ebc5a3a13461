"""Sinks: JSON lines round trip, a Kafka sink that cannot build its producer drops and counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccld.errors import ConfigError
from ccld.producers.attach.outlet_spec import sink_from_spec
from ccld.producers.attach.outlets import JsonlSink, KafkaSink, read_jsonl
from ccld.records import DType, KernelBatch, KernelRecord, OpType, Status
from ccld.settings import Settings


def rec(seq: int) -> KernelRecord:
    return KernelRecord(
        job="j", incarnation=0, comm_hash=-5, op_seq=seq, op_type=OpType.BROADCAST, dtype=DType.BFLOAT16,
        count=7, peer=1, rank=2, comm_rank=2, comm_size=4, world_size=4, host="h", status=Status.DONE,
        t_enter_ns=1, t_exit_ns=3, t_sample_ns=3, t_prev_exit_ns=seq - 1,
    )  # fmt: skip


def test_jsonl_round_trip_and_torn_last_line(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "out")
    sink.submit(rec(0))
    sink.submit(rec(1))
    sink.flush()
    sink.close()
    [path] = list((tmp_path / "out").glob("records-*.jsonl"))
    with path.open("a") as fh:
        fh.write('{"job": "j", "incar')  # a process killed mid-write
    assert read_jsonl([path]) == [rec(0), rec(1)]  # t_prev_exit_ns included


def test_jsonl_lines_of_writers_before_t_prev_exit_ns_read_it_as_unknown() -> None:
    d = rec(5).to_dict()
    del d["t_prev_exit_ns"]
    assert KernelRecord.from_dict(d).t_prev_exit_ns == -1


def test_kafka_sink_without_a_producer_counts_drops(monkeypatch: pytest.MonkeyPatch) -> None:
    import ccld.producers.kafka as kafka

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("no client")

    monkeypatch.setattr(kafka, "MetricsProducer", boom)
    sink = KafkaSink(Settings.load({}, bootstrap="127.0.0.1:1"))
    sink.submit(rec(0))
    sink.submit(rec(1))
    assert sink.stats == {"sink_dropped": 2, "sink_undelivered": 0, "sink_flush_timeouts": 0}
    assert sink.submit_batch(KernelBatch.from_records([rec(2), rec(3)])) is False
    assert sink.stats["sink_dropped"] == 4
    sink.flush(0.1)
    sink.close()


def test_kafka_sink_sends_batches_under_its_own_producer_id_and_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """``submit_batch`` numbers batches apart from the batcher's and waits for the broker only until a refusal."""
    import ccld.producers.kafka as kafka

    class Fake:
        producer_id = "p1"

        def __init__(self, *a: object, **k: object) -> None:
            self.sent: list[tuple[KernelBatch, float]] = []
            self.ok = True

        def send_batch(self, batch: KernelBatch, timestamp_ms: int | None = None, *, block_s: float = 10.0) -> bool:
            self.sent.append((batch, block_s))
            return self.ok

    monkeypatch.setattr(kafka, "MetricsProducer", Fake)
    sink = KafkaSink(Settings.load({}, bootstrap="127.0.0.1:1"))
    b = KernelBatch.from_records([rec(0), rec(1)])
    assert sink.submit_batch(b)
    fake = sink._producer
    fake.ok = False
    assert not sink.submit_batch(b)
    fake.ok = True
    assert sink.submit_batch(b)
    assert [(x.producer, x.batch_seq, w) for x, w in fake.sent] == [
        ("p1-b", 0, KafkaSink.FIRST_WAIT_S), ("p1-b", 1, KafkaSink.FIRST_WAIT_S), ("p1-b", 2, 0.0)]
    assert fake.sent[0][0].records() == b.records()


def test_sink_specs() -> None:
    s = Settings.load({}, bootstrap="x:1")
    assert isinstance(sink_from_spec("kafka", s), KafkaSink)
    assert isinstance(sink_from_spec("jsonl:/tmp/ccld-test-sink.jsonl", s), JsonlSink)
    with pytest.raises(ConfigError):
        sink_from_spec("carrier-pigeon", s)
