"""What ``ccld up`` reads on a real broker before it renews its embedded broker: the messages its services'
groups have not committed. An alert bridge commits a verdict only once its receiver took it, so while one runs
a verdict it has not delivered holds the renewal back (a renewal empties the topics: the alert would be lost)."""

from __future__ import annotations

from confluent_kafka import Consumer, Producer, TopicPartition

from ccld.security import kafka_config
from ccld.settings import Settings
from ccld.stack.renew import behind


def commit(s: Settings, group: str, topic: str, offset: int) -> None:
    """``group`` has taken ``topic``'s partition 0 up to ``offset`` (every other partition is empty here)."""
    c = Consumer({**kafka_config(s), "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        c.close()


def test_a_verdict_the_alert_bridge_has_not_delivered_is_behind(ccld_settings: Settings) -> None:
    s = ccld_settings.replace(alert_group=f"{ccld_settings.sink_group}-alert")
    p = Producer(kafka_config(s))
    for i in range(3):
        p.produce(s.verdicts_topic, value=b"v%d" % i, partition=0)
    assert p.flush(10) == 0
    assert behind(s) == 3, "the sink has archived none of the three"
    commit(s, s.sink_group, s.verdicts_topic, 3)
    assert behind(s) == 0, "the worker and the sink have everything"
    assert behind(s, alert=True) == 3, "a bridge that never committed has delivered nothing"
    commit(s, s.alert_group, s.verdicts_topic, 1)
    assert behind(s, alert=True) == 2
    commit(s, s.alert_group, s.verdicts_topic, 3)
    assert behind(s, alert=True) == 0
