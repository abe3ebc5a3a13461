"""Measure what a broker outage costs the metrics producer, with and without the on-disk spool.

    python benchmarks/chaos.py [--outage-s 60] [--run-s 120] [--rate 1000]
    python benchmarks/chaos.py --fault-verdict [--outage-s 60]

Each run: a fresh embedded broker, one MetricsProducer submitting ``rate`` records/s for
``run_s`` seconds, an outage of ``outage_s`` starting at ``run_s/6`` (SIGSTOP/SIGCONT, or
kill -9 and a restart on the same port), then close() and a read-back of the topic.
Default settings otherwise (message timeout 30 s). Prints one markdown table row per run.

``--fault-verdict``: the end-to-end run instead (``tests/chaos/test_outage_fault.py`` with a long
outage): a real-time ``ccld simulate`` with the spool on, a real ``ccld worker``, the broker frozen
for ``outage_s`` while a rank hangs; one row: records produced / on the broker, verdicts.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
import uuid

from ccld.producers.kafka import MetricsProducer
from ccld.schemas.codec import decode_metrics
from ccld.settings import Settings
from ccld.stack.broker import EmbeddedBroker
from ccld.topics import ensure_topics


def read_back(settings: Settings) -> set[int]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"m-{time.time_ns()}",
                  "enable.auto.commit": False})
    topic = settings.metrics_topic
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    got: set[int] = set()
    last = time.monotonic()
    while time.monotonic() - last < 5:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            got.update(int(x) for x in decode_metrics(m.value() or b"").columns["op_seq"])
            last = time.monotonic()
    c.close()
    return got


def one_run(fault: str, spool: bool, *, run_s: float, outage_s: float, rate: int) -> str:
    from factories import make_kernel_record  # tests/factories.py: the same records the tests use

    broker = EmbeddedBroker(0).start()
    spool_dir = tempfile.mkdtemp(prefix="ccld-spool-") if spool else ""
    s = Settings.load({}, bootstrap=broker.bootstrap, topic_prefix=f"m{uuid.uuid4().hex[:6]}.",
                      metrics_partitions=1, spool_dir=spool_dir)
    ensure_topics(s)
    p = MetricsProducer(s, producer_id=f"m-{fault}")
    n = int(run_s * rate)
    start_at, end_at = run_s / 6, run_s / 6 + outage_s
    t0 = time.monotonic()
    state = "before"
    delivered_at_kill = 0
    slowest = 0.0
    for i in range(n):
        target = t0 + i / rate
        now = time.monotonic()
        if now < target:
            time.sleep(target - now)
        if state == "before" and now - t0 >= start_at:
            assert broker.pid is not None
            if fault == "sigstop":
                os.kill(broker.pid, signal.SIGSTOP)
            else:
                os.kill(broker.pid, signal.SIGKILL)
                time.sleep(0.2)
                delivered_at_kill = p.stats["delivered_records"]
            state = "during"
        if state == "during" and now - t0 >= end_at:
            if fault == "sigstop":
                assert broker.pid is not None
                os.kill(broker.pid, signal.SIGCONT)
            else:
                broker.start()
                ensure_topics(s)
            state = "after"
        a = time.perf_counter()
        p.submit(make_kernel_record(op_seq=i))
        slowest = max(slowest, time.perf_counter() - a)
    p.close(timeout_s=90)
    st = p.stats
    got = read_back(s)
    broker.stop()
    if fault == "sigstop":
        arrived = f"{len(got)}"
        really_lost = n - len(got)
        what = f"SIGSTOP broker {outage_s:.0f} s, SIGCONT"
    else:
        arrived = f"{len(got)} on the new broker (of {n - delivered_at_kill} not delivered before the kill)"
        really_lost = (n - delivered_at_kill) - len(got)
        what = f"kill -9 broker, restart on same port after {outage_s:.0f} s"
    return (f"| {what} | {'on' if spool else 'off'} | {n} | {st['delivered_records']} | {arrived} | "
            f"{really_lost} | {st['lost_records']} (expired {st['expired_records']}, refused "
            f"{st['refused_records']}, dropped {st['dropped_progress'] + st['dropped_critical']}) | "
            f"{st['spooled_in_records']} / {st['replayed_records']} | {slowest * 1000:.1f} ms |")


def fault_verdict_run(outage_s: float) -> str:
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent.parent / "tests"
    sys.path[:0] = [str(here), str(here / "chaos")]
    from chaoslib import ChaosBroker, fault_during_outage  # the chaos test's own function, longer outage
    from harness import WorkerProcess

    broker = ChaosBroker()
    tmp = Path(tempfile.mkdtemp(prefix="ccld-chaos-"))
    tag = uuid.uuid4().hex[:8]
    s = Settings.load({}, bootstrap=broker.bootstrap, topic_prefix=f"v{tag}.", metrics_partitions=1,
                      worker_app_id=f"ccld-chaos-{tag}", worker_tick_s=0.5, worker_commit_interval_s=0.5)
    ensure_topics(s)
    worker = WorkerProcess(s, tmp / "worker.log").start()
    try:
        at, onset = 10.0, 10.0 + outage_s / 2
        r = fault_during_outage(broker, s, worker, tmp / "spool", outage_at_s=at, outage_s=outage_s,
                                onset_s=onset, duration_s=at + outage_s + 40.0)
    finally:
        worker.stop()
        broker.stop()
    v = r["verdict"]
    opened = len({x.incident_id for x in r["verdicts_raw"]})
    stats = r["stdout"].strip().splitlines()[-1] if r["stdout"].strip() else "(no output)"
    return (f"| SIGSTOP broker {outage_s:.0f} s from {at:.0f} s, rank 5 hangs at {onset:.0f} s | on | "
            f"{r['expected_records']} | {r['records_on_broker']} | {r['expected_records'] - r['records_on_broker']} | "
            f"{'H1 rank 5' if v else 'none'}, {r['verdict_after_thaw_s'] or 0:.0f} s after SIGCONT | "
            f"{opened} / {len(r['verdicts_raw'])} | exit {r['returncode']}: {stats} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--outage-s", type=float, default=60.0)
    ap.add_argument("--run-s", type=float, default=120.0)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--only", default="", help="sigstop-off, sigstop-on, kill-off, kill-on (comma separated)")
    ap.add_argument("--fault-verdict", action="store_true",
                    help="the end-to-end run: a hang during the outage, producer spooling, worker reporting")
    a = ap.parse_args()
    if a.fault_verdict:
        print("| fault | spool | records produced | on the broker | lost | verdict | verdicts distinct / raw "
              "| producer |")
        print("|---|---|---|---|---|---|---|---|")
        print(fault_verdict_run(a.outage_s), flush=True)
        return
    print("| fault | spool | records produced | delivered (counted) | on the broker | really lost "
          "| counted lost | spooled / replayed | slowest submit |")
    print("|---|---|---|---|---|---|---|---|---|")
    runs = [("sigstop", False), ("sigstop", True), ("kill", False), ("kill", True)]
    wanted = {x for x in a.only.split(",") if x}
    for fault, spool in runs:
        if wanted and f"{fault}-{'on' if spool else 'off'}" not in wanted:
            continue
        print(one_run(fault, spool, run_s=a.run_s, outage_s=a.outage_s, rate=a.rate), flush=True)


if __name__ == "__main__":
    main()
