"""What each service's /metrics says, built from its in-memory state (no sockets, no processes).

The worker's from real partition processors (``streams.worker_metrics``), the sink's and the alert
bridge's from an ``Archiver`` and an ``AlertService`` that never ran (``sinks.sink_metrics``), the
aggregator's from a ``HostAggregator`` fed by hand; and every metric a service exposes is listed in
docs/operations.md's "Metrics" section, and every one the Grafana dashboard queries exists.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ccld.metrics import Family, render
from ccld.producers.attach.aggregate import HostAggregator
from ccld.producers.attach.aggregate_metrics import aggregator_families
from ccld.records import AnomalyKind, KernelBatch, VerdictState
from ccld.schemas.codec import encode_batch
from ccld.settings import AnalyzerSettings, Settings
from ccld.sinks.alerts import AlertService
from ccld.sinks.archiver import Archiver
from ccld.sinks.sink_metrics import alert_families, archiver_families
from ccld.stack.up import Pipeline
from ccld.streams.lag import LagWatch
from ccld.streams.processor import PartitionProcessor
from ccld.streams.worker_metrics import WorkerMetrics
from ccld.streams.worker_state import WorkerState
from factories import make_kernel_record, make_verdict
from harness import parse_exposition

ROOT = Path(__file__).resolve().parents[3]


class Table:
    """The part of a Faust table ``WorkerState`` and the metrics read: the snapshots by key."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}


def worker_metrics() -> tuple[WorkerMetrics, WorkerState[PartitionProcessor]]:
    state: WorkerState[PartitionProcessor] = WorkerState(
        Settings(), Table(), "m",
        restore=lambda p, raw, parts: PartitionProcessor.restore(p, AnalyzerSettings(), raw, parts=parts))
    return WorkerMetrics([state], LagWatch()), state


def batch(n: int, seq: int) -> bytes:
    return encode_batch(KernelBatch.from_records([make_kernel_record(rank=r, comm_rank=r) for r in range(n)],
                                                 producer="p", batch_seq=seq))


def test_worker_metrics_are_the_processors_counters_by_partition() -> None:
    metrics, state = worker_metrics()
    p0, p1 = state.processor(0), state.processor(1)
    for i in range(3):
        p0.handle(batch(4, i), topic="m", offset=i, timestamp_s=100.0 + i)
    p1.handle(batch(2, 0), topic="m", offset=0, timestamp_s=100.0)
    p1.handle(b"garbage", topic="m", offset=1, timestamp_s=100.0)
    v = make_verdict(kind=AnomalyKind.H2, state=VerdictState.OPEN)
    p0.found([v, make_verdict(incident_id="b", kind=AnomalyKind.S1, state=VerdictState.RESOLVED)])
    p0.mark_sent(v)  # acknowledged: counted by kind and state; the other one is still pending
    p0.counters["lag_ms"], p1.counters["unread_messages"] = 1500, 7
    state.table.data[state.key(1)] = b"x" * 123
    state.unchanged[1] = 4
    metrics.lag.caught_up = False
    for seconds in (0.0002, 0.003, 4.0):
        metrics.observe_analysis(seconds)

    got = parse_exposition(metrics.render())
    assert got['ccld_worker_records_total{partition="0"}'] == 12
    assert got['ccld_worker_records_total{partition="1"}'] == 2
    assert got['ccld_worker_messages_total{partition="1"}'] == 2
    assert got['ccld_worker_dead_letters_total{partition="1"}'] == 1
    assert got['ccld_worker_dead_letters_total{partition="0"}'] == 0
    assert got['ccld_worker_lag_seconds{partition="0"}'] == 1.5
    assert got['ccld_worker_unread_messages{partition="1"}'] == 7
    assert got['ccld_worker_snapshot_bytes{partition="1"}'] == 123
    assert got['ccld_worker_snapshot_bytes{partition="0"}'] == 0
    assert got['ccld_worker_snapshots_unchanged_total{partition="1"}'] == 4
    assert got['ccld_worker_snapshots_unchanged_total{partition="0"}'] == 0
    assert got['ccld_worker_verdicts_total{kind="H2",state="open"}'] == 1
    assert not any(k.startswith("ccld_worker_verdicts_total{kind=\"S1\"") for k in got), "pending is not sent"
    assert got["ccld_worker_pending_verdicts"] == 1
    assert got["ccld_worker_partitions"] == 2 and got["ccld_worker_behind"] == 1
    assert got['ccld_worker_analysis_seconds_bucket{le="0.00025"}'] == 1
    assert got['ccld_worker_analysis_seconds_bucket{le="0.005"}'] == 2
    assert got['ccld_worker_analysis_seconds_bucket{le="2.5"}'] == 2
    assert got['ccld_worker_analysis_seconds_bucket{le="+Inf"}'] == got["ccld_worker_analysis_seconds_count"] == 3


def test_verdict_counts_by_kind_survive_a_snapshot() -> None:
    proc = PartitionProcessor(0, AnalyzerSettings())
    v = make_verdict(kind=AnomalyKind.S3, state=VerdictState.UPDATE)
    proc.found([v])
    proc.mark_sent(v)
    restored = PartitionProcessor.restore(0, AnalyzerSettings(), proc.snapshot())
    assert restored.report()["verdicts:S3:update"] == 1 and restored.report()["verdicts"] == 1


def test_sink_metrics_map_the_archivers_counters_and_say_what_waits(tmp_path: Path) -> None:
    s = Settings.load({}, bootstrap="127.0.0.1:1", archive_dir=str(tmp_path))
    arch = Archiver(s)  # no client is created until run()
    got = parse_exposition(render(archiver_families(arch)))
    assert got["ccld_sink_uncommitted_messages"] == 0 and got["ccld_sink_commit_lag_seconds"] == 0
    arch._add(s.metrics_topic, 0, 0, 1_000, batch(3, 0))
    arch._add(s.metrics_topic, 0, 1, 1_000, b"garbage")
    arch.counters.update(rows=30, files=2, write_failures=1)
    got = parse_exposition(render(archiver_families(arch)))
    assert got["ccld_sink_messages_total"] == 2 and got["ccld_sink_rows_total"] == 30
    assert got["ccld_sink_files_total"] == 2 and got["ccld_sink_write_failures_total"] == 1
    assert got['ccld_sink_skipped_messages_total{reason="undecodable"}'] == 1
    assert got["ccld_sink_uncommitted_messages"] == 2 and got["ccld_sink_commit_lag_seconds"] >= 0
    assert got["ccld_sink_archive_blocked"] == 0


def test_alert_metrics_have_one_series_per_receiver_and_the_live_gauges() -> None:
    service = AlertService(Settings.load({}, bootstrap="kafka:9092", alert_webhook_url="http://hook",
                                         alert_alertmanager_url="http://am:9093"))
    service.counters.update(delivered_webhook=3, failures_alertmanager=2, duplicates=1, verdicts=4)
    service.receivers[0].failed(0.0, 1.0)  # alertmanager is failing
    service.backlog.add(0, 0, None)
    got = parse_exposition(render(alert_families(service)))
    assert got['ccld_alert_delivered_total{receiver="webhook"}'] == 3
    assert got['ccld_alert_delivered_total{receiver="alertmanager"}'] == 0
    assert got['ccld_alert_failures_total{receiver="alertmanager"}'] == 2
    assert got["ccld_alert_duplicates_total"] == 1 and got["ccld_alert_verdicts_total"] == 4
    assert got["ccld_alert_backlog"] == 1 and got["ccld_alert_open_incidents"] == 0
    assert got['ccld_alert_receiver_failing_seconds{receiver="alertmanager"}'] > 0
    assert got['ccld_alert_receiver_failing_seconds{receiver="webhook"}'] == 0


class StatsSink:
    """A batch sink with the Kafka sink's ``stats`` and ``spool_bytes``."""

    def __init__(self) -> None:
        self.taken: list[KernelBatch] = []
        self.spool_bytes = 4096
        self.stats: dict[str, Any] = {"sink_dropped": 0, "producer_delivered_records": 5,
                                      "producer_expired_records": 2, "producer_dropped_progress": 1,
                                      "producer_spooled_records": 9, "producer_in_flight_records": 3}

    def submit_batch(self, b: KernelBatch) -> bool:
        self.taken.append(b)
        return True

    def flush(self, timeout_s: float = 0.0) -> int:
        return 0

    def close(self, timeout_s: float = 0.0) -> None:
        pass


def test_aggregator_metrics_count_records_in_and_out_drops_and_the_spool() -> None:
    agg = HostAggregator(sink=StatsSink(), max_rows=6, producer_id="host-m")  # never started: fed by hand
    agg._take(batch(4, 0))
    agg._take(batch(4, 1))  # over max_rows: dropped
    agg._take(b"junk")
    got = parse_exposition(render(aggregator_families(agg, spool_max_bytes=1 << 20)))
    assert got["ccld_aggregator_received_records_total"] == 4 and got["ccld_aggregator_buffered_records"] == 4
    assert got["ccld_aggregator_dropped_records_total"] == 4 and got["ccld_aggregator_decode_errors_total"] == 1
    agg.flush()
    got = parse_exposition(render(aggregator_families(agg, spool_max_bytes=1 << 20)))
    assert got["ccld_aggregator_sent_records_total"] == 4 and got["ccld_aggregator_sent_messages_total"] == 1
    assert got["ccld_aggregator_buffered_records"] == 0
    assert got['ccld_aggregator_producer_records_total{outcome="delivered"}'] == 5
    assert got['ccld_aggregator_producer_records_total{outcome="expired"}'] == 2
    assert got['ccld_aggregator_producer_records_total{outcome="dropped"}'] == 1
    assert got["ccld_aggregator_spooled_records"] == 9 and got["ccld_aggregator_spool_bytes"] == 4096
    assert got["ccld_aggregator_spool_max_bytes"] == 1 << 20


def test_ccld_up_hands_each_child_its_own_port_and_keeps_it() -> None:
    p = Pipeline(Settings.load({}, bootstrap="127.0.0.1:1"), metrics_port=9700)
    assert p._child_settings("worker").worker_web_port == 9700
    assert p._child_settings("worker-2").worker_web_port == 9701
    assert p._child_settings("sink").sink_metrics_port == 9702
    assert p._child_settings("alert").alert_metrics_port == 9703
    assert p._child_settings("sink").sink_metrics_port == 9702, "a restarted child keeps its port"
    assert p.metrics_ports == {"worker": 9700, "worker-2": 9701, "sink": 9702, "alert": 9703}
    untouched = Pipeline(Settings.load({}, bootstrap="127.0.0.1:1"))  # metrics_port None: the settings as they are
    assert untouched._child_settings("sink").sink_metrics_port == Settings().sink_metrics_port


def every_family() -> list[Family]:
    """One of each service's families (built from idle services: the names and types are what matter)."""
    metrics, state = worker_metrics()
    state.processor(0)
    s = Settings.load({}, bootstrap="127.0.0.1:1", alert_webhook_url="http://hook",
                      alert_alertmanager_url="http://am:9093")
    return [*metrics.families(), *archiver_families(Archiver(s)), *alert_families(AlertService(s)),
            *aggregator_families(HostAggregator(sink=StatsSink()))]


def test_every_metric_is_documented_with_its_type_and_labels() -> None:
    ops = (ROOT / "docs" / "operations.md").read_text()
    section = ops.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
        r"^\| `(ccld_[a-z_]+)` \| (counter|gauge|histogram) \| ([^|]*) \|", section, flags=re.M)}
    missing, wrong = [], []
    for fam in every_family():
        if fam.name not in rows:
            missing.append(fam.name)
            continue
        kind, labels = rows[fam.name]
        named = set(re.findall(r"`([a-z_]+)`", labels))
        if kind != fam.kind or named != set(fam.labelnames):
            wrong.append(f"{fam.name}: documented {kind} {sorted(named)}, is {fam.kind} {sorted(fam.labelnames)}")
    assert not missing, f"docs/operations.md's Metrics table lacks {missing}"
    assert not wrong, "\n".join(wrong)
    stale = set(rows) - {f.name for f in every_family()}
    assert not stale, f"docs/operations.md documents metrics nothing exposes: {sorted(stale)}"


def test_the_grafana_dashboard_queries_only_metrics_that_exist() -> None:
    dash = json.loads((ROOT / "docs" / "grafana-ccld.json").read_text())
    exprs = [t["expr"] for panel in dash["panels"] for t in panel.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    names: set[str] = set()
    for fam in every_family():
        names.add(fam.name)
        if fam.kind == "histogram":
            names |= {f"{fam.name}_bucket", f"{fam.name}_sum", f"{fam.name}_count"}
    used = {n for e in exprs for n in re.findall(r"\bccld_[a-z_]+", e)}
    assert used - names == set(), f"the dashboard queries metrics nothing exposes: {sorted(used - names)}"
    for needed in ("ccld_worker_lag_seconds", "ccld_worker_records_total", "ccld_worker_verdicts_total",
                   "ccld_worker_open_incidents", "ccld_worker_analysis_seconds_bucket"):
        assert needed in used, f"the dashboard does not show {needed}"
    assert any("histogram_quantile(0.95" in e for e in exprs), "no p95 latency panel"
