"""Per-call overhead of the torch.distributed attachment: attached vs not, same script, medians.

One gloo rank (world size 1, in process) calls small collectives in alternating blocks, with and
without ``ccld.producers.attach.attach()``, and times every call with ``perf_counter_ns``.
The records go to a counting sink by default (emission runs on the attachment's own thread,
so the training thread's cost does not depend on the sink) or, with ``--bootstrap``, to a
real broker through ``MetricsProducer``. Prints the median per-call time of each mode, the
added microseconds per call (target: < 20 us) and the ratio.

    python benchmarks/attach_overhead.py [--calls 20000] [--blocks 10] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

TARGET_US = 20.0


class CountingSink:
    def __init__(self) -> None:
        self.n = 0

    def submit(self, record: Any) -> None:
        self.n += 1

    def flush(self, timeout_s: float = 0.0) -> int:
        return 0

    def close(self, timeout_s: float = 0.0) -> None:
        pass


def time_calls(fn: Callable[[], Any], n: int) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--calls", type=int, default=20_000, help="calls per mode and case")
    p.add_argument("--blocks", type=int, default=10, help="alternating blocks per mode")
    p.add_argument("--bootstrap", default="", help="send records to this broker instead of a counting sink")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    from ccld.producers.attach import attach, detach
    from ccld.settings import Settings

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    t = torch.ones(256)
    cases: dict[str, Callable[[], Any]] = {
        "all_reduce": lambda: dist.all_reduce(t),
        "all_reduce async+wait": lambda: dist.all_reduce(t, async_op=True).wait(),
        "broadcast": lambda: dist.broadcast(t, src=0),
        "barrier": lambda: dist.barrier(),
    }
    settings = Settings.load({}, bootstrap=args.bootstrap or None, job="attach-overhead")
    per_block = max(1, args.calls // args.blocks)
    results: dict[str, dict[str, float]] = {}
    sink_records = 0
    for name, fn in cases.items():
        time_calls(fn, 200)  # warm-up
        plain: list[int] = []
        attached: list[int] = []
        for _ in range(args.blocks):
            plain += time_calls(fn, per_block)
            sink = None if args.bootstrap else CountingSink()
            attach(settings, sink=sink, markers=False)
            attached += time_calls(fn, per_block)
            stats = detach()
            sink_records += int(stats.get("records", 0))
        mp, ma = statistics.median(plain) / 1000, statistics.median(attached) / 1000
        results[name] = {"plain_us": mp, "attached_us": ma, "added_us": ma - mp, "ratio": ma / mp}
    dist.destroy_process_group()
    worst = max(r["added_us"] for r in results.values())
    if args.json:
        print(json.dumps({"cases": results, "worst_added_us": worst, "records": sink_records}))
    else:
        print(f"{'case':<24}{'plain us':>10}{'attached us':>13}{'added us':>10}{'ratio':>8}")
        for name, r in results.items():
            print(f"{name:<24}{r['plain_us']:>10.2f}{r['attached_us']:>13.2f}{r['added_us']:>10.2f}{r['ratio']:>8.3f}")
        print(f"worst added per call: {worst:.2f} us (target < {TARGET_US:.0f} us); records emitted: {sink_records}")
    return 0 if worst < TARGET_US else 1


if __name__ == "__main__":
    sys.exit(main())
