"""A small real training job for long runs: DDP on gloo, Python collectives, send/recv, evaluation, a checkpoint.

Started by ``benchmarks/long_real_job.py`` under ``torchrun`` (with or without ``ccld run``); it knows
nothing about CCL-D. Every step, on CPU with gloo:

- rank 0 broadcasts a control tensor (stop, evaluate, checkpoint), so every rank takes the same
  branch at the same step;
- "compute": a sleep of ``--compute-ms`` standing in for the GPU (the machine is shared: the job
  must not be CPU-bound), then a forward and backward pass of a few ``Linear`` layers wrapped in
  ``DistributedDataParallel`` (its gradient all-reduce is issued from C++);
- pipeline-like neighbours exchange an activation and its gradient: even rank ``r`` sends to
  ``r + 1`` and receives back from it (blocking ``send``/``recv``);
- the loss is all-reduced from Python (a metric).

Every ``--eval-every-s`` seconds of the job's clock (counted from ``--start-at``, so the cadence
survives a restart), an evaluation: a few forward passes without gradients and an all-reduce and an
all-gather of the metrics. Once, at ``--ckpt-at``, a checkpoint pause: rank 0 writes model and
optimizer to ``--ckpt-dir`` and takes ``--ckpt-pause-s`` in all, the other ranks wait at a barrier.
A rank started with ``TORCHELASTIC_RESTART_COUNT`` > 0 (torchrun restarted the group) resumes from
that checkpoint.

Each rank writes its pid to ``<log-dir>/pid-inc<I>-rank<R>`` (so a driver can kill it) and one line per
step to ``<log-dir>/steps-rank<R>.tsv``: incarnation, step, phase (train, eval, ckpt), wall time of
the step's start, the step's duration and its busy part (the step without the compute sleep), in ms.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

#: columns of the steps file, tab-separated
STEP_COLUMNS = ("incarnation", "step", "phase", "t_start", "step_ms", "busy_ms")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--start-at", type=float, required=True, help="the job's start (Unix time): the eval clock")
    p.add_argument("--end-at", type=float, required=True, help="stop at this Unix time")
    p.add_argument("--log-dir", required=True)
    p.add_argument("--ckpt-dir", default="", help="where the checkpoint goes (empty: no checkpoint, no resume)")
    p.add_argument("--ckpt-at", type=float, default=0.0, help="Unix time of the one checkpoint pause (0: none)")
    p.add_argument("--ckpt-pause-s", type=float, default=15.0)
    p.add_argument("--eval-every-s", type=float, default=0.0, help="0: no evaluation")
    p.add_argument("--eval-batches", type=int, default=5)
    p.add_argument("--compute-ms", type=float, default=75.0, help="sleep per step standing in for the GPU")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--timeout-s", type=float, default=300.0, help="gloo collective timeout")
    return p.parse_args(argv)


class Control:
    """Rank 0's decisions, broadcast every step: stop, evaluate, checkpoint."""

    def __init__(self, args: argparse.Namespace, resumed: bool) -> None:
        self.args = args
        every = args.eval_every_s
        now = time.time()
        # the next evaluation on the job's clock: a restarted group keeps the cadence
        self.next_eval = float("inf")
        if every > 0:
            self.next_eval = args.start_at + every * (int((now - args.start_at) // every) + 1)
        self.ckpt_pending = bool(args.ckpt_dir and args.ckpt_at > 0 and not resumed)

    def decide(self) -> list[float]:
        now = time.time()
        stop = now >= self.args.end_at
        ev = not stop and now >= self.next_eval
        if ev:
            while self.next_eval <= now:
                self.next_eval += self.args.eval_every_s
        ck = not stop and self.ckpt_pending and now >= self.args.ckpt_at
        if ck:
            self.ckpt_pending = False
        return [float(stop), float(ev), float(ck)]


def init_process_group(dist: Any, incarnation: int, timeout: timedelta) -> None:
    """``init_process_group("gloo")`` from torchrun's environment, its keys under a prefix of their own per
    restart.

    torchrun (2.13) hands a restarted group the agent's store as it was: with plain ``env://`` the new
    ranks read the gloo addresses the first group published there and fail to connect to the dead ones
    ("Gloo connectFullMesh failed ... Connection refused"). A prefix per restart count keeps each
    group's keys apart (the shared rendezvous store and restarts: pytorch/pytorch#135712, where
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` is the other way out)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_store and rank == 0, timeout=timeout)
    prefixed = dist.PrefixStore(f"long-job/incarnation-{incarnation}", store)
    dist.init_process_group("gloo", store=prefixed, rank=rank, world_size=world, timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)  # two shared cores: no intra-op thread pool
    incarnation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    init_process_group(dist, incarnation, timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / f"pid-inc{incarnation}-rank{rank}").write_text(str(os.getpid()))
    torch.manual_seed(1234 + rank)
    w = args.width
    model = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    step = 0
    ckpt = Path(args.ckpt_dir) / "ckpt.pt" if args.ckpt_dir else None
    resumed = bool(ckpt is not None and incarnation > 0 and ckpt.exists())
    if resumed and ckpt is not None:
        state: dict[str, Any] = torch.load(ckpt, map_location="cpu")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
    print(f"rank {rank}/{world} pid {os.getpid()} incarnation {incarnation} ready"
          f"{f' (resumed at step {step})' if resumed else ''}", flush=True)
    control = Control(args, resumed)
    flags = torch.zeros(3)
    metric = torch.zeros(1)
    peer = rank + 1 if rank % 2 == 0 else rank - 1
    act = torch.empty(args.batch, w)
    out = open(log_dir / f"steps-rank{rank}.tsv", "a", buffering=1)  # noqa: SIM115 - line-buffered: a killed rank keeps its lines
    sleep_s = args.compute_ms / 1000.0
    try:
        while True:
            t0 = time.time()
            p0 = time.perf_counter()
            if rank == 0:
                flags = torch.tensor(control.decide())
            dist.broadcast(flags, src=0)
            stop, ev, ck = (bool(x) for x in flags.tolist())
            if stop:
                break
            phase = "train"
            slept = 0.0
            if ck and ckpt is not None:
                phase = "ckpt"
                if rank == 0:
                    ckpt.parent.mkdir(parents=True, exist_ok=True)
                    tmp = ckpt.with_suffix(".tmp")
                    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
                    os.replace(tmp, ckpt)
                    rest = args.ckpt_pause_s - (time.perf_counter() - p0)
                    if rest > 0:  # a real checkpoint of a big model takes this long
                        time.sleep(rest)
                        slept += rest
                    print(f"rank 0 wrote a checkpoint at step {step} ({time.perf_counter() - p0:.1f} s)", flush=True)
                dist.barrier()
            elif ev:
                phase = "eval"
                ddp.eval()
                stats = torch.zeros(3)  # loss sum, correct, samples
                with torch.no_grad():
                    for _ in range(args.eval_batches):
                        time.sleep(sleep_s / 2)
                        slept += sleep_s / 2
                        x, y = torch.randn(args.batch, w), torch.randint(0, 10, (args.batch,))
                        logits = ddp(x)
                        stats += torch.tensor([float(F.cross_entropy(logits, y, reduction="sum")),
                                               float((logits.argmax(1) == y).sum()), float(args.batch)])
                dist.all_reduce(stats)
                gathered = [torch.zeros(3) for _ in range(world)]
                dist.all_gather(gathered, stats)
                ddp.train()
                if rank == 0:
                    print(f"eval at step {step}: loss {float(stats[0] / stats[2]):.4f}", flush=True)
            else:
                time.sleep(sleep_s)
                slept += sleep_s
                x, y = torch.randn(args.batch, w), torch.randint(0, 10, (args.batch,))
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(ddp(x), y)
                loss.backward()  # DDP's gradient all-reduce (from C++)
                opt.step()
                # pipeline-like neighbours: an activation forward, its gradient back
                if rank % 2 == 0 and peer < world:
                    dist.send(x.detach(), peer)
                    dist.recv(act, peer)
                elif rank % 2 == 1:
                    dist.recv(act, peer)
                    dist.send(act * 0.5, peer)
                metric.fill_(loss.item())
                dist.all_reduce(metric)  # the loss, averaged below
                step += 1
            dur = time.perf_counter() - p0
            out.write(f"{incarnation}\t{step}\t{phase}\t{t0:.3f}\t{dur * 1000:.3f}\t{(dur - slept) * 1000:.3f}\n")
    finally:
        out.close()
    dist.destroy_process_group()
    print(f"rank {rank} incarnation {incarnation} done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
