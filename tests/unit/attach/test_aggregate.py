"""Host aggregator: fake ranks send real datagrams to a real aggregator over its real socket.

The aggregator's own timer is set an hour away, so every flush here is the test's ``flush()``
(or ``close()``); waits poll the counters and end as soon as the datagrams are in.
"""

from __future__ import annotations

import os
import socket
import stat
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ccld.producers.attach import aggregate
from ccld.producers.attach.aggregate import AggregatorSink, HostAggregator
from ccld.producers.attach.bootstrap import ENV_AGGREGATE_SOCKET, child_env
from ccld.producers.attach.outlet_spec import sink_from_spec
from ccld.producers.attach.outlets import KafkaSink
from ccld.records import KernelBatch
from ccld.schemas.codec import encode_batch
from ccld.settings import Settings
from factories import FakeBatchSink, make_kernel_record

HOUR = 3600.0


def rank_batch(rank: int, seqs: range, *, job: str = "job-a", incarnation: int = 0, world: int = 4) -> KernelBatch:
    """What a rank's tracker hands its sink in one pump: rows of two communicators."""
    recs = [
        make_kernel_record(job=job, incarnation=incarnation, rank=rank, comm_rank=rank, world_size=world,
                           comm_size=world, op_seq=s, comm_hash=0x1234 + (s % 2), host=f"node-{rank // 2}")
        for s in seqs
    ]  # fmt: skip
    return KernelBatch.from_records(recs, producer=f"rank-{rank}", batch_seq=seqs.start)


def rows(batch: KernelBatch) -> Counter[tuple[object, ...]]:
    """Each row as (rank, host, comm, op_seq): what must arrive exactly once."""
    return Counter((r.rank, r.host, r.comm_hash, r.op_seq) for r in batch.records())


def wait_for(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.fixture
def agg_and_sink() -> Iterator[tuple[HostAggregator, FakeBatchSink]]:
    sink = FakeBatchSink()
    agg = HostAggregator(sink=sink, flush_interval_s=HOUR, producer_id="host-a").start()
    yield agg, sink
    agg.close(1.0)


def ranks_sending(path: str, n: int) -> list[AggregatorSink]:
    return [AggregatorSink(path, fallback=FakeBatchSink()) for _ in range(n)]


def test_one_batch_per_job_incarnation_and_flush_holding_every_row_once(
    agg_and_sink: tuple[HostAggregator, FakeBatchSink],
) -> None:
    agg, sink = agg_and_sink
    assert agg.path is not None
    ranks = ranks_sending(agg.path, 3)
    sent = [rank_batch(r, range(10 * r, 10 * r + 5)) for r in range(3)]
    sent.append(rank_batch(0, range(100, 103)))  # a second pump of rank 0 in the same interval
    sent.append(rank_batch(1, range(0, 4), incarnation=1))  # the job restarted: another incarnation
    sent.append(rank_batch(2, range(0, 2), job="job-b"))
    for b in sent:
        assert ranks[b.records()[0].rank].submit_batch(b)
    wait_for(lambda: agg.stats.received == len(sent))
    assert agg.flush() == 3
    by_key = {(b.job, b.incarnation): b for b in sink.batches}
    assert sorted(by_key) == [("job-a", 0), ("job-a", 1), ("job-b", 0)] and len(sink.batches) == 3
    for key, got in by_key.items():
        want: Counter[tuple[object, ...]] = Counter()
        for b in sent:
            if (b.job, b.incarnation) == key:
                want += rows(b)
        assert rows(got) == want, key
        assert got.producer == "host-a"  # the host is the producer, not the ranks
    assert sorted(b.batch_seq for b in sink.batches) == [0, 1, 2]
    assert {r.host for r in by_key[("job-a", 0)].records()} == {"node-0", "node-1"}
    # the next interval: numbers go on increasing, nothing sent twice
    ranks[0].submit_batch(rank_batch(0, range(200, 201)))
    wait_for(lambda: agg.stats.received == len(sent) + 1)
    assert agg.flush() == 1 and agg.flush() == 0
    assert sink.batches[-1].batch_seq == 3 and rows(sink.batches[-1]) == rows(rank_batch(0, range(200, 201)))
    s = agg.stats
    assert (s.received, s.merged_messages, s.sent_batches, s.dropped, s.decode_errors) == (7, 7, 4, 0, 0)
    assert all(r.counters.fallback == 0 for r in ranks)


def test_the_flusher_thread_sends_on_its_own(tmp_path: Path) -> None:
    sink = FakeBatchSink()
    with HostAggregator(sink=sink, flush_interval_s=0.05, producer_id="host-t") as agg:
        assert agg.path is not None
        AggregatorSink(agg.path, fallback=FakeBatchSink()).submit_batch(rank_batch(1, range(3)))
        wait_for(lambda: agg.stats.sent_batches == 1)
    assert rows(sink.batches[0]) == rows(rank_batch(1, range(3)))


def test_a_corrupt_datagram_is_counted_and_the_aggregator_goes_on(
    agg_and_sink: tuple[HostAggregator, FakeBatchSink],
) -> None:
    agg, sink = agg_and_sink
    assert agg.path is not None
    good = encode_batch(rank_batch(1, range(4)))
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as raw:
        raw.sendto(b"\x00garbage", agg.path)
        raw.sendto(good[: len(good) // 2], agg.path)  # a torn batch
        raw.sendto(b"", agg.path)
        raw.sendto(good, agg.path)
    wait_for(lambda: agg.stats.received == 1)
    wait_for(lambda: agg.stats.decode_errors == 3)
    assert agg.flush() == 1 and rows(sink.batches[0]) == rows(rank_batch(1, range(4)))


def test_a_batch_with_an_impossible_value_is_not_merged(agg_and_sink: tuple[HostAggregator, FakeBatchSink]) -> None:
    agg, sink = agg_and_sink
    assert agg.path is not None
    bad = KernelBatch.from_records([make_kernel_record(rank=9, world_size=4)])  # rank >= world size
    AggregatorSink(agg.path, fallback=FakeBatchSink()).submit_batch(bad)
    wait_for(lambda: agg.stats.decode_errors == 1)
    assert agg.flush() == 0 and sink.batches == []


def test_the_buffer_bound_drops_and_counts() -> None:
    sink = FakeBatchSink()
    agg = HostAggregator(sink=sink, flush_interval_s=HOUR, max_rows=10).start()
    try:
        assert agg.path is not None
        rank = AggregatorSink(agg.path, fallback=FakeBatchSink())
        rank.submit_batch(rank_batch(0, range(6)))
        rank.submit_batch(rank_batch(1, range(6)))  # 12 rows > 10: dropped whole
        rank.submit_batch(rank_batch(2, range(4)))  # fits (10)
        wait_for(lambda: agg.stats.received + agg.stats.dropped_messages == 3)
        assert (agg.stats.dropped, agg.stats.dropped_messages) == (6, 1)
        assert agg.flush() == 1 and sink.batches[0].n == 10
        # the job's next merged batch says whose ENTERED/DONE records were dropped here, once
        assert (sink.batches[0].lost_records, sink.batches[0].lost_ranks) == (6, (1,))
        rank.submit_batch(rank_batch(1, range(6)))  # room again after the flush
        wait_for(lambda: agg.stats.received == 3)
    finally:
        agg.close(1.0)
    assert agg.stats.dropped == 6 and sum(b.n for b in sink.batches) == 16
    assert [(b.lost_records, b.lost_ranks) for b in sink.batches[1:]] == [(0, ())]
    assert "dropped 6 rows" in agg.stats_line()


def test_close_drains_the_socket_flushes_and_cleans_up() -> None:
    sink = FakeBatchSink()
    agg = HostAggregator(sink=sink, flush_interval_s=HOUR).start()
    path = agg.path
    assert path is not None
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    rank = AggregatorSink(path, fallback=FakeBatchSink())
    for r in range(3):
        rank.submit_batch(rank_batch(r, range(5)))
    agg.close(1.0)  # whatever the receiver had not read yet is drained, then sent
    assert sink.closed and len(sink.batches) == 1 and sink.batches[0].n == 15
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))
    # the aggregator is gone: the rank's next batch goes straight to its fallback
    assert rank.submit_batch(rank_batch(0, range(5, 7)))
    assert rank.counters.no_aggregator == 1 and rank.counters.fallback_rows == 2


def test_a_refusing_or_raising_sink_never_kills_the_aggregator() -> None:
    class Raising(FakeBatchSink):
        def submit_batch(self, batch: KernelBatch) -> bool:
            raise RuntimeError("broker on fire")

        def close(self, timeout_s: float = 0.0) -> None:
            raise RuntimeError("still on fire")

    agg = HostAggregator(sink=Raising(), flush_interval_s=HOUR).start()
    assert agg.path is not None
    AggregatorSink(agg.path, fallback=FakeBatchSink()).submit_batch(rank_batch(0, range(2)))
    wait_for(lambda: agg.stats.received == 1)
    assert agg.flush() == 0
    agg.close(1.0)
    assert agg.stats.send_failures == 1 and agg.stats.sent_batches == 0


# ---------------------------------------------------------------- the rank's side


def test_no_aggregator_listening_falls_back_and_counts(tmp_path: Path) -> None:
    fallback = FakeBatchSink()
    sink = AggregatorSink(str(tmp_path / "nobody.sock"), fallback=fallback)
    b = rank_batch(1, range(3))
    assert sink.submit_batch(b)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as dead:  # a socket file nobody reads any more
        dead.bind(str(tmp_path / "dead.sock"))
    sink.path = str(tmp_path / "dead.sock")
    sink.submit(make_kernel_record(rank=2))  # a single record: a batch of one, same path
    assert [x.n for x in fallback.batches] == [3, 1] and fallback.batches[0] is b
    c = sink.counters
    assert (c.sent, c.fallback, c.fallback_rows, c.no_aggregator) == (0, 2, 4, 2)
    assert sink.stats["agg_fallback"] == 2


def test_an_oversized_batch_falls_back(
    agg_and_sink: tuple[HostAggregator, FakeBatchSink], monkeypatch: pytest.MonkeyPatch
) -> None:
    agg, agg_sink = agg_and_sink
    assert agg.path is not None
    fallback = FakeBatchSink()
    # the kernel refuses a datagram larger than the sender's buffer (EMSGSIZE); make that buffer small
    monkeypatch.setattr(aggregate, "SEND_BUFFER", 4096)
    sink = AggregatorSink(agg.path, fallback=fallback)
    big = rank_batch(1, range(400))
    assert len(encode_batch(big)) > 16384
    assert sink.submit_batch(big) and fallback.batches == [big]
    assert sink.counters.too_big == 1
    # and one over MAX_DATAGRAM is not even tried
    monkeypatch.setattr(aggregate, "MAX_DATAGRAM", 100)
    assert sink.submit_batch(rank_batch(1, range(2)))
    assert sink.counters.too_big == 2 and sink.counters.sent == 0 and agg.stats.received == 0


def test_a_full_socket_falls_back_without_blocking(tmp_path: Path) -> None:
    path = str(tmp_path / "slow.sock")
    fallback = FakeBatchSink()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as stuck:  # bound, never read: the queue fills
        stuck.bind(path)
        sink = AggregatorSink(path, fallback=fallback)
        one = rank_batch(1, range(1))
        t0 = time.monotonic()
        tries = 0
        while sink.counters.full < 3 and tries < 20_000:  # the queue holds net.unix.max_dgram_qlen (10 here)
            assert sink.submit_batch(one)
            tries += 1
        assert time.monotonic() - t0 < 5.0
    c = sink.counters
    assert c.sent > 0 and c.full == 3 and c.sent + c.full == tries and len(fallback.batches) == c.full


def test_a_fallback_that_fails_is_counted_never_raised(tmp_path: Path) -> None:
    class Boom(FakeBatchSink):
        def submit_batch(self, batch: KernelBatch) -> bool:
            raise RuntimeError("no broker either")

    sink = AggregatorSink(str(tmp_path / "none.sock"), fallback=Boom())
    assert sink.submit_batch(rank_batch(1, range(2))) is False
    assert sink.counters.fallback_failed == 1
    sink.flush(0.1)
    sink.close(0.1)


def test_the_default_fallback_is_a_lazy_kafka_sink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[KafkaSink] = []
    real_init = KafkaSink.__init__

    def spy(self: KafkaSink, *a: object, **k: object) -> None:
        real_init(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(KafkaSink, "__init__", spy)
    monkeypatch.setattr(KafkaSink, "submit_batch", lambda self, b: True)
    settings = Settings.load({}, bootstrap="127.0.0.1:1")
    sink = sink_from_spec("kafka", settings, aggregate_socket=str(tmp_path / "none.sock"))
    assert isinstance(sink, AggregatorSink) and made == []  # nothing built until it is needed
    assert sink.submit_batch(rank_batch(0, range(1)))
    assert len(made) == 1 and made[0].settings is settings
    assert isinstance(sink_from_spec("kafka", settings), KafkaSink)
    assert not isinstance(sink_from_spec(f"jsonl:{tmp_path}", settings, aggregate_socket="x"), AggregatorSink)


def test_the_socket_reaches_the_ranks_environment_only_when_given() -> None:
    base = {ENV_AGGREGATE_SOCKET: "/outer/run.sock"}
    on = child_env(base, {}, site_dir="/s", sink="kafka", heartbeat_ms=None, aggregate_socket="/tmp/x/agg.sock")
    off = child_env(base, {}, site_dir="/s", sink="kafka", heartbeat_ms=None)
    assert on[ENV_AGGREGATE_SOCKET] == "/tmp/x/agg.sock" and ENV_AGGREGATE_SOCKET not in off


def test_ccld_run_aggregates_by_default() -> None:
    import argparse

    from ccld.producers.attach import run_command

    p = argparse.ArgumentParser()
    run_command.configure(p)
    assert p.parse_args(["--", "true"]).aggregate is True
    assert p.parse_args(["--no-aggregate", "--", "true"]).aggregate is False
