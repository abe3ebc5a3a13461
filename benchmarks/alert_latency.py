"""Alert latency: an OPEN verdict on the verdicts topic until a real Alertmanager lists its alert, and a
RESOLVED verdict until Alertmanager no longer lists it as active.

Usage: python benchmarks/alert_latency.py [--n 30] [--gap-s 1.0] [--poll-ms 20] [--out RESULT.json]

Starts the embedded broker (Tansu, a free loopback port; topics created as ``ccld up`` does), a real
Alertmanager (``ccld.stack.alertmanager``: Debian's ``prometheus-alertmanager``, no gossip, a receiver
that drops) and ``ccld alert --alertmanager URL`` as a real process with default settings. Then, one
incident at a time, ``--n`` times: an OPEN verdict of a new incident is produced to the verdicts topic
the way the worker sends one (the outbox's bytes, ``encode_verdict``, keyed by the incident id; the worker
sends them through Faust's producer, here through confluent-kafka with ``acks=all`` and no linger), and
``/api/v2/alerts?filter=incident_id=...`` is polled every ``--poll-ms`` until the alert is listed active;
then the incident's RESOLVED verdict, timed until the alert is no longer listed active. Incidents are
``--gap-s`` apart; the first ``--warmup`` are timed but not counted (the first after start-up pays for
connections and metadata: about 3 s). Each latency runs from just before ``produce()`` to the poll
that saw the change, so it includes the poll interval (up to ``--poll-ms``) and the HTTP round trips.
Median, p95 and max are printed and written to ``--out`` (default ``benchmarks/results/alert-latency.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from ccld.anomaly import AnomalyKind
from ccld.records import Verdict, VerdictState
from ccld.schemas.codec import encode_verdict
from ccld.settings import Settings
from ccld.stack.alertmanager import LocalAlertmanager, alertmanager_binary
from ccld.stack.broker import EmbeddedBroker
from ccld.stack.up import child_env
from ccld.topics import ensure_topics

OUT = Path(__file__).resolve().parent / "results" / "alert-latency.json"


def verdict(incident_id: str, state: VerdictState, i: int) -> Verdict:
    """An H1 verdict with wall-clock times, as a worker sends one (each incident its own communicator and culprit)."""
    now = time.time()
    return Verdict(incident_id=incident_id, state=state, kind=AnomalyKind.H1, job="alert-latency",
                   communicator=f"{i:016x}", op_seq=35, op_type="ALL_REDUCE", root_cause_ranks=(13 + i,),
                   root_cause_hosts=(f"node-{i:04d}",), affected_ranks=(8, 9),
                   evidence=f"ranks 8,9 entered ALL_REDUCE #35 and waited 21.0 s; rank {13 + i} never entered",
                   confidence=0.95, onset_time=now - 21, detected_time=now)


def percentile(xs: list[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100) of ``xs``."""
    s = sorted(xs)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def summary(xs: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(xs), "p95_s": percentile(xs, 95), "max_s": max(xs), "min_s": min(xs)}


def start_alert(settings: Settings, log: Path, timeout_s: float = 60.0) -> subprocess.Popen[bytes]:
    """``ccld alert`` in a child process, returned once it logs that it is alerting."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "ccld.cli", "alert"], env=child_env(settings),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while b"alerting:" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"ccld alert did not start:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)
    return proc


def time_until(t0: float, cond: Any, poll_s: float, timeout_s: float) -> float | None:
    """Seconds from ``t0`` (a ``perf_counter``) until ``cond()`` holds, polled every ``poll_s``; None after
    ``timeout_s``."""
    while time.perf_counter() - t0 < timeout_s:
        if cond():
            return time.perf_counter() - t0
        time.sleep(poll_s)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=30, help="incidents (each opened, then resolved)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="incidents first, timed but not counted (the first produce and fetch after start-up)")
    ap.add_argument("--gap-s", type=float, default=1.0, help="pause between incidents")
    ap.add_argument("--poll-ms", type=float, default=20.0, help="Alertmanager poll interval")
    ap.add_argument("--timeout-s", type=float, default=60.0, help="give up on one alert after this long")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if alertmanager_binary() is None:
        raise SystemExit("Alertmanager is not installed: apt-get install prometheus-alertmanager")

    poll_s = args.poll_ms / 1000
    opened: list[float] = []
    resolved: list[float] = []
    missed = {"open": 0, "resolved": 0}
    work = Path(tempfile.mkdtemp(prefix="ccld-alert-latency-"))
    with EmbeddedBroker(0) as broker, LocalAlertmanager(work / "alertmanager") as am:
        s = Settings.load({}, bootstrap=broker.bootstrap, topic_prefix=f"lat-{uuid.uuid4().hex[:6]}.",
                          alert_group=f"lat-{uuid.uuid4().hex[:6]}", alert_alertmanager_url=am.url,
                          alert_metrics_port=0, log_level="INFO")
        ensure_topics(s)
        producer = Producer({"bootstrap.servers": s.bootstrap, "acks": "all", "linger.ms": 0})
        alert = start_alert(s, work / "alert.log")
        print(f"broker {s.bootstrap}, Alertmanager {am.url}, ccld alert pid {alert.pid}; logs in {work}",
              flush=True)
        try:
            for i in range(args.warmup + args.n):
                iid = uuid.uuid4().hex[:16]

                def active(iid: str = iid) -> bool:
                    return any(a["status"]["state"] == "active" for a in am.alerts(iid))

                for state, times in ((VerdictState.OPEN, opened), (VerdictState.RESOLVED, resolved)):
                    v = verdict(iid, state, i)
                    want_active = state is VerdictState.OPEN
                    t0 = time.perf_counter()
                    producer.produce(s.verdicts_topic, key=v.incident_id.encode(), value=encode_verdict(v))
                    producer.flush(10)
                    took = time_until(t0, lambda w=want_active: active() == w, poll_s, args.timeout_s)
                    if took is None:
                        missed[state.value] += 1
                        print(f"  incident {i + 1} {state.value}: not seen in {args.timeout_s:.0f} s", flush=True)
                        continue
                    times.append(took)
                if len(opened) > i and len(resolved) > i:
                    what = f"warm-up {i + 1}" if i < args.warmup else f"{i + 1 - args.warmup}/{args.n}"
                    print(f"  {what}: alert active after {opened[i]:.3f} s, "
                          f"gone after resolve {resolved[i]:.3f} s", flush=True)
                time.sleep(args.gap_s)
        finally:
            alert.terminate()
            try:
                alert.wait(20)
            except subprocess.TimeoutExpired:
                alert.kill()
                alert.wait()
            producer.flush(5)
            del producer  # before the broker stops, or librdkafka logs the disconnect
    warm_open, warm_resolved = opened[:args.warmup], resolved[:args.warmup]
    opened, resolved = opened[args.warmup:], resolved[args.warmup:]
    if not opened or not resolved:
        raise SystemExit(f"no latencies measured (missed {missed}); see {work}")
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "n": args.n, "gap_s": args.gap_s,
        "poll_ms": args.poll_ms, "missed": missed, "warmup_open_to_active_s": warm_open,
        "warmup_resolved_to_gone_s": warm_resolved,
        "open_to_active": summary(opened), "resolved_to_gone": summary(resolved),
        "open_to_active_s": opened, "resolved_to_gone_s": resolved,
        "alertmanager": subprocess.run([am.binary or "", "--version"], capture_output=True,
                                       text=True).stdout.splitlines()[0:1] or [""],
    }
    for name in ("open_to_active", "resolved_to_gone"):
        m = result[name]
        print(f"{name}: median {m['median_s']:.3f} s, p95 {m['p95_s']:.3f} s, max {m['max_s']:.3f} s "
              f"(n {len(result[name + '_s'])})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
