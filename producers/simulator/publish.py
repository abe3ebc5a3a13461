"""Send a simulated job's batches through the real producer, stamped with simulated time."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import KernelBatch

log = logging.getLogger(__name__)


class BatchSender(Protocol):
    """What ``publish`` needs of ``ccld.producers.kafka.MetricsProducer``."""

    def send_batch(self, batch: KernelBatch, timestamp_ms: int | None = None) -> bool: ...


def publish(
    scenario: Scenario, producer: BatchSender, realtime: bool = False, *, job: str | None = None
) -> dict[str, int]:
    """Send every batch with ``timestamp_ms`` = its simulated delivery time (epoch 0 = sim start),
    so a worker reading Kafka timestamps sees the same clock as the in-process benchmark.

    ``realtime`` paces the batches to the wall clock (a live demo); otherwise as fast as possible.
    Returns counts of batches, records and batches the producer refused.
    """
    t_wall0 = time.monotonic()
    batches = records = refused = 0
    for t, batch in simulate(scenario, job=job):
        if realtime:
            wait = t - (time.monotonic() - t_wall0)
            if wait > 0:
                time.sleep(wait)
        ok = producer.send_batch(batch, timestamp_ms=int(t * 1000))
        batches += 1
        records += batch.n
        # a producer that answers None (fire and forget) is taken as accepted
        refused += ok is False
    if refused:  # counted by the producer too (refused_records); this names the scenario
        log.warning("scenario %s: the producer refused %d of %d batches", scenario.id, refused, batches)
    return {"batches": batches, "records": records, "refused": refused}
