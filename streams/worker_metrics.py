"""The worker's Prometheus metrics: its processors' counters as they are, plus the analysis latency histogram.

Nothing is counted twice: each scrape reads every partition processor's ``report()`` (the counters the
``counters {...}`` log line shows) and maps its keys to metric names (``COUNTERS``, ``GAUGES``). The
counters carry on through restarts and rebalances in the snapshots, so a partition's series keeps its
value when another worker takes the partition over (Prometheus sees a new series there, not a reset).
Only the time the processor spends on each message is measured here (``observe_analysis``).

Served at ``/metrics`` on Faust's web server (``worker_web_port``; ``ccld up`` gives each worker one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ccld.metrics import CONTENT_TYPE, Family, Histogram, render
from ccld.streams.lag import LagWatch
from ccld.streams.outbox import VERDICT_COUNTER_PREFIX
from ccld.streams.worker_state import WorkerState

#: Upper bounds (s) of the analysis latency buckets: a message usually takes 0.1-1 ms (``processor.handle``),
#: a large batch or a full evaluation tens of ms; beyond a second the worker cannot keep up.
ANALYSIS_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

#: metric name, the metrics-topic processors' report key, help: counters by metrics partition
COUNTERS = (
    ("ccld_worker_messages_total", "messages",
     "Metrics messages handled (each offset once: re-deliveries are skipped)."),
    ("ccld_worker_records_total", "records", "Kernel records in the metrics messages handled."),
    ("ccld_worker_dead_letters_total", "dead_letters",
     "Messages that went to the dead-letter topic (undecodable or impossible values)."),
    ("ccld_worker_bad_value_messages_total", "bad_value", "Dead letters for impossible values (reason bad-value)."),
    ("ccld_worker_dead_letters_lost_total", "dead_letters_lost",
     "Dead letters the broker refused five times (lost, logged)."),
    ("ccld_worker_caught_up_messages_total", "caught_up_messages",
     "Messages read back because the consumer went past offsets without delivering them."),
    ("ccld_worker_redelivered_skipped_total", "redelivered_skipped",
     "Messages delivered again below the partition's next offset (a resume below the snapshot, a read-back "
     "that got there first): skipped, so every record is analysed once."),
    ("ccld_worker_stuck_reads_total", "stuck_reads",
     "Read-backs of a partition left behind with nothing delivered for 10 ticks while the worker waited "
     "(a consumer past the log's end after the broker restarted empty)."),
    ("ccld_worker_analyzer_errors_total", "analyzer_errors", "Evaluations of a job that raised (logged)."),
    ("ccld_worker_misrouted_rows_total", "misrouted_rows",
     "Rows on a partition their job and communicator group do not map to (analysis_groups differs)."),
    ("ccld_worker_slow_held_starved_total", "slow_held_starved",
     "Slow-communication findings held because the communicator's ranks were waiting for CPUs (a loaded host, "
     "not a link; KernelBatch cpu_wait), one per alarm episode."),
    ("ccld_worker_slow_held_cheap_total", "slow_held_cheap",
     "Slow findings held because the extra time per call (or a late arriver's lateness) was under "
     "slow_min_cost_share of the time between the communicator's calls (a sliver of the job's time) on hosts "
     "contended for CPUs, or also under host_timed_min_extra_s (a time slice) on any host measuring its CPU "
     "stalls; one per alarm episode."),
    ("ccld_worker_upstream_lost_records_total", "upstream_lost_records",
     "ENTERED/DONE records producers and aggregators said they lost on the way (KernelBatch lost_records)."),
    ("ccld_worker_far_clock_records_total", "far_clock_records",
     "Records whose rank clock is more than a day from their message's timestamp (analysed: only durations "
     "on a rank's own clock are used, but the clock is wrong)."),
)
#: metric name, RecoveryWatch.counts key, help: the worker's table recovery unstuck (recovery_watch.py)
RECOVERY = (
    ("ccld_worker_recovery_rearms_total", "rearms",
     "Changelog partitions the table recovery waited on 10 s with nothing delivered, re-armed (resumed, sought "
     "again)."),
    ("ccld_worker_recovery_phantom_offsets_total", "phantom_offsets",
     "Changelog offsets the recovery waited for that the log does not hold (a wrong high watermark), read to "
     "make sure and given up."),
    ("ccld_worker_recovery_undelivered_total", "undelivered",
     "Times the changelog held messages the recovery waited 20 s for and the consumer had not delivered "
     "(logged with the consumer's fetch state, re-armed again)."),
)
#: the same for gauges
GAUGES = (
    ("ccld_worker_unread_messages", "unread_messages",
     "Messages between the partition's next offset and the broker's high watermark (the embedded broker "
     "reports a watermark a batch short)."),
    ("ccld_worker_jobs", "jobs", "Jobs with an analyzer on the partition."),
)
#: summed over every processor of the worker (metrics partitions and, in shard mode, the job stage's)
TOTALS = (
    ("ccld_worker_duplicate_verdicts_total", "counter", "duplicate_verdicts",
     "Verdicts found again and dropped (already pending or sent)."),
    ("ccld_worker_verdict_send_failures_total", "counter", "verdict_send_failures",
     "Rounds in which sending a pending verdict failed (it stays pending)."),
    ("ccld_worker_pending_verdicts", "gauge", "pending_verdicts",
     "Verdicts found and not yet acknowledged by the broker."),
    ("ccld_worker_open_incidents", "gauge", "open_incidents", "Incidents open now (not resolved)."),
)


class WorkerMetrics:
    """Collects the worker's metrics from its states when scraped; times each message's analysis."""

    def __init__(self, states: Sequence[WorkerState[Any]], lag: LagWatch,
                 recovery: Mapping[str, int] | None = None) -> None:
        self.states = states  # the metrics topic's first; the job stage's in shard mode
        self.lag = lag
        self.recovery = recovery if recovery is not None else {}  # RecoveryWatch.counts
        self.analysis = Histogram("ccld_worker_analysis_seconds",
                                  "Time the partition processor spent on one metrics message (decode, checks, "
                                  "analysis, evaluation when due).", ANALYSIS_BUCKETS_S)

    def observe_analysis(self, seconds: float) -> None:
        self.analysis.observe(seconds)

    def families(self) -> list[Family]:
        metrics = self.states[0]
        reports = {p: proc.report() for p, proc in sorted(metrics.processors.items())}
        out: list[Family] = []
        for name, key, text in COUNTERS:
            fam = Family(name, "counter", text, ("partition",))
            for p, rep in reports.items():
                fam.add(rep.get(key, 0), partition=p)
            out.append(fam)
        lag = Family("ccld_worker_lag_seconds", "gauge",
                     "How much later than usual the partition's latest messages were read (0 when none "
                     "arrived in the last 2 s).", ("partition",))
        snap = Family("ccld_worker_snapshot_bytes", "gauge",
                      "Size of the partition's state snapshot on the changelog (compressed; its head and every "
                      "job's part).", ("partition",))
        for p, rep in reports.items():
            lag.add(rep.get("lag_ms", 0) / 1000.0, partition=p)
            snap.add(metrics.snapshot_bytes(p), partition=p)
        same = Family("ccld_worker_snapshots_unchanged_total", "counter",
                      "Snapshots of the partition not written because the broker already had that one (an "
                      "idle partition adds nothing to the changelog).", ("partition",))
        big = Family("ccld_worker_snapshots_too_large_total", "counter",
                     "Snapshots of the partition not written for being over worker_snapshot_max_bytes (its offsets "
                     "stay uncommitted until one fits; verdicts still go out).", ("partition",))
        for p in reports:
            same.add(metrics.unchanged.get(p, 0), partition=p)
            big.add(metrics.too_large.get(p, 0), partition=p)
        out += [lag, snap, same, big]
        for name, key, text in GAUGES:
            fam = Family(name, "gauge", text, ("partition",))
            for p, rep in reports.items():
                fam.add(rep.get(key, 0), partition=p)
            out.append(fam)
        out.append(Family("ccld_worker_partitions", "gauge", "Metrics partitions this worker owns now.")
                   .add(len(reports)))
        out.append(Family("ccld_worker_behind", "gauge",
                          "1 while the worker is behind its partitions (silence does not count towards hangs "
                          "then), else 0.").add(0 if self.lag.caught_up else 1))
        everything = [proc.report() for st in self.states for proc in list(st.processors.values())]
        verdicts = Family("ccld_worker_verdicts_total", "counter",
                          "Verdicts the broker acknowledged, by anomaly class and incident state.", ("kind", "state"))
        for rep in everything:
            for key, n in rep.items():
                if key.startswith(VERDICT_COUNTER_PREFIX):
                    kind, _, state = key[len(VERDICT_COUNTER_PREFIX):].partition(":")
                    verdicts.add(n, kind=kind, state=state)
        out.append(verdicts)
        for name, kind, key, text in TOTALS:
            out.append(Family(name, "counter" if kind == "counter" else "gauge", text)
                       .add(sum(rep.get(key, 0) for rep in everything)))
        for name, key, text in RECOVERY:
            out.append(Family(name, "counter", text).add(self.recovery.get(key, 0)))
        out.append(self.analysis.family())
        return out

    def render(self) -> str:
        return render(self.families())

    def serve(self, app: Any) -> None:
        """Add ``/metrics`` to the Faust app's web server."""

        async def metrics_page(view: Any, request: Any) -> Any:
            return view.bytes(self.render().encode(), headers={"Content-Type": CONTENT_TYPE})

        app.page("/metrics", name="ccld-metrics")(metrics_page)
