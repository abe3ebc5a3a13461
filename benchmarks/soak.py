"""A day of jobs through ``ccld up``, time compressed: does anything grow without bound, is every fault named?

``ccld up``'s own pipeline (``stack.up.Pipeline``: the embedded broker, a worker, the sink, and the alert bridge
delivering to a webhook this script serves) runs here, supervised as ``ccld up`` does (a dead child restarted, the
broker renewed past ``--renew-mb`` when nothing is in flight).
``--jobs`` simulated jobs of 8 to 256 ranks (random 3D layouts, 30-60 s each, an H1 or S1 on a random rank in
every third) run in real time through the real producer, stamped at the wall clock as live jobs are: in waves of
``--wave`` jobs started ``--gap-s`` apart (about 20 at once), and ``--idle-s`` with no job between waves (the quiet
moments a renewal of the broker needs). Every ``--sample-s``
the resident memory of broker, worker, sink and alert bridge, the metrics, verdicts and state-log topics' sizes, and the
archive's files and bytes are sampled. At the end: the sink's compaction (``ccld archive compact``), the
README's two DuckDB queries, the worker killed as the last jobs end and restarted (the time until it has read its
state back), every job's verdicts from the archive, judged as ``ccld bench accuracy`` judges (``stack.bench``),
and whether the webhook got every one of them (a renewal of the broker must not drop an alert).

The analyzer forgets a job ``--expiry-s`` after its end (an hour in production; compressed like the day).

    python benchmarks/soak.py [--jobs 1000] [--wave 100] [--gap-s 2.0] [--idle-s 90] [--renew-mb 128] [--out F.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

RANKS = (8, 8, 16, 16, 32, 32, 64, 64, 128, 256)
#: what Faust's worker logs once its tables are read back from their changelogs
READY = "Worker ready"


def scenarios(n: int, seed: int) -> list[dict[str, Any]]:
    """The day's jobs: random sizes and 3D layouts, a fault on a random rank in every third."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ranks = int(rng.choice(RANKS))
        tp = int(rng.choice([t for t in (1, 2, 4, 8) if ranks % t == 0 and ranks // t >= 2]))
        pp = int(rng.choice([p for p in (1, 2, 4) if (ranks // tp) % p == 0]))
        duration = float(rng.choice([30.0, 45.0, 60.0]))
        sc: dict[str, Any] = {"id": f"soak-{seed}-{i:05d}", "seed": seed * 100_000 + i, "ranks": ranks,
                              "layout": {"tp": tp, "pp": pp, "dp": ranks // tp // pp}, "channels": 2,
                              "step_time_s": 1.0, "duration_s": duration, "faults": [], "expect": []}
        if i % 3 == 2:
            kind, rank = str(rng.choice(["H1", "S1"])), int(rng.integers(ranks))
            # a hang needs 20 s of stall before it is a verdict: early enough to be named before the job's end
            onset = duration / 6 if kind == "H1" else duration / 3
            fault: dict[str, Any] = {"kind": kind, "rank": rank, "onset_s": round(onset, 1)}
            if kind == "S1":
                fault["factor"] = 3.0
            sc["faults"], sc["expect"] = [fault], [{"kind": kind, "rank": rank}]
        out.append(sc)
    return out


def topic_size(settings: Any, topic: str) -> int:
    """Messages a topic holds: the sum of its partitions' end offsets (``renew.log_end``: the embedded broker's
    high watermarks are a batch short)."""
    from confluent_kafka import Consumer

    from ccld.security import kafka_config
    from ccld.stack.renew import log_end

    c = Consumer(kafka_config(settings, **{"group.id": "ccld-soak-sizes", "enable.auto.commit": False}))
    try:
        meta = c.list_topics(topic, timeout=5).topics.get(topic)
        if meta is None or meta.error is not None:
            return 0
        return sum(log_end(c, topic, p) for p in meta.partitions)
    finally:
        c.close()


def archive_files(root: Path) -> tuple[int, int]:
    """Parquet files under ``root`` and their bytes; a file the sink's compaction removes while they are counted
    is left out (a sample that raised on it ended the sampler: the first run's samples stopped at 19 minutes)."""
    n = size = 0
    for p in root.rglob("*.parquet"):
        try:
            size += p.stat().st_size
        except FileNotFoundError:
            continue
        n += 1
    return n, size


class Soak:
    """The pipeline, its supervision thread and its sampler."""

    def __init__(self, args: argparse.Namespace) -> None:
        from ccld.settings import Settings
        from ccld.stack.alertmanager import LocalWebhook

        self.args = args
        tag = f"{int(time.time())}-{os.getpid()}"
        self.root = Path(tempfile.mkdtemp(prefix="ccld-soak-"))
        self.archive = self.root / "archive"
        self.webhook = LocalWebhook()  # the alert bridge's receiver
        env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_")}
        env.update({"CCLD_TOPIC_PREFIX": f"soak-{tag}.", "CCLD_WORKER_APP_ID": f"soak-{tag}",
                    "CCLD_SINK_GROUP": f"soak-sink-{tag}", "CCLD_ARCHIVE_DIR": str(self.archive),
                    "CCLD_ANALYZER_JOB_EXPIRY_S": str(args.expiry_s), "CCLD_UP_BROKER_RENEW_MB": str(args.renew_mb),
                    "CCLD_UP_RENEW_QUIET_S": str(args.quiet_s), "CCLD_SINK_COMPACT_EVERY_S": str(args.compact_s),
                    "CCLD_ALERT_WEBHOOK_URL": self.webhook.url, "CCLD_ALERT_GROUP": f"soak-alert-{tag}"})
        self.settings = Settings.load(env)
        self.samples: list[dict[str, Any]] = []
        self.events: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self.t0 = time.monotonic()

    def start(self) -> None:
        from ccld.stack.up import Pipeline

        self.pipeline = Pipeline(self.settings, log_dir=self.root / "logs", metrics_port=0).start()
        self.settings = self.pipeline.settings
        threading.Thread(target=self._supervise, daemon=True).start()
        threading.Thread(target=self._sample, daemon=True).start()

    def _supervise(self) -> None:
        while not self._stop.is_set():
            for line in self.pipeline.supervise():
                self.events.append((time.monotonic() - self.t0, line))
                print(f"\n  ccld up: {line}", file=sys.stderr, flush=True)
            self._stop.wait(0.5)

    def pids(self) -> dict[str, int | None]:
        kids = {name: p.pid if p.poll() is None else None for name, p in self.pipeline.children.items()}
        return {"broker": self.pipeline.broker.pid if self.pipeline.broker else None, **kids}

    def sample(self) -> dict[str, Any]:
        s = self.settings
        files, size = archive_files(self.archive)
        from ccld.stack.renew import metric_sums, rss_mb

        row: dict[str, Any] = {"t_s": round(time.monotonic() - self.t0, 1),
                               **{f"{k}_mb": round(rss_mb(pid or 0), 1) for k, pid in self.pids().items()},
                               "archive_files": files, "archive_mb": round(size / 1e6, 2),
                               "renewals": self.pipeline.renewals}
        sizes: dict[str, Any] = {}

        def measure() -> None:
            try:
                sizes.update({"metrics_msgs": topic_size(s, s.metrics_topic),
                              "verdicts_msgs": topic_size(s, s.verdicts_topic),
                              "state_msgs": topic_size(s, f"{s.worker_app_id}-analyzer-state-changelog")})
            except Exception as exc:  # noqa: BLE001 - a broker being renewed: the sample goes without sizes
                sizes["sizes_error"] = type(exc).__name__

        # in a thread of its own: a client of a broker that is being renewed can block past its timeouts
        t = threading.Thread(target=measure, daemon=True)
        t.start()
        t.join(20.0)
        row.update(dict(sizes) if not t.is_alive() else {"sizes_error": "timeout"})
        try:  # how far behind the worker reads, and what it holds open
            m = metric_sums(self.pipeline.metrics_urls()["worker"],
                            ("ccld_worker_unread_messages", "ccld_worker_open_incidents"))
            row.update({"worker_unread": m["ccld_worker_unread_messages"],
                        "open_incidents": m["ccld_worker_open_incidents"]})
        except (OSError, KeyError, ValueError):  # a worker being restarted
            pass
        return row

    def _sample(self) -> None:
        while not self._stop.wait(self.args.sample_s):
            try:
                self.samples.append(self.sample())
            except Exception as exc:  # noqa: BLE001 - one failed sample must not end the sampling
                print(f"\n  sample failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        self._stop.set()
        self.pipeline.stop()
        self.webhook.close()


def schedule(scs: list[Any], wave: int, gap_s: float, idle_s: float) -> list[float]:
    """Each job's start (s from the run's start): a wave's jobs ``gap_s`` apart, the next wave ``idle_s`` after the
    last job of the one before has ended (the quiet moments a renewal needs)."""
    starts: list[float] = []
    t = 0.0
    for w in range(0, len(scs), wave):
        ends = []
        for sc in scs[w:w + wave]:
            starts.append(t)
            ends.append(t + sc.duration_s)
            t += gap_s
        t = max(ends) + idle_s
    return starts


def _timeline(scs: list[Any], starts: list[float]) -> Any:
    """Every job's batches in the order they are sent: (time from the run's start, job index, batch). A job is
    simulated only once its start is due, so only the jobs running at once are held in memory."""
    from ccld.producers.simulator.sim import simulate

    order = sorted(range(len(scs)), key=lambda i: starts[i])
    heap: list[tuple[float, int, int, Any, Any]] = []  # (when, tie-break, job, batch, the job's other batches)
    k = seq = 0

    def push(i: int, gen: Any) -> None:
        nonlocal seq
        nxt = next(gen, None)
        if nxt is not None:
            heapq.heappush(heap, (starts[i] + nxt[0], seq, i, nxt[1], gen))
            seq += 1

    while k < len(order) or heap:
        while k < len(order) and (not heap or starts[order[k]] <= heap[0][0]):
            push(order[k], iter(simulate(scs[order[k]], job=scs[order[k]].id)))
            k += 1
        ts, _, i, batch, gen = heapq.heappop(heap)
        yield ts, i, batch
        push(i, gen)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ccld.producers.kafka import MetricsProducer
    from ccld.producers.simulator.publish import clock_offset_ns, shifted
    from ccld.producers.simulator.scenario import Scenario
    from ccld.sinks.report_model import archived_verdicts
    from ccld.stack import bench

    scs = [Scenario.from_dict(d) for d in scenarios(args.jobs, args.seed)]
    starts = schedule(scs, args.wave, args.gap_s, args.idle_s)
    soak = Soak(args)
    soak.start()
    epoch0 = time.time()  # the run's start: job i starts at epoch0 + starts[i], as a live job does
    records = behind_max = 0.0
    restart_s = None
    try:
        producer = MetricsProducer(soak.settings, producer_id="ccld-soak")
        wall0, said = time.monotonic(), 0.0
        for ts, i, batch in _timeline(scs, starts):
            wait = wall0 + ts - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            behind_max = max(behind_max, -wait)
            producer.send_batch(shifted(batch, clock_offset_ns(epoch0 + starts[i])),
                                timestamp_ms=int((epoch0 + ts) * 1000))
            records += batch.n
            if ts - said >= 30.0:
                said = ts
                last = soak.samples[-1] if soak.samples else {}
                began = sum(st <= ts for st in starts)
                print(f"\r{ts:.0f} s: {began}/{len(scs)} jobs started, {records / 1e6:.1f} M records, worker "
                      f"{last.get('worker_unread', 0):.0f} messages behind; broker "
                      f"{last.get('broker_mb', 0):.0f} MB, worker {last.get('worker_mb', 0):.0f} MB, sink "
                      f"{last.get('sink_mb', 0):.0f} MB, archive {last.get('archive_files', 0)} files, renewals "
                      f"{soak.pipeline.renewals}   ", end="", file=sys.stderr, flush=True)
        producer.close()
        print(file=sys.stderr)
        # the worker killed as the last jobs end, with every job since the broker's last renewal on its state log,
        # and restarted by the supervisor: until Faust has read its state back ("Worker ready")
        log_path = soak.root / "logs" / "worker.log"
        readies = log_path.read_text(errors="replace").count(READY)
        os.kill(soak.pipeline.children["worker"].pid, signal.SIGKILL)
        killed = time.monotonic()
        while time.monotonic() - killed < 300:
            if log_path.read_text(errors="replace").count(READY) > readies:
                restart_s = time.monotonic() - killed
                break
            time.sleep(0.2)
        time.sleep(args.settle_s)  # the silence after the last jobs' ends: their incidents close, rows archived
        end_sample = soak.sample()
    finally:
        soak.stop()
    # the archive after the run: compaction, the README's queries, every job's verdicts
    from ccld.sinks.compact import compact

    files_before = archive_files(soak.archive)[0]
    compact(soak.archive)
    files_after, size_after = archive_files(soak.archive)
    queries = time_queries(soak.archive, soak.settings, scs, args.repeat)
    verdicts: dict[str, list[Any]] = {}
    epochs = {sc.id: epoch0 + st for sc, st in zip(scs, starts, strict=True)}
    archived: set[tuple[str, str]] = set()
    for v in archived_verdicts(soak.archive, soak.settings.verdicts_topic):
        archived.add((v.incident_id, v.state.value))
        off = epochs.get(v.job, 0.0)
        verdicts.setdefault(v.job, []).append(dataclasses.replace(v, onset_time=v.onset_time - off,
                                                                  detected_time=v.detected_time - off))
    report = bench.score(scs, verdicts)
    rss = {k: [s[f"{k}_mb"] for s in soak.samples if s.get(f"{k}_mb")] for k in ("broker", "worker", "sink", "alert")}
    posted = {(str(b.get("incident_id")), str(b.get("state"))) for b in soak.webhook.taken}
    return {
        "jobs": len(scs), "faulty": sum(bool(sc.faults) for sc in scs), "records": int(records),
        "job_time_s": round(max(st + sc.duration_s for sc, st in zip(scs, starts, strict=True)), 1),
        "send_behind_max_s": round(behind_max, 2),
        "wall_s": round(time.monotonic() - soak.t0, 1), "renewals": soak.pipeline.renewals,
        "events": soak.events, "samples": soak.samples, "end": end_sample,
        "rss_mb": {k: {"first": v[0] if v else None, "max": max(v, default=None), "end": end_sample.get(f"{k}_mb"),
                       "median": statistics.median(v) if v else None} for k, v in rss.items()},
        "archive": {"files_before_compact": files_before, "files_after_compact": files_after,
                    "mb": round(size_after / 1e6, 1), "days": len({p.name for p in soak.archive.rglob("date=*")})},
        "queries_s": queries, "worker_restart_s": restart_s,
        # every archived verdict (incident, state) the webhook got, and any it got twice (at-least-once)
        "alerts": {"archived": len(archived), "delivered": len(archived & posted), "posts": len(soak.webhook.taken),
                   "not_delivered": sorted(archived - posted)[:20]},
        "accuracy": {k: report["overall"][k] for k in ("ok", "incidents", "precision", "recall", "rank_accuracy",
                                                         "class_accuracy", "false_alarms", "after_end",
                                                         "hang_ttv_p95_s", "slow_ttv_p95_s")},
        "missed": [{"id": r["id"], "expected": r["expected"], "verdicts": [(v["kind"], v["root_cause_ranks"])
                                                                         for v in r["verdicts"]]}
                   for r in report["scenarios"] if not r["ok"]],
        "root": str(soak.root),
    }


def time_queries(root: Path, settings: Any, scs: list[Any], repeat: int) -> dict[str, float]:
    """The README's two queries on a faulty job of the day: medians of ``repeat`` (s)."""
    import datetime as dt

    import duckdb

    job = next(sc.id for sc in scs if sc.faults)
    day = dt.datetime.now(dt.UTC).date().isoformat()
    qs = {"one job's verdicts": (
              f"SELECT detected_ts, state, kind, root_cause_ranks, evidence FROM read_parquet("
              f"'{root}/topic={settings.verdicts_topic}/*/*/*.parquet', hive_partitioning = true) "
              f"WHERE job = '{job}' ORDER BY detected_ts"),
          "rank 3's collectives on one day": (
              f"SELECT t_enter_ts, communicator, op_seq, op_type, (t_exit_ns - t_enter_ns) / 1e6 AS duration_ms "
              f"FROM read_parquet('{root}/topic={settings.metrics_topic}/job={job}/*/*.parquet', "
              f"hive_partitioning = true) WHERE date = DATE '{day}' AND rank = 3 AND status = 'DONE' "
              f"ORDER BY t_enter_ts")}
    out = {}
    for name, q in qs.items():
        times = []
        for _ in range(repeat):
            con = duckdb.connect()
            began = time.perf_counter()
            con.execute(q).fetchall()
            times.append(time.perf_counter() - began)
            con.close()
        out[name] = round(statistics.median(times), 4)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--wave", type=int, default=100, help="jobs per wave")
    ap.add_argument("--gap-s", type=float, default=2.0, help="a wave's jobs start this far apart (s)")
    ap.add_argument("--idle-s", type=float, default=90.0,
                    help="no job runs for this long between waves (an incident closes 60 s after its job's end)")
    ap.add_argument("--settle-s", type=float, default=120.0, help="after the last job's end, before the end checks")
    ap.add_argument("--expiry-s", type=float, default=60.0, help="the analyzer forgets a job this long after its end")
    ap.add_argument("--renew-mb", type=float, default=128.0, help="ccld up renews its broker past this (MB)")
    ap.add_argument("--quiet-s", type=float, default=10.0, help="... once nothing has arrived for this long")
    ap.add_argument("--compact-s", type=float, default=120.0, help="the sink compacts its archive this often")
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5, help="runs of each query (median)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    res = run(args)
    text = json.dumps(res, indent=2, default=str)
    summary = {k: v for k, v in res.items() if k not in ("samples", "events")}
    print(json.dumps(summary, indent=2, default=str))
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
