"""`ccld verdicts`: tail the verdicts topic as readable lines or JSON lines, filtered by job, class and state.

Reads by assigning every partition (no consumer group join, no committed offsets), and
drops repeats that at-least-once delivery may produce by ``Verdict.dedupe_key`` (the worker's
own key), so each distinct ``update`` of an incident is shown, not only the first. Each line starts
with the detection time (UTC) and the job. librdkafka's log goes through Python logging, one line
per condition (``ccld.kafka_events``); a broker that does not answer at the start fails in a few
seconds with one line, and one that is gone for ``verdicts_broker_timeout_s`` ends the tail (code 2).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from ccld.anomaly import AnomalyKind, Family, kinds_of
from ccld.errors import BrokerError, SchemaError
from ccld.kafka_events import BrokerWatch, KafkaLog, reason, unreachable
from ccld.records import Verdict, VerdictState
from ccld.schemas.codec import decode_verdict
from ccld.security import kafka_config
from ccld.settings import Settings

log = logging.getLogger(__name__)

#: The first contact with the broker waits at most this long (seconds): a person is waiting for the answer.
CONNECT_TIMEOUT_S = 5.0


def utc_seconds(t: float) -> str:
    """Epoch seconds as ISO 8601 UTC to the second (``2025-03-01T12:00:07Z``)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_line(v: Verdict) -> str:
    """One readable line: when it was detected (the analyzer's clock, as UTC), the job, then the verdict."""
    return f"{utc_seconds(v.detected_time)} job={v.job} {v.describe()}"


@dataclass(frozen=True)
class VerdictFilter:
    """Which verdicts to show; an empty set means any."""

    jobs: frozenset[str] = frozenset()
    kinds: frozenset[AnomalyKind] = frozenset()
    states: frozenset[VerdictState] = frozenset()

    def __call__(self, v: Verdict) -> bool:
        return ((not self.jobs or v.job in self.jobs) and (not self.kinds or v.kind in self.kinds)
                and (not self.states or v.state in self.states))


def parse_kinds(values: Iterable[str]) -> frozenset[AnomalyKind]:
    """``H1``, ``s2`` or a family (``hang``, ``slow``), repeated or comma-separated."""
    out: set[AnomalyKind] = set()
    families = {f.value: f for f in Family}
    for item in _items(values):
        if item.lower() in families:
            out |= {AnomalyKind(k) for k in kinds_of(families[item.lower()])}
        elif item.upper() in AnomalyKind.__members__:
            out.add(AnomalyKind(item.upper()))
        else:
            raise argparse.ArgumentTypeError(
                f"unknown class {item!r}; one of {', '.join(k.value for k in AnomalyKind)}, hang or slow")
    return frozenset(out)


def parse_states(values: Iterable[str]) -> frozenset[VerdictState]:
    """``open``, ``update``, ``resolved`` (every ``VerdictState``), repeated or comma-separated."""
    known = {s.value: s for s in VerdictState}
    out: set[VerdictState] = set()
    for item in _items(values):
        if item.lower() not in known:
            raise argparse.ArgumentTypeError(f"unknown state {item!r}; one of {', '.join(known)}")
        out.add(known[item.lower()])
    return frozenset(out)


def _items(values: Iterable[str]) -> list[str]:
    return [x.strip() for v in values for x in v.split(",") if x.strip()]


def _kind_arg(text: str) -> str:
    parse_kinds([text])  # refused at parse time, with the flag named
    return text


def _state_arg(text: str) -> str:
    parse_states([text])
    return text


def _seconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def iter_verdicts(
    settings: Settings,
    *,
    from_beginning: bool = True,
    idle_timeout_s: float | None = None,
    stop: Callable[[], bool] = lambda: False,
    connect_timeout_s: float = 10.0,
    broker_timeout_s: float | None = None,
) -> Iterator[Verdict]:
    """Yield distinct verdicts until ``idle_timeout_s`` passes without a new one, or ``stop()``.

    Raises ``BrokerError`` when no broker answers within ``connect_timeout_s`` at the start, or,
    with ``broker_timeout_s``, when no broker connection has been up for that long since.
    """
    klog = KafkaLog(muted=True)  # until the first contact: a failure then is reported in one line, below
    watch = BrokerWatch(time.monotonic())
    consumer = Consumer(kafka_config(settings, **{
        "group.id": f"ccld-tail-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "logger": klog,
        "error_cb": klog.error,
        "statistics.interval.ms": 1000,  # the broker-gone clock reads connection states from these
        "stats_cb": lambda raw: watch.stats(raw, time.monotonic()),
    }))
    try:
        try:
            md = consumer.list_topics(settings.verdicts_topic, timeout=connect_timeout_s)
        except KafkaException as exc:
            consumer.poll(0)  # serves the queued log lines: the muted log keeps the newest cause
            raise BrokerError(unreachable(settings.bootstrap, reason(klog.last) or str(exc.args[0]))) from exc
        topic = md.topics.get(settings.verdicts_topic)
        if topic is None or topic.error is not None or not topic.partitions:
            raise BrokerError(f"topic {settings.verdicts_topic} does not exist at {settings.bootstrap} "
                              "(`ccld topics` creates it; check --topic-prefix)")
        klog.muted = False
        watch.alive(time.monotonic())
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        consumer.assign([TopicPartition(settings.verdicts_topic, p, start) for p in topic.partitions])
        seen: set[str] = set()
        last_new = time.monotonic()
        while not stop():
            now = time.monotonic()
            if idle_timeout_s is not None and now - last_new >= idle_timeout_s:
                return
            if broker_timeout_s is not None and watch.down_for(now) >= broker_timeout_s:
                cause = f"; last: {reason(klog.last)}" if klog.last else ""
                raise BrokerError(f"lost Kafka at {settings.bootstrap}: no broker answered for "
                                  f"{watch.down_for(now):.0f} s{cause}")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    klog.error(err)
                continue
            watch.alive(time.monotonic())
            try:
                v = decode_verdict(msg.value() or b"")
            except SchemaError as exc:
                log.warning("skipping undecodable message at offset %s: %s", msg.offset(), exc)
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
    parser.add_argument("--kind", action="append", default=[], metavar="CLASS", type=_kind_arg,
                        help="only these classes: H1..S3, hang or slow (repeat or comma-separate)")
    parser.add_argument("--state", action="append", default=[], metavar="STATE", type=_state_arg,
                        help=f"only these states: {', '.join(s.value for s in VerdictState)} "
                             "(repeat or comma-separate)")
    parser.add_argument("--broker-timeout-s", dest="broker_timeout_s", type=_seconds_arg, metavar="SECONDS",
                        help="exit (code 2) when no broker answered for this long (default: verdicts_broker_timeout_s)")
    # --job (every command's flag) filters here: only that job's verdicts are shown


def main(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.bootstrap:
        raise BrokerError("ccld verdicts needs --bootstrap (or CCLD_BOOTSTRAP)")
    # the flag, not settings.job: CCLD_JOB is what producers stamp, and must not silently filter a tail
    show = VerdictFilter(jobs=frozenset([args.job] if args.job else []), kinds=parse_kinds(args.kind),
                         states=parse_states(args.state))
    broker_timeout_s = args.broker_timeout_s or settings.verdicts_broker_timeout_s
    n = 0
    for v in iter_verdicts(settings, from_beginning=args.from_beginning, idle_timeout_s=args.timeout,
                           connect_timeout_s=min(CONNECT_TIMEOUT_S, broker_timeout_s),
                           broker_timeout_s=broker_timeout_s):
        if not show(v):
            continue
        n += 1
        print(json.dumps(v.to_dict(), sort_keys=True) if args.json else format_line(v), flush=True)
    if not args.json:
        print(f"{n} verdicts", file=sys.stderr)
    return 0
