"""Producer accounting without a broker: each delivery outcome lands in one counter, the stats line says it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError

from ccld.producers.kafka import MetricsProducer, RepeatFilter, format_stats
from ccld.settings import Settings


class DeliveredMessage:
    """What librdkafka hands a delivery callback: only the fields the producer reads."""

    def key(self) -> bytes:
        return b"job-a/00000000000000ff/7"

    def value(self) -> bytes:
        return b"payload"

    def partition(self) -> int:
        return 0

    def timestamp(self) -> tuple[int, int]:
        return TIMESTAMP_CREATE_TIME, 1234


def producer(tmp_path: Path, spool: bool) -> MetricsProducer:
    s = Settings.load({}, bootstrap="127.0.0.1:1", spool_dir=str(tmp_path / "spool") if spool else "")
    return MetricsProducer(s, producer_id="unit", background=False)


@pytest.mark.parametrize(
    ("code", "spool", "counter"),
    [
        (KafkaError._MSG_TIMED_OUT, False, "expired_records"),
        (KafkaError.MSG_SIZE_TOO_LARGE, False, "error_records"),
        (KafkaError._MSG_TIMED_OUT, True, "spooled_records"),
        (KafkaError._PURGE_QUEUE, True, "spooled_records"),
        (KafkaError.MSG_SIZE_TOO_LARGE, True, "error_records"),  # would fail again: never spooled
    ],
)
def test_each_delivery_failure_is_counted_once(tmp_path: Path, code: int, spool: bool, counter: str) -> None:
    p = producer(tmp_path, spool)
    p._in_flight = 10  # as if one message of 10 records had been handed to librdkafka
    p._on_delivery(KafkaError(code), DeliveredMessage(), 10, 0)
    st = p.stats
    assert st[counter] == 10 and st["in_flight_records"] == 0
    assert st["lost_records"] == (0 if counter == "spooled_records" else 10)


def test_a_delivered_message_is_counted(tmp_path: Path) -> None:
    p = producer(tmp_path, False)
    p._in_flight = 3
    p._on_delivery(None, DeliveredMessage(), 3, 0)
    assert p.stats["delivered_records"] == 3 and p.lost_records == 0


def test_stats_line_names_every_reason() -> None:
    line = format_stats({"delivered_records": 90, "expired_records": 5, "refused_records": 3, "error_records": 1,
                         "dropped_progress": 1, "replay_rejected_records": 4, "spooled_records": 7,
                         "replayed_records": 2}, "p1")
    assert line.startswith("producer p1: 90 records delivered, 14 lost (expired 5, refused 3, failed 1, dropped 1")
    assert "replay-rejected 4)" in line
    assert "spooled 7, replayed 2" in line


def test_repeated_librdkafka_lines_are_throttled() -> None:
    f = RepeatFilter(every_s=3600)

    def rec() -> logging.LogRecord:
        return logging.LogRecord("ccld.librdkafka", logging.ERROR, "", 0, "%s [%s] %s",
                                 ("FAIL", "rdkafka#producer-1", "Connection refused"), None)

    assert f.filter(rec()) and not f.filter(rec()) and not f.filter(rec())
    f.every_s = 0
    again = rec()
    assert f.filter(again) and "and 2 similar lines" in again.getMessage()
