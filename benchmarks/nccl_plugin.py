"""NCCL profiler plugin: what each call costs NCCL's threads, and what the plugin's records let the analyzer name.

1. **Cost per event.** ``probe/nccl/bench_events.c`` (built here with gcc) loads the plugin with ``dlopen`` and
   calls it as NCCL does for ring all-reduces (2 channels, 8 send and 8 receive proxy steps each: 176 calls
   per op), paced to ``--rate`` events per second, timing every call with CLOCK_MONOTONIC (the clock's own
   cost subtracted). ``--repeats`` runs; the table gives the medians of their medians and p99s, per kind of
   call and over all, and the time per all-reduce.
2. **Verdicts.** Jobs replayed into the plugin on a virtual clock (``stack.nccl_check``), one fault each: a
   4-rank ring (H1, H3, S1 3x and 1.5x, S2 3x and 1.5x), two 4-rank rings of an 8-rank job, a 4-stage
   pipeline of send/recv; and a healthy ring of ``--healthy-s``: what the analyzer said, and how many job
   seconds after the onset.

    python benchmarks/nccl_plugin.py --out benchmarks/results/nccl-plugin.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ccld.probe import nccl_build
from ccld.probe.nccl_replay import RingJob
from ccld.probe.nccl_watch import announce
from ccld.records import VerdictState
from ccld.stack.nccl_check import replay_verdicts

#: a forward pipeline: each rank a stage sending its micro-batches to the next (NCCL's send/recv channels)
PIPE: dict[str, Any] = {"shape": "pipeline", "compute_s": 0.4, "op_s": 0.05}
FAULTS: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("H1 rank 2", {"fault": "H1", "rank": 2}, "H1 (2,)"),
    ("H3 link 1->2 ch 1", {"fault": "H3", "rank": 1, "channel": 1}, "H3 1->2 ch 1"),
    ("S1 rank 1, 3x", {"fault": "S1", "rank": 1, "factor": 3.0}, "S1 (1,)"),
    ("S1 rank 1, 1.5x", {"fault": "S1", "rank": 1, "factor": 1.5}, "S1 (1,)"),
    ("S2 link 2->3, 3x", {"fault": "S2", "rank": 2, "factor": 3.0}, "S2 2->3"),
    ("S2 link 2->3, 1.5x", {"fault": "S2", "rank": 2, "factor": 1.5}, "S2 2->3"),
    ("8 ranks, two 4-rank rings: H1 rank 6", {"nranks": 8, "group_size": 4, "fault": "H1", "rank": 6}, "H1 (6,)"),
    ("8 ranks, two 4-rank rings: H3 link 7->4 ch 0", {"nranks": 8, "group_size": 4, "fault": "H3", "rank": 7},
     "H3 7->4 ch 0"),
    ("pipeline of 4 stages: H1 stage 2", {**PIPE, "fault": "H1", "rank": 2}, "H1 (2,)"),
    ("pipeline: H3 link 1->2", {**PIPE, "fault": "H3", "rank": 1}, "H3 1->2"),
    ("pipeline: S1 stage 2, 2x", {**PIPE, "fault": "S1", "rank": 2, "factor": 2.0}, "S1 (2,)"),
    ("pipeline: S2 link 1->2, 3x", {**PIPE, "fault": "S2", "rank": 1, "factor": 3.0}, "S2 1->2"),
)


def event_costs(rate: float, seconds: float, repeats: int) -> dict[str, Any]:
    lib = nccl_build.build()
    with tempfile.TemporaryDirectory(prefix="ccld-nccl-bench-") as tmp:
        exe = Path(tmp) / "bench_events"
        src = nccl_build.source_dir()
        subprocess.run([nccl_build.compiler(), "-std=c11", "-O2", "-I", str(src), "-o", str(exe),
                        str(src / "bench_events.c"), "-ldl"], check=True)  # fmt: skip
        d = Path(tmp) / "dir"
        announce(d)
        runs = []
        for i in range(repeats):
            out = Path(tmp) / f"run{i}.json"
            subprocess.run([str(exe), str(lib), str(seconds), str(rate), str(out)], check=True,
                           env=dict(os.environ, CCLD_NCCL_DIR=str(d)))  # fmt: skip
            runs.append(json.loads(out.read_text()))
            print(f"  run {i + 1}/{repeats}: {runs[-1]['events_per_s']:.0f} events/s, median "
                  f"{runs[-1]['all']['median_ns']} ns, p99 {runs[-1]['all']['p99_ns']} ns", flush=True)
    med = statistics.median
    kinds = runs[0]["calls"].keys()
    return {
        "rate_asked": rate,
        "events_per_s": med(r["events_per_s"] for r in runs),
        "clock_cost_ns": med(r["clock_cost_ns"] for r in runs),
        "all": {k: med(r["all"][k] for r in runs) for k in ("median_ns", "p99_ns", "mean_ns", "per_op_ns")},
        "calls": {k: {m: med(r["calls"][k][m] for r in runs) for m in ("median_ns", "p99_ns")} for k in kinds},
        "runs": runs,
    }


def claim(v: Any) -> str:
    if v.link is not None:
        ch = f" ch {v.channel}" if v.kind.value == "H3" and v.channel is not None else ""
        return f"{v.kind.value} {v.link.src}->{v.link.dst}{ch}"
    return f"{v.kind.value} {v.root_cause_ranks}"


def verdicts(healthy_s: float, onset_s: float = 15.0, duration_s: float = 45.0) -> list[dict[str, Any]]:
    rows = []
    for label, fault, want in FAULTS:
        res = replay_verdicts(RingJob(onset_s=onset_s, duration_s=duration_s, **fault))
        opened = [v for v in res.verdicts if v.state == VerdictState.OPEN]
        rows.append({"case": label, "want": want, "said": [claim(v) for v in opened],
                     "ok": [claim(v) for v in opened] == [want],
                     "ttv_s": [round(v.detected_time - onset_s, 1) for v in opened], "wall_s": round(res.wall_s, 2),
                     "calls": res.calls, "records": res.records})  # fmt: skip
        print(f"  {label}: {rows[-1]['said']} after {rows[-1]['ttv_s']} s", flush=True)
    res = replay_verdicts(RingJob(duration_s=healthy_s, channels=4), past_end_s=120.0)
    rows.append({"case": f"healthy, {healthy_s:.0f} s + 120 s past its end", "want": "nothing",
                 "said": [claim(v) for v in res.verdicts], "ok": not res.verdicts, "ttv_s": [],
                 "wall_s": round(res.wall_s, 2), "calls": res.calls, "records": res.records})  # fmt: skip
    print(f"  healthy: {rows[-1]['said'] or 'nothing'} ({res.calls} calls, {res.wall_s:.1f} s)", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rate", type=float, default=100_000, help="events per second per process (default 100,000)")
    ap.add_argument("--seconds", type=float, default=10.0, help="per timing run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--healthy-s", type=float, default=600.0)
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args(argv)
    print(f"cost per event at {a.rate:,.0f} events/s, {a.repeats} x {a.seconds:.0f} s:", flush=True)
    costs = event_costs(a.rate, a.seconds, a.repeats)
    print("verdicts from the plugin's records (virtual clock):", flush=True)
    rows = verdicts(a.healthy_s)
    print()
    print("| call | median (ns) | p99 (ns) |")
    print("|---|---|---|")
    for k, v in costs["calls"].items():
        print(f"| {k} | {v['median_ns']:.0f} | {v['p99_ns']:.0f} |")
    al = costs["all"]
    print(f"| **every call** | **{al['median_ns']:.0f}** (mean {al['mean_ns']:.0f}) | **{al['p99_ns']:.0f}** |")
    print(f"\n{costs['events_per_s']:,.0f} events/s held; {al['per_op_ns'] / 1000:.1f} us of plugin time per "
          f"all-reduce "
          f"(176 calls); clock cost {costs['clock_cost_ns']:.0f} ns subtracted\n")
    print("| case | said | job s after onset | wall |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {', '.join(r['said']) or 'nothing'}{'' if r['ok'] else ' (WRONG)'} | "
              f"{', '.join(map(str, r['ttv_s'])) or '-'} | {r['wall_s']} s |")
    if a.out:
        doc = {"machine": platform.node(), "python": sys.version.split()[0], "costs": costs, "verdicts": rows}
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
