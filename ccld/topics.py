"""Create the CCL-D topics explicitly (brokers that auto-create would pick the wrong partition count)."""

from __future__ import annotations

import argparse
import logging

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from ccld.errors import BrokerError
from ccld.kafka_events import KafkaLog, reason, unreachable
from ccld.security import kafka_config
from ccld.settings import Settings

log = logging.getLogger(__name__)


def topic_specs(settings: Settings) -> dict[str, int]:
    """Topic name -> partition count."""
    return {
        settings.metrics_topic: settings.metrics_partitions,
        settings.verdicts_topic: settings.verdicts_partitions,
        settings.deadletter_topic: settings.deadletter_partitions,
        # shard reports go to their job's partition: as many as the metrics topic, so the job stage spreads too
        settings.reports_topic: settings.metrics_partitions,
    }


def ensure_topics(settings: Settings, timeout_s: float = 15.0, *, grow: bool = False) -> dict[str, int]:
    """Create missing topics; returns name -> partitions as the broker reports them.

    A topic with fewer partitions than the settings ask for leaves workers idle (``--scale worker=N``
    gets no more partitions to share): ``grow`` adds the missing ones (Kafka allows adding, never
    removing) and raises ``BrokerError`` when the broker refuses; without it, a warning (a worker
    or sink starting against an existing topic does not change it)."""
    # librdkafka's connect retries stay off stderr: a broker that does not answer is the one line below
    klog = KafkaLog(muted=True)
    admin = AdminClient(kafka_config(settings, logger=klog))
    specs = topic_specs(settings)
    try:
        existing = admin.list_topics(timeout=timeout_s).topics
    except KafkaException as exc:
        admin.poll(0)  # serves the queued log lines: the muted log keeps the newest cause
        raise BrokerError(unreachable(settings.bootstrap, reason(klog.last) or str(exc.args[0]))) from exc
    missing = [
        NewTopic(name, num_partitions=n, replication_factor=settings.replication_factor)
        for name, n in specs.items()
        if name not in existing
    ]
    if missing:
        for name, fut in admin.create_topics(missing, operation_timeout=timeout_s).items():
            try:
                fut.result(timeout=timeout_s)
                log.info("created topic %s", name)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise BrokerError(f"cannot create topic {name}: {exc}") from exc
    md = admin.list_topics(timeout=timeout_s).topics
    out = {name: len(md[name].partitions) for name in specs if name in md}
    short = {name: want for name, want in specs.items() if 0 < out.get(name, 0) < want}
    if grow and short:
        _add_partitions(admin, short, out, timeout_s)
        out.update(short)
    for name, want in specs.items():
        if out.get(name, 0) != want:
            log.warning("topic %s has %s partitions, settings ask for %d", name, out.get(name), want)
    return out


def _add_partitions(admin: AdminClient, short: dict[str, int], have: dict[str, int], timeout_s: float) -> None:
    """Grow each topic of ``short`` to its partition count, or raise naming the topic and what to do."""
    for name, fut in admin.create_partitions([NewPartitions(n, want) for n, want in short.items()],
                                             operation_timeout=timeout_s).items():
        try:
            fut.result(timeout=timeout_s)
            log.warning("topic %s grew from %d to %d partitions (jobs hash to partitions anew: a running job's "
                        "next records may go to another worker)", name, have[name], short[name])
        except (KafkaException, TimeoutError) as exc:
            raise BrokerError(
                f"topic {name} has {have[name]} partitions, the settings ask for {short[name]}, and adding them "
                f"failed ({exc}): workers beyond {have[name]} would sit idle. Set CCLD_METRICS_PARTITIONS="
                f"{have[name]} (or the topic's own setting), or delete the topic and run ccld topics again"
            ) from exc


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = "Create the metrics, verdicts and dead-letter topics (idempotent)."


def main(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.bootstrap:
        raise BrokerError("ccld topics needs --bootstrap (or CCLD_BOOTSTRAP)")
    for name, n in ensure_topics(settings, grow=True).items():
        print(f"{name}: {n} partitions")
    return 0
