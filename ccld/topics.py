"""Create the CCL-D topics explicitly (brokers that auto-create would pick the wrong partition count), with
their retention: how long and how much each keeps (``topic_configs``).

A broker that refuses a topic's configs gets the topic without them and one warning line that says so;
``ccld topics`` also sets them on existing topics where they differ."""

from __future__ import annotations

import argparse
import logging

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic

from ccld.errors import BrokerError
from ccld.kafka_events import KafkaLog, reason, unreachable
from ccld.security import kafka_config
from ccld.settings import Settings

log = logging.getLogger(__name__)

#: The worker's state logs roll a segment this often: Kafka compacts closed segments only, and at its
#: default (7 days, or 1 GiB) a partition snapshotted every second would hold a week of copies
STATE_SEGMENT_MS = 3_600_000


def topic_specs(settings: Settings) -> dict[str, int]:
    """Topic name -> partition count."""
    return {
        settings.metrics_topic: settings.metrics_partitions,
        settings.verdicts_topic: settings.verdicts_partitions,
        settings.deadletter_topic: settings.deadletter_partitions,
        # shard reports go to their job's partition: as many as the metrics topic, so the job stage spreads too
        settings.reports_topic: settings.metrics_partitions,
    }


def topic_configs(settings: Settings) -> dict[str, dict[str, str]]:
    """Topic name -> the configs CCL-D sets on it (retention by time and, for metrics, by size)."""
    def keep(ms: int, size: int = -1) -> dict[str, str]:
        return {"retention.ms": str(ms), "retention.bytes": str(size)}

    return {
        settings.metrics_topic: keep(settings.metrics_retention_ms, settings.metrics_retention_bytes),
        settings.verdicts_topic: keep(settings.verdicts_retention_ms),
        settings.deadletter_topic: keep(settings.deadletter_retention_ms),
        settings.reports_topic: keep(settings.reports_retention_ms),
    }


def state_log_configs(settings: Settings) -> dict[str, str]:
    """Extra configs of the worker's state logs (Faust's changelog topics, compacted by Faust's own config):
    tombstones kept ``state_delete_retention_ms``, a segment rolled every ``STATE_SEGMENT_MS``."""
    return {"delete.retention.ms": str(settings.state_delete_retention_ms), "segment.ms": str(STATE_SEGMENT_MS)}


def ensure_topics(settings: Settings, timeout_s: float = 15.0, *, grow: bool = False) -> dict[str, int]:
    """Create missing topics; returns name -> partitions as the broker reports them.

    A topic with fewer partitions than the settings ask for leaves workers idle (``--scale worker=N``
    gets no more partitions to share): ``grow`` adds the missing ones (Kafka allows adding, never
    removing) and raises ``BrokerError`` when the broker refuses; without it, a warning (a worker
    or sink starting against an existing topic does not change it). Missing topics are created with
    their ``topic_configs``; ``grow`` also sets them on existing topics where they differ."""
    # librdkafka's connect retries stay off stderr: a broker that does not answer is the one line below
    klog = KafkaLog(muted=True)
    admin = AdminClient(kafka_config(settings, logger=klog))
    specs = topic_specs(settings)
    try:
        existing = admin.list_topics(timeout=timeout_s).topics
    except KafkaException as exc:
        admin.poll(0)  # serves the queued log lines: the muted log keeps the newest cause
        raise BrokerError(unreachable(settings.bootstrap, reason(klog.last) or str(exc.args[0]))) from exc
    configs = topic_configs(settings)
    missing = {name: n for name, n in specs.items() if name not in existing}
    refused = _create(admin, settings, missing, configs, timeout_s)
    if refused:  # created again without them: the topic matters more than its retention
        _create(admin, settings, {name: missing[name] for name in refused}, {}, timeout_s)
    if grow:
        _set_configs(admin, {name: c for name, c in configs.items() if name in existing}, timeout_s)
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


def _create(admin: AdminClient, settings: Settings, topics: dict[str, int], configs: dict[str, dict[str, str]],
            timeout_s: float) -> list[str]:
    """Create ``topics`` (name -> partitions) with their ``configs``; returns those whose configs the broker
    refused (each said in one line), raises ``BrokerError`` for any other failure."""
    if not topics:
        return []
    new = [NewTopic(name, num_partitions=n, replication_factor=settings.replication_factor,
                    config=configs.get(name, {})) for name, n in topics.items()]  # fmt: skip
    refused: list[str] = []
    for name, fut in admin.create_topics(new, operation_timeout=timeout_s).items():
        try:
            fut.result(timeout=timeout_s)
            log.info("created topic %s", name)
        except KafkaException as exc:
            text = str(exc)
            if "TOPIC_ALREADY_EXISTS" in text:
                continue
            if configs.get(name) and any(k in text.upper() for k in ("CONFIG", "POLICY", "UNSUPPORTED")):
                log.warning("the broker refused the retention of topic %s (%s): creating it without; set "
                            "retention on the broker", name, text)
                refused.append(name)
                continue
            raise BrokerError(f"cannot create topic {name}: {exc}") from exc
    return refused


def _set_configs(admin: AdminClient, configs: dict[str, dict[str, str]], timeout_s: float) -> None:
    """Set each existing topic's configs where the broker reports other values; a refusal is one warning line."""
    if not configs:
        return
    try:
        described = admin.describe_configs([ConfigResource("topic", name) for name in configs])
        have = {res.name: {k: e.value for k, e in fut.result(timeout=timeout_s).items()}
                for res, fut in described.items()}  # fmt: skip
    except (KafkaException, TimeoutError) as exc:
        log.warning("cannot read the topics' configs (%s): their retention is left as it is", exc)
        return
    differ = {name: {k: v for k, v in want.items() if have.get(name, {}).get(k) != v} for name, want in configs.items()}
    changes = [ConfigResource("topic", name, incremental_configs=[
                   ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in diff.items()])
               for name, diff in differ.items() if diff]  # fmt: skip
    if not changes:
        return
    for res, fut in admin.incremental_alter_configs(changes).items():
        try:
            fut.result(timeout=timeout_s)
            log.info("topic %s: retention set (%s)", res.name,
                     ", ".join(f"{e.name}={e.value}" for e in res.incremental_configs))
        except (KafkaException, TimeoutError) as exc:
            log.warning("the broker refused the retention of topic %s (%s): left as it is", res.name, exc)


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
    parser.description = ("Create the metrics, verdicts, dead-letter and reports topics with their retention, or set "
                          "it where it differs (idempotent).")


def main(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.bootstrap:
        raise BrokerError("ccld topics needs --bootstrap (or CCLD_BOOTSTRAP)")
    configs = topic_configs(settings)
    for name, n in ensure_topics(settings, grow=True).items():
        keep = configs.get(name, {})
        print(f"{name}: {n} partitions, keeps {_span(keep.get('retention.ms'))}, "
              f"{_size(keep.get('retention.bytes'))} per partition at most")
    return 0


def _span(ms: str | None) -> str:
    if ms is None or int(ms) < 0:
        return "everything"
    hours = int(ms) / 3_600_000
    return f"{hours / 24:g} days" if hours >= 48 else f"{hours:g} h"


def _size(size: str | None) -> str:
    return "no limit" if size is None or int(size) < 0 else f"{int(size) / 2**30:g} GiB"
