"""Silence is not a hang, and a lost host is one incident (issue 18, item 4).

- A whole job whose records stop mid-step (a scheduler's cancel, ``kill -9`` of every rank, a cut
  to the broker) has ended: no verdict, however many of its ops were in flight at the cut.
- A host whose ranks all stop at once while the other ranks wait for them is one incident naming
  the host and its ranks, not one H1 per rank.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import KernelBatch, Verdict
from ccld.streams.analysis.analyzer import Analyzer

HOST0 = range(8)  # gpus_per_node 8: ranks 0-7 are node-0000


def job(faults: list[dict[str, object]], duration_s: float) -> Scenario:
    return Scenario.from_dict({
        "id": "silence", "seed": 4, "ranks": 64, "gpus_per_node": 8, "layout": {"tp": 8, "pp": 2, "dp": 4},
        "channels": 2, "duration_s": duration_s, "clock_skew_s": 1.0, "jitter": 0.05,
        "workload": {"microbatches": 4, "layers": 2, "layer_ms": 4.0},  # some op is always in flight
        "faults": faults, "expect": [],
    })


@cache
def batches(lost_host: bool) -> tuple[tuple[float, KernelBatch], ...]:
    faults = [{"kind": "H1", "rank": r, "onset_s": 30.0} for r in HOST0] if lost_host else []
    return tuple(simulate(job(faults, 60.0)))


def run(feed: list[tuple[float, KernelBatch]], then_s: float) -> list[Verdict]:
    """Ingest in time order with an evaluation every second, then let the clock run ``then_s`` on."""
    a = Analyzer()
    out: list[Verdict] = []
    tick = 1.0
    last = 0.0
    for t, b in feed:
        while t >= tick:
            out += a.evaluate(tick)
            tick += 1.0
        a.ingest(b, t)
        last = t
    for k in range(int(then_s)):
        out += a.evaluate(last + 1.0 + k)
    return out


def without_ranks(feed: tuple[tuple[float, KernelBatch], ...], ranks: range, after_s: float
                  ) -> list[tuple[float, KernelBatch]]:
    out = []
    for t, b in feed:
        if t > after_s:
            keep = np.flatnonzero(~np.isin(b.columns["rank"], list(ranks)))
            if keep.size == 0:
                continue
            b = b.take(keep)
        out.append((t, b))
    return out


@pytest.mark.parametrize("cut_s", [20.0, 31.7, 44.9, 52.5])
def test_a_healthy_job_whose_records_all_stop_mid_step_gets_no_verdict(cut_s: float) -> None:
    # Before the cut rule each of these cuts opened H3s on the ops in flight (up to 20 at 20.0 s)
    feed = [(t, b) for t, b in batches(False) if t <= cut_s]
    assert run(feed, then_s=60.0) == []


def test_a_hang_seen_before_the_job_went_silent_is_still_a_hang() -> None:
    """The other side of the rule: ranks 0-7 stop at 30 s, everyone else goes on reporting (waiting) until
    the whole job goes silent at 36 s; the host's hang was seen before the silence and is reported."""
    feed = [(t, b) for t, b in without_ranks(batches(True), HOST0, 30.5) if t <= 36.0]
    got = [v for v in run(feed, then_s=40.0) if v.state.value == "open"]
    assert [(v.kind.value, v.root_cause_hosts) for v in got] == [("H1", ("node-0000",))], got


def test_a_lost_host_is_one_incident_naming_the_host_and_its_ranks() -> None:
    # ranks 0-7 stop (never enter their next ops) at 30 s and their records stop with them
    got = [v for v in run(without_ranks(batches(True), HOST0, 30.5), then_s=5.0) if v.state.value == "open"]
    assert len(got) == 1, [v.describe() for v in got]
    v = got[0]
    assert (v.kind.value, v.root_cause_ranks, v.root_cause_hosts) == ("H1", tuple(HOST0), ("node-0000",))
    assert "host node-0000" in v.evidence


def test_a_job_that_ends_while_a_rank_waits_for_a_peer_still_at_work_gets_no_hang() -> None:
    """The job of ``heldout-2`` ``pair-same-64-239`` (3D, 16 micro-batches, an S1 and an intermittent S2 in
    one replica): at its end rank 51 had waited 1.2 s in a data-parallel reduce-scatter whose ops never
    lasted 20 ms, for rank 19, which was still passing micro-batches through its pipeline and finished a
    send 30 ms before its last sample. Waiting that long against the op's own time, before the silence, was
    a hang by the cut rule (an H1 on rank 19, 24 s after the end); a member that moved on in another op
    until the end had not stopped, and the wait was the end's."""
    sc = Scenario.from_dict({
        "id": "pair-same-64-239", "seed": 143404, "ranks": 64, "gpus_per_node": 8,
        "layout": {"tp": 8, "pp": 4, "dp": 2},
        "channels": 64, "duration_s": 40.8, "clock_skew_s": 6.69, "jitter": 0.076, "clock_drift_ppm": 70.6,
        "workload": {"microbatches": 16, "layers": 4, "layer_ms": 8.95, "hidden": 1024, "seq_parallel": False,
                     "dp_buckets": 8, "pause_rate": 0.01, "eval_every": 25},
        "faults": [{"kind": "S1", "rank": 27, "onset_s": 15.8, "factor": 3.23},
                   {"kind": "S2", "rank": 24, "onset_s": 15.8, "peer": 25, "factor": 0.445,
                    "on_s": 20.0, "off_s": 15.0}],
        "expect": [{"kind": "S1", "rank": 27}, {"kind": "S2", "rank": 24}],
    })
    got = run(list(simulate(sc)), then_s=120.0)
    assert sorted({(v.kind.value, v.root_cause_ranks) for v in got}) == [("S1", (27,)), ("S2", (24, 25))], \
        [v.describe() for v in got]


def test_a_hang_whose_rank_still_heartbeats_is_a_hang_when_the_whole_job_then_goes_silent() -> None:
    """Rank 5 never enters its next op at 30 s but its attachment goes on sending its (unchanged) state every
    interval, as a hung rank's does; everyone goes silent at 36 s. The stopped rank is told by its
    communicators, which stand still from the hang on, not by its samples, which still come."""
    sc = job([{"kind": "H1", "rank": 5, "onset_s": 30.0}], 60.0)
    feed = [(t, b) for t, b in simulate(sc) if t <= 36.0]
    got = [v for v in run(feed, then_s=40.0) if v.state.value == "open"]
    assert [(v.kind.value, v.root_cause_ranks) for v in got] == [("H1", (5,))], [v.describe() for v in got]
