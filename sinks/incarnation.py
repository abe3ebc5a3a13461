"""Which incarnation of a topic a message comes from, so that a recreated topic never overwrites the archive.

A topic deleted and created again, and every topic of a memory broker that restarted (the embedded
Tansu of ``ccld up``), numbers its messages from offset 0 again: offset 0 of the new topic is another
message than offset 0 of the old one. The sink names each incarnation's files (and its ledger) by a
*label* (``part-p<partition>-<label>-o<offset>.parquet``, ``sinks.layout``):

- ``id-<32 hex digits>``: the topic id the broker reports (Kafka since 2.8, Tansu 0.6). Every
  incarnation gets a new one and every restart of the sink reads the same one back, so a replay of
  the same incarnation still rewrites its files instead of adding copies.
- ``sink-<16 hex digits>``: for a broker without topic ids, a token the sink makes itself and keeps
  in ``topic=<topic>/_offsets/p<partition>/incarnation`` (``sinks.layout.marker_path``). A new one
  is made when the first message the sink takes after an assignment (or after the offsets went
  back) disagrees with the row the archive holds at its offset: another Kafka timestamp means
  another message, hence another incarnation.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from confluent_kafka import KafkaException, TopicCollection

from ccld.sinks.layout import files_holding, marker_path

log = logging.getLogger(__name__)

_MASK = (1 << 64) - 1


def id_label(topic_id: Any) -> str | None:
    """The label for a broker's topic id (a ``confluent_kafka.Uuid``; its stubs lack the two getters);
    None for the all-zero id, what a broker without topic ids sends."""
    if topic_id is None:
        return None
    # The bits come back signed; masked, they print as the 128-bit id.
    msb, lsb = topic_id.get_most_significant_bits() & _MASK, topic_id.get_least_significant_bits() & _MASK
    return f"id-{msb:016x}{lsb:016x}" if msb or lsb else None


class TopicIds:
    """Asks the broker for topic ids (an admin client made on first use, so tests without a broker need none)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config
        self._admin: Any = None

    def labels(self, topics: Sequence[str], timeout_s: float) -> dict[str, str]:
        """topic -> ``id-...`` label, or ``""`` when the broker answered without an id for it.

        A topic the broker did not answer for (down, unreachable, timed out) is left out: its
        incarnation is unknown, which is not the same as "the same as before".
        """
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient(self._config)
        out: dict[str, str] = {}
        try:
            futures = self._admin.describe_topics(TopicCollection(list(topics)), request_timeout=timeout_s)
        except KafkaException as exc:
            log.debug("describe_topics %s failed: %s", topics, exc)
            return out
        for topic, fut in futures.items():
            try:
                out[topic] = id_label(fut.result(timeout=timeout_s + 1.0).topic_id) or ""
            except (KafkaException, TimeoutError) as exc:  # the broker's error, or the future timed out
                log.debug("no topic id for %s: %s", topic, exc)
        return out


class SinkTokens:
    """Labels the sink derives for partitions of a broker that reports no topic ids (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def label(self, topic: str, partition: int, offset: int, ts_ms: int) -> str:
        """The label for a partition whose next message is ``offset`` with Kafka timestamp ``ts_ms``."""
        marker = marker_path(self.root, topic, partition)
        token = marker.read_text().strip() if marker.is_file() else ""
        if token and _agrees(files_holding(self.root, topic, partition, token, offset), offset, ts_ms):
            return token
        new = f"sink-{time.time_ns():016x}"
        if token:
            log.warning("%s[%d]@%d is not the message the archive holds at that offset: the topic was recreated; "
                        "its files now go to %s (the old ones stay in %s)", topic, partition, offset, new, token)
        marker.parent.mkdir(parents=True, exist_ok=True)
        tmp = marker.with_name(f".incarnation.tmp-{os.getpid()}")
        tmp.write_text(new + "\n")
        os.replace(tmp, marker)
        return new


def _agrees(files: list[Path], offset: int, ts_ms: int) -> bool:
    """Whether ``files`` (those holding ``offset``) hold nothing at ``offset``, or rows with timestamp ``ts_ms``."""
    stamps: set[int] = set()
    for f in files:
        table = pq.read_table(f, columns=["offset", "kafka_ts_ms"])
        stamps |= set(table.filter(pc.equal(table["offset"], offset))["kafka_ts_ms"].to_pylist())
    return not stamps or stamps == {ts_ms}
