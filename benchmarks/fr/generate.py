"""Write the real gloo Flight Recorder corpus: 8 torch ranks (tp=2, pp=2, dp=2, expert all_to_all) with faults.

Each case launches 8 gloo ranks on loopback (this file, ``--worker``). Rank r has
tp = r % 2, dp = (r // 2) % 2, stage = r // 4 (tensor fastest, as Megatron lays them out). A step
is a two-micro-batch 1F1B pipeline schedule: every forward and backward pass all-reduces in
its tensor group and exchanges tokens with an uneven ``all_to_all_single`` in its expert group
(the four ranks of a stage; split sizes differ per rank and step, as MoE routing does); stages
exchange activations and gradients with ``isend``/``irecv`` in the pipeline group; then the
data-parallel group all-reduces gradients and all-gathers parameters
(``all_gather_into_tensor``), and the world all-reduces the loss.

Every live rank dumps its Flight Recorder with ``_dump_fr_trace_json(True, False)`` from a
timer thread (the pickle dump blocks while a gloo collective is in flight), gzip-compressed, as
``rank<R>.json.gz``; a rank that cannot run Python (stopped, GIL held) writes nothing. Faults:
``sigstop`` (SIGSTOP before a forward pass), ``gil`` (a thread holds the GIL forever inside a
ctypes.PyDLL call to libc ``sleep``), ``sleep`` (Python sleeps forever before a forward pass: the
GIL is free, so the rank still dumps), ``raise`` (an exception; the rank's error handler dumps
and the process exits), ``two`` (sigstop on one rank and raise on another), ``slow`` (the rank
computes 6x longer every step; no hang), ``healthy`` (every rank finishes and dumps after a
final barrier). ``gloo-pipe-*`` cases run a dense model (``--program pipe``: no expert
all_to_all, so the stages meet only in send/recv, which gloo does not record). ``partial``
cases are copies with one rank's dump deleted. ``truth.json`` per case names the broken ranks,
the class and what the dumps can show.

Not here: a rank that keeps enqueueing while its ops stop completing. Gloo runs each op on its
own worker thread and retires it as soon as the algorithm returns; there is no device stream
for an op to sit in, and a rank cannot finish a collective its peers are still inside, so gloo
cannot show it. The NCCL-format cases (``synth.py``, ``nccl-stall-*``) cover it. Gloo also
records no send/recv, no start/completion times and no members in ``pg_config``.

    .venv/bin/python benchmarks/fr/generate.py            # all cases into benchmarks/fr/gloo/
    .venv/bin/python benchmarks/fr/generate.py --cases raise,slow
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORLD = 8
FAULT_STEP = 3
COMPUTE_S = 0.004


# ----------------------------------------------------------------------------------- worker side
def _wait(work: Any) -> None:
    if work is not None:  # torch types a p2p Work as optional
        work.wait()


def dump(out: Path, rank: int) -> None:
    """Write this rank's Flight Recorder as gzip JSON (atomic rename: a half file is never read)."""
    import torch

    c10d: Any = torch._C._distributed_c10d  # private API: untyped
    data = c10d._dump_fr_trace_json(True, False)
    raw = data if isinstance(data, bytes) else str(data).encode()
    tmp = out / f".rank{rank}.tmp"
    tmp.write_bytes(gzip.compress(raw, mtime=0))
    os.replace(tmp, out / f"rank{rank}.json.gz")


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    rank, out = int(os.environ["RANK"]), Path(args.out)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    tp, dp, stage = rank % 2, (rank // 2) % 2, rank // 4
    # every rank creates every group in the same order (torch requires it)
    tp_groups = [dist.new_group([b, b + 1]) for b in (0, 2, 4, 6)]
    dp_groups = [dist.new_group([s * 4 + t, s * 4 + 2 + t]) for s in (0, 1) for t in (0, 1)]
    pp_groups = [dist.new_group([d * 2 + t, 4 + d * 2 + t]) for d in (0, 1) for t in (0, 1)]
    ep_groups = [dist.new_group([s * 4 + i for i in range(4)]) for s in (0, 1)]
    g_tp, g_dp = tp_groups[rank // 2], dp_groups[stage * 2 + tp]
    g_pp, g_ep = pp_groups[dp * 2 + tp], ep_groups[stage]
    peer = rank + 4 if stage == 0 else rank - 4  # pipeline neighbour (global rank)
    culprits = [int(c) for c in args.culprit.split(",")] if args.culprit else []
    faults = args.fault.split(",")
    mine = faults[culprits.index(rank)] if rank in culprits else "none"
    ep_index = rank % 4

    dist.barrier()  # everyone is up: the dump clock starts now, the same on every rank
    if args.dump_after > 0:
        timer = threading.Timer(args.dump_after, dump, (out, rank))
        timer.daemon = True
        timer.start()

    def split(step: int, mb: int, phase: int) -> tuple[list[int], list[int]]:
        # tokens rank i sends to rank j of the expert group: uneven, the same table on every rank
        def n(i: int, j: int) -> int:
            return 1 + (i * 7 + j * 3 + step * 5 + mb * 11 + phase * 13) % 6

        return [n(ep_index, j) for j in range(4)], [n(i, ep_index) for i in range(4)]

    def layer(step: int, mb: int, phase: int) -> None:
        x = torch.ones(64)
        dist.all_reduce(x, group=g_tp)
        if args.program == "pipe":
            return  # a dense model: no expert exchange
        send_n, recv_n = split(step, mb, phase)
        tokens = torch.ones(sum(send_n), 8)
        got = torch.empty(sum(recv_n), 8)
        dist.all_to_all_single(got, tokens, recv_n, send_n, group=g_ep)

    def maybe_fault(step: int, where: str) -> None:
        if mine == "none" or step != args.fault_step or where != "F1":
            return
        print(f"rank {rank}: fault {mine} at step {step} before {where}", flush=True)
        if mine == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif mine == "gil":
            import ctypes

            libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL
            hog = threading.Thread(target=libc.sleep, args=(1_000_000,), daemon=True)
            hog.start()
            time.sleep(0.05)  # the main thread gives up the GIL; it never gets it back
        elif mine == "sleep":
            time.sleep(1_000_000)  # Python sleeps with the GIL released: the dump timer still runs
        elif mine == "raise":
            raise RuntimeError(f"rank {rank}: injected failure at step {step}")

    def step_fn(step: int) -> None:
        slow = 6.0 if mine == "slow" else 1.0
        time.sleep(COMPUTE_S * slow)
        act, grad = torch.ones(32), torch.ones(32)
        sends = []
        if stage == 0:
            for mb in (0, 1):
                if mb == 1:
                    maybe_fault(step, "F1")
                layer(step, mb, 0)
                sends.append(dist.isend(act, peer, group=g_pp))
            for mb in (0, 1):
                _wait(dist.irecv(grad, peer, group=g_pp))
                layer(step, mb, 1)
        else:
            for mb in (0, 1):
                if mb == 1:
                    maybe_fault(step, "F1")
                _wait(dist.irecv(act, peer, group=g_pp))
                layer(step, mb, 0)
                layer(step, mb, 1)
                sends.append(dist.isend(grad, peer, group=g_pp))
        for w in sends:
            _wait(w)
        dist.all_reduce(torch.ones(128), group=g_dp)
        dist.all_gather_into_tensor(torch.empty(32), torch.ones(16), group=g_dp)
        dist.all_reduce(torch.ones(1))

    print(f"rank {rank} pid {os.getpid()} ready", flush=True)
    try:
        for step in range(args.steps):
            step_fn(step)
        dist.barrier()
        if args.dump_after <= 0:
            time.sleep(0.3)  # gloo retires entries just after the op returned
            dump(out, rank)
        print(f"rank {rank} finished", flush=True)
        time.sleep(args.linger)
    except Exception as exc:  # noqa: BLE001 - a rank's error handler: report, dump, exit
        print(f"rank {rank}: {type(exc).__name__}: {exc}", flush=True)
        if mine == "raise":
            dump(out, rank)
            os._exit(1)
        time.sleep(args.linger)  # a victim stays up until its dump timer fires
    return 0


# ----------------------------------------------------------------------------------- driver side
CASES: dict[str, dict[str, Any]] = {
    "gloo-sigstop-r5": {"fault": "sigstop", "culprit": "5", "truth": {"roots": [5], "kind": "H1"}},
    "gloo-gil-r2": {"fault": "gil", "culprit": "2", "truth": {"roots": [2], "kind": "H1"}},
    "gloo-raise-r6": {"fault": "raise", "culprit": "6", "truth": {"roots": [6], "kind": "H1"}},
    "gloo-raise-r1": {"fault": "raise", "culprit": "1", "truth": {"roots": [1], "kind": "H1"}},
    "gloo-two-sigstop-r0-raise-r3": {
        "fault": "sigstop,raise",
        "culprit": "0,3",
        "truth": {"roots": [0, 3], "kind": "H1"},
    },
    "gloo-slow-r3": {
        "fault": "slow",
        "culprit": "3",
        "steps": 400,
        "truth": {
            "roots": [3],
            "kind": "S1",
            "expected": {
                "acceptable": [{"roots": [], "kind": None}, {"roots": [3], "kind": "H1"}],
                "why": "a slow rank does not hang the job and gloo records no start/completion times: one "
                "snapshot of the running job either catches ops completing (then import-fr makes no verdict) "
                "or catches the others waiting for the late rank (then H1 on rank 3, with the caveat that a "
                "late rank looks the same); naming any other rank is wrong",
            },
        },
    },
    "gloo-healthy": {"fault": "none", "culprit": "", "steps": 6, "dump_at": 0, "truth": {"roots": [], "kind": None}},
    # a dense pipeline (no expert all_to_all): ranks that wait in a send/recv, which gloo does not
    # record, look idle; only the rank that stopped is the root
    "gloo-pipe-gil-r3": {"program": "pipe", "fault": "gil", "culprit": "3", "truth": {"roots": [3], "kind": "H1"}},
    "gloo-pipe-sleep-r3": {"program": "pipe", "fault": "sleep", "culprit": "3", "truth": {"roots": [3], "kind": "H1"}},
    "gloo-pipe-sleep-r5": {"program": "pipe", "fault": "sleep", "culprit": "5", "truth": {"roots": [5], "kind": "H1"}},
    "gloo-pipe-slow-r6": {
        "program": "pipe",
        "fault": "slow",
        "culprit": "6",
        "steps": 400,
        "truth": {
            "roots": [6],
            "kind": "S1",
            "expected": {
                "acceptable": [{"roots": [], "kind": None}, {"roots": [6], "kind": "H1"}],
                "why": "as gloo-slow-r3: a slow rank in a pipeline; the snapshot shows either a running job or "
                "the others waiting for rank 6; naming any other rank (its pipeline neighbours wait on it in "
                "send/recv) is wrong",
            },
        },
    },
}
#: copies with one dump deleted: name -> (source case, rank whose dump is removed)
PARTIAL = {
    "gloo-raise-r6-missing-r0": ("gloo-raise-r6", 0),
    "gloo-raise-r1-missing-r1": ("gloo-raise-r1", 1),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_case(name: str, spec: dict[str, Any], root: Path, wait_s: float, fault_step: int) -> None:
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    port = free_port()
    dump_after = wait_s if spec.get("dump_at", 1) else 0
    steps = spec.get("steps", 1_000_000)
    procs = []
    logs = root / f".{name}-logs"
    logs.mkdir(exist_ok=True)
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="40", PYTHONUNBUFFERED="1")  # fmt: skip
        cmd = [sys.executable, __file__, "--worker", "--out", str(out), "--fault", spec["fault"],
               "--culprit", spec["culprit"], "--steps", str(steps), "--dump-after", str(dump_after),
               "--linger", str(wait_s + 30), "--fault-step", str(fault_step),
               "--program", spec.get("program", "moe")]  # fmt: skip
        fh = open(logs / f"rank{rank}.log", "wb")  # noqa: SIM115 - closed with the process
        procs.append((subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True), fh))
    deadline = time.time() + wait_s + 60  # start-up of 8 torch processes on 2 cores is slow
    expected = WORLD - sum(1 for f in spec["fault"].split(",") if f in ("sigstop", "gil"))
    while time.time() < deadline and len(list(out.glob("rank*.json.gz"))) < expected:
        time.sleep(0.2)
    time.sleep(1.0)  # a missing dump must really be missing, not late
    for p, fh in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        p.wait(10)
        fh.close()
    dumps = sorted(p.name for p in out.iterdir())
    source = "real gloo run, torch " + _torch_version()
    truth = dict(
        spec["truth"],
        world_size=WORLD,
        fault=spec["fault"],
        culprit=spec["culprit"],
        source=source,
        dumps=dumps,
        **({"program": spec["program"]} if "program" in spec else {}),
    )
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    print(f"{name}: {len(truth['dumps'])} dumps", flush=True)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def make_partial(root: Path) -> None:
    for name, (src, rank) in PARTIAL.items():
        if not (root / src).is_dir():
            continue
        out = root / name
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(root / src, out)
        (out / f"rank{rank}.json.gz").unlink(missing_ok=True)
        truth = json.loads((out / "truth.json").read_text())
        truth["dumps"] = sorted(p.name for p in out.glob("rank*"))
        truth["note"] = f"copy of {src} with rank {rank}'s dump deleted"
        (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--worker", action="store_true")
    p.add_argument("--out", default=str(HERE / "gloo"))
    p.add_argument("--fault", default="none")
    p.add_argument("--culprit", default="")
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--dump-after", dest="dump_after", type=float, default=0.0)
    p.add_argument("--linger", type=float, default=10.0)
    p.add_argument("--keep-logs", dest="keep_logs", action="store_true")
    p.add_argument("--program", default="moe", choices=["moe", "pipe"], help="moe: expert all_to_all per layer")
    p.add_argument("--fault-step", dest="fault_step", type=int, default=FAULT_STEP, help="step the fault hits")
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    p.add_argument("--wait-s", dest="wait_s", type=float, default=4.0, help="seconds from start-up to the dump")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.cases.split(",") if n] or list(CASES)
    for name in names:
        run_case(name, CASES[name], root, args.wait_s, args.fault_step)
    make_partial(root)
    if not args.keep_logs:
        for logs in root.glob(".*-logs"):
            shutil.rmtree(logs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
