"""Prometheus metrics of the host aggregator: rank batches in, merged messages out, drops, the producer's spool.

Read from the metrics server's thread (``ccld.metrics_http``, started by ``ccld run --aggregate``):
the aggregator's ``AggregatorStats`` and its Kafka sink's ``stats`` are what it counts anyway, mapped
to names here. Records are kernel records (rows); a rank batch is one rank's datagram.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ccld.metrics import Family
from ccld.producers.attach.aggregate import HostAggregator

#: metric name, ``AggregatorStats`` field, help
COUNTERS = (
    ("ccld_aggregator_received_batches_total", "received", "Rank batches received over the socket and buffered."),
    ("ccld_aggregator_received_records_total", "received_rows", "Records in the rank batches received."),
    ("ccld_aggregator_sent_messages_total", "sent_batches", "Merged messages the Kafka producer took."),
    ("ccld_aggregator_sent_records_total", "sent_rows", "Records in the merged messages the producer took."),
    ("ccld_aggregator_dropped_records_total", "dropped", "Records dropped because the buffer was full."),
    ("ccld_aggregator_dropped_batches_total", "dropped_messages", "Rank batches dropped because the buffer was full."),
    ("ccld_aggregator_decode_errors_total", "decode_errors", "Datagrams that were no valid batch (or were cut)."),
    ("ccld_aggregator_send_failures_total", "send_failures",
     "Merged messages the producer refused or raised on (its outcome counters say why)."),
    ("ccld_aggregator_internal_errors_total", "internal_errors", "Errors inside the aggregator's threads (logged)."),
)
#: outcome label -> the producer stats keys (``MetricsProducer.stats``, ``producer_`` in the sink's) it sums
OUTCOMES = {
    "delivered": ("delivered_records",),
    "expired": ("expired_records",),
    "refused": ("refused_records",),
    "failed": ("error_records",),
    "dropped": ("dropped_progress", "dropped_critical"),
    "spool_lost": ("spool_lost_records",),
    "replay_rejected": ("replay_rejected_records",),
}


def aggregator_families(agg: HostAggregator, *, spool_max_bytes: int = 0) -> list[Family]:
    stats = dataclasses.asdict(agg.stats)
    out = [Family(name, "counter", text).add(int(stats.get(key, 0))) for name, key, text in COUNTERS]
    out.append(Family("ccld_aggregator_buffered_records", "gauge",
                      "Records received and not yet flushed to the producer.").add(agg.buffered_rows))
    sink_stats: dict[str, Any] = dict(getattr(agg.sink, "stats", {}) or {})
    producer = {k.removeprefix("producer_"): v for k, v in sink_stats.items() if k.startswith("producer_")}
    outcomes = Family("ccld_aggregator_producer_records_total", "counter",
                      "Records of the merged messages by what became of them at the broker (or the spool).",
                      ("outcome",))
    for outcome, keys in OUTCOMES.items():
        outcomes.add(sum(int(producer.get(k, 0)) for k in keys), outcome=outcome)
    # no producer could be made at all: each record is a drop of the sink's own
    outcomes.add(int(sink_stats.get("sink_dropped", 0)), outcome="no_producer")
    out.append(outcomes)
    out.append(Family("ccld_aggregator_producer_in_flight_records", "gauge",
                      "Records handed to the Kafka client whose delivery is not reported yet.")
               .add(int(producer.get("in_flight_records", 0))))
    out.append(Family("ccld_aggregator_spooled_records", "gauge",
                      "Records waiting in the on-disk spool for the broker (spool_dir).")
               .add(int(producer.get("spooled_records", 0))))
    out.append(Family("ccld_aggregator_spool_bytes", "gauge", "Bytes the on-disk spool holds now.")
               .add(int(getattr(agg.sink, "spool_bytes", 0) or 0)))
    out.append(Family("ccld_aggregator_spool_max_bytes", "gauge",
                      "The spool's bound (spool_max_mb; 0 without spool_dir): past it records are lost.")
               .add(spool_max_bytes))
    out.extend(nccl_families(agg))
    return out


def nccl_families(agg: HostAggregator) -> list[Family]:
    """The NCCL profiler plugin's side (``ccld run --nccl-plugin``): the tables polled and the plugins' own counters."""
    w = agg.nccl
    ws = dataclasses.asdict(w.stats) if w is not None else {}
    plugin = w.table_stats() if w is not None else {}
    out = [
        Family("ccld_aggregator_nccl_tables", "gauge", "NCCL plugin tables (processes) polled now.")
        .add(int(ws.get("tables", 0))),
        Family("ccld_aggregator_nccl_tables_done_total", "counter",
               "Plugin tables whose process ended: polled a last time and removed.").add(int(ws.get("tables_done", 0))),
        Family("ccld_aggregator_nccl_bad_tables_total", "counter",
               "Files in the plugin's directory that were no readable table (skipped).")
        .add(int(ws.get("bad_tables", 0))),
        Family("ccld_aggregator_nccl_records_total", "counter", "Records made from the plugin's frames.")
        .add(int(ws.get("records", 0))),
    ]
    events = Family("ccld_aggregator_nccl_plugin_events", "gauge",
                    "NCCL events the plugins of the processes polled now handled, dropped (pools or table full) "
                    "or ignored (types they do not know).", ("outcome",))  # fmt: skip
    events.add(int(plugin.get("events", 0)), outcome="seen")
    events.add(int(plugin.get("dropped_events", 0)), outcome="dropped")
    events.add(int(plugin.get("unknown_events", 0)), outcome="unknown")
    out.append(events)
    out.append(Family("ccld_aggregator_nccl_refused_communicators", "gauge",
                      "Communicators the plugins of the processes polled now had no slot for (CCLD_NCCL_SLOTS).")
               .add(int(plugin.get("slots_refused", 0))))
    return out
