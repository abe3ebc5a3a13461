"""Exits known only to +/- (``t_exit_err_ns``, the Flight Recorder poller on gloo): a late arriver's
noisy exit must not pass for slower communication, and only the uncertainty the record carries decides."""

from __future__ import annotations

import dataclasses

from analysis_factories import NS, Comm, Probe, batches_by_tick, healthy_steps

from ccld.records import AnomalyKind, KernelRecord, Status, VerdictState
from ccld.streams.analysis.replay import analyze_batches

CULPRIT = 2
#: how far after the true exit the culprit's source put it (a poll midpoint), and what it says it may be off
SHIFT_S = 0.1


def late_arriver_with_noisy_exits(err_s: float) -> list[tuple[float, KernelRecord]]:
    """Four gloo ranks (no counters), 200-ms all-reduces; from step 20 rank 2 arrives 1.2 s late, and its
    DONE records put the exit ``SHIFT_S`` after the real one (its kernel time reads 300 ms, not 200),
    saying the exit is known to +/- ``err_s``."""
    probe = Probe(channels=0, world_size=4)
    recs = healthy_steps(probe, Comm(0x61, tuple(range(4))), 40, late={CULPRIT: 1.2}, from_step=20)
    out = []
    for t, r in recs:
        if r.rank == CULPRIT and r.status is Status.DONE and r.op_seq >= 20:
            shift = int(SHIFT_S * NS)
            r = dataclasses.replace(r, t_exit_ns=r.t_exit_ns + shift, t_sample_ns=r.t_sample_ns + shift,
                                    t_exit_err_ns=int(err_s * NS))
        out.append((t, r))
    return out


def opened(recs: list[tuple[float, KernelRecord]]) -> list[tuple[AnomalyKind, tuple[int, ...]]]:
    return [(v.kind, v.root_cause_ranks) for v in analyze_batches(batches_by_tick(recs))
            if v.state == VerdictState.OPEN]


def test_a_late_arrivers_exit_known_to_plus_minus_is_not_slow_communication() -> None:
    assert opened(late_arriver_with_noisy_exits(SHIFT_S)) == [(AnomalyKind.S1, (CULPRIT,))]


def test_the_same_exits_given_as_exact_read_as_slow_communication_too() -> None:
    # the 100 ms extra then is communication time (the last arriver's own kernel time, 1.5x its
    # baseline): the uncertainty column, nothing else, tells the two apart
    assert opened(late_arriver_with_noisy_exits(0.0)) == [(AnomalyKind.S3, (CULPRIT,))]
