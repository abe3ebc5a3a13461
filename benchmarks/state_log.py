"""What the worker's state log costs over a stream of jobs: messages and bytes written, the largest message, what a
compacted log keeps, and how long a restart takes to read it back.

One metrics partition takes ``--jobs`` simulated jobs of 8 to 64 ranks (random layouts, an H1 or S1 in every third),
each ``--job-s`` long, a new one every ``--every-s``; the worker's timer and checkpoint run once per second of job
time, as a caught-up worker does. The snapshot goes out the way the worker writes it (``WorkerState``: a head and a
part per job, only the changed ones, tombstones for forgotten jobs) and, side by side, the way it was written
before (one blob per partition, when it changed). A compacted changelog (Apache Kafka) keeps the newest message
per key; the embedded broker keeps every one (it never compacts). The restart is ``WorkerState.processor`` on what
the compacted log holds at the busiest moment: the time to decode and rebuild every job then held.

    python benchmarks/state_log.py [--jobs 60] [--job-s 120] [--every-s 20] [--seed 1] [--out F.json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import heapq
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


class MemoryChangelog:
    """The changelog topic: every message sent, in order (what an uncompacted broker keeps)."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes | None]] = []

    async def send(self, *, key: bytes, value: bytes | None, **_: Any) -> asyncio.Future[None]:
        self.sent.append((key, value))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


class MemoryTable:
    """The worker's Faust table as ``WorkerState`` uses it: the data by key and the changelog it writes (the unit
    tests of ``WorkerState`` use it too)."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.changelog_topic = MemoryChangelog()

    def send_changelog(self, partition: int, key: bytes, value: bytes | None) -> None:
        self.changelog_topic.sent.append((key, value))

    def compacted(self) -> dict[bytes, bytes]:
        """What a compacted changelog keeps (and a restarted worker's table recovers): the newest per key."""
        out: dict[bytes, bytes] = {}
        for key, value in self.changelog_topic.sent:
            if value is None:
                out.pop(key, None)
            else:
                out[key] = value
        return out


def scenarios(n: int, job_s: float, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ranks = int(rng.choice([8, 16, 32, 64]))
        tp = int(rng.choice([t for t in (1, 2, 4, 8) if ranks % t == 0]))
        pp = int(rng.choice([p for p in (1, 2, 4) if (ranks // tp) % p == 0]))
        faults = []
        if i % 3 == 2:
            kind = str(rng.choice(["H1", "S1"]))
            f: dict[str, Any] = {"kind": kind, "rank": int(rng.integers(ranks)), "onset_s": round(job_s * 0.4, 1)}
            if kind == "S1":
                f["factor"] = 3.0
            faults.append(f)
        out.append({"id": f"job-{i:04d}", "seed": seed * 1000 + i, "ranks": ranks,
                    "layout": {"tp": tp, "pp": pp, "dp": ranks // tp // pp}, "channels": 2,
                    "step_time_s": 1.0, "duration_s": job_s, "faults": faults})
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ccld.producers.simulator.emit import EPOCH_NS
    from ccld.producers.simulator.scenario import Scenario
    from ccld.producers.simulator.sim import simulate
    from ccld.schemas.codec import encode_batch
    from ccld.settings import AnalyzerSettings, Settings
    from ccld.streams.processor import PartitionProcessor
    from ccld.streams.worker_state import WorkerState

    analyzer = AnalyzerSettings(job_expiry_s=args.expiry_s)
    settings = Settings(worker_snapshot_max_bytes=1 << 30)
    table = MemoryTable()
    st: WorkerState[PartitionProcessor] = WorkerState(
        settings, table, "m", restore=lambda p, raw, parts: PartitionProcessor.restore(p, analyzer, raw, parts=parts))
    proc = st.processor(0)
    # every job's messages on one time line (job i starts at i * every_s)
    stream: list[tuple[float, bytes]] = []
    for i, sc in enumerate(scenarios(args.jobs, args.job_s, args.seed)):
        start = i * args.every_s
        stream += [(start + t, encode_batch(b)) for t, b in simulate(Scenario.from_dict(sc))]
        print(f"\rsimulated {i + 1}/{args.jobs} jobs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    stream = list(heapq.merge(sorted(stream, key=lambda m: m[0])))
    end = stream[-1][0] + args.expiry_s + 60.0
    old_msgs = old_bytes = old_max = 0
    old_digest = b""
    held_max = 0
    peak: dict[bytes, bytes] = {}
    k, offset, t = 0, 0, 0.0
    wall0 = EPOCH_NS / 1e9  # the worker's wall clock at time 0: records arrive as they are stamped
    seconds = math.ceil(end)
    for sec in range(seconds):
        t = float(sec + 1)
        while k < len(stream) and stream[k][0] < t:
            ts, raw = stream[k]
            proc.handle(raw, topic="m", offset=offset, timestamp_s=wall0 + ts, recv_s=wall0 + ts)
            k, offset = k + 1, offset + 1
        for v, _ in proc.tick(recv_s=wall0 + t, caught_up=True):
            proc.mark_sent(v)
        busiest = len(proc.jobs) >= held_max
        held_max = max(held_max, len(proc.jobs))
        blob = proc.snapshot()
        d = hashlib.blake2b(blob, digest_size=16).digest()
        if d != old_digest:
            old_digest, old_msgs, old_bytes = d, old_msgs + 1, old_bytes + len(blob)
            old_max = max(old_max, len(blob))
        asyncio.run(st.checkpoint(0, force=True))
        if busiest:  # what a compacted log holds at the busiest moment: what a restart then reads
            peak = table.compacted()
        if sec % 60 == 0:
            print(f"\r{sec}/{seconds} s of job time, {len(proc.jobs)} jobs held", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    sent = table.changelog_topic.sent
    compacted = table.compacted()
    restarts = []
    for _ in range(args.repeat):
        again: WorkerState[PartitionProcessor] = WorkerState(settings, MemoryTable(), "m", restore=st._restore)
        again.table.data = dict(peak)
        began = time.perf_counter()
        back = again.processor(0)
        restarts.append(time.perf_counter() - began)
    assert len(back.jobs) == held_max
    return {
        "jobs": args.jobs, "job_s": args.job_s, "every_s": args.every_s, "job_time_s": seconds,
        "messages": offset, "jobs_held_max": held_max, "jobs_held_end": len(proc.jobs),
        "one_blob": {"messages": old_msgs, "bytes": old_bytes, "largest": old_max},
        "parts": {"messages": len(sent), "bytes": sum(len(v or b"") for _, v in sent),
                  "largest": max((len(v or b"") for _, v in sent), default=0),
                  "tombstones": sum(v is None for _, v in sent)},
        "compacted_end": {"messages": len(compacted), "bytes": sum(len(v) for v in compacted.values())},
        "compacted_busiest": {"messages": len(peak), "bytes": sum(len(v) for v in peak.values())},
        "restart_busiest_s_median": sorted(restarts)[len(restarts) // 2],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--job-s", type=float, default=120.0)
    ap.add_argument("--every-s", type=float, default=20.0)
    ap.add_argument("--expiry-s", type=float, default=300.0, help="the analyzer's job_expiry_s (default 300)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5, help="restarts timed (median)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    res = run(args)
    text = json.dumps(res, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
