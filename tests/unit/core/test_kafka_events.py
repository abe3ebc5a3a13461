"""librdkafka's log and statistics made readable: one line per condition, and the broker-gone clock."""

from __future__ import annotations

import json
import logging

import pytest

from ccld.kafka_events import BrokerWatch, KafkaLog, condition, reason, unreachable

# what librdkafka 2.x hands confluent-kafka's logger, as captured from a consumer of a closed port
REFUSED = ("[thrd:127.0.0.1:45631/bootstrap]: 127.0.0.1:45631/bootstrap: Connect to ipv4#127.0.0.1:45631 "
           "failed: Connection refused (after 0ms in state CONNECT)")
REFUSED_LATER = ("[thrd:127.0.0.1:45631/bootstrap]: 127.0.0.1:45631/bootstrap: Connect to ipv4#127.0.0.1:45631 "
                 "failed: Connection refused (after 1ms in state CONNECT, 5 identical error(s) suppressed)")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_condition_drops_the_thread_timing_and_repeat_count() -> None:
    text = "127.0.0.1:45631/bootstrap: Connect to ipv4#127.0.0.1:45631 failed: Connection refused"
    assert condition(REFUSED) == condition(REFUSED_LATER) == text
    assert reason(text) == "Connection refused"
    assert reason("1/1 brokers are down") == "1/1 brokers are down"


def test_a_hundred_refused_connects_are_one_line(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    klog = KafkaLog(clock=clock)
    with caplog.at_level(logging.DEBUG, logger="ccld.kafka"):
        for _ in range(100):
            klog.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", REFUSED)
            clock.t += 0.05
        klog.log(logging.WARNING, "%s [%s] %s", "ALLBROKERSDOWN", "rdkafka#consumer-1", "1/1 brokers are down")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["kafka: " + condition(REFUSED), "kafka: 1/1 brokers are down"]
    assert caplog.records[0].levelno == logging.ERROR and klog.errors == 100


def test_a_condition_that_lasts_is_repeated_with_its_count_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    klog = KafkaLog(clock=clock, repeat_s=60.0)
    with caplog.at_level(logging.DEBUG, logger="ccld.kafka"):
        for _ in range(1040):  # 65 s of one attempt every 62.5 ms (exact in binary: no drift at 60 s)
            klog.log(logging.ERROR, "%s [%s] %s", "FAIL", "c", REFUSED)
            clock.t += 0.0625
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[1].endswith("(again; 960 times in the last 60 s)"), lines[1]


def test_routine_librdkafka_lines_go_to_debug_and_errors_share_the_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    klog = KafkaLog()

    class Err:
        def str(self) -> str:
            return REFUSED.split("]: ", 1)[1]

        def fatal(self) -> bool:
            return False

    with caplog.at_level(logging.DEBUG, logger="ccld.kafka"):
        klog.log(logging.INFO, "%s [%s] %s", "FAIL", "c", "[thrd:x]: x: Disconnected (after 12014ms in state UP)")
        klog.log(logging.ERROR, "%s [%s] %s", "FAIL", "c", REFUSED)
        klog.error(Err())  # the error_cb repeats the same condition: no second line
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, "kafka: x: Disconnected"), (logging.ERROR, "kafka: " + condition(REFUSED))]


def test_muted_log_remembers_the_cause_without_a_line(caplog: pytest.LogCaptureFixture) -> None:
    klog = KafkaLog(muted=True)
    with caplog.at_level(logging.DEBUG, logger="ccld.kafka"):
        klog.log(logging.ERROR, "%s [%s] %s", "FAIL", "c", REFUSED)
    assert not caplog.records and reason(klog.last) == "Connection refused"


def stats(*states: str) -> str:
    return json.dumps({"brokers": {f"b{i}": {"state": s, "nodeid": i} for i, s in enumerate(states)}})


def test_broker_watch_counts_from_the_last_connection_up() -> None:
    w = BrokerWatch(now=0.0)
    w.stats(stats("UP", "INIT"), 1.0)
    assert w.down_for(5.0) == 0.0
    w.stats(stats("INIT", "TRY_CONNECT"), 2.0)
    assert w.down_for(5.0) == 4.0, "down since the last statistics that showed a connection up"
    w.alive(6.0)  # a message arrived: the broker is there
    assert w.down_for(7.0) == 0.0
    w.stats("not json", 8.0)
    assert w.down_for(9.0) == 0.0, "unreadable statistics change nothing"


def test_unreachable_names_the_address_the_cause_and_what_to_check() -> None:
    line = unreachable("127.0.0.1:9", "Connection refused")
    assert line.startswith("cannot reach Kafka at 127.0.0.1:9 (Connection refused): check")
    assert "CCLD_BOOTSTRAP" in line and "CCLD_SECURITY_PROTOCOL" in line and "\n" not in line
