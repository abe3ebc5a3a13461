"""`ccld verdicts`: tail the verdicts topic as readable lines or JSON lines.

Reads by assigning every partition (no consumer group join, no committed offsets), and
drops repeats that at-least-once delivery may produce by ``Verdict.dedupe_key`` (the worker's
own key), so each distinct ``update`` of an incident is shown, not only the first.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

from ccld.errors import BrokerError, SchemaError
from ccld.records import Verdict
from ccld.schemas.codec import decode_verdict
from ccld.security import kafka_config
from ccld.settings import Settings


def iter_verdicts(
    settings: Settings,
    *,
    from_beginning: bool = True,
    idle_timeout_s: float | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> Iterator[Verdict]:
    """Yield distinct verdicts until ``idle_timeout_s`` passes without a new one, or ``stop()``."""
    consumer = Consumer(kafka_config(settings, **{
        "group.id": f"ccld-tail-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
    }))
    try:
        try:
            md = consumer.list_topics(settings.verdicts_topic, timeout=10)
        except Exception as exc:
            raise BrokerError(f"cannot reach Kafka at {settings.bootstrap}: {exc}") from exc
        topic = md.topics.get(settings.verdicts_topic)
        if topic is None or topic.error is not None or not topic.partitions:
            raise BrokerError(f"topic {settings.verdicts_topic} does not exist at {settings.bootstrap}")
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        consumer.assign([TopicPartition(settings.verdicts_topic, p, start) for p in topic.partitions])
        seen: set[str] = set()
        last_new = time.monotonic()
        while not stop():
            if idle_timeout_s is not None and time.monotonic() - last_new >= idle_timeout_s:
                return
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    print(f"ccld verdicts: {err}", file=sys.stderr)
                continue
            try:
                v = decode_verdict(msg.value() or b"")
            except SchemaError as exc:
                print(f"ccld verdicts: skipping undecodable message at offset {msg.offset()}: {exc}",
                      file=sys.stderr)
                continue
            key = v.dedupe_key
            if key in seen:
                continue
            seen.add(key)
            last_new = time.monotonic()
            yield v
    finally:
        consumer.close()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object per line (the Verdict schema)")
    parser.add_argument("--from-beginning", action="store_true", help="start at the oldest verdict")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="stop after this long without a new verdict (default: run until Ctrl-C)")


def main(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.bootstrap:
        raise BrokerError("ccld verdicts needs --bootstrap (or CCLD_BOOTSTRAP)")
    n = 0
    for v in iter_verdicts(settings, from_beginning=args.from_beginning, idle_timeout_s=args.timeout):
        n += 1
        print(json.dumps(v.to_dict(), sort_keys=True) if args.json else v.describe(), flush=True)
    if not args.json:
        print(f"{n} verdicts", file=sys.stderr)
    return 0
