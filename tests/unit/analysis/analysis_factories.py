"""Hand-built kernel records for analyzer tests: a record factory and a tiny ring model, the open
verdicts of a replay; and the drawn jobs of the accuracy suites, by id.

Nothing here knows about faults: each helper only writes what a probe would observe (times on
each rank's own, skewed clock; counters per channel) for the behaviour a test describes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from ccld.producers.simulator.scenario import Scenario, load_scenarios
from ccld.records import DType, KernelBatch, KernelRecord, OpType, Status, Verdict, VerdictState
from ccld.settings import AnalyzerSettings
from ccld.streams.analysis.replay import analyze_batches

SUITES = Path(__file__).resolve().parents[3] / "benchmarks" / "scenarios"

NS = 1_000_000_000
EPOCH_NS = 1_700_000_000 * NS


def make_kernel_record(
    *,
    rank: int,
    comm_rank: int | None = None,
    comm_size: int = 4,
    op_seq: int = 0,
    status: Status = Status.DONE,
    op_type: OpType = OpType.ALL_REDUCE,
    dtype: DType = DType.BFLOAT16,
    count: int = 1 << 20,
    peer: int = -1,
    comm_hash: int = 0x1111,
    job: str = "job",
    incarnation: int = 0,
    world_size: int = 8,
    host: str | None = None,
    t_enter_ns: int = -1,
    t_exit_ns: int = -1,
    t_sample_ns: int = -1,
    send: Sequence[int] = (0, 0),
    recv: Sequence[int] = (0, 0),
) -> KernelRecord:
    return KernelRecord(
        job=job, incarnation=incarnation, comm_hash=comm_hash, op_seq=op_seq, op_type=op_type, dtype=dtype,
        count=count, peer=peer, rank=rank, comm_rank=rank if comm_rank is None else comm_rank,
        comm_size=comm_size, world_size=world_size, host=host or f"host-{rank // 8}", status=status,
        t_enter_ns=t_enter_ns, t_exit_ns=t_exit_ns, t_sample_ns=t_sample_ns,
        send_counts=tuple(send), recv_counts=tuple(recv),
    )


@dataclass
class Comm:
    """A communicator of the toy job: its hash and its members (global ranks, ring order)."""

    comm_hash: int
    ranks: tuple[int, ...]
    seq: int = 0
    stride: int = 1  # op sequence numbers between two ops written (a sampling probe reports one in ``stride``)

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass
class Probe:
    """Turns true times (seconds) into the records one rank's probe would emit."""

    skew_s: dict[int, float] = field(default_factory=dict)  # per rank clock offset
    channels: int = 2
    job: str = "job"
    world_size: int = 8

    def ns(self, rank: int, t: float) -> int:
        return EPOCH_NS + int(round((t + self.skew_s.get(rank, 0.0)) * NS))

    def rec(self, comm: Comm, i: int, seq: int, status: Status, t_enter: float, t_sample: float,
            t_exit: float | None = None, send: int = 0, recv: int = 0, **kw: object) -> KernelRecord:
        r = comm.ranks[i]
        return make_kernel_record(
            rank=r, comm_rank=i, comm_size=comm.size, op_seq=seq, status=status, comm_hash=comm.comm_hash,
            job=self.job, world_size=self.world_size,
            t_enter_ns=self.ns(r, t_enter), t_sample_ns=self.ns(r, t_sample),
            t_exit_ns=-1 if t_exit is None else self.ns(r, t_exit),
            send=(send,) * self.channels, recv=(recv,) * self.channels, **kw,  # type: ignore[arg-type]
        )

    def ring_op(self, comm: Comm, enters: Sequence[float], dur: float, slots: int = 64,
                lag_rank: int | None = None, sample_at: float | None = None,
                **kw: object) -> list[tuple[float, KernelRecord]]:
        """One ring op: DONE records (exit = last enter + dur), plus PROGRESS samples mid-op.

        ``lag_rank`` makes that comm rank's outgoing link the bottleneck: in the samples its
        RecvCount runs 8 slots ahead of its SendCount and its successor's lags 8 behind.
        """
        seq = comm.seq
        comm.seq += comm.stride
        start = max(enters)
        exit_ = start + dur
        out: list[tuple[float, KernelRecord]] = []
        if sample_at is not None and start < sample_at < exit_:
            level = int(slots * (sample_at - start) / dur) // 2
            for i in range(comm.size):
                s = r = level + 8
                if lag_rank is not None and i == lag_rank:
                    s = level
                if lag_rank is not None and i == (lag_rank + 1) % comm.size:
                    r = level
                out.append((sample_at, self.rec(comm, i, seq, Status.PROGRESS, enters[i], sample_at,
                                                send=s, recv=r, **kw)))
        for i in range(comm.size):
            out.append((exit_, self.rec(comm, i, seq, Status.DONE, enters[i], exit_, exit_,
                                        send=slots, recv=slots, **kw)))
        return out


def batches_by_tick(records: Iterable[tuple[float, KernelRecord]], tick_s: float = 1.0,
                    latency_s: float = 0.1, producer: str = "test") -> list[tuple[float, KernelBatch]]:
    """Group (true time, record) pairs into per-communicator batches delivered each tick."""
    buckets: dict[tuple[int, int], list[KernelRecord]] = {}
    for t, r in records:
        w = int(t // tick_s)
        buckets.setdefault((w, r.comm_hash), []).append(r)
    out: list[tuple[float, KernelBatch]] = []
    for n, ((w, _), recs) in enumerate(sorted(buckets.items())):
        recs.sort(key=lambda r: (r.t_sample_ns, r.rank))
        out.append(((w + 1) * tick_s + latency_s, KernelBatch.from_records(recs, producer=producer, batch_seq=n)))
    out.sort(key=lambda x: x[0])
    return out


def healthy_steps(probe: Probe, comm: Comm, steps: int, step_s: float = 2.0, dur: float = 0.2,
                  t0: float = 0.0, late: dict[int, float] | None = None,
                  slow: float = 1.0, lag_rank: int | None = None, from_step: int = 0,
                  jitter: Sequence[float] = (0.0, 0.013, 0.007, 0.021, 0.004, 0.017, 0.011, 0.002),
                  **kw: object) -> list[tuple[float, KernelRecord]]:
    """``steps`` ring ops, one per step; from ``from_step`` on, ``late`` ranks arrive that much later
    and the op takes ``slow`` x longer (with the backlog at ``lag_rank``); ``kw`` goes to every record
    (another ``op_type``, say)."""
    out: list[tuple[float, KernelRecord]] = []
    for k in range(steps):
        base = t0 + k * step_s + 1.0
        faulty = k >= from_step
        enters = []
        for i in range(comm.size):
            e = base + jitter[(i + k) % len(jitter)]
            if faulty and late and i in late:
                e += late[i]
            enters.append(e)
        d = dur * (slow if faulty else 1.0)
        sample = max(enters) + d / 2 if faulty and lag_rank is not None else None
        out += probe.ring_op(comm, enters, d, lag_rank=lag_rank if faulty else None, sample_at=sample, **kw)
    return out


def opens(batches: list[tuple[float, KernelBatch]], settings: AnalyzerSettings | None = None) -> list[Verdict]:
    """The OPEN verdicts of ``batches`` replayed through a fresh analyzer (``settings``: the defaults)."""
    return [v for v in analyze_batches(batches, settings) if v.state == VerdictState.OPEN]


@cache
def _suite(suite: str) -> dict[str, Scenario]:
    return {sc.id: sc for sc in load_scenarios(SUITES / f"{suite}.jsonl")}


def drawn(suite: str, sid: str) -> Scenario:
    """Scenario ``sid`` of ``benchmarks/scenarios/<suite>.jsonl`` (each suite read once)."""
    return _suite(suite)[sid]
