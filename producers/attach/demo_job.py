"""A small torch.distributed (gloo) training loop with injectable faults, for demos and fault tests.

Run it under ``ccld run -- torchrun --standalone --nproc-per-node 4 -m ccld.producers.attach.demo_job``
(or any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Each step sleeps
``--compute-ms`` ("compute") and then all-reduces a float tensor. ``--fault`` breaks one rank
(``--culprit``) from step ``--at-step`` on:

- ``sleep``: the culprit sleeps forever before the collective (H1)
- ``stop``: the culprit sends itself SIGSTOP before the collective (H1)
- ``pause``: at ``--at-step`` only, the culprit prints "pauses" and sleeps ``--pause-s`` before
  the collective: a window in which a test stops it from outside (SIGSTOP)
- ``dtype`` / ``count`` / ``op``: the culprit calls all_reduce on int32 instead of float32 (same
  bytes: gloo does not notice and sums garbage), with half the elements (gloo aborts the
  processes within milliseconds), or calls all_gather instead (everyone hangs) (H2)
- ``slow``: the culprit's compute takes ``--slow-factor`` times longer (S1)

``--fr-dir DIR`` dumps the Flight Recorder of every rank that can still run
(``rank<R>.pkl``, or ``.json`` with ``--fr-json``) ``--fr-after-s`` seconds after the fault
step, and at the end of a clean run. The script knows nothing about CCL-D.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

FAULTS = ("none", "sleep", "stop", "pause", "dtype", "count", "op", "slow")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--duration-s", type=float, default=0.0, help="stop after this long (0: use --steps)")
    p.add_argument("--compute-ms", type=float, default=20.0)
    p.add_argument("--elements", type=int, default=4096)
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--culprit", type=int, default=1)
    p.add_argument("--at-step", type=int, default=10)
    p.add_argument("--slow-factor", type=float, default=5.0)
    p.add_argument("--pause-s", type=float, default=3.0)
    p.add_argument("--timeout-s", type=float, default=120.0, help="gloo collective timeout")
    p.add_argument("--mix", action="store_true", help="each step also runs other collectives and ring p2p")
    p.add_argument("--fr-dir", default=None)
    p.add_argument("--fr-json", action="store_true")
    p.add_argument("--fr-after-s", type=float, default=3.0)
    return p.parse_args(argv)


def dump_flight_recorder(directory: str, rank: int, as_json: bool) -> Path:
    import torch

    c10d: Any = torch._C._distributed_c10d
    data = c10d._dump_fr_trace_json() if as_json else c10d._dump_fr_trace()
    path = Path(directory) / f"rank{rank}.{'json' if as_json else 'pkl'}"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data if isinstance(data, bytes) else str(data).encode())
    os.replace(tmp, path)
    return path


def mixed_step(dist: Any, torch: Any, rank: int, world: int, groups: list[Any]) -> None:
    """Async all_gather, broadcast, reduce_scatter, a subgroup all_reduce and a p2p ring."""
    small = torch.full((16,), float(rank))
    work = dist.all_gather_into_tensor(torch.empty(16 * world), small, async_op=True)
    dist.broadcast(small, src=0)
    dist.reduce_scatter_tensor(torch.empty(16), torch.ones(16 * world))
    work.wait()
    dist.all_reduce(torch.ones(8, dtype=torch.float64), group=groups[rank % 2])
    ops = [
        dist.P2POp(dist.isend, torch.ones(32), (rank + 1) % world),
        dist.P2POp(dist.irecv, torch.empty(32), (rank - 1) % world),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    if rank % 2 == 0:
        dist.send(torch.ones(4, dtype=torch.int64), rank + 1)
    else:
        dist.recv(torch.empty(4, dtype=torch.int64), rank - 1)
    dist.barrier()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # Flight Recorder on (gloo records too)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.fr_dir:
        Path(args.fr_dir).mkdir(parents=True, exist_ok=True)
    tensor = torch.ones(args.elements)
    # every rank creates every group, in the same order (torch requires it)
    pairs = [dist.new_group([r for r in range(world) if r % 2 == parity]) for parity in (0, 1)] if args.mix else []
    culprit = rank == args.culprit and args.fault != "none"
    started = time.monotonic()
    timer: threading.Timer | None = None
    print(f"rank {rank}/{world} pid {os.getpid()} ready", flush=True)
    for step in range(args.steps):
        if args.duration_s and time.monotonic() - started > args.duration_s:
            break
        faulty = culprit and step >= args.at_step
        if step == args.at_step and args.fr_dir and args.fault != "none":
            timer = threading.Timer(args.fr_after_s, dump_flight_recorder, (args.fr_dir, rank, args.fr_json))
            timer.daemon = True
            timer.start()
        compute_s = args.compute_ms / 1000.0
        time.sleep(compute_s * (args.slow_factor if faulty and args.fault == "slow" else 1.0))
        if faulty and args.fault == "sleep":
            print(f"rank {rank} sleeps forever before step {step}", flush=True)
            while True:
                time.sleep(3600)
        if faulty and args.fault == "pause" and step == args.at_step:
            print(f"rank {rank} pauses before step {step}", flush=True)
            time.sleep(args.pause_s)
        if faulty and args.fault == "stop":
            print(f"rank {rank} stops itself before step {step}", flush=True)
            time.sleep(0.5)  # let the attachment ship what it has
            os.kill(os.getpid(), signal.SIGSTOP)
        if faulty and args.fault == "dtype":
            dist.all_reduce(tensor.int())
        elif faulty and args.fault == "count":
            dist.all_reduce(tensor[: args.elements // 2].clone())
        elif faulty and args.fault == "op":
            dist.all_gather([torch.empty_like(tensor) for _ in range(world)], tensor)
        else:
            dist.all_reduce(tensor)
        if args.mix:
            mixed_step(dist, torch, rank, world, pairs)
        tensor.fill_(1.0)
    if timer is not None:
        timer.cancel()
    if args.fr_dir:
        time.sleep(0.3)  # gloo retires Flight Recorder entries lazily, after the op returned
        dump_flight_recorder(args.fr_dir, rank, args.fr_json)
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
