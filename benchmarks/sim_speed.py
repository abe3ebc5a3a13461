"""How fast the simulator plays the Megatron-style job: simulated seconds per wall second, per world size.

Usage: python benchmarks/sim_speed.py [--ranks 128 512 1024] [--duration-s 30] [--repeat 3] [--out FILE.json]

The job is the standard suite's Megatron-style workload (``make_standard.py``: tp 8, pp 4, dp R/32,
1F1B over 4 micro-batches of 2 layers, 4 gradient buckets, 8 channels) with its noise on: heavy-tailed
jitter, GC/data-loader pauses, clock skew and drift. ``simulate()`` is drained batch by batch and each
batch's status column is counted, as ``ccld simulate --dry-run`` does, so the figure is what a
producer or the accuracy benchmark gets. Run it on one core (``taskset -c 1``) and compare runs side by
side: the speed is the median of ``--repeat`` runs. This is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate


def job_scenario(ranks: int, duration_s: float, *, seed: int = 11) -> Scenario:
    """The standard suite's Megatron-style job at ``ranks`` (a multiple of 32), noise on, no fault."""
    if ranks % 32:
        raise ValueError(f"--ranks must be a multiple of 32 (tp 8 x pp 4), got {ranks}")
    return Scenario.from_dict({
        "id": f"speed-{ranks}", "seed": seed, "ranks": ranks, "gpus_per_node": 8,
        "layout": {"tp": 8, "pp": 4, "dp": ranks // 32}, "channels": 8, "duration_s": duration_s,
        "clock_skew_s": 2.0, "jitter": 0.03, "clock_drift_ppm": 50.0,
        "workload": {"microbatches": 4, "layers": 2, "layer_ms": 4.0, "hidden": 4096, "dp_buckets": 4,
                     "pause_rate": 0.02},
    })


def run_once(sc: Scenario) -> tuple[float, int, int]:
    """Wall seconds, batches and records of one full ``simulate()`` of ``sc``."""
    t0 = time.perf_counter()
    batches = records = 0
    for _t, batch in simulate(sc):
        batches += 1
        records += int(np.bincount(batch.col("status")).sum())  # the status count of ccld simulate --dry-run
    return time.perf_counter() - t0, batches, records


def measure(ranks: int, duration_s: float, repeat: int) -> dict[str, Any]:
    sc = job_scenario(ranks, duration_s)
    walls = []
    batches = records = 0
    for _ in range(repeat):
        wall, batches, records = run_once(sc)
        walls.append(wall)
    wall = statistics.median(walls)
    return {"ranks": ranks, "sim_s": duration_s, "wall_s": round(wall, 3), "speed": round(duration_s / wall, 2),
            "batches": batches, "records": records, "records_per_s": round(records / wall), "walls": walls}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[128, 512, 1024])
    ap.add_argument("--duration-s", type=float, default=30.0, help="simulated seconds per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per size (the median is shown)")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    rows = []
    print(f"{'ranks':>6} {'sim s':>6} {'wall s':>8} {'speed':>7} {'records/s':>10}", flush=True)
    for r in args.ranks:
        row = measure(r, args.duration_s, args.repeat)
        rows.append(row)
        print(f"{row['ranks']:>6} {row['sim_s']:>6.0f} {row['wall_s']:>8.2f} {row['speed']:>6.1f}x "
              f"{row['records_per_s']:>10,}", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
