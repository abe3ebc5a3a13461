"""A data-parallel job's NCCL events, timed as a ring all-reduce runs, replayed into the profiler plugin.

``schedule(job)`` computes, for every rank, the calls NCCL would make into a profiler plugin while
the job runs: per iteration a compute phase, then one all-reduce of all ranks over ``channels``
ring channels, each rank's ``rounds`` x 2(R-1) sends and receives per channel timed by the ring's
dependencies (a step waits for the message it receives; a rank produces at most ``fifo_slots``
messages ahead of the network; a message leaves when its link is free and its receiver is inside),
with the kernel channels' start and stop (the GPU clock) and the proxy ops and steps of the network
(a send step is posted when the GPU produced its chunk and stops when the network took it). Faults change the
timing, never the analysis: ``H1`` a rank never starts its next all-reduce; ``H3`` one link's proxy
steps on one channel stop; ``S1`` a rank computes ``factor`` times longer (it arrives late); ``S2`` one
link carries each message ``factor`` times slower. Every rank derives the same schedule from the job,
so the ranks of a replay need not talk to each other.

Two ways to play it:

- ``VirtualReplay``: every rank's plugin in this process (one copy of the library per rank, so each has
  its own table), on a virtual clock, polled by the real poller and fed to the real analyzer; minutes of
  job time in seconds (unit tests, the benchmark).
- ``python -m ccld.probe.nccl_replay --job JSON [--job JSON ...]``: one process per rank of each job in
  real time (as a launcher starts them: ``RANK``, ``WORLD_SIZE``, the job's ``CCLD_JOB``), each loading the
  plugin NCCL would load (``NCCL_PROFILER_PLUGIN``): under ``ccld run --nccl-plugin`` their records go
  through the host aggregator, the broker and the worker (integration tests).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ccld.probe.nccl_driver import Comm, NcclDriver

INF = math.inf
FAULT_KINDS = ("", "H1", "H3", "S1", "S2")


@dataclass(frozen=True)
class RingJob:
    """A job of ``nranks`` ranks doing one all-reduce per iteration; one fault at most."""

    nranks: int = 4
    channels: int = 2
    compute_s: float = 0.4  # per iteration, per rank
    op_s: float = 0.1  # a healthy all-reduce, kernel start to stop
    duration_s: float = 60.0
    comm_hash: int = 0x0CC1D_0DD5_1234
    count: int = 1 << 20
    fault: str = ""  # "", "H1", "H3", "S1", "S2"
    rank: int = -1  # H1, S1: the rank; H3, S2: the link's source (link rank -> rank + 1)
    channel: int = 0  # H3: the channel whose proxy steps stop
    onset_s: float = 20.0
    factor: float = 3.0  # S1: compute x factor; S2: each message on the link x factor
    rounds: int = 4  # ring rounds per all-reduce and channel (each 2(R-1) messages per rank)
    fifo_slots: int = 8  # messages a rank may produce ahead of the network (NCCL_STEPS)
    jitter: float = 0.02  # a rank's compute varies by up to this share, the same on every replay
    name: str = ""  # the job's name (CCLD_JOB of its ranks, launch mode); "": the launcher's
    group_size: int = 0  # ranks per communicator (consecutive blocks, tensor-parallel style); 0: one of all ranks
    shape: str = "ring"  # "ring": all-reduces; "pipeline": each rank a stage sending to the next (send/recv)
    micro_batches: int = 4  # pipeline: per iteration

    def __post_init__(self) -> None:
        if self.nranks < 2 or self.channels < 1:
            raise ValueError("a ring needs at least 2 ranks and 1 channel")
        if self.fault not in FAULT_KINDS:
            raise ValueError(f"unknown fault {self.fault!r}: use one of H1, H3, S1, S2")
        if self.shape not in ("ring", "pipeline"):
            raise ValueError(f"unknown shape {self.shape!r}: ring or pipeline")
        if self.fault and not 0 <= self.rank < self.nranks:
            raise ValueError(f"fault {self.fault} needs a rank in 0..{self.nranks - 1}")
        size = self.group_size or self.nranks
        if size < 2 or self.nranks % size:
            raise ValueError(f"group_size {self.group_size} must divide {self.nranks} ranks into groups of 2 or more")

    def group_of(self, rank: int) -> tuple[int, list[int], int]:
        """(group index, its global ranks, the rank's place in it): the communicator a rank runs."""
        size = self.group_size or self.nranks
        g = rank // size
        return g, list(range(g * size, (g + 1) * size)), rank % size

    def comm_hash_of(self, rank: int) -> int:
        return self.comm_hash + self.group_of(rank)[0]


@dataclass(frozen=True, slots=True)
class Call:
    """One call into the plugin at ``t`` seconds of the job: ``what`` with its arguments."""

    t: float
    order: int  # ties keep the order NCCL makes them in
    what: str  # op (op_send, op_recv), kch_start, pop_start, send_ready, send_done, recv, kch_stop, pop_stop
    op: int  # the iteration
    channel: int = 0
    arg: int = 0  # step index; peer
    is_send: bool = False


_FIRST = {"op": 0, "op_send": 0, "op_recv": 0, "kch_start": 1, "pop_start": 2}


def schedule(job: RingJob) -> list[list[Call]]:
    """Every rank's calls, each list in time order (calls that would happen after a hang are left out).
    Each communicator (``group_size`` ranks) runs its ring on its own; a fault is in the group of its rank."""
    if job.shape == "pipeline":
        return _pipeline_schedule(job)
    size = job.group_size or job.nranks
    out: list[list[Call]] = [[] for _ in range(job.nranks)]
    for first in range(0, job.nranks, size):
        members = list(range(first, first + size))
        local = job.rank - first if job.fault and job.rank in members else -1
        g_job = replace(job, nranks=size, group_size=0, rank=local, fault=job.fault if local >= 0 else "")
        for i, calls in enumerate(_ring_schedule(g_job, members)):
            out[members[i]] = calls
    return out


def _pipeline_schedule(job: RingJob) -> list[list[Call]]:
    """A forward pipeline: rank s computes each micro-batch and sends it to s + 1 (one channel, ``rounds`` steps
    per message); s + 1 posts its receive when free and computes once the data landed. A message leaves
    when its link is free and the receiver has posted; H1 stops a stage before its next op, H3 the link's steps,
    S1 slows a stage's compute, S2 the link from ``rank`` to ``rank + 1``."""
    n = job.nranks
    out: list[list[Call]] = [[] for _ in range(n)]
    d = job.op_s / job.rounds  # one step of a message on a healthy link
    ready = [0.0] * n  # when each stage is free
    seq = 0
    k = 0
    while ready[0] < job.duration_s:  # a micro-batch the first stage starts goes through every stage
        landed: list[float] = []  # the landing times of the message the previous stage sent, per step
        for st in range(n):
            t = ready[st]
            faulty = job.rank == st and t >= job.onset_s
            if job.fault == "H1" and faulty:
                t = INF
            if st > 0:  # post the receive, wait for the data
                if math.isinf(t):
                    ready[st] = INF
                    landed = []
                    continue
                op = 2 * k
                out[st] += [Call(t, seq, "op_recv", op, 0, st - 1), Call(t, seq + 1, "kch_start", op),
                            Call(t, seq + 2, "pop_start", op, 0, st - 1, False)]  # fmt: skip
                seq += 3
                for i, a in enumerate(landed):
                    if not math.isinf(a):
                        out[st].append(Call(a, seq, "recv", op, 0, i))
                        seq += 1
                end = max(landed, default=INF) if landed else INF
                if math.isinf(end):
                    ready[st] = INF
                    landed = []
                    continue
                out[st] += [Call(end + 1e-6, seq, "kch_stop", op), Call(end + 2e-6, seq + 1, "pop_stop", op)]
                seq += 2
                t = end + 3e-6  # its next op begins after this one's kernel ended
            c = job.compute_s / max(job.micro_batches, 1) * _jitter(job, st, k)
            if job.fault == "S1" and faulty:
                c *= job.factor
            t += c
            if st == n - 1:
                ready[st] = t
                landed = []
                continue
            op = 2 * k + 1  # send to st + 1 once it posted its receive
            out[st] += [Call(t, seq, "op_send", op, 0, st + 1), Call(t, seq + 1, "kch_start", op),
                        Call(t, seq + 2, "pop_start", op, 0, st + 1, True)]  # fmt: skip
            seq += 3
            link = d * (job.factor if job.fault == "S2" and faulty else 1.0)
            free = max(t, ready[st + 1])
            landed = []
            for i in range(job.rounds):
                out[st].append(Call(t, seq, "send_ready", op, 0, i))
                leave = free
                land = INF if job.fault == "H3" and faulty else leave + link
                free = land
                landed.append(land)
                if not math.isinf(land):
                    out[st].append(Call(land, seq + 1, "send_done", op, 0, i))
                seq += 2
            end = landed[-1]
            if not math.isinf(end):
                out[st] += [Call(end + 1e-6, seq, "kch_stop", op), Call(end + 2e-6, seq + 1, "pop_stop", op)]
            seq += 2
            ready[st] = end + 3e-6
        k += 1
        if all(math.isinf(x) for x in ready):
            break
    for calls in out:
        calls.sort(key=lambda c: (c.t, _FIRST.get(c.what, 3), c.order))
    return out


def _jitter(job: RingJob, rank: int, it: int) -> float:
    # a fixed pseudo-random share in [-jitter, +jitter]: no RNG state, the same in every process
    x = (rank * 2_654_435_761 + it * 40_503 + 12_345) % 1_000_003 / 1_000_003
    return 1.0 + job.jitter * (2.0 * x - 1.0)


def _ring_schedule(job: RingJob, members: list[int]) -> list[list[Call]]:
    """One communicator's ring (``job`` in its own ranks; ``members`` give the global ranks, for the jitter)."""
    r_n, ch_n = job.nranks, job.channels
    steps = 2 * r_n - 1  # steps of one all-reduce round per rank and channel
    d = job.op_s / (steps * job.rounds)  # one message on a healthy link
    out: list[list[Call]] = [[] for _ in range(r_n)]
    seq = 0
    exit_t = [0.0] * r_n
    it = 0
    while True:
        t_iter = min(exit_t)
        if t_iter >= job.duration_s or math.isinf(t_iter):
            break
        enter = []
        for r in range(r_n):
            c = job.compute_s * _jitter(job, members[r], it)
            if job.fault == "S1" and r == job.rank and exit_t[r] >= job.onset_s:
                c *= job.factor
            e = exit_t[r] + c
            if job.fault == "H1" and r == job.rank and e >= job.onset_s:
                e = INF
            enter.append(e)
        if min(enter) >= job.duration_s:
            break
        ends = [[INF] * ch_n for _ in range(r_n)]
        for ch in range(ch_n):
            t_step = list(enter)
            link_free = [0.0] * r_n
            dep: list[list[float]] = [[] for _ in range(r_n)]  # message k of rank r left for r + 1
            arr: list[list[float]] = [[] for _ in range(r_n)]  # ... and arrived
            n_recv = [0] * r_n
            for j in range(steps * job.rounds):
                local = j % steps  # a round: send; recv + send (2R - 3 times); recv
                for r in range(r_n):
                    t = t_step[r]
                    if math.isinf(t):
                        continue
                    if local > 0:  # receive message i from r - 1 (sent at its step j - 1 or earlier)
                        src = (r - 1) % r_n
                        i = n_recv[r]
                        a = arr[src][i] if i < len(arr[src]) else INF  # its sender is stuck
                        n_recv[r] += 1
                        t = max(t, a)
                        if not math.isinf(a):
                            out[r].append(Call(a, seq, "recv", it, ch, n_recv[r] - 1))
                            seq += 1
                    if local < steps - 1 and not math.isinf(t):  # produce message k for r + 1
                        k = len(dep[r])
                        if k >= job.fifo_slots:  # the send FIFO is full until message k - slots has left
                            t = max(t, dep[r][k - job.fifo_slots])
                        if math.isinf(t):
                            t_step[r] = t
                            continue
                        link = d * (job.factor if job.fault == "S2" and r == job.rank and enter[r] >= job.onset_s
                                    else 1.0)
                        # it leaves when the link is free and the receiver has posted its buffers (inside)
                        leave = max(t, link_free[r], enter[(r + 1) % r_n])
                        land = leave + link
                        if job.fault == "H3" and r == job.rank and ch == job.channel and enter[r] >= job.onset_s:
                            leave = land = INF
                        link_free[r] = land
                        dep[r].append(leave)
                        arr[r].append(land)
                        out[r].append(Call(t, seq, "send_ready", it, ch, k))
                        if not math.isinf(land):
                            out[r].append(Call(land, seq + 1, "send_done", it, ch, k))
                        seq += 2
                    t_step[r] = t
            for r in range(r_n):
                ends[r][ch] = max([t_step[r], *arr[r][-1:]])
        for r in range(r_n):
            e = enter[r]
            if math.isinf(e):
                continue
            out[r].append(Call(e, seq, "op", it))
            for ch in range(ch_n):
                out[r].append(Call(e, seq + 1 + ch, "kch_start", it, ch))
                out[r].append(Call(e, seq + 1 + ch_n + 2 * ch, "pop_start", it, ch, (r + 1) % r_n, True))
                out[r].append(Call(e, seq + 2 + ch_n + 2 * ch, "pop_start", it, ch, (r - 1) % r_n, False))
                end = ends[r][ch]
                if not math.isinf(end):
                    out[r].append(Call(end + 1e-6, seq + 1, "kch_stop", it, ch))
                    out[r].append(Call(end + 2e-6, seq + 2, "pop_stop", it, ch))
            seq += 2 + 3 * ch_n
        for r in range(r_n):
            exit_t[r] = max(ends[r]) if not math.isinf(enter[r]) else INF
        if all(math.isinf(x) for x in exit_t):
            break
        it += 1
    for calls in out:  # at one instant NCCL starts the op, then its kernel channels, then its proxy ops
        calls.sort(key=lambda c: (c.t, _FIRST.get(c.what, 3), c.order))
    return out


@dataclass
class RankPlayer:
    """Plays one rank's calls into its plugin through a driver, as time passes."""

    driver: NcclDriver
    comm: Comm
    calls: list[Call]
    job: RingJob
    t0_ns: int = 0  # the GPU clock at job time 0
    pos: int = 0
    _ops: dict[int, int] = field(default_factory=dict)
    _kch: dict[tuple[int, int], int] = field(default_factory=dict)
    _pops: dict[tuple[int, int, bool], int] = field(default_factory=dict)
    _steps: dict[tuple[int, int, int], int] = field(default_factory=dict)

    @property
    def next_t(self) -> float:
        return self.calls[self.pos].t if self.pos < len(self.calls) else INF

    def play_until(self, t: float) -> int:
        """Make every call due by job time ``t``; returns how many."""
        n = 0
        drv, comm = self.driver, self.comm
        while self.pos < len(self.calls) and self.calls[self.pos].t <= t:
            c = self.calls[self.pos]
            self.pos += 1
            n += 1
            gpu_ns = self.t0_ns + int(c.t * 1e9)
            if c.what == "op":
                h = drv.coll(comm, "AllReduce", self.job.count, n_channels=self.job.channels)
                drv.stop(h)  # the host's event ends once the op is enqueued; the handle stays valid for children
                self._ops[c.op] = h
            elif c.what in ("op_send", "op_recv"):
                h = drv.p2p(comm, "Send" if c.what == "op_send" else "Recv", c.arg, self.job.count)
                drv.stop(h)
                self._ops[c.op] = h
            elif c.what == "kch_start":
                self._kch[(c.op, c.channel)] = drv.kernel_ch_start(comm, self._ops[c.op], c.channel, gpu_ns)
            elif c.what == "pop_start":
                steps = self.job.rounds if self.job.shape == "pipeline" else \
                    2 * ((self.job.group_size or self.job.nranks) - 1) * self.job.rounds
                self._pops[(c.op, c.channel, c.is_send)] = drv.proxy_op_start(
                    comm, self._ops[c.op], c.channel, c.arg, steps, c.is_send)  # fmt: skip
            elif c.what == "send_ready":  # the GPU wrote the chunk: the proxy posts it
                pop = self._pops[(c.op, c.channel, True)]
                self._steps[(c.op, c.channel, c.arg)] = drv.proxy_step_posted(comm, pop, c.arg)
            elif c.what == "send_done":  # the network took it
                drv.proxy_step_sent(self._steps.pop((c.op, c.channel, c.arg)))
            elif c.what == "recv":
                drv.proxy_step(comm, self._pops[(c.op, c.channel, False)], c.arg, False)
            elif c.what == "kch_stop":
                drv.kernel_ch_stop(self._kch.pop((c.op, c.channel)), gpu_ns)
            elif c.what == "pop_stop":
                for send in (True, False):
                    h = self._pops.pop((c.op, c.channel, send), 0)
                    if h:
                        drv.stop(h)
            if c.what == "pop_stop" and not any(k[0] == c.op for k in self._kch):
                self._ops.pop(c.op, None)
        return n


def plugin_copies(plugin: str | os.PathLike[str], folder: Path, n: int) -> list[Path]:
    """``n`` copies of the library: ``dlopen`` of one path twice gives one instance, so each rank gets its own."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for r in range(n):
        dst = folder / f"libnccl-profiler-ccld-r{r}.so"
        shutil.copyfile(plugin, dst)
        out.append(dst)
    return out


class VirtualReplay:
    """Every rank's plugin in this process on a virtual clock (job time 0 = GPU clock ``t0_ns``).

    The tables go to ``table_dir`` (which must hold a live ``aggregator.pid``, as the plugin checks);
    ``advance(t)`` makes every rank's calls due by job time ``t``.
    """

    def __init__(self, job: RingJob, plugin: str | os.PathLike[str], table_dir: Path, *, version: int = 6,
                 t0_ns: int = 0) -> None:  # fmt: skip
        self.job = job
        self.t0_ns = t0_ns
        self.players: list[RankPlayer] = []
        calls = schedule(job)
        saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "CCLD_NCCL_DIR")}
        try:
            os.environ["CCLD_NCCL_DIR"] = str(table_dir)
            os.environ["WORLD_SIZE"] = str(job.nranks)
            for r, lib in enumerate(plugin_copies(plugin, table_dir / "libs", job.nranks)):
                os.environ["RANK"] = str(r)  # the plugin copies it into its table at its first init
                drv = NcclDriver.load(lib, version)
                if drv is None:
                    raise RuntimeError(f"{lib} exports no ncclProfiler_v{version}")
                _, members, local = job.group_of(r)
                comm = drv.init(job.comm_hash_of(r), len(members), local)
                if comm is None:
                    raise RuntimeError(f"the plugin refused rank {r}'s communicator (see stderr)")
                self.players.append(RankPlayer(drv, comm, calls[r], job, t0_ns))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def advance(self, t: float) -> int:
        return sum(p.play_until(t) for p in self.players)

    def clock_ns(self, t: float) -> int:
        return self.t0_ns + int(t * 1e9)


def ticks(end_s: float, step_s: float) -> Iterator[float]:
    n = int(round(end_s / step_s))
    for i in range(1, n + 1):
        yield i * step_s


def play_realtime(job: RingJob, rank: int, plugin: str, t0: float, *, version: int = 6, linger_s: float = 0.0,
                  log: Callable[[str], None] = lambda s: None) -> int:  # fmt: skip
    """One rank in real time from wall-clock ``t0`` (seconds): the calls NCCL would make, at their times."""
    drv = NcclDriver.load(plugin, version)
    if drv is None:
        log(f"rank {rank}: {plugin} exports no ncclProfiler_v{version}")
        return 2
    _, members, local = job.group_of(rank)
    comm = drv.init(job.comm_hash_of(rank), len(members), local)
    if comm is None:
        log(f"rank {rank}: the plugin refused the communicator; running without it")
        return 3
    player = RankPlayer(drv, comm, schedule(job)[rank], job, int(t0 * 1e9))
    # every call of the schedule, the last op's too (it may end after duration_s: an op one rank began, all
    # finish, as in a job that ends cleanly); a rank the schedule leaves early (hung) sits until the job is over
    while not math.isinf(player.next_t):
        time.sleep(max(0.0, t0 + player.next_t - time.time()))
        player.play_until(time.time() - t0)
    time.sleep(max(0.0, t0 + job.duration_s - time.time()) + linger_s)
    drv.finalize(comm)
    log(f"rank {rank}: {player.pos} calls made")
    return 0


def launch(jobs: list[RingJob], plugin: str, *, version: int = 6, start_in_s: float = 1.0,
           linger_s: float = 0.0) -> int:  # fmt: skip
    """Start every rank of every job as its own process (``RANK``, ``WORLD_SIZE``, ``CCLD_JOB`` set as a launcher
    would), all on one clock; wait for them; returns the worst exit status."""
    t0 = time.time() + start_in_s  # every rank's job time 0
    procs = []
    for job in jobs:
        for r in range(job.nranks):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(job.nranks), LOCAL_RANK=str(r))
            if job.name:
                env["CCLD_JOB"] = job.name
            cmd = [sys.executable, "-m", "ccld.probe.nccl_replay", "--rank", str(r), "--job", job_json(job),
                   "--plugin", plugin, "--t0", repr(t0), "--version", str(version), "--linger-s", str(linger_s)]
            procs.append(subprocess.Popen(cmd, env=env))
    return max((p.wait() for p in procs), default=0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--job", required=True, action="append",
                    help="a RingJob as JSON (repeat for several jobs, launch mode)")
    ap.add_argument("--rank", type=int, help="play this rank (default: launch every rank of every job)")
    ap.add_argument("--plugin", default=os.environ.get("NCCL_PROFILER_PLUGIN", ""),
                    help="the plugin library (default: NCCL_PROFILER_PLUGIN, as NCCL reads it)")
    ap.add_argument("--t0", type=float, help="wall-clock start of job time 0 (seconds; rank mode)")
    ap.add_argument("--version", type=int, default=6)
    ap.add_argument("--linger-s", type=float, default=0.0, help="stay this long after the job's end")
    a = ap.parse_args(argv)
    if not a.plugin:
        ap.error("no plugin: pass --plugin or set NCCL_PROFILER_PLUGIN (ccld run --nccl-plugin sets it)")
    jobs = [RingJob(**json.loads(j)) for j in a.job]
    if a.rank is None:
        return launch(jobs, a.plugin, version=a.version, linger_s=a.linger_s)
    return play_realtime(jobs[0], a.rank, a.plugin, a.t0 if a.t0 is not None else time.time(), version=a.version,
                         linger_s=a.linger_s, log=lambda s: print(s, file=sys.stderr, flush=True))  # fmt: skip


def job_json(job: RingJob) -> str:
    return json.dumps(asdict(job))


if __name__ == "__main__":
    sys.exit(main())
