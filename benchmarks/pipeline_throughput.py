"""Kernel records/s through the Faust worker next to raw confluent-kafka consume-and-decode, same run.

Usage: python benchmarks/pipeline_throughput.py [--ranks 1024] [--seconds 120] [--messages rank]
       [--repeat 3] [--out RESULT.json] [--metrics-cost [--scrape-interval-s 1]]

The workload is a real job's, as the producers send it: the Megatron-style job of
``realtime_scale.py`` (about 300 collectives/s per rank, tp 8 x pp 4 x dp R/32, the bounded
record format), grouped into messages by ``realtime_scale.regroup`` (``--messages rank``, the
default: one message per rank and delivery second holding all of its communicators, as ranks
send without ``ccld run``'s aggregator; ``host`` one per host and second, as the aggregator sends;
``rank-comm`` and ``comm`` as there; ``linger`` the old workload: the simulator's default job
re-batched per communicator into messages of about ``--batch`` records, which no producer sends).
Published once to the embedded broker,
then read (1) by a plain confluent-kafka consumer that decodes every message into columns, and
(2) by a real ``ccld worker`` process (decode, analyze, verdicts), timed from "Worker ready" until
its committed offsets reach the end. Medians over ``--repeat`` runs are printed with the ratio.

``--metrics-cost``: what the worker's ``/metrics`` endpoint costs it. The records are published once;
then ``--repeat`` pairs of worker runs (each a fresh app id, reading the same records from the start),
both with the web server on (``worker_web_port``), one with nothing scraping it and one with a
scraper GETting ``/metrics`` every ``--scrape-interval-s`` (1 s: the worst case; Prometheus' usual
15 s costs less). The order inside a pair alternates, so drift in the machine's load falls on both.
Printed: records/s medians of both and the median of the per-pair ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from ccld.producers.kafka import MetricsProducer
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import KernelBatch
from ccld.schemas.codec import decode_metrics
from ccld.settings import Settings
from ccld.stack.broker import EmbeddedBroker, free_port
from ccld.stack.up import child_env
from ccld.topics import ensure_topics


def make_batches(ranks: int, seconds: float, messages: str, batch: int) -> list[tuple[float, KernelBatch]]:
    if messages != "linger":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from realtime_scale import job_scenario, regroup  # the real job's load, grouped as producers send it

        return list(regroup(simulate(job_scenario(ranks, seconds)), messages))
    return linger_batches(ranks, seconds, batch)


def linger_batches(ranks: int, seconds: float, batch: int) -> list[tuple[float, KernelBatch]]:
    sc = Scenario.from_dict({"id": "throughput", "seed": 1, "ranks": ranks, "duration_s": seconds, "channels": 8,
                             "layout": {"tp": 8, "pp": 4, "dp": max(ranks // 32, 1)}})
    pending: dict[int, list[KernelBatch]] = defaultdict(list)
    out: list[tuple[float, KernelBatch]] = []
    for t, b in simulate(sc):
        group = pending[b.comm_hash]
        group.append(b)
        if sum(x.n for x in group) >= batch:
            out.append((t, KernelBatch.concat(group, producer="bench", batch_seq=len(out))))
            group.clear()
    for group in pending.values():
        if group:
            out.append((seconds, KernelBatch.concat(group, producer="bench", batch_seq=len(out))))
    return out


def publish(settings: Settings, batches: list[tuple[float, KernelBatch]]) -> dict[int, int]:
    """Produce everything; returns the number of messages per partition."""
    per_part: dict[int, int] = defaultdict(int)
    with MetricsProducer(settings, background=False) as p:
        from ccld.records import job_partition

        for t, b in batches:
            p.send_batch(b, timestamp_ms=int(t * 1000))
            per_part[job_partition(b.job, settings.metrics_partitions)] += 1
        if p.flush(60):
            raise SystemExit("could not deliver the benchmark's messages")
    return dict(per_part)


def raw_rate(settings: Settings, per_part: dict[int, int]) -> tuple[float, int]:
    c = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"raw-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "fetch.max.bytes": 64 << 20,
                  "max.partition.fetch.bytes": 16 << 20})  # the same per-partition fetch size as the worker
    c.assign([TopicPartition(settings.metrics_topic, p, OFFSET_BEGINNING) for p in per_part])
    want, got, records = sum(per_part.values()), 0, 0
    t0 = None
    while got < want:
        for msg in c.consume(500, timeout=1.0):
            if msg.error():
                continue
            if t0 is None:
                t0 = time.perf_counter()
            records += decode_metrics(msg.value() or b"").n
            got += 1
    elapsed = time.perf_counter() - (t0 or time.perf_counter())
    c.close()
    return records / max(elapsed, 1e-9), records


class Scraper:
    """A thread that GETs ``url`` every ``interval_s`` until stopped, counting answers and failures."""

    def __init__(self, url: str, interval_s: float) -> None:
        self.url, self.interval_s = url, interval_s
        self.ok = self.failed = 0
        self.seconds: list[float] = []  # each answered GET, request to last byte
        self.bytes = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            try:
                t0 = time.perf_counter()
                with urllib.request.urlopen(self.url, timeout=5) as resp:
                    self.bytes = len(resp.read())
                self.seconds.append(time.perf_counter() - t0)
                self.ok += 1
            except OSError:
                self.failed += 1

    def __enter__(self) -> Scraper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(10)


def worker_rate(settings: Settings, per_part: dict[int, int], records: int, log: Path,
                scrape_s: float = 0.0, scrapes: list[Scraper] | None = None) -> float:
    """Records/s of a real worker from "Worker ready" until its commits reach the end; ``scrape_s`` > 0:
    its ``/metrics`` is scraped that often meanwhile (``settings.worker_web_port`` must be set)."""
    app_id = f"bench-{uuid.uuid4().hex[:8]}"
    s = settings.replace(worker_app_id=app_id, worker_commit_interval_s=0.2, log_level="INFO")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "ccld.cli", "worker"], env=child_env(s), stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        while b"Worker ready" not in log.read_bytes():
            if proc.poll() is not None:
                raise SystemExit(f"worker died:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
        scraper = Scraper(f"http://127.0.0.1:{s.worker_web_port}/metrics", scrape_s) if scrape_s > 0 else None
        t0 = time.perf_counter()
        if scraper:
            scraper.__enter__()
        c = Consumer({"bootstrap.servers": s.bootstrap, "group.id": app_id, "enable.auto.commit": False})
        parts = [TopicPartition(s.metrics_topic, p) for p in per_part]
        while True:
            done = {tp.partition: tp.offset for tp in c.committed(parts, timeout=5)}
            if all(done.get(p, -1) >= n for p, n in per_part.items()):
                break
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
        c.close()
        if scraper:
            scraper.__exit__()
            if scraper.ok == 0 or scraper.failed:
                raise SystemExit(f"scraping {scraper.url}: {scraper.ok} answered, {scraper.failed} failed")
            if scrapes is not None:
                scrapes.append(scraper)
        return records / elapsed
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--messages", choices=["rank", "rank-comm", "comm", "host", "linger"], default="rank",
                    help="how records are grouped into messages (see the module docstring)")
    ap.add_argument("--batch", type=int, default=1000, help="--messages linger: records per message")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--metrics-cost", action="store_true",
                    help="the worker with and without a /metrics scraper instead (see the module docstring)")
    ap.add_argument("--scrape-interval-s", type=float, default=1.0)
    args = ap.parse_args()

    batches = make_batches(args.ranks, args.seconds, args.messages, args.batch)
    n_records = sum(b.n for _, b in batches)
    print(f"{len(batches)} messages, {n_records:,} kernel records "
          f"({n_records / len(batches):.0f} per message), {args.ranks} ranks, {args.seconds:.0f} s simulated")
    if args.metrics_cost:
        return metrics_cost(args, batches, n_records)
    raws, workers = [], []
    with EmbeddedBroker(0) as broker:
        for i in range(args.repeat):
            s = Settings.load({}, bootstrap=broker.bootstrap, topic_prefix=f"bench{i}-{uuid.uuid4().hex[:4]}.",
                              metrics_partitions=1)
            ensure_topics(s)
            per_part = publish(s, batches)
            raw, got = raw_rate(s, per_part)
            if got != n_records:
                raise SystemExit(f"raw consumer read {got} records, {n_records} were produced")
            w = worker_rate(s, per_part, n_records, Path(f"/tmp/ccld-bench-worker-{i}.log"))
            raws.append(raw)
            workers.append(w)
            print(f"run {i + 1}: raw consume+decode {raw:,.0f} records/s; worker {w:,.0f} records/s "
                  f"({w / raw:.0%} of raw)", flush=True)
    raw_m, w_m = statistics.median(raws), statistics.median(workers)
    result = {"grouping": args.messages, "ranks": args.ranks, "seconds": args.seconds, "messages": len(batches),
              "records": n_records, "records_per_message": n_records / len(batches),
              "raw_records_per_s": raws, "worker_records_per_s": workers, "raw_median": raw_m,
              "worker_median": w_m, "ratio_median": w_m / raw_m,
              "target_worker_records_per_s": 100_000, "target_ratio": 0.5}
    print(f"median: raw {raw_m:,.0f} records/s, worker {w_m:,.0f} records/s, ratio {w_m / raw_m:.0%} "
          f"(targets: >= 100,000 records/s and >= 50 %)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


def metrics_cost(args: argparse.Namespace, batches: list[tuple[float, KernelBatch]], n_records: int) -> int:
    """``--repeat`` pairs of worker runs on the same published records, unscraped and scraped, order alternating."""
    quiet, scraped, ratios = [], [], []
    scrapers: list[Scraper] = []
    with EmbeddedBroker(0) as broker:
        s = Settings.load({}, bootstrap=broker.bootstrap, topic_prefix=f"mcost-{uuid.uuid4().hex[:4]}.",
                          metrics_partitions=1)
        ensure_topics(s)
        per_part = publish(s, batches)
        for i in range(args.repeat):
            got: dict[bool, float] = {}
            for scrape in ((False, True) if i % 2 == 0 else (True, False)):
                run = s.replace(worker_web_port=free_port())
                log = Path(f"/tmp/ccld-bench-mcost-{i}-{'scraped' if scrape else 'quiet'}.log")
                got[scrape] = worker_rate(run, per_part, n_records, log, args.scrape_interval_s if scrape else 0.0,
                                          scrapers)
            quiet.append(got[False])
            scraped.append(got[True])
            ratios.append(got[True] / got[False])
            print(f"pair {i + 1}: not scraped {got[False]:,.0f} records/s; scraped every "
                  f"{args.scrape_interval_s:g} s {got[True]:,.0f} records/s ({ratios[-1]:.1%})", flush=True)
    q_m, s_m, r_m = statistics.median(quiet), statistics.median(scraped), statistics.median(ratios)
    gets = [x for sc in scrapers for x in sc.seconds]
    result = {"mode": "metrics-cost", "grouping": args.messages, "ranks": args.ranks, "seconds": args.seconds,
              "messages": len(batches), "records": n_records, "scrape_interval_s": args.scrape_interval_s,
              "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "unscraped_records_per_s": quiet, "scraped_records_per_s": scraped, "ratios": ratios,
              "unscraped_median": q_m, "scraped_median": s_m, "ratio_median": r_m,
              "scrapes": len(gets), "scrape_ms_median": 1000 * statistics.median(gets),
              "scrape_ms_max": 1000 * max(gets), "scrape_bytes": scrapers[-1].bytes}
    print(f"median: not scraped {q_m:,.0f} records/s, scraped {s_m:,.0f} records/s; "
          f"median ratio scraped/not {r_m:.1%}; {len(gets)} scrapes of {scrapers[-1].bytes:,} bytes, "
          f"median {1000 * statistics.median(gets):.1f} ms, max {1000 * max(gets):.1f} ms")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
