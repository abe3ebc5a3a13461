"""DONE records carry the peak backlog each kernel would have kept (probe v2): small but not zero on
a healthy ring, the in-flight depth on a slow link's source rank, unknown on every other row; the
same for a given seed, in both timing models."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from ccld.probe.ring_plan import fold_peaks
from ccld.producers.simulator.engine import HEALTHY_PEAK, IN_FLIGHT, kernel_peaks, source_peak
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import OpType, Status


def peaks(**kw: Any) -> list[tuple[float, int, int, int, int, tuple[int, ...]]]:
    """(time, status, rank, op_type, op_seq, per-channel peak) of every row."""
    d: dict[str, Any] = {"id": "pk", "seed": 5, "ranks": 16, "layout": {"tp": 4, "pp": 2, "dp": 2},
                         "duration_s": 30, "step_time_s": 1.0, "channels": 4}
    d.update(kw)
    out = []
    for t, b in simulate(Scenario.from_dict(d)):
        c = b.columns
        for i in range(b.n):
            out.append((t, int(c["status"][i]), int(c["rank"][i]), int(c["op_type"][i]), int(c["op_seq"][i]),
                        tuple(b.peaks[i].tolist())))
    return out


def test_kernel_peaks_model() -> None:
    rng = np.random.default_rng(0)
    lead = np.array([0, 0, IN_FLIGHT, -IN_FLIGHT] * 500)
    pk = kernel_peaks(rng, lead, 4)
    healthy = pk[lead <= 0]
    assert healthy.min() == 0 and healthy.max() == HEALTHY_PEAK and 0.5 < healthy.mean() < 1.5
    src = pk[lead > 0]
    assert src.min() >= IN_FLIGHT - 2 and src.max() == IN_FLIGHT
    # more than 8 hardware channels fold onto the frame's 8: a slot keeps the largest of its channels
    folded = fold_peaks(np.arange(20, dtype=np.int64)[None, :], 8)
    assert folded.tolist() == [[16, 17, 18, 19, 12, 13, 14, 15]]


def _rows_by_kind(**kw: Any) -> tuple[dict[int, list[int]], list[tuple[int, ...]]]:
    rows = peaks(**kw)
    done: dict[int, list[int]] = defaultdict(list)
    other = []
    for t, st, rank, op, _seq, pk in rows:
        if st == int(Status.DONE):
            assert len(pk) == 4 and min(pk) >= 0
            if op == int(OpType.ALL_REDUCE) and t > 17:
                done[rank].append(max(pk))
        else:
            other.append(pk)
    return done, other


def test_healthy_peaks_are_small_but_not_zero() -> None:
    done, other = _rows_by_kind()
    every = [p for v in done.values() for p in v]
    assert every and max(every) <= HEALTHY_PEAK and min(every) >= 0 and np.mean(every) > 0.5
    assert other and all(pk == (-1,) * 4 for pk in other)  # ENTERED, PROGRESS, IDLE: unknown


def test_a_slow_links_source_peaks_at_the_in_flight_depth() -> None:
    done, _ = _rows_by_kind(faults=[{"kind": "S2", "rank": 5, "onset_s": 15, "factor": 0.05}])
    assert done[5] and min(done[5]) >= IN_FLIGHT - 2 and max(done[5]) == IN_FLIGHT
    assert all(max(v) <= HEALTHY_PEAK for rank, v in done.items() if rank != 5)


def test_a_mild_slow_link_builds_a_smaller_backlog() -> None:
    """What arrives faster than it leaves over one op, at most the slots in flight."""
    assert source_peak(16, 0.05) == IN_FLIGHT and source_peak(16, 0.0) == IN_FLIGHT
    assert source_peak(16, 0.67) == 6 and source_peak(40, 0.67) == IN_FLIGHT and source_peak(16, 1.0) == 0


RING = {int(OpType.ALL_REDUCE), int(OpType.ALL_GATHER), int(OpType.REDUCE_SCATTER)}


def test_megatron_model_carries_the_same_peaks() -> None:
    kw: dict[str, Any] = {"channels": 12, "workload": {}, "duration_s": 25}
    healthy = peaks(**kw)
    done = [pk for _, st, _r, op, _s, pk in healthy if st == int(Status.DONE) and op in RING]
    assert done and all(len(pk) == 8 and 0 <= min(pk) and max(pk) <= HEALTHY_PEAK for pk in done)
    # a pipeline RECV receives everything and forwards nothing (its peak is its whole transfer); a SEND never receives
    recv = [min(pk) for _, st, _r, op, _s, pk in healthy if st == int(Status.DONE) and op == int(OpType.RECV)]
    send = [max(pk) for _, st, _r, op, _s, pk in healthy if st == int(Status.DONE) and op == int(OpType.SEND)]
    assert recv and min(recv) >= 2 * IN_FLIGHT and send and max(send) == 0
    slow = peaks(**kw, faults=[{"kind": "S2", "rank": 5, "onset_s": 12, "factor": 0.2}])
    src = [max(pk) for t, st, rank, op, _s, pk in slow
           if st == int(Status.DONE) and rank == 5 and op == int(OpType.ALL_REDUCE) and t > 14]
    rest = [max(pk) for t, st, rank, op, _s, pk in slow if st == int(Status.DONE) and rank != 5 and op in RING]
    assert src and min(src) >= IN_FLIGHT - 2
    assert rest and max(rest) <= HEALTHY_PEAK


def test_peaks_are_deterministic_per_seed() -> None:
    assert peaks(duration_s=12) == peaks(duration_s=12)
    assert peaks(duration_s=12) != peaks(duration_s=12, seed=6)
