"""GPU probe benchmark: correctness of the instrumented ring and probe overhead (needs an NVIDIA GPU).

One script, under 5 minutes on one GPU:
1. compile ``probe/cuda`` with CuPy's RawModule (NVRTC), timed;
2. run the reference all-reduce for 4 ranks x 8 channels and check the reduction against numpy;
3. check that the frames decode into the expected records for a healthy run, a stopped rank and a
   slowed link (``ccld.probe.gpu_scenarios``);
4. time probe-on against probe-off per operation at 1 MiB .. 256 MiB (median) and print a table.
The JSON (``--out``) holds every figure. Without a GPU it exits 2 with a message saying why.

    python benchmarks/gpu_probe.py --out gpu-probe.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict
from typing import Any

SIZES_MIB = (1, 4, 16, 64, 256)
TARGET_OVERHEAD_PCT = 1.0
BUDGET_S = 270.0


def _iters(size_mib: int, quick: bool) -> int:
    base = 30 if size_mib <= 16 else (12 if size_mib <= 64 else 6)
    return max(3, base // 3) if quick else base


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--sizes-mib", type=int, nargs="+", default=list(SIZES_MIB))
    ap.add_argument("--quick", action="store_true", help="fewer timing iterations")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--channels", type=int, default=8)
    args = ap.parse_args(argv)

    from ccld.errors import CcldError
    from ccld.probe.errors import GpuUnavailableError
    from ccld.probe.gpu import compile_module, require_device

    t_start = time.monotonic()
    try:
        cp = require_device()
    except GpuUnavailableError as exc:
        print(f"gpu_probe: no GPU, nothing measured: {exc}", file=sys.stderr)
        return 2

    from ccld.probe import gpu_scenarios as sc
    from ccld.probe import layout

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    report: dict[str, Any] = {
        "device": name,
        "compute_capability": dev.compute_capability,
        "cupy": cp.__version__,
        "python": platform.python_version(),
        "ranks": args.ranks,
        "channels": args.channels,
        "frame_bytes_per_rank": layout.FRAME_SIZE,
        "device_scratch_bytes_per_rank": layout.DEV_SCRATCH_SIZE,
    }
    print(f"device: {name} (sm_{dev.compute_capability}), CuPy {cp.__version__}")
    try:
        t0 = time.monotonic()
        ring = compile_module("ccld_ring.cu")
        compile_module("ccld_markers.cu")
        report["compile_s"] = time.monotonic() - t0
        print(f"RawModule compile: {report['compile_s']:.2f} s")

        checks = [
            sc.check_healthy(ring, args.ranks, args.channels),
            sc.check_stopped(ring, args.ranks, args.channels),
            sc.check_slow_link(ring, args.ranks, args.channels),
        ]
        report["checks"] = [asdict(c) for c in checks]
        for c in checks:
            print(f"{'PASS' if c.ok else 'FAIL'} {c.name:<13} {c.seconds:6.2f} s  {c.records:5d} records  {c.detail}")

        rows = []
        for size in args.sizes_mib:
            if time.monotonic() - t_start > BUDGET_S:
                print(f"time budget spent: sizes from {size} MiB on skipped")
                break
            rows.append(sc.time_ops(ring, size << 20, _iters(size, args.quick), args.ranks, args.channels))
        report["timing"] = rows
    except CcldError as exc:
        print(f"gpu_probe: {exc}", file=sys.stderr)
        report["error"] = str(exc)
        rows, checks = report.get("timing", []), []

    print()
    print(f"{'size':>8} {'iters':>5} {'probe off ms':>13} {'probe on ms':>12} {'overhead':>9}")
    for r in rows:
        print(
            f"{int(r['size_bytes']) >> 20:>5} MiB {int(r['iters']):>5} {r['median_off_ms']:>13.4f} "
            f"{r['median_on_ms']:>12.4f} {r['overhead_pct']:>8.2f}%"
        )
    worst = max((r["overhead_pct"] for r in rows), default=float("nan"))
    report["worst_overhead_pct"] = worst
    report["target_overhead_pct"] = TARGET_OVERHEAD_PCT
    report["total_s"] = time.monotonic() - t_start
    print(f"worst overhead {worst:.2f}% (target < {TARGET_OVERHEAD_PCT}%); total {report['total_s']:.0f} s")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
        print(f"wrote {args.out}")
    ok = "error" not in report and all(c.ok for c in checks) and bool(rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
