"""The producer's spool replay without a broker: order, bounds and refused messages, with a stand-in client.

The stand-in takes the place of librdkafka's ``Producer`` (``produce`` keeps the message, ``poll``
serves its delivery report with the error a test chooses): unit tier, no processes, no sleeps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE, KafkaError, KafkaException

from ccld.producers.kafka import MetricsProducer
from ccld.producers.spool import SpooledMessage
from ccld.producers.spool_replay import SpoolReplay
from ccld.records import KernelBatch
from ccld.settings import Settings
from factories import make_kernel_record

#: what the stand-in broker answers for a message key: None (delivered) or an error
Verdict = Callable[[bytes], KafkaError | None]


def key(i: int) -> bytes:
    return f"job-a/00000000000000ff/{i}".encode()


class Reported:
    """A message as a delivery callback sees it."""

    def __init__(self, k: bytes, value: bytes = b"v", *, failed: bool = False) -> None:
        self._k, self._v = k, value
        self._failed = failed  # librdkafka's report of a failed delivery has no timestamp

    def key(self) -> bytes:
        return self._k

    def value(self) -> bytes:
        return self._v

    def partition(self) -> int:
        return 0

    def timestamp(self) -> tuple[int, int]:
        return (TIMESTAMP_NOT_AVAILABLE, -1) if self._failed else (TIMESTAMP_CREATE_TIME, 1234)


class StandInClient:
    """Takes what the producer produces; ``poll`` answers each delivery report with ``verdict(key)``."""

    def __init__(self, verdict: Verdict = lambda _k: None, refuse: Verdict = lambda _k: None) -> None:
        self.verdict = verdict
        self.refuse = refuse  # an error here is raised by produce() itself, as librdkafka does for oversize
        self.produced: list[bytes] = []  # every produce call, retries included
        self.stamps: list[int | None] = []  # the timestamp of each produce call
        self.delivered: list[bytes] = []
        self._reports: list[tuple[Any, bytes]] = []

    def produce(self, topic: str, *, value: bytes, key: bytes, partition: int, on_delivery: Any,
                timestamp: int | None = None) -> None:
        err = self.refuse(key)
        if err is not None:
            raise KafkaException(err)
        self.produced.append(key)
        self.stamps.append(timestamp)
        self._reports.append((on_delivery, key))

    def poll(self, timeout: float = 0) -> int:
        reports, self._reports = self._reports, []
        for cb, k in reports:
            err = self.verdict(k)
            if err is None:
                self.delivered.append(k)
            cb(err, Reported(k, failed=err is not None))
        return len(reports)

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return 0


def producer(tmp_path: Path, client: StandInClient, **changes: Any) -> MetricsProducer:
    s = Settings.load({}, bootstrap="127.0.0.1:1", spool_dir=str(tmp_path / "spool"), **changes)
    p = MetricsProducer(s, producer_id="unit", background=False)
    p._producer = client  # the seam: _client() hands out this one
    p._partitions = 1
    return p


def spool(p: MetricsProducer, n: int, *, records: int = 2, size: int = 100, written_s: float = 0.0) -> None:
    on_disk = p._spool_replay.spool
    assert on_disk is not None
    for i in range(n):
        assert on_disk.append(SpooledMessage(key=key(i), value=b"x" * size, partition=0, records=records,
                                             written_s=written_s))


def replay(p: MetricsProducer, client: StandInClient, rounds: int = 200) -> None:
    """Drive the replay as the sender thread would, without its back-off waits."""
    r = p._spool_replay
    for _ in range(rounds):
        r._next_replay_s = 0.0
        r.step()
        client.poll()
        if r.spool is not None and not r.spool.pending_messages and r._group is None:
            return
    raise AssertionError(f"the spool did not drain in {rounds} rounds: {p.stats_line()}")


def first_seen(keys: list[bytes]) -> list[bytes]:
    return list(dict.fromkeys(keys))


# --- order ------------------------------------------------------------------------------------


class DroppingClient(StandInClient):
    """The connection drops when it reaches message ``at``: that one and the rest of the round fail, once."""

    def __init__(self, at: bytes) -> None:
        super().__init__(self._answer)
        self.at = at
        self.state = "before"  # -> "down" (the rest of this round fails) -> "after" (all delivered)

    def _answer(self, k: bytes) -> KafkaError | None:
        if self.state == "before" and k == self.at:
            self.state = "down"
        return KafkaError(KafkaError._TRANSPORT) if self.state == "down" else None

    def poll(self, timeout: float = 0) -> int:
        n = super().poll(timeout)
        if self.state == "down":
            self.state = "after"
        return n


def test_replay_sends_in_spool_order_across_segments_and_a_retried_group(tmp_path: Path) -> None:
    client = DroppingClient(at=key(23))
    p = producer(tmp_path, client, spool_max_mb=0.05)  # segments of ~13 KB: 60 messages span several
    spool(p, 60, size=500)
    on_disk = p._spool_replay.spool
    assert on_disk is not None and len(list(on_disk.dir.glob("*.seg"))) > 2
    replay(p, client)
    assert client.state == "after", "the broker never failed: nothing was retried"
    assert first_seen(client.delivered) == [key(i) for i in range(60)]
    # What the replay produced is runs of consecutive messages in spool order; a retried group
    # starts again at the first message not yet committed (duplicates allowed, never a reordering).
    seqs = [int(k.rsplit(b"/", 1)[1]) for k in client.produced]
    restarts = [i for i in range(1, len(seqs)) if seqs[i] != seqs[i - 1] + 1]
    assert restarts, "no group was retried"
    assert all(seqs[i] <= seqs[i - 1] for i in restarts)
    assert seqs[0] == 0 and seqs[-1] == 59
    st = p.stats
    assert st["replayed_records"] == 120 and st["lost_records"] == 0 and st["spooled_records"] == 0


# --- a message the broker always refuses ------------------------------------------------------


@pytest.mark.parametrize("code", [KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                  KafkaError.INVALID_MSG, KafkaError.RECORD_LIST_TOO_LARGE])
def test_a_message_refused_for_good_is_counted_and_the_rest_replays(tmp_path: Path, code: int,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    bad = {key(3), key(7)}
    client = StandInClient(lambda k: KafkaError(code) if k in bad else None)
    p = producer(tmp_path, client)
    spool(p, 12)
    with caplog.at_level(logging.WARNING, logger="ccld.producers.kafka"):
        replay(p, client)
    assert client.delivered == [key(i) for i in range(12) if key(i) not in bad]
    st = p.stats
    assert st["replay_rejected_records"] == 4 and st["lost_records"] == 4, p.stats_line()
    assert st["replayed_records"] == 20 and st["spooled_records"] == 0
    assert "replay-rejected 4" in p.stats_line() and "4 lost" in p.stats_line()
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1, "one warning per kind of error, not one per message"
    assert KafkaError(code).name() in refusals[0].getMessage()


def test_a_message_librdkafka_refuses_to_take_is_counted_and_the_rest_replays(tmp_path: Path) -> None:
    # Larger than message.max.bytes: produce() raises at once, no delivery report ever comes.
    client = StandInClient(refuse=lambda k: KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if k == key(0) else None)
    p = producer(tmp_path, client)
    spool(p, 5)
    replay(p, client)
    assert client.delivered == [key(i) for i in range(1, 5)]
    assert p.stats["replay_rejected_records"] == 2 and p.stats["lost_records"] == 2


def test_an_unclassified_error_is_retried_a_bounded_number_of_times(tmp_path: Path) -> None:
    client = StandInClient(lambda k: KafkaError(KafkaError.UNKNOWN) if k == key(2) else None)
    p = producer(tmp_path, client)
    spool(p, 6)
    replay(p, client)
    assert first_seen(client.delivered) == [key(i) for i in range(6) if i != 2]
    # once inside a group of four (whose head, key 1, then moved on), then REPLAY_ATTEMPTS_MAX times
    # in a row as the head: bounded, and never again after it was counted lost
    assert client.produced.count(key(2)) == SpoolReplay.REPLAY_ATTEMPTS_MAX + 1
    assert p.stats["replay_rejected_records"] == 2 and p.stats["lost_records"] == 2


def test_an_outage_is_waited_out_however_long(tmp_path: Path) -> None:
    down = {"rounds": 3 * SpoolReplay.REPLAY_ATTEMPTS_MAX}

    def verdict(_k: bytes) -> KafkaError | None:
        if down["rounds"]:
            down["rounds"] -= 1
            return KafkaError(KafkaError._MSG_TIMED_OUT)
        return None

    client = StandInClient(verdict)
    p = producer(tmp_path, client)
    spool(p, 4)
    replay(p, client)
    assert first_seen(client.delivered) == [key(i) for i in range(4)]
    assert p.stats["lost_records"] == 0 and p.stats["replayed_records"] == 8


# --- the spool's bounds -----------------------------------------------------------------------


def test_a_full_spool_keeps_the_oldest_and_counts_the_refused(tmp_path: Path) -> None:
    client = StandInClient()
    p = producer(tmp_path, client, spool_max_mb=0.01)  # 10,485 bytes
    frame = len(SpooledMessage(key=key(0), value=b"x" * 1000, partition=0, records=3, written_s=1.0).encode())
    fits = int(0.01 * 1024 * 1024) // frame
    n = fits + 4
    p._in_flight = 3 * n
    for i in range(n):  # the broker is away: every message expires and goes to the spool
        p._on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), Reported(key(i), b"x" * 1000), 3, 1234)
    st = p.stats
    assert st["spooled_records"] == 3 * fits and st["spooled_in_records"] == 3 * fits
    assert st["spool_lost_records"] == 3 * 4 and st["lost_records"] == 3 * 4 and st["delivery_failures"] == 4
    assert "spool-lost 12" in p.stats_line()
    replay(p, client)
    assert client.delivered == [key(i) for i in range(fits)], "the newest are refused, the oldest replayed"
    assert p.stats["replayed_records"] == 3 * fits and p.stats["lost_records"] == 12


def test_records_past_the_age_limit_are_discarded_oldest_first_and_counted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    client = StandInClient()
    p = producer(tmp_path, client, spool_max_age_s=60)
    now = time.time()
    on_disk = p._spool_replay.spool
    assert on_disk is not None
    for i, age in enumerate([600, 300, 61, 30, 5, 0]):  # spooled oldest first, as an outage fills it
        on_disk.append(SpooledMessage(key=key(i), value=b"v", partition=0, records=i + 1, written_s=now - age))
    with caplog.at_level(logging.WARNING, logger="ccld.producers.kafka"):
        replay(p, client)
    assert client.produced == [key(3), key(4), key(5)], "only the records younger than the limit go out"
    st = p.stats
    assert st["spool_lost_records"] == 1 + 2 + 3 and st["lost_records"] == 6, p.stats_line()
    assert st["replayed_records"] == 4 + 5 + 6 and st["spooled_records"] == 0
    assert "spool-lost 6" in p.stats_line()
    assert any("discarded" in r.getMessage() and "older than 60 s" in r.getMessage() for r in caplog.records)


def test_a_message_spooled_after_a_failed_delivery_is_replayed_with_its_own_timestamp(tmp_path: Path) -> None:
    """librdkafka's report of a failed delivery carries no timestamp: the spooled copy took none, and the
    replay was stamped with the replay's time (a simulated job's verdicts came out in wall-clock seconds
    after an outage; a live job's clock jumped). The producer keeps the stamp it produced with."""
    first = [True]

    def once_down(_k: bytes) -> KafkaError | None:
        if first[0]:
            first[0] = False
            return KafkaError(KafkaError._MSG_TIMED_OUT)
        return None

    client = StandInClient(verdict=once_down)
    p = producer(tmp_path, client)
    batch = KernelBatch.from_records([make_kernel_record(rank=r, comm_rank=r) for r in range(4)])
    assert p.send_batch(batch, timestamp_ms=777_000, block_s=0.0)  # the broker does not take it: spooled
    replay(p, client)
    assert p.stats["spooled_in_records"] == 4 and p.stats["replayed_records"] == 4
    assert client.stamps == [777_000, 777_000], client.stamps
