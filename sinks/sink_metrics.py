"""Prometheus metrics of the Parquet sink and the alert bridge, mapped from the counters they keep anyway.

Each function reads a running service from the metrics server's thread (``ccld.metrics_http``):
the counters are copied (``dict()`` of a dict is one step under the GIL), never counted here.
"""

from __future__ import annotations

import time

from ccld.metrics import Family
from ccld.sinks.alerts import AlertService
from ccld.sinks.archiver import Archiver
from ccld.sinks.fleet import HostStanding

#: metric name, the archiver's counter, help
SINK_COUNTERS = (
    ("ccld_sink_messages_total", "messages", "Messages consumed from the metrics and verdicts topics."),
    ("ccld_sink_rows_total", "rows", "Rows written to Parquet files (kernel records and verdicts)."),
    ("ccld_sink_files_total", "files", "Parquet files written (each renamed into place complete)."),
    ("ccld_sink_write_failures_total", "write_failures",
     "Attempts to write a file that failed (archive folder full or read-only; retried, nothing committed)."),
    ("ccld_sink_commit_errors_total", "commit_errors", "Offset commits that failed (the files are written)."),
    ("ccld_sink_offset_resets_total", "offset_resets",
     "Times a partition's offsets went back without a rebalance (the topic was recreated)."),
    ("ccld_sink_compactions_total", "compactions", "Archive compactions the sink's timer ran."),
    ("ccld_sink_compacted_files_total", "compacted_files", "Files fewer in the archive after its compactions."),
    ("ccld_sink_compact_errors_total", "compact_errors", "Folders or compactions that failed (tried again later)."),
    ("ccld_sink_pruned_folders_total", "pruned_folders",
     "Day folders (one topic and job each) removed past archive_retention_days."),
)


def archiver_families(arch: Archiver) -> list[Family]:
    c = dict(arch.counters)
    out = [Family(name, "counter", text).add(c.get(key, 0)) for name, key, text in SINK_COUNTERS]
    out.append(Family("ccld_sink_skipped_messages_total", "counter",
                      "Messages not archived: undecodable, or records with impossible values.", ("reason",))
               .add(c.get("undecodable", 0), reason="undecodable").add(c.get("bad_value", 0), reason="bad_value"))
    waiting, age_s = arch.uncommitted()
    out.append(Family("ccld_sink_uncommitted_messages", "gauge",
                      "Messages consumed whose offsets are not committed yet (buffered for a file).").add(waiting))
    out.append(Family("ccld_sink_commit_lag_seconds", "gauge",
                      "How long the oldest uncommitted message has waited for its file and commit (0: none).")
               .add(round(age_s, 3)))
    out.append(Family("ccld_sink_archive_blocked", "gauge",
                      "1 while the archive folder cannot be written (fetching paused, retried every 5 s).")
               .add(1 if arch.blocked else 0))
    out += host_families(list(arch.hosts))
    return out


#: metric name, the alert service's counter, help
ALERT_COUNTERS = (
    ("ccld_alert_messages_total", "messages", "Messages consumed from the verdicts topic (replays included)."),
    ("ccld_alert_verdicts_total", "verdicts", "New verdicts taken for delivery (repeats and replays excluded)."),
    ("ccld_alert_duplicates_total", "duplicates", "Verdicts dropped as repeats (same dedupe key)."),
    ("ccld_alert_undecodable_total", "undecodable", "Messages on the verdicts topic that could not be decoded."),
    ("ccld_alert_stale_total", "stale", "Verdicts of incidents that had already ended (not sent)."),
    ("ccld_alert_replayed_total", "replayed",
     "Verdicts below the committed offset re-read at an assignment to rebuild the open incidents."),
    ("ccld_alert_reposts_total", "reposts", "Open incidents re-posted to Alertmanager (keeps their alerts firing)."),
    ("ccld_alert_repost_failures_total", "repost_failures", "Re-posts to Alertmanager that failed."),
    ("ccld_alert_pauses_total", "pauses", "Times consuming paused because the backlog was full."),
    ("ccld_alert_commit_errors_total", "commit_errors", "Offset commits that failed (delivered already)."),
    ("ccld_alert_kafka_errors_total", "kafka_errors", "Errors librdkafka reported (logged one line per condition)."),
)
#: per receiver: metric name, counter prefix (``<prefix>_<receiver>``), help
ALERT_BY_RECEIVER = (
    ("ccld_alert_delivered_total", "delivered", "Verdicts a receiver took (2xx)."),
    ("ccld_alert_failures_total", "failures", "Failed delivery attempts (retried with backoff until taken)."),
    ("ccld_alert_rejected_total", "rejected", "Verdicts a receiver refused for good (400, 413, 422; skipped)."),
)


def alert_families(service: AlertService) -> list[Family]:
    c = dict(service.counters)
    out = [Family(name, "counter", text).add(c.get(key, 0)) for name, key, text in ALERT_COUNTERS]
    for name, prefix, text in ALERT_BY_RECEIVER:
        fam = Family(name, "counter", text, ("receiver",))
        for r in service.receivers:
            fam.add(c.get(f"{prefix}_{r.name}", 0), receiver=r.name)
        out.append(fam)
    out.append(Family("ccld_alert_backlog", "gauge",
                      "Verdicts consumed and not yet taken by every receiver (consuming pauses at "
                      "alert_backlog_max).").add(len(service.backlog)))
    out.append(Family("ccld_alert_open_incidents", "gauge", "Open incidents the bridge keeps firing.")
               .add(len(service.table.open)))
    now = time.monotonic()
    failing = Family("ccld_alert_receiver_failing_seconds", "gauge",
                     "How long a receiver has been failing (0: it takes alerts).", ("receiver",))
    for r in service.receivers:
        since = r.failing_since
        failing.add(0.0 if since is None else round(now - since, 3), receiver=r.name)
    out.append(failing)
    out += host_families(list(service.hosts))
    return out


def host_families(hosts: list[HostStanding]) -> list[Family]:
    """The fleet tracker's standings (``sinks.fleet``): each host root cause of an incident in the window."""
    score = Family("ccld_host_suspect_score", "gauge", "A host's fleet score: its root-cause incidents in the "
                   "window, each counting 1 halved every fleet_half_life_h (split among the hosts it names).",
                   ("host",))
    cand = Family("ccld_host_drain_candidate", "gauge", "1 for a drain candidate: root cause in fleet_min_incidents "
                  "incidents of fleet_min_jobs jobs within fleet_window_days.", ("host",))
    incidents = Family("ccld_host_incidents", "gauge", "Incidents a host was root cause of within the window.",
                       ("host",))
    for h in hosts:
        score.add(round(h.score, 4), host=h.host)
        cand.add(1 if h.candidate else 0, host=h.host)
        incidents.add(h.incidents, host=h.host)
    return [score, cand, incidents]
