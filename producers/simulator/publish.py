"""Send a simulated job's batches through the real producer, stamped with simulated time from an epoch."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Protocol

import numpy as np

from ccld.producers.simulator.emit import EPOCH_NS
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import KernelBatch

log = logging.getLogger(__name__)


class BatchSender(Protocol):
    """What ``publish`` needs of ``ccld.producers.kafka.MetricsProducer``."""

    def send_batch(self, batch: KernelBatch, timestamp_ms: int | None = None) -> bool: ...


#: the record columns that hold times on a rank's clock (ns; -1: none)
#: every column that is a time on a rank's clock (``t_exit_err_ns`` is a duration): one left behind reads as a
#: year-long compute gap (``t_prev_exit_ns`` at the simulator's epoch, the op's entry at today's)
TIME_COLUMNS = ("t_enter_ns", "t_exit_ns", "t_sample_ns", "t_prev_exit_ns")


def shifted(batch: KernelBatch, offset_ns: int) -> KernelBatch:
    """``batch`` with every time on the ranks' clocks ``offset_ns`` later (a -1, "none", stays)."""
    if not offset_ns:
        return batch
    cols = dict(batch.columns)
    for name in TIME_COLUMNS:
        if name not in cols:
            continue
        col = np.asarray(cols[name], dtype=np.int64)
        cols[name] = np.where(col >= 0, col + np.int64(offset_ns), col)
    return dataclasses.replace(batch, columns=cols)


def clock_offset_ns(epoch_s: float) -> int:
    """How far to move the ranks' clocks (which read ``emit.EPOCH_NS`` at simulated time 0) so that they read
    ``epoch_s`` there; 0 for epoch 0 (the benchmark's stamps)."""
    return int(round(epoch_s * 1e9)) - EPOCH_NS if epoch_s else 0


def publish(
    scenario: Scenario, producer: BatchSender, realtime: bool = False, *, job: str | None = None,
    epoch_s: float = 0.0,
) -> dict[str, int]:
    """Send every batch with ``timestamp_ms`` = its simulated delivery time after ``epoch_s``, and the ranks'
    clocks (which read ``emit.EPOCH_NS`` at time 0) moved to read ``epoch_s`` there. The benchmark keeps
    epoch 0 (a worker reading Kafka timestamps sees the same clock as the in-process bench); ``ccld
    simulate`` starts a job at the wall clock, as a real one does (its archive days and verdict times are
    today's, its ranks' clocks agree with its timestamps).

    ``realtime`` paces the batches to the wall clock (a live demo); otherwise as fast as possible.
    Returns counts of batches, records and batches the producer refused.
    """
    t_wall0 = time.monotonic()
    offset_ns = clock_offset_ns(epoch_s)
    batches = records = refused = 0
    for t, batch in simulate(scenario, job=job):
        if realtime:
            wait = t - (time.monotonic() - t_wall0)
            if wait > 0:
                time.sleep(wait)
        ok = producer.send_batch(shifted(batch, offset_ns), timestamp_ms=int((epoch_s + t) * 1000))
        batches += 1
        records += batch.n
        # a producer that answers None (fire and forget) is taken as accepted
        refused += ok is False
    if refused:  # counted by the producer too (refused_records); this names the scenario
        log.warning("scenario %s: the producer refused %d of %d batches", scenario.id, refused, batches)
    return {"batches": batches, "records": records, "refused": refused}
