"""Producers whose clocks are 25 s off, within the allowed skew, in a healthy job: no verdict (issue 18, item 3).

A real broker and a real ``ccld worker``. A healthy 32-rank Megatron-style job is produced in real
time by four producers (its communicators split among them): one stamps its messages 25 s ahead,
one 25 s behind, two are honest. 25 s is under the clock's skew bound (30 s) and over the hang
thresholds (15 and 20 s): a clock moved by the one ahead, or honest data judged against it, would
make the other producers' ranks look stalled. The worker must stay silent and analyze every record.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from confluent_kafka import Producer

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.schemas.codec import encode_batch
from ccld.settings import Settings
from chaoslib import committed, raw_verdicts, record_result, wait_for, worker_counters
from harness import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SKEW_S = {0: 0.0, 1: 25.0, 2: -25.0, 3: 0.0}  # producer -> how far its clock is off
DURATION_S = 40.0


def test_producers_25_s_ahead_and_behind_in_a_healthy_job_make_no_verdict(
    chaos_settings: Settings, chaos_worker: WorkerProcess
) -> None:
    s = chaos_settings
    sc = Scenario.from_dict({
        "id": "skew-live", "seed": 21, "ranks": 32, "layout": {"tp": 4, "pp": 2, "dp": 4}, "channels": 2,
        "duration_s": DURATION_S, "clock_skew_s": 1.0, "jitter": 0.05,
        "workload": {"microbatches": 4, "layers": 2, "layer_ms": 4.0}, "faults": [], "expect": [],
    })
    batches = list(simulate(sc))
    hosts = sorted({b.hosts[0] for _, b in batches})  # one producer per host, as the attachment runs
    worker = chaos_worker.start()
    p = Producer({"bootstrap.servers": s.bootstrap, "linger.ms": 5})
    t0 = time.time()
    sent = 0
    for t, b in batches:
        ahead = t0 + t - time.time()
        if ahead > 0:
            time.sleep(ahead)  # real time: the worker's wall clock and the job's move together
        k = hosts.index(b.hosts[0]) % len(SKEW_S)
        b = dataclasses.replace(b, producer=f"skew-p{k}")
        p.produce(s.metrics_topic, encode_batch(b), partition=0, timestamp=int((t0 + t + SKEW_S[k]) * 1000))
        p.poll(0)
        sent += b.n
    assert p.flush(30) == 0
    # the job ends healthily; wait past the longest hang threshold for anything the skew would make
    time.sleep(5)
    assert wait_for(lambda: committed(s) >= len(batches), 30), worker.log()
    time.sleep(3)
    got = [v for v in raw_verdicts(s) if v.state.value == "open"]
    assert worker.stop() == 0
    c = worker_counters(worker)
    assert got == [], [v.describe() for v in got]
    assert c.get("analyzed_records") == sent, c
    record_result("producer clocks +25 s and -25 s", "2 of 4 producers of a healthy 32-rank job, real time",
                  produced=sent, delivered=c.get("analyzed_records", 0), verdicts_expected=0,
                  verdicts_received=len(got), verdicts_raw=len(got))
