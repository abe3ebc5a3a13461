"""How fast the simulator plays the Megatron-style job: simulated seconds per wall second, per world size.

Usage: python benchmarks/sim_speed.py [--ranks 128 512 1024] [--duration-s 30] [--repeat 3] [--out FILE.json]
       [--against OTHER_CHECKOUT/.venv/bin/python]

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
import subprocess
import sys
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


def one_run(ranks: int, duration_s: float) -> dict[str, Any]:
    """One run of the job at ``ranks``: wall and CPU seconds (this process), batches, records."""
    sc = job_scenario(ranks, duration_s)
    c0 = time.process_time()
    wall, batches, records = run_once(sc)
    return {"wall_s": wall, "cpu_s": time.process_time() - c0, "batches": batches, "records": records}


def child_run(python: str, ranks: int, duration_s: float) -> dict[str, Any]:
    """``one_run`` in a fresh process of ``python`` (another checkout's interpreter runs this file)."""
    out = subprocess.run([python, __file__, "--one", str(ranks), "--duration-s", str(duration_s)],
                         capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.splitlines()[-1]))


def _summary(ranks: int, duration_s: float, runs: list[dict[str, Any]]) -> dict[str, Any]:
    wall = statistics.median(r["wall_s"] for r in runs)
    cpu = statistics.median(r["cpu_s"] for r in runs)
    return {"ranks": ranks, "sim_s": duration_s, "wall_s": round(wall, 3), "speed": round(duration_s / wall, 2),
            "cpu_s": round(cpu, 3), "cpu_speed": round(duration_s / cpu, 2), "batches": runs[-1]["batches"],
            "records": runs[-1]["records"], "records_per_s": round(runs[-1]["records"] / wall),
            "walls": [r["wall_s"] for r in runs], "cpus": [r["cpu_s"] for r in runs]}


def measure(ranks: int, duration_s: float, repeat: int, against: str | None = None) -> dict[str, Any]:
    """The median of ``repeat`` runs; with ``against``, the same for that interpreter, run by run alternated."""
    runs: list[dict[str, Any]] = []
    before: list[dict[str, Any]] = []
    for _ in range(repeat):
        if against:
            before.append(child_run(against, ranks, duration_s))
            runs.append(child_run(sys.executable, ranks, duration_s))
        else:
            runs.append(one_run(ranks, duration_s))
    row = _summary(ranks, duration_s, runs)
    if against:
        row["before"] = _summary(ranks, duration_s, before)
        if row["before"]["records"] != row["records"]:
            row["differs"] = True  # not the same records: a speed comparison of different work
        # (the batches may differ: one per communicator and window until 2026-12-04, one per host since)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[128, 512, 1024])
    ap.add_argument("--duration-s", type=float, default=30.0, help="simulated seconds per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per size (the median is shown)")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    ap.add_argument("--against", help="another checkout's python: before/after, alternated run by run")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # one run at this many ranks, as JSON
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one_run(args.one, args.duration_s)))
        return 0
    rows = []
    print(f"{'ranks':>6} {'sim s':>6} {'wall s':>8} {'speed':>7} {'cpu s':>7} {'speed':>7} {'records/s':>10}"
          + ("   before: wall s  speed  cpu s  speed  cpu gain" if args.against else ""), flush=True)
    for r in args.ranks:
        row = measure(r, args.duration_s, args.repeat, args.against)
        rows.append(row)
        line = (f"{row['ranks']:>6} {row['sim_s']:>6.0f} {row['wall_s']:>8.2f} {row['speed']:>6.1f}x "
                f"{row['cpu_s']:>7.2f} {row['cpu_speed']:>6.1f}x {row['records_per_s']:>10,}")
        if "before" in row:
            b = row["before"]
            line += (f"   {b['wall_s']:>14.2f} {b['speed']:>5.1f}x {b['cpu_s']:>6.2f} {b['cpu_speed']:>5.1f}x "
                     f"{b['cpu_s'] / row['cpu_s']:>8.2f}x" + ("  RECORDS DIFFER" if row.get("differs") else "")
                     + (f"  batches {b['batches']:,} -> {row['batches']:,}" if b["batches"] != row["batches"] else ""))
        print(line, flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
