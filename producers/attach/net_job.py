"""Real gloo training shapes for the network and job-shape tests: a pipeline with DDP in each stage, FSDP, MoE.

Run under ``ccld run -- torchrun ...`` like ``demo_job`` (any launcher that sets RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT); the script knows nothing about CCL-D.

- ``--shape pipe``: ``world / dp`` pipeline stages of ``dp`` ranks (rank r is in stage ``r // dp``).
  Each step, every stage runs ``--micro-batches`` forward micro-batches (receive the activation from
  the rank ``dp`` below, compute, send it on to the rank ``dp`` above) and as many backward ones
  (the gradient the other way), then a ``DistributedDataParallel`` backward whose gradient
  all-reduce runs over the stage's data-parallel group (torch's C++ reducer issues it, as in any
  DDP job). The pipeline send/recv pairs and the data-parallel rings cross the ranks' links. With
  ``--dp`` the world size it is one stage: pure data parallel, DDP alone; with ``--dp 1`` it is a
  pipeline only (no data-parallel group, no DDP: send/recv between the stages and nothing else).
- ``--shape fsdp``: pure data parallel with FSDP (``fully_shard``, FSDP2): ``--layers`` linear layers,
  each sharded over every rank, so each step all-gathers every layer's parameters in the forward and
  again in the backward and reduce-scatters its gradients (torch issues them; the script only
  calls the model and steps the optimizer). The step's compute is spent inside the layers, half in
  their forwards and half in their backwards, so a slow rank is late at every layer's collectives.
- ``--shape moe``: every rank holds one expert. Each step it computes, dispatches its tokens to the
  experts with ``all_to_all_single`` (uneven splits drawn per step by a router seeded alike on every
  rank, so the sizes agree and vary from step to step and rank to rank), computes its expert on
  what it received, sends the results back with a second ``all_to_all_single`` (whose input size is
  then what the router sent it) and all-reduces the dense gradients. gloo has ``all_to_all_single``
  with uneven splits (alltoallv); its list form ``all_to_all`` needs equal sizes.

``--fault slow`` makes ``--culprit`` compute ``--slow-factor`` times longer from step ``--at-step``
(S1; in ``moe`` its expert only); ``--fault sleep`` stops it for good at that step (H1: in ``moe``
before the combine, so the others wait in an all_to_all whose sizes differ from rank to rank;
elsewhere before the step's first call); ``--fault pause`` stops it once for ``--pause-s`` and goes
on (a one-off stall: a slow checkpoint write, a page-cache flush, a preempted host); a slow link is
shaped from outside (``netns.NetnsJob.throttle``), the script is the same.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from datetime import timedelta
from typing import Any


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--shape", choices=("pipe", "moe", "fsdp"), default="pipe")
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--compute-ms", type=float, default=20.0, help="compute per micro-batch (pipe) or step (moe)")
    p.add_argument("--elements", type=int, default=65536, help="floats per activation (pipe) or per token row x tokens")
    p.add_argument("--dp", type=int, default=2, help="data-parallel ranks per pipeline stage (pipe)")
    p.add_argument("--micro-batches", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256, help="model width: hidden x hidden per layer (pipe, fsdp)")
    p.add_argument("--layers", type=int, default=4, help="linear layers, each sharded on its own (fsdp)")
    p.add_argument("--tokens", type=int, default=512, help="tokens each rank dispatches per step (moe)")
    p.add_argument("--width", type=int, default=128, help="floats per token (moe)")
    p.add_argument("--fault", choices=("none", "slow", "sleep", "pause"), default="none")
    p.add_argument("--pause-s", type=float, default=20.0, help="how long --fault pause stops the culprit, once")
    p.add_argument("--culprit", type=int, default=2)
    p.add_argument("--at-step", type=int, default=0)
    p.add_argument("--slow-factor", type=float, default=5.0)
    p.add_argument("--timeout-s", type=float, default=120.0, help="gloo timeout")
    return p.parse_args(argv)


def pipe_step(dist: Any, torch: Any, args: argparse.Namespace, rank: int, world: int, ddp: Any,
              compute_s: float) -> None:  # fmt: skip
    """One step of a pipeline stage: micro-batches forward and backward over send/recv, then DDP's backward."""
    stage, stages = rank // args.dp, world // args.dp
    below, above = rank - args.dp, rank + args.dp
    act = torch.ones(args.elements)
    for _ in range(args.micro_batches):  # forward
        if stage > 0:
            dist.recv(act, below)
        time.sleep(compute_s)
        if stage < stages - 1:
            dist.send(act, above)
    for _ in range(args.micro_batches):  # backward
        if stage < stages - 1:
            dist.recv(act, above)
        time.sleep(compute_s)
        if stage > 0:
            dist.send(act, below)
    if ddp is not None:  # the reducer all-reduces the gradients over the stage's data-parallel group
        ddp(torch.ones(8, args.hidden)).sum().backward()


def fsdp_step(torch: Any, args: argparse.Namespace, model: Any, opt: Any, compute_s: float) -> None:
    """One FSDP step: a forward and backward through the sharded layers (each all-gathers its parameters,
    twice, and reduce-scatters its gradients) and the update. The step's compute is spent inside the
    layers, half in their forwards and half in their backwards (``layer_compute``), as a GPU spends it:
    a slow rank is late at every layer's collectives, not only at the step's first."""
    model.compute_s = compute_s
    model(torch.ones(8, args.hidden)).sum().backward()
    opt.step()
    opt.zero_grad()


def layer_compute(model: Any) -> None:
    """Hooks on each layer of ``model`` that spend ``model.compute_s / (2 x layers)`` after its forward and
    as much in its backward, before its gradients are reduce-scattered (the tiny layers compute nothing)."""
    layers = list(model)

    def spend() -> None:
        time.sleep(model.compute_s / (2 * len(layers)))

    def after_forward(module: Any, inputs: Any, out: Any) -> None:
        spend()
        if out.requires_grad:
            out.register_hook(lambda grad: spend())  # the layer's backward starts from its output's gradient

    for layer in layers:
        layer.register_forward_hook(after_forward)


def moe_step(dist: Any, torch: Any, args: argparse.Namespace, rank: int, world: int, step: int,
             dense: Any, expert_factor: float) -> None:  # fmt: skip
    """One MoE layer: route, dispatch (all_to_all_single), expert compute, combine, dense all-reduce.

    ``expert_factor`` slows this rank's expert only (a straggling expert): its lateness shows at the
    combine, the all_to_all whose input sizes are what the router sent each rank."""
    compute_s = args.compute_ms / 1000.0
    router = random.Random(step)  # the same draw on every rank: the split sizes agree
    # routed[i][j]: tokens rank i sends to expert j this step (each rank sends all its tokens)
    routed = []
    for _ in range(world):
        cuts = sorted(router.randint(0, args.tokens) for _ in range(world - 1))
        routed.append([b - a for a, b in zip([0, *cuts], [*cuts, args.tokens], strict=True)])
    send = routed[rank]
    recv = [routed[i][rank] for i in range(world)]
    w = args.width
    time.sleep(compute_s)  # attention and the router
    tokens = torch.ones(args.tokens * w)
    got = torch.empty(sum(recv) * w)
    dist.all_to_all_single(got, tokens, [n * w for n in recv], [n * w for n in send])
    if expert_factor == float("inf"):  # a hung expert: its peers wait in the combine, each with its own size
        print(f"rank {rank} sleeps forever before the combine of step {step}", flush=True)
        while True:
            time.sleep(3600)
    time.sleep(compute_s * expert_factor * sum(recv) / args.tokens)  # the expert, on what it was sent
    back = torch.empty(args.tokens * w)
    dist.all_to_all_single(back, got, [n * w for n in send], [n * w for n in recv])
    dist.all_reduce(dense)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = sharded = opt = None
    torch.manual_seed(0)
    if args.shape == "pipe" and args.dp > 1:
        if world % args.dp:
            raise SystemExit(f"--dp {args.dp} must divide the world ({world}) into stages")
        # every rank creates every group, in the same order (torch requires it)
        groups = [dist.new_group(list(range(s * args.dp, (s + 1) * args.dp))) for s in range(world // args.dp)]
        ddp = DistributedDataParallel(torch.nn.Linear(args.hidden, args.hidden), process_group=groups[rank // args.dp])
    elif args.shape == "fsdp":
        from torch.distributed.fsdp import fully_shard

        sharded = torch.nn.Sequential(*[torch.nn.Linear(args.hidden, args.hidden) for _ in range(args.layers)])
        for layer in sharded:
            fully_shard(layer)
        fully_shard(sharded)
        layer_compute(sharded)
        opt = torch.optim.SGD(sharded.parameters(), lr=1e-3)
    dense = torch.ones(args.elements)
    started = time.monotonic()
    print(f"rank {rank}/{world} pid {os.getpid()} ready", flush=True)
    step = 0
    while True:  # ends only where every rank agrees (below): ranks that stopped apart would hang
        faulty = args.fault in ("slow", "sleep") and rank == args.culprit and step >= args.at_step
        factor = (args.slow_factor if args.fault == "slow" else float("inf")) if faulty else 1.0
        if faulty and step == args.at_step and args.fault == "slow":
            print(f"rank {rank} slows {args.slow_factor:g}x from step {step}", flush=True)
        if args.fault == "pause" and rank == args.culprit and step == args.at_step:
            print(f"rank {rank} pauses {args.pause_s:g} s before step {step}", flush=True)
            time.sleep(args.pause_s)
            print(f"rank {rank} goes on", flush=True)
        if factor == float("inf") and args.shape != "moe":
            print(f"rank {rank} sleeps forever before step {step}", flush=True)
            while True:
                time.sleep(3600)
        compute_s = args.compute_ms / 1000.0 * factor
        if args.shape == "pipe":
            pipe_step(dist, torch, args, rank, world, ddp, compute_s)
        elif args.shape == "fsdp":
            fsdp_step(torch, args, sharded, opt, compute_s)
        else:
            moe_step(dist, torch, args, rank, world, step, dense, factor)
        step += 1
        # every rank stops at the same step: agree on it once the time is up (a collective, as a
        # real job's end-of-training check would be)
        if step % 10 == 0:
            flag = torch.tensor([float(time.monotonic() - started >= args.duration_s)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                break
    dist.destroy_process_group()
    print(f"rank {rank} done after {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
