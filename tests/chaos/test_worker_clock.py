"""A producer whose clock runs an hour ahead cannot move another job's clock, nor its own job's.

A real broker and a real ``ccld worker`` process. Job A (a hang) is shipped by three producers,
one of which stamps its messages an hour ahead; job B, on the same partition, is shipped by one
producer that is an hour ahead too. A's verdict must carry the onset time and stall that the
analyzer finds on honest timestamps alone.
"""

from __future__ import annotations

import dataclasses
import re
import time

import pytest

from ccld.records import KernelBatch
from ccld.settings import AnalyzerSettings, Settings
from ccld.streams.analysis.replay import analyze_batches
from chaoslib import (
    committed,
    produce,
    raw_verdicts,
    record_result,
    scenario_batches,
    wait_for,
    worker_counters,
)
from harness import WorkerProcess, collect_verdicts

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SKEW_S = 3600.0


def waited(evidence: str) -> float:
    m = re.search(r"waited ([0-9.]+) s", evidence)
    assert m, evidence
    return float(m.group(1))


def test_a_producer_an_hour_ahead_changes_no_other_jobs_onset_or_stall(
    chaos_settings: Settings, chaos_worker: WorkerProcess
) -> None:
    s = chaos_settings
    t0 = time.time() - 60.0  # honest timestamps: the wall clock, the job started a minute ago
    a = scenario_batches("skew-a", {"kind": "H1", "rank": 5, "onset_s": 20.0}, 60.0)
    b = scenario_batches("skew-b", None, 60.0)
    comms = sorted({x.comm_hash for _, x in a})

    def producer_of(batch: KernelBatch) -> int:
        return comms.index(batch.comm_hash) % 3

    messages: list[tuple[float, int, KernelBatch]] = []
    for t, x in a:
        p = producer_of(x)
        # producer a-2 stamps an hour ahead; a-0 and a-1 are honest
        messages.append((t0 + t + (SKEW_S if p == 2 else 0.0), p, dataclasses.replace(x, producer=f"a-{p}")))
    messages += [(t0 + t + SKEW_S, 9, dataclasses.replace(x, producer="b")) for t, x in b]
    # the order the records would arrive in: by true time; an honest producer of A is heard first
    messages.sort(key=lambda m: (m[0] - (SKEW_S if m[1] in (2, 9) else 0.0), m[1] in (2, 9)))

    honest = analyze_batches([(t0 + t, x) for t, x in a], AnalyzerSettings(), tick_s=s.worker_tick_s)
    (want,) = [v for v in honest if v.state.value == "open" and 5 in v.root_cause_ranks]

    worker = chaos_worker.start()
    sent = produce(s, [(ts, x) for ts, _, x in messages])  # stamped with their own times
    got = collect_verdicts(s, 45, until=lambda vs: any(5 in v.root_cause_ranks for v in vs))
    opened = [v for v in got if v.state.value == "open" and v.job == "skew-a"]
    assert [(v.kind.value, v.root_cause_ranks) for v in opened] == [("H1", (5,))], worker.log()
    (v,) = opened
    # Same onset and the same stall as on honest timestamps (one evaluation tick apart at most).
    assert abs(v.onset_time - want.onset_time) <= 2 * s.worker_tick_s, (v.onset_time, want.onset_time)
    assert abs(waited(v.evidence) - waited(want.evidence)) <= 2 * s.worker_tick_s, (v.evidence, want.evidence)
    assert v.onset_time < time.time() + 60, "job A's clock was moved by the producer an hour ahead"
    assert wait_for(lambda: committed(s) >= len(messages), 30), "the worker did not take in every message"
    assert not [x for x in raw_verdicts(s) if x.job == "skew-b"], "the healthy job got a verdict"
    assert worker.stop() == 0
    c = worker_counters(worker)
    skewed_a = sum(1 for _, p, _ in messages if p == 2)
    assert c.get("clock_rejected", 0) >= skewed_a - 1, c  # all but possibly one message of a-2 clamped
    assert c.get("analyzed_records") == sent, c
    raw = [x for x in raw_verdicts(s) if x.state.value == "open"]
    record_result("producer clock +1 h", f"1 of 3 producers of job A and the only producer of job B stamp "
                  f"+{SKEW_S:.0f} s; A's onset {v.onset_time - t0:.1f} s vs {want.onset_time - t0:.1f} s honest, "
                  f"{c.get('clock_rejected', 0)} timestamps clamped", produced=sent,
                  delivered=c.get("analyzed_records", 0), verdicts_expected=1, verdicts_received=len(opened),
                  verdicts_raw=len(raw))
