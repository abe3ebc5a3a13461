"""What a worker reads back from the broker to recover: a topic's identity, a partition's new log, sent verdicts.

Blocking confluent-kafka calls, run by the Faust app in a thread (``asyncio.to_thread``). None
of them joins a consumer group or commits anything. Tansu's high watermark is wrong (see the
platform notes), so reads end at a known offset or after a quiet interval, never at end-of-partition.
"""

from __future__ import annotations

import time
from typing import Any

from ccld.security import kafka_config
from ccld.settings import Settings

#: One admin client per bootstrap for the process: the topic check runs every few seconds, and a new
#: client each time would open (and leave reconnecting) a connection each time.
_ADMINS: dict[str, Any] = {}


def topic_id(settings: Settings, timeout_s: float = 1.5) -> str | None:
    """The metrics topic's id at the broker, None when the topic does not exist (raises when unreachable)."""
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    admin = _ADMINS.get(settings.bootstrap)
    if admin is None:
        admin = _ADMINS[settings.bootstrap] = AdminClient(kafka_config(settings))
    fut = admin.describe_topics(TopicCollection([settings.metrics_topic]), request_timeout=timeout_s)
    try:
        return str(fut[settings.metrics_topic].result(timeout_s).topic_id)
    except KafkaException as exc:
        if "UNKNOWN_TOPIC" in str(exc):
            return None
        raise


def read_partition(settings: Settings, partition: int, upto: int, idle_s: float = 3.0, *, start: int = 0,
                   topic: str | None = None) -> list[tuple[int, float | None, bytes | None]]:
    """(offset, timestamp s, value) of every message of the metrics partition (or ``topic``'s) in ``[start, upto)``
    (no group)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    out: list[tuple[int, float | None, bytes | None]] = []
    if upto <= max(start, 0):
        return out
    # No end-of-partition events: Tansu's high watermark is wrong (platform notes), so the read ends at
    # ``upto`` or after ``idle_s`` without a message.
    # A ``start`` below the log's first offset (retention deleted it) reads from the first one there is.
    c = Consumer(kafka_config(settings, **{"group.id": f"{settings.worker_app_id}-backfill",
                                           "enable.auto.commit": False, "auto.offset.reset": "earliest"}))
    try:
        c.assign([TopicPartition(topic or settings.metrics_topic, partition, start if start > 0 else OFFSET_BEGINNING)])
        last = time.monotonic()
        while time.monotonic() - last < idle_s:
            msg = c.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            last = time.monotonic()
            offset = int(msg.offset() or 0)
            if offset >= upto:
                break
            kind, ms = msg.timestamp()
            out.append((offset, ms / 1000.0 if kind and ms > 0 else None, msg.value()))
        return out
    finally:
        c.close()


def verdict_keys_on_topic(settings: Settings, idle_s: float = 1.5) -> set[str]:
    """The dedupe keys of every verdict on the verdicts topic (read from the beginning, no group)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from ccld.errors import SchemaError
    from ccld.schemas.codec import decode_verdict

    c = Consumer(kafka_config(settings, **{"group.id": f"{settings.worker_app_id}-reconcile",
                                           "enable.auto.commit": False}))
    keys: set[str] = set()
    try:
        parts = c.list_topics(settings.verdicts_topic, timeout=5).topics[settings.verdicts_topic].partitions
        c.assign([TopicPartition(settings.verdicts_topic, p, OFFSET_BEGINNING) for p in parts])
        last = time.monotonic()
        while time.monotonic() - last < idle_s:  # no end-of-partition events: Tansu's watermark is wrong
            msg = c.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            last = time.monotonic()
            try:
                keys.add(decode_verdict(msg.value() or b"").dedupe_key)
            except SchemaError:
                continue
        return keys
    finally:
        c.close()
