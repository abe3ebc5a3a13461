"""The NCCL profiler plugin on a real GPU: PyTorch's NCCL loads it, what it saw, and the verdict (needs NVIDIA GPUs).

One script, one call on a lent GPU machine, under 3 minutes:
1. build the plugin (gcc) and check the interface offsets against the recorded ones;
2. start one rank per GPU (at most ``--ranks``) with ``torch.multiprocessing``, each with
   ``NCCL_PROFILER_PLUGIN`` naming the plugin and ``CCLD_NCCL_DIR`` this script's directory, where this
   process polls their tables (the host aggregator's watcher) and runs the analyzer on what it reads;
3. a healthy phase of ``--healthy-s`` (all-reduces of ``--mib`` MiB, a short compute between), then, with two
   or more GPUs, the last rank stops before its next all-reduce: the others hang inside it;
4. print what the plugin saw per rank (interface version NCCL chose, communicators, events, kernels begun
   and ended, counters of the newest kernel) and every verdict; ``--out`` writes it as JSON.
NCCL allows one rank per GPU: on a one-GPU machine only the healthy phase runs (the plugin's records and the
absence of a verdict are still checked). Without a GPU or with an NCCL older than 2.26 it exits 2 saying why.

    python benchmarks/nccl_plugin_gpu.py --out nccl-gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HANG_S = 10.0


def rank_main(rank: int, world: int, port: int, mib: int, healthy_s: float, stop_rank: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    x = torch.ones(mib * 1024 * 1024 // 4, device="cuda")
    t_end = time.time() + healthy_s
    while time.time() < t_end:
        torch.cuda._sleep(2_000_000)  # a short "compute" on the GPU between all-reduces
        dist.all_reduce(x)
        torch.cuda.synchronize()
    if rank == stop_rank:
        time.sleep(HANG_S * 6)  # never enters the next all-reduce; the parent ends the job
        return
    dist.all_reduce(x)  # with a stopped rank this never completes
    torch.cuda.synchronize()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--healthy-s", type=float, default=30.0)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as exc:
        print(f"needs torch with CUDA: {exc}")
        return 2
    if not torch.cuda.is_available():
        print("no CUDA device: this script needs a GPU")
        return 2
    nccl = torch.cuda.nccl.version()
    if tuple(nccl) < (2, 26, 0):
        print(f"PyTorch's NCCL is {nccl}: the plugin needs NCCL 2.26 or later (profiler interface v4)")
        return 2
    from ccld.probe import frame, nccl_build, nccl_table
    from ccld.probe.nccl_watch import TableWatcher, announce
    from ccld.records import KernelBatch
    from ccld.streams.analysis.analyzer import Analyzer
    from ccld.streams.analysis.settings import AnalyzerSettings

    lib = nccl_build.build()
    abi_ok = nccl_build.abi_offsets() == nccl_build.recorded_offsets()
    world = max(1, min(a.ranks, torch.cuda.device_count()))
    stop_rank = world - 1 if world >= 2 else -1
    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
                              "nccl": ".".join(map(str, nccl)), "torch": torch.__version__, "ranks": world,
                              "plugin": str(lib), "abi_ok": abi_ok, "stop_rank": stop_rank}  # fmt: skip
    print(f"{report['gpu']} x {report['gpus']}, NCCL {report['nccl']}, torch {report['torch']}: {world} ranks; "
          f"plugin {lib} (interface offsets {'agree' if abi_ok else 'DIFFER'})", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="ccld-nccl-gpu-"))
    announce(tmp)
    os.environ.update(NCCL_PROFILER_PLUGIN=str(lib), CCLD_NCCL_DIR=str(tmp), CCLD_JOB="gpu-nccl-plugin")
    batches: list[KernelBatch] = []
    lock = threading.Lock()

    def sink(b: KernelBatch) -> None:
        with lock:
            batches.append(b)

    watcher = TableWatcher(tmp, sink, remove_done=False)
    an = Analyzer(AnalyzerSettings(hang_min_s=HANG_S))
    verdicts: list[Any] = []
    stop = threading.Event()
    t0 = time.time()

    def poll() -> None:
        last_eval = 0.0
        while not stop.wait(0.1):
            watcher.scan()
            watcher.poll()
            now = time.time() - t0
            with lock:
                got, batches[:] = list(batches), []
            for b in got:
                an.ingest(b, now)
            if now - last_eval >= 1.0:
                last_eval = now
                for v in an.evaluate(now):
                    verdicts.append(v)
                    print(f"  t={now:5.1f} s {v.describe()}", flush=True)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    port = 29_500 + os.getpid() % 1000
    ctx = mp.spawn(rank_main, args=(world, port, a.mib, a.healthy_s, stop_rank), nprocs=world, join=False)
    deadline = t0 + a.healthy_s + HANG_S * 4 + 30
    while time.time() < deadline:
        if ctx.join(timeout=1.0):
            break
        if stop_rank >= 0 and any(v.kind.value == "H1" for v in verdicts):
            time.sleep(2.0)
            break
    seen = []
    for path in sorted(tmp.glob("nccl-*.table")):
        t = nccl_table.NcclTable(path)
        slots = list(t.slots())
        rank, _ = nccl_table.rank_of(t.env, slots)
        kernels = []
        for s in slots:
            snap = frame.read_consistent(t.frame(s.index))
            if snap is not None and snap.kernel_index:
                sub = snap.sub_for(snap.kernel_index)
                kernels.append({"slot": s.index, "kind": s.kind, "comm_size": s.comm_size, "begun": snap.kernel_index,
                                "ended": snap.kernels_done, "inside": snap.inside, "send": list(sub.send),
                                "recv": list(sub.recv), "peak": list(sub.peak)})  # fmt: skip
        seen.append({"rank": rank, "stats": t.stats(), "frames": kernels})
        print(f"rank {rank}: profiler v{t.stats()['abi']}, {t.stats()['events']} events "
              f"({t.stats()['dropped_events']} dropped), {len(slots)} communicators/channels; "
              f"{json.dumps(kernels)[:300]}", flush=True)
    stop.set()
    poller.join(5)
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
    said = [v.describe() for v in verdicts]
    ok = abi_ok and bool(seen) and all(s["stats"]["events"] > 0 for s in seen)
    if stop_rank >= 0:
        h1 = [v for v in verdicts if v.kind.value == "H1"]
        ok = ok and bool(h1) and h1[0].root_cause_ranks == (stop_rank,)
    else:
        ok = ok and not verdicts
    report.update(tables=seen, verdicts=said, ok=ok, seconds=round(time.time() - t0, 1))
    print(f"{'OK' if ok else 'NOT OK'}: {len(said)} verdicts; {report['seconds']} s", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
