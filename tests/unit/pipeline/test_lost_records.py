"""Records lost on the way (issue 18, item 6): the producer, the host aggregator and the wire say whose
ENTERED/DONE records never arrived, and a verdict resting on those ranks' absence says so, with less
confidence."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError

from ccld.producers.batcher import RecordBatcher
from ccld.producers.kafka import MetricsProducer
from ccld.records import AnomalyKind, KernelBatch, Status, VerdictState
from ccld.schemas.codec import _writers, decode_metrics, encode_batch, load_schema
from ccld.settings import Settings
from ccld.streams.analysis.replay import analyze_batches
from factories import make_kernel_record, written_by


def test_a_critical_record_dropped_at_the_hard_cap_is_said_with_the_next_batch() -> None:
    b = RecordBatcher(producer_id="p", batch_max=100, queue_max=2, linger_s=0.5)
    for r in range(4):  # the hard cap is twice the bound: the fifth critical record is dropped (4 ranks here)
        assert b.add(make_kernel_record(rank=r, comm_rank=r, status=Status.ENTERED), 0.0)
    assert not b.add(make_kernel_record(rank=3, comm_rank=3, status=Status.DONE), 0.0)
    assert not b.add(make_kernel_record(rank=2, comm_rank=2, status=Status.PROGRESS), 0.0)  # a sample: not said
    (first,) = b.ready(0.0, force=True)
    assert (first.lost_records, first.lost_ranks) == (1, (3,))
    b.add(make_kernel_record(), 1.0)
    (second,) = b.ready(1.0, force=True)
    assert (second.lost_records, second.lost_ranks) == (0, ())  # said once


def test_the_wire_carries_it_and_an_older_writer_reads_as_nothing_lost() -> None:
    b = KernelBatch.from_records([make_kernel_record(rank=r, comm_rank=r) for r in range(3)])
    lossy = dataclasses.replace(b, lost_records=7, lost_ranks=(1, 5))
    back = decode_metrics(encode_batch(lossy))
    assert (back.lost_records, back.lost_ranks) == (7, (1, 5)) and back.records() == b.records()
    old = load_schema("KernelBatch-v5")
    assert old.fingerprint in _writers() and "lost_ranks" not in {f["name"] for f in old.raw["fields"]}
    got = decode_metrics(written_by(old, lossy))
    assert (got.lost_records, got.lost_ranks) == (0, ()) and got.records() == b.records()


class Undelivered:
    def __init__(self, value: bytes) -> None:
        self._value = value

    def key(self) -> bytes:
        return b"job/ff/0"

    def value(self) -> bytes:
        return self._value

    def partition(self) -> int:
        return 0

    def timestamp(self) -> tuple[int, int]:
        return TIMESTAMP_CREATE_TIME, 1234


def test_an_undeliverable_message_names_its_ranks_in_the_jobs_next_batch(tmp_path: Path) -> None:
    s = Settings.load({}, bootstrap="127.0.0.1:1")
    p = MetricsProducer(s, producer_id="unit", background=False)
    rows = [make_kernel_record(rank=2, comm_rank=2, status=Status.ENTERED),
            make_kernel_record(rank=3, comm_rank=3, status=Status.PROGRESS)]
    p._in_flight = 2
    p._on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), Undelivered(encode_batch(KernelBatch.from_records(rows))),
                   2, 0)
    assert p.stats["expired_records"] == 2
    p.submit(make_kernel_record(rank=0, comm_rank=0))
    (nxt,) = p._batcher.ready(10.0, force=True)
    assert (nxt.lost_records, nxt.lost_ranks) == (1, (2,))  # the sample of rank 3 says nothing an op needs


@pytest.mark.parametrize(("lost_rank", "halved"), [(2, True), (0, False)])
def test_a_hang_resting_on_lost_records_says_so_with_less_confidence(lost_rank: int, halved: bool) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "analysis"))
    from analysis_factories import Comm, Probe, batches_by_tick, healthy_steps
    from test_hangs import stuck

    probe = Probe()
    tp = Comm(0xA7, (0, 1, 2, 3))
    recs = healthy_steps(probe, tp, 20)
    k = tp.seq
    for i in (0, 1, 3):
        recs += stuck(probe, tp, i, k, 41.0 + 0.01 * i, 100.0)
    batches = batches_by_tick(recs)
    # a batch a little before the hang says ENTERED/DONE records of one rank were lost on the way
    at = next(i for i, (t, _) in enumerate(batches) if t > 35.0)
    t, b = batches[at]
    batches[at] = (t, dataclasses.replace(b, lost_records=3, lost_ranks=(lost_rank,)))
    (v,) = [v for v in analyze_batches(batches) if v.state == VerdictState.OPEN]
    assert v.kind == AnomalyKind.H1 and v.root_cause_ranks == (2,)
    if halved:
        assert v.confidence == pytest.approx(0.475) and v.details["lost_records"] == "3"
        assert "3 ENTERED/DONE records of rank 2 were lost on the way" in v.evidence
    else:
        assert v.confidence == pytest.approx(0.95) and "lost_records" not in v.details


def test_the_worker_counts_lost_records_and_rank_clocks_years_off() -> None:
    from ccld.settings import AnalyzerSettings
    from ccld.streams.processor import PartitionProcessor

    now = 1_800_000_000.0
    ns = int(now * 1e9)
    rows = [make_kernel_record(rank=r, comm_rank=r, t_enter_ns=ns, t_sample_ns=ns, t_exit_ns=ns + 1000)
            for r in range(3)]
    ten_years = ns + 10 * 365 * 86_400 * 10**9
    ahead = [make_kernel_record(rank=3, comm_rank=3, t_enter_ns=ten_years, t_sample_ns=ten_years,
                                t_exit_ns=ten_years + 1000)]
    proc = PartitionProcessor(0, AnalyzerSettings())
    b = dataclasses.replace(KernelBatch.from_records(rows + ahead, producer="p", batch_seq=0),
                            lost_records=4, lost_ranks=(2,))
    out = proc.handle(encode_batch(b), topic="m", offset=0, timestamp_s=now, recv_s=now)
    assert not out.dead_letters  # analysed: only durations on a rank's own clock are used
    assert proc.counters["far_clock_records"] == 1 and proc.counters["upstream_lost_records"] == 4
    proc.handle(encode_batch(KernelBatch.from_records(rows, producer="p", batch_seq=1)), topic="m", offset=1,
                timestamp_s=now, recv_s=now)
    assert proc.counters["far_clock_records"] == 1 and proc.counters["upstream_lost_records"] == 4
    # the PyTorch attachment's clock is time.monotonic_ns (since boot, 40 days here): no wall clock, not far
    boot = 40 * 86_400 * 10**9
    mono = [make_kernel_record(rank=r, comm_rank=r, t_enter_ns=boot, t_sample_ns=boot, t_exit_ns=boot + 1000)
            for r in range(3)]
    proc.handle(encode_batch(KernelBatch.from_records(mono, producer="q", batch_seq=0)), topic="m", offset=2,
                timestamp_s=now, recv_s=now)
    assert proc.counters["far_clock_records"] == 1
