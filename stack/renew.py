"""When ``ccld up`` renews its embedded broker: the bound on a broker that never compacts or expires a log.

The embedded Tansu broker keeps every message in memory until it stops (retention and compaction settings are
accepted and never applied), so its memory grows with every kernel record and every state snapshot. Past
``up_broker_renew_mb`` of resident memory, ``ccld up`` restarts it empty, the way it restarts a broker that
died, but only at a moment when that loses nothing: no record has reached the worker(s) for ``up_renew_quiet_s``,
no message waits unread, no incident is open, no verdict waits for the broker, and the worker's and the sink's
groups have committed every message (the sink every row it archived; a running alert bridge every verdict its
receiver took). Anything that says otherwise, or a service
or broker that does not answer, postpones it. What a renewal forgets: the topics' contents (the archive keeps every
row), finished jobs the worker still held (a job that comes back starts fresh), and the alert bridge's view of the
hosts (rebuilt from the verdicts that follow; ``ccld nodes --archive`` keeps the whole history).

``RenewalWatch`` is the decision alone (pure, unit-tested); ``Pipeline.supervise`` reads the broker's memory and
the services' ``/metrics`` and carries it out.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from typing import Any

from ccld.security import kafka_config
from ccld.settings import Settings

#: Check the broker's memory this often (s).
CHECK_EVERY_S = 10.0


@dataclass(frozen=True)
class Activity:
    """What the services' ``/metrics`` say, summed over partitions and workers."""

    records: float  # ccld_worker_records_total: moves while any job sends
    unread: float  # ccld_worker_unread_messages
    open_incidents: float  # ccld_worker_open_incidents
    pending: float  # ccld_worker_pending_verdicts
    uncommitted: float  # ccld_sink_uncommitted_messages
    behind: float = 0.0  # messages past the worker's and the sink's committed offsets (``behind``)

    @property
    def settled(self) -> bool:
        return not (self.unread or self.open_incidents or self.pending or self.uncommitted or self.behind)


class RenewalWatch:
    """Decides when the broker may be renewed; ``observe`` once per check."""

    def __init__(self, cap_mb: float, quiet_s: float) -> None:
        self.cap_mb = cap_mb
        self.quiet_s = quiet_s
        self._records: float | None = None
        self._since: float | None = None  # since when the records total has not moved and all was settled

    def observe(self, now: float, rss_mb: float, activity: Activity | None) -> bool:
        """Whether to renew now: over the cap, and quiet and settled for ``quiet_s`` (``activity`` None: a
        service did not answer, which is never quiet)."""
        if activity is None or not activity.settled or activity.records != self._records:
            self._records = None if activity is None else activity.records
            self._since = now
            return False
        if self._since is None:
            self._since = now
        return self.cap_mb > 0 and rss_mb > self.cap_mb and now - self._since >= self.quiet_s

    def renewed(self, now: float) -> None:
        self._records, self._since = None, now


def rss_mb(pid: int) -> float:
    """A process's resident memory in MB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def metric_sums(url: str, names: tuple[str, ...], timeout_s: float = 2.0) -> dict[str, float]:
    """The sum over label sets of each of ``names`` in the exposition at ``url`` (a family not there: 0)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - our own loopback services
        text = resp.read().decode()
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


WORKER = ("ccld_worker_records_total", "ccld_worker_unread_messages", "ccld_worker_open_incidents",
          "ccld_worker_pending_verdicts")
SINK = ("ccld_sink_uncommitted_messages",)


def log_end(c: Any, topic: str, partition: int, timeout_s: float = 5.0) -> int:
    """The offset after a partition's last message. The embedded broker's high watermark is the base offset of
    the last batch + 1 (platform notes), short of the end by the rest of that batch: read that batch (one fetch;
    on Apache Kafka, the one message before the watermark) and take the offset after its last message."""
    from confluent_kafka import TopicPartition

    lo, hw = (int(x) for x in c.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s))
    if hw <= max(lo, 0):
        return max(hw, 0)  # empty, or everything before the watermark expired
    end = hw
    c.assign([TopicPartition(topic, partition, hw - 1)])
    try:
        m = c.poll(timeout_s)
        while m is not None:
            if m.error() is None:
                end = max(end, m.offset() + 1)
            m = c.poll(0.05)  # the rest of the fetched batch is already here
    finally:
        c.unassign()
    return end


def behind(settings: Settings, *, alert: bool = False) -> int | None:
    """Messages of the metrics topic past the worker group's committed offsets, plus those of the metrics and
    verdicts topics past the sink group's, and with ``alert`` those of the verdicts topic past the alert bridge's
    (it commits only what a receiver took: a renewal must not drop an alert not yet delivered); a partition never
    committed counts whole; None if the broker does not say. The ground truth the services' gauges may miss: a
    service just restarted has read nothing yet."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**kafka_config(settings), "group.id": f"{settings.worker_app_id}-renewal",
                  "enable.auto.commit": False})
    try:
        ends: dict[tuple[str, int], int] = {}
        for topic in (settings.metrics_topic, settings.verdicts_topic):
            for p in c.list_topics(topic, timeout=5).topics[topic].partitions:
                ends[topic, p] = log_end(c, topic, p)
        total = 0
        groups = [(settings.worker_app_id, (settings.metrics_topic,)),
                  (settings.sink_group, (settings.metrics_topic, settings.verdicts_topic))]
        if alert:
            groups.append((settings.alert_group, (settings.verdicts_topic,)))
        for group, topics in groups:
            done = Consumer({**kafka_config(settings), "group.id": group, "enable.auto.commit": False})
            try:
                got = done.committed([TopicPartition(t, p) for t, p in ends if t in topics], timeout=5)
            finally:
                done.close()
            total += sum(max(ends[tp.topic, tp.partition] - max(tp.offset, 0), 0) for tp in got)
        return total
    except Exception:  # noqa: BLE001 - any client error: the broker does not say, so nothing is settled
        return None
    finally:
        c.close()


def activity(worker_urls: list[str], sink_urls: list[str], settings: Settings, *,
             alert: bool = False) -> Activity | None:
    """The services' activity from their ``/metrics`` and the groups' offsets (None when any does not answer, or
    no service is known); ``alert``: an alert bridge runs, and a verdict it has not delivered is in flight too."""
    if not worker_urls or not sink_urls:
        return None
    try:
        w = [metric_sums(u, WORKER) for u in worker_urls]
        s = [metric_sums(u, SINK) for u in sink_urls]
    except (OSError, ValueError):
        return None
    late = behind(settings, alert=alert)
    if late is None:
        return None
    return Activity(records=sum(x["ccld_worker_records_total"] for x in w),
                    unread=sum(x["ccld_worker_unread_messages"] for x in w),
                    open_incidents=sum(x["ccld_worker_open_incidents"] for x in w),
                    pending=sum(x["ccld_worker_pending_verdicts"] for x in w),
                    uncommitted=sum(x["ccld_sink_uncommitted_messages"] for x in s), behind=late)
