"""``ccld simulate``: run scenarios of a JSON-lines file and publish their records (or summarise them)."""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import Counter

import numpy as np

from ccld.errors import CcldError, ScenarioError
from ccld.producers.simulator.publish import publish
from ccld.producers.simulator.scenario import Scenario, load_scenarios
from ccld.producers.simulator.sim import simulate
from ccld.records import Status
from ccld.settings import Settings

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenarios", help="JSON-lines scenario file (or one scenario as a JSON object)")
    parser.add_argument("--id", action="append", default=[], dest="ids", help="run only this scenario id (repeatable)")
    parser.add_argument("--limit", type=int, default=0, help="run at most N scenarios")
    parser.add_argument("--realtime", action="store_true", help="pace batches to the wall clock")
    parser.add_argument("--epoch", type=float, metavar="SECONDS",
                        help="a job's time 0 in seconds since 1970 (default: the wall clock when it starts; "
                        "0: simulated time as the benchmark stamps it)")
    parser.add_argument(
        "--dry-run", action="store_true", help="do not publish; print per-scenario record counts instead"
    )
    parser.add_argument("--flush-timeout-s", type=float, default=60.0, dest="flush_timeout_s",
                        help="at the end, wait this long for the broker to take what is queued or spooled")


def _scenarios(args: argparse.Namespace) -> list[Scenario]:
    src = args.scenarios.strip()
    if src.startswith("{"):
        try:
            found = [Scenario.from_dict(json.loads(src))]
        except json.JSONDecodeError as exc:
            raise ScenarioError(f"not a JSON scenario: {exc}") from exc
    else:
        found = load_scenarios(src)
    if args.ids:
        wanted = set(args.ids)
        found = [s for s in found if s.id in wanted]
        missing = wanted - {s.id for s in found}
        if missing:
            raise ScenarioError(f"no scenario with id {sorted(missing)} in {args.scenarios}")
    return found[: args.limit] if args.limit > 0 else found


def _summary(sc: Scenario) -> dict[str, object]:
    t0 = time.perf_counter()
    statuses: Counter[str] = Counter()
    batches = 0
    last = 0.0
    for t, batch in simulate(sc):
        batches += 1
        last = t
        for s, n in zip(*_unique(batch.col("status")), strict=True):
            statuses[Status(s).name] += n
    return {"id": sc.id, "ranks": sc.ranks, "batches": batches, "records": sum(statuses.values()),
            **statuses, "last_delivery_s": round(last, 2), "wall_s": round(time.perf_counter() - t0, 3)}


def _unique(col: object) -> tuple[list[int], list[int]]:
    """The statuses present in a batch and their counts (a bincount: statuses are small, and
    np.unique's sort cost as much per batch as the simulator's own work at thousands of batches/s)."""
    counts = np.bincount(np.asarray(col, dtype=np.int64))
    vals = np.flatnonzero(counts)
    return vals.tolist(), counts[vals].tolist()


def main(args: argparse.Namespace, settings: Settings) -> int:
    scenarios = _scenarios(args)
    if args.dry_run:
        for sc in scenarios:
            print(json.dumps(_summary(sc)))
        return 0
    from ccld.producers.kafka import MetricsProducer  # imported here: --dry-run needs no Kafka client

    if not settings.bootstrap:
        raise CcldError("simulate publishes to Kafka: give --bootstrap (or CCLD_BOOTSTRAP), or use --dry-run")
    producer = MetricsProducer(settings, producer_id="ccld-simulate")
    try:
        # Fail fast and say so when no broker answers, instead of letting records expire one by one.
        producer.check_broker()
        for sc in scenarios:
            t0 = time.perf_counter()
            epoch = time.time() if args.epoch is None else args.epoch
            counts = publish(sc, producer, realtime=args.realtime, job=settings.job if args.job else None,
                             epoch_s=epoch)
            print(f"{sc.id}: {counts['batches']} batches, {counts['records']} records, "
                  f"{counts['refused']} refused in {time.perf_counter() - t0:.1f} s", flush=True)
        left = producer.flush(args.flush_timeout_s)
    finally:
        producer.close()
    return _verdict(producer.stats, left, settings)


def _verdict(stats: dict[str, int], left: int, settings: Settings) -> int:
    """Print the stats line; 1 when any record was lost or is not delivered yet (never a silent 0)."""
    from ccld.producers.kafka import format_stats

    print(format_stats(stats), flush=True)
    if stats["lost_records"]:
        log.error("%d records were lost (see the counts above)", stats["lost_records"])
        return 1
    if stats["spooled_records"]:
        log.error("%d records are still in the spool %s; the next producer using it replays them",
                  stats["spooled_records"], settings.spool_dir)
        return 1
    if left or stats["in_flight_records"]:
        log.error("%d messages were not delivered", left)
        return 1
    return 0
