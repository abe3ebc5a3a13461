"""CPU per message and per rank-second of the worker's own path, for each way of grouping records into messages.

Usage: python benchmarks/worker_cost.py [--ranks 256 1024] [--duration-s 30] [--repeat 3] [--out RESULT.json]

The job of ``realtime_scale.py`` (Megatron-style, about 300 collectives/s per rank, the bounded record
format) is generated once per R and grouped three ways (``realtime_scale.regroup``): ``rank`` (one
message per rank and delivery interval holding all its communicators: today's producers),
``rank-comm`` (one per rank, communicator and interval: producers before they merged communicators)
and ``comm`` (the simulator's own grouping). Each grouping's encoded messages are then fed, in
order and with their timestamps, to one ``PartitionProcessor`` (what the worker runs per message:
decode, value checks, clock, analyzer, evaluation on the analyzer's clock) with a snapshot every
second, as the worker writes them. Measured: process CPU time (``time.process_time``, so another
process on the machine slows the run but hardly changes the figure), side by side in one run,
median of ``--repeat``. Not included: Kafka and Faust (about 40 % more on top in the real worker, see
``benchmarks/RESULTS.md``). Medians are printed and written to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from realtime_scale import MESSAGES, job_scenario, regroup  # noqa: E402

from ccld.producers.simulator.sim import simulate  # noqa: E402
from ccld.schemas.codec import encode_batch  # noqa: E402
from ccld.streams.analysis.settings import AnalyzerSettings  # noqa: E402
from ccld.streams.processor import PartitionProcessor  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
EPOCH_S = 1.9e9  # message timestamps: the job's seconds from this wall-clock instant


def feed(messages: Sequence[tuple[float, bytes]]) -> float:
    """CPU seconds one partition processor spends on ``messages`` (snapshots every second included)."""
    proc = PartitionProcessor(0, AnalyzerSettings(), None)
    next_snapshot = 0.0
    c0 = time.process_time()
    for offset, (t, raw) in enumerate(messages):
        proc.handle(raw, topic="metrics", offset=offset, timestamp_s=EPOCH_S + t, recv_s=EPOCH_S + t)
        if t >= next_snapshot:
            proc.snapshot()
            next_snapshot = t + 1.0
    return time.process_time() - c0


def measure(ranks: int, duration_s: float, repeat: int, progress: Any) -> dict[str, Any]:
    stream = list(simulate(job_scenario(ranks, duration_s)))
    rows = sum(b.n for _, b in stream)
    out: dict[str, Any] = {"ranks": ranks, "duration_s": duration_s, "records": rows, "groupings": {}}
    encoded = {how: [(t, encode_batch(b)) for t, b in regroup(stream, how)] for how in MESSAGES}
    cpu: dict[str, list[float]] = {how: [] for how in MESSAGES}
    for _ in range(repeat):  # interleaved, so a noisy minute hurts every grouping alike
        for how in MESSAGES:
            cpu[how].append(feed(encoded[how]))
    for how in MESSAGES:
        med = statistics.median(cpu[how])
        n = len(encoded[how])
        out["groupings"][how] = {
            "messages": n, "messages_per_rank_s": n / ranks / duration_s, "records_per_message": rows / n,
            "cpu_s": med, "cpu_s_all": cpu[how], "us_per_message": med / n * 1e6,
            "cpu_ms_per_rank_s": med / ranks / duration_s * 1e3,
            # one core's worth of this path: the largest R it could follow in real time, Kafka and Faust aside
            "ranks_per_core": ranks * duration_s / med,
        }
        g = out["groupings"][how]
        progress(f"R={ranks} {how:>9}: {n:,} messages ({g['records_per_message']:.1f} records each), "
                 f"{g['us_per_message']:.0f} us/message, {g['cpu_ms_per_rank_s']:.3f} ms CPU per rank-second, "
                 f"one core follows {g['ranks_per_core']:,.0f} ranks")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--ranks", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--duration-s", type=float, default=30.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS / "worker-cost.json")
    args = ap.parse_args(argv)

    def progress(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    results = [measure(r, args.duration_s, args.repeat, progress) for r in args.ranks]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"repeat": args.repeat, "results": results}, indent=1) + "\n")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
