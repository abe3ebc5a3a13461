"""Typed records every stage shares: Trace IDs, kernel records, columnar batches, verdicts.

The Avro schemas in ``schemas/`` are the wire contract; these dataclasses are what the code
handles, with ``to_dict``/``from_dict`` at the boundary. A ``KernelBatch`` is columnar (numpy
arrays, one row per kernel record) because the analyzer works on whole columns at once.
"""

from __future__ import annotations

import enum
import math
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ccld.anomaly import AnomalyKind
from ccld.errors import RecordError

__all__ = ["AnomalyKind"]  # re-exported: the class table (ccld.anomaly) owns it; the rest is imported by name

I64 = npt.NDArray[np.int64]

#: Number of per-channel counter slots a record carries (the probing frame folds more onto these).
MAX_CHANNELS = 8


class OpType(enum.IntEnum):
    """Collective or point-to-point operation type (one byte of the Trace ID)."""

    ALL_REDUCE = 0
    ALL_GATHER = 1
    REDUCE_SCATTER = 2
    BROADCAST = 3
    REDUCE = 4
    ALL_TO_ALL = 5
    BARRIER = 6
    SEND = 7
    RECV = 8


def op_name(op: int) -> str:
    """``all_reduce`` for an op type code (``op42`` for one this version does not know)."""
    try:
        return OpType(op).name.lower()
    except ValueError:
        return f"op{op}"


class DType(enum.IntEnum):
    """Element type of the buffer (one byte of the Trace ID)."""

    FLOAT32 = 0
    FLOAT16 = 1
    BFLOAT16 = 2
    FLOAT64 = 3
    INT32 = 4
    INT64 = 5
    INT8 = 6
    UINT8 = 7
    BOOL = 8
    FLOAT8 = 9
    OTHER = 15


class Status(enum.IntEnum):
    """What a kernel record says about its operation on that rank."""

    ENTERED = 0  # the rank entered the operation (t_enter_ns set)
    PROGRESS = 1  # a sample while inside the operation (counters, t_sample_ns)
    DONE = 2  # the rank left the operation (t_exit_ns set)
    # The newest state of a communicator the rank is in but not inside any op of: its last op
    # (op_seq) ended at t_exit_ns. A heartbeat of sources that send ops only in part (the bounded
    # record format): it says "alive and idle" and is never mistaken for a sampled op's DONE.
    # Batches only (a column value); a single KernelRecord on the wire cannot carry it.
    IDLE = 3


class VerdictState(enum.StrEnum):
    """Life cycle of one incident on the verdicts topic."""

    OPEN = "open"  # first verdict of an incident
    UPDATE = "update"  # the incident changed (more affected ranks, a better root cause)
    RESOLVED = "resolved"  # progress resumed / the slowdown ended
    # ended without resolving: its job went silent (ended, killed, lost its link); why: details["closed"]
    CLOSED = "closed"


def comm_hex(comm_hash: int) -> str:
    """Render a communicator hash (signed or unsigned 64-bit) as 16 lowercase hex digits."""
    return f"{comm_hash & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def to_signed64(value: int) -> int:
    """Map an unsigned 64-bit hash onto Avro's signed ``long``."""
    value &= 0xFFFF_FFFF_FFFF_FFFF
    return value - (1 << 64) if value >= 1 << 63 else value


_TRACE = struct.Struct("<QIBBH")


@dataclass(frozen=True, slots=True)
class TraceId:
    """The 16-byte decentralised identity of one communication round.

    Layout (little-endian): communicator hash u64, op sequence u32, op type u8, dtype u8,
    flags/root u16. Every rank computes it the same way without a central server.
    """

    comm_hash: int
    op_seq: int
    op_type: OpType
    dtype: DType
    root: int = 0xFFFF  # root or peer rank for rooted / p2p ops; 0xFFFF when none

    SIZE = 16

    def pack(self) -> bytes:
        return _TRACE.pack(
            self.comm_hash & 0xFFFF_FFFF_FFFF_FFFF,
            self.op_seq & 0xFFFF_FFFF,
            int(self.op_type),
            int(self.dtype),
            self.root & 0xFFFF,
        )

    @classmethod
    def unpack(cls, raw: bytes) -> TraceId:
        if len(raw) != cls.SIZE:
            raise RecordError(f"a Trace ID is 16 bytes, got {len(raw)}")
        comm, seq, op, dt, root = _TRACE.unpack(raw)
        try:
            return cls(to_signed64(comm), seq, OpType(op), DType(dt), root)
        except ValueError as exc:
            raise RecordError(f"bad Trace ID {raw.hex()}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class KernelRecord:
    """One observation of one operation on one rank (the row form of the metrics wire format).

    Times are nanoseconds on the rank's **own** clock; -1 means not observed. Clocks of
    different hosts disagree by seconds, so only differences on one rank are meaningful.
    """

    job: str
    incarnation: int
    comm_hash: int
    op_seq: int
    op_type: OpType
    dtype: DType
    count: int  # element count
    peer: int  # root (rooted collectives) or peer (send/recv) as a rank of the communicator; -1 none
    rank: int  # global rank
    comm_rank: int  # rank inside the communicator
    comm_size: int
    world_size: int
    host: str
    status: Status
    t_enter_ns: int = -1
    t_exit_ns: int = -1
    t_sample_ns: int = -1
    send_counts: tuple[int, ...] = ()
    recv_counts: tuple[int, ...] = ()
    #: per channel, the largest RecvCount - SendCount the kernel itself had during its lifetime
    #: (its peak send backlog, counter units, saturating at ``PEAK_LAG_MAX``), reported with DONE by a
    #: source whose kernels keep it (the probe, format v2); empty (or -1 per channel): unknown. Carried
    #: by ``KernelBatch`` (column ``peak_lag``); the single-record schema has no such field.
    peak_lag: tuple[int, ...] = ()
    #: end of this rank's previous op on any communicator (own clock, -1 unknown): with sampled detail
    #: the op before a DONE record is usually not sent, yet the analyzer needs the compute gap before it.
    #: Carried by ``KernelBatch`` (column ``t_prev_exit_ns``) and ``to_dict``/``from_dict`` (JSON lines);
    #: the single-record Avro schema has no such field (a single record on the wire reads as -1).
    t_prev_exit_ns: int = -1
    #: the exit happened within +/- this of ``t_exit_ns`` (ns); 0: timed exactly (the probe, the function
    #: wrapper, the simulator). A source that only sees an op finish between two looks (the Flight Recorder
    #: poller on gloo: between two polls) sets half that window, so the analyzer can tell noise of its own
    #: measurement from a slower op. Carried like ``t_prev_exit_ns`` (column ``t_exit_err_ns``, JSON lines);
    #: not in the single-record Avro schema (a single record on the wire reads as 0).
    t_exit_err_ns: int = 0

    def __post_init__(self) -> None:
        if self.rank < 0 or not 0 <= self.comm_rank < max(self.comm_size, 1):
            raise RecordError(f"bad rank {self.rank} / comm rank {self.comm_rank} of {self.comm_size}")
        if len(self.send_counts) != len(self.recv_counts) or len(self.send_counts) > MAX_CHANNELS:
            raise RecordError("send_counts and recv_counts must have the same length, at most 8")
        if self.peak_lag and len(self.peak_lag) != len(self.send_counts):
            raise RecordError("peak_lag must be empty (unknown) or one value per counter channel")
        if not 0 <= self.t_exit_err_ns <= MAX_TIME_NS:
            raise RecordError(f"t_exit_err_ns {self.t_exit_err_ns} outside [0, {MAX_TIME_NS}]")

    @property
    def trace_id(self) -> TraceId:
        return TraceId(self.comm_hash, self.op_seq, self.op_type, self.dtype, self.peer & 0xFFFF)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "incarnation": self.incarnation,
            "comm_hash": to_signed64(self.comm_hash),
            "op_seq": self.op_seq,
            "op_type": self.op_type.name,
            "dtype": self.dtype.name,
            "count": self.count,
            "peer": self.peer,
            "rank": self.rank,
            "comm_rank": self.comm_rank,
            "comm_size": self.comm_size,
            "world_size": self.world_size,
            "host": self.host,
            "status": self.status.name,
            "t_enter_ns": self.t_enter_ns,
            "t_exit_ns": self.t_exit_ns,
            "t_sample_ns": self.t_sample_ns,
            "send_counts": list(self.send_counts),
            "recv_counts": list(self.recv_counts),
            "t_prev_exit_ns": self.t_prev_exit_ns,  # not in the Avro schema: the encoder ignores it
            "t_exit_err_ns": self.t_exit_err_ns,  # nor is this
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KernelRecord:
        try:
            return cls(
                job=str(d["job"]),
                incarnation=int(d["incarnation"]),
                comm_hash=int(d["comm_hash"]),
                op_seq=int(d["op_seq"]),
                op_type=OpType[d["op_type"]],
                dtype=DType[d["dtype"]],
                count=int(d["count"]),
                peer=int(d["peer"]),
                rank=int(d["rank"]),
                comm_rank=int(d["comm_rank"]),
                comm_size=int(d["comm_size"]),
                world_size=int(d["world_size"]),
                host=str(d["host"]),
                status=Status[d["status"]],
                t_enter_ns=int(d["t_enter_ns"]),
                t_exit_ns=int(d["t_exit_ns"]),
                t_sample_ns=int(d["t_sample_ns"]),
                send_counts=tuple(int(x) for x in d["send_counts"]),
                recv_counts=tuple(int(x) for x in d["recv_counts"]),
                # absent from the single-record schema and from JSON lines of writers before it
                t_prev_exit_ns=int(d.get("t_prev_exit_ns", -1)),
                t_exit_err_ns=int(d.get("t_exit_err_ns", 0)),
            )
        except (KeyError, TypeError) as exc:
            raise RecordError(f"kernel record lacks or mistypes a field: {exc}") from exc


#: Per-row integer columns of a KernelBatch, in wire order (each packed as little-endian int64).
BATCH_COLUMNS: tuple[str, ...] = (
    "op_seq",
    "op_type",
    "dtype",
    "count",
    "peer",
    "rank",
    "comm_rank",
    "comm_size",
    "status",
    "host_idx",
    "t_enter_ns",
    "t_exit_ns",
    "t_sample_ns",
)
#: collectives whose element count is each rank's own data, not the op's: an all_to_all sends what the
#: router chose, so the counts differ between the ranks of one op and from step to step. Back to back (an
#: MoE layer's dispatch and combine) they are detailed in pairs (``ccld.bounded.RunSample``)
VARIABLE_SIZE_OPS = (int(OpType.ALL_TO_ALL),)
#: Detailed (sampled) ops per second and communicator a source sends at most (the bounded format).
DETAIL_OPS_PER_S = 8.0


def detail_one_in(ops_per_s: float, budget_per_s: float = DETAIL_OPS_PER_S) -> int:
    """The sampling stride for a communicator running ``ops_per_s``: the smallest power of two
    that keeps detailed ops at or under ``budget_per_s``. Powers of two nest: an op sampled at
    stride 2K is sampled at stride K too, so ranks that briefly disagree on K still agree on the
    coarser set."""
    if budget_per_s <= 0 or ops_per_s <= budget_per_s:
        return 1
    return 1 << math.ceil(math.log2(ops_per_s / budget_per_s))


def detail_sampled(comm_hash: npt.ArrayLike, op_seq: npt.ArrayLike, one_in: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Whether op ``op_seq`` of communicator ``comm_hash`` is sent in full at stride ``one_in``.

    A rule on the Trace ID alone (a 64-bit mix of communicator hash and op sequence), so every
    rank of the communicator picks the same ops with no coordination, and the choice does not
    alias with the periodic pattern of a training step the way ``op_seq % K`` would.
    """
    with np.errstate(over="ignore"):
        x = np.asarray(comm_hash, dtype=np.int64).astype(np.uint64) ^ (
            np.asarray(op_seq, dtype=np.int64).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        )
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    k = np.asarray(one_in, dtype=np.int64).astype(np.uint64)
    return np.asarray((x & (k - np.uint64(1))) == 0)


#: The largest per-channel peak backlog a kernel reports (16 bits in the probing frame: it saturates there).
def comm_group(comm_hash: npt.ArrayLike, groups: int) -> I64:
    """The group (0 to ``groups`` - 1) of each communicator, for analysis spread over several shards.

    The hash's unsigned value modulo ``groups``: communicator hashes are uniform, every producer and
    worker computes the same group with no coordination, and one communicator is never split.
    """
    h = np.asarray(comm_hash, dtype=np.int64).view(np.uint64)
    return (h % np.uint64(max(groups, 1))).astype(np.int64)


def job_partition(job: str, partitions: int) -> int:
    """The metrics partition of a job: stable across processes and languages (CRC-32)."""
    return zlib.crc32(job.encode("utf-8")) % max(partitions, 1)


def metrics_partition(job: str, comm_hash: int, partitions: int, groups: int = 1) -> int:
    """The metrics partition of a job's communicator: the job's own partition, moved on by the
    communicator's group (``comm_group``) when the job is spread over ``groups`` partitions."""
    home = job_partition(job, partitions)
    if groups <= 1:
        return home
    return (home + int(comm_group(comm_hash, groups))) % max(partitions, 1)


PEAK_LAG_MAX = 0xFFFF

#: Each row's communicator hash in a batch of several communicators; absent on the wire (and filled
#: with ``comm_hash``) when every row is of one, as in batches of writers that predate it.
COMM_COLUMN = "comm"

#: Columns a writer may leave out (older writers, sources that cannot know them), with the value
#: that stands for "unknown"; a batch without one gets it filled in.
OPTIONAL_BATCH_COLUMNS: dict[str, int] = {
    # end of this rank's previous op on any communicator: with sampled detail (only some ops sent
    # in full) the analyzer cannot see the previous op itself, yet needs the compute gap before this one
    "t_prev_exit_ns": -1,
    # how far from t_exit_ns the exit may have been (0: timed exactly, and every row of older writers)
    "t_exit_err_ns": 0,
}


@dataclass(frozen=True, eq=False)
class KernelBatch:
    """Many kernel records of one job incarnation, column by column.

    ``columns`` maps each name of ``BATCH_COLUMNS`` to an int64 array of length ``n``;
    ``send``/``recv`` are ``(n, channels)`` int64 arrays; ``host_idx`` indexes ``hosts``.
    ``producer``/``batch_seq`` identify the batch so a replayed duplicate can be recognised.
    Rows may belong to several communicators (one message per producer and flush, not one per
    communicator: the worker's cost is per message): column ``comm`` (``COMM_COLUMN``) holds each
    row's communicator hash; without it every row is ``comm_hash``'s, which is also the first row's.
    ``peak_lag`` is ``(n, channels)`` like send/recv: each DONE row's per-channel peak send backlog
    the kernel recorded (``KernelRecord.peak_lag``), -1 where unknown (an older writer, a source
    without counters, a row that is not a DONE); None (the default) fills it with -1.
    """

    job: str
    incarnation: int
    comm_hash: int
    world_size: int
    hosts: tuple[str, ...]
    columns: Mapping[str, I64]
    send: I64
    recv: I64
    producer: str = ""
    batch_seq: int = 0
    peak_lag: I64 | None = None
    # ENTER/DONE/IDLE records of this job incarnation its producer lost before this batch (queue full,
    # undeliverable, spool full or too old), and the ranks they were of: an absence-based verdict about
    # one of those ranks ("never entered") may rest on records that never arrived
    lost_records: int = 0
    lost_ranks: tuple[int, ...] = ()
    # (rank, stalled ns, not stalled ns) per sample: of the wall time since the rank's previous sample, how
    # long some task of its host (its cgroup) waited for a CPU, and the rest (Linux PSI, ``producers/attach/
    # cpu_wait.py``); a communication that is slow while its members' hosts are that starved of CPUs is the
    # host's load, not a link (``starved_wait_share``)
    cpu_wait: tuple[tuple[int, int, int], ...] = ()

    def __post_init__(self) -> None:
        n = self.n
        for c in self.cpu_wait:
            if len(c) != 3 or not 0 <= c[0] < max(self.world_size, 1) or c[1] < 0 or c[2] < 0 or c[1] + c[2] <= 0:
                raise RecordError(f"cpu_wait holds (rank in the job, wait ns >= 0, on-CPU ns >= 0, not both 0) "
                                  f"triples, got {c!r}")
        pk = self.peak_lag
        if pk is None or (pk.shape != self.send.shape and (self.send.ndim != 2 or self.send.shape[1] == 0
                                                            or not (pk >= 0).any())):
            # unknown, or a copy whose counters were replaced (dataclasses.replace): no peak without counters
            object.__setattr__(self, "peak_lag", np.full(self.send.shape, -1, dtype=np.int64))
        missing = {k: v for k, v in OPTIONAL_BATCH_COLUMNS.items() if k not in self.columns}
        if COMM_COLUMN not in self.columns:
            missing[COMM_COLUMN] = self.comm_hash
        if missing:
            filled = {k: np.full(n, v, dtype=np.int64) for k, v in missing.items()}
            object.__setattr__(self, "columns", {**self.columns, **filled})
        for name in (*BATCH_COLUMNS, *OPTIONAL_BATCH_COLUMNS, COMM_COLUMN):
            col = self.columns.get(name)
            if col is None or col.shape != (n,):
                raise RecordError(f"batch column {name!r} missing or not of length {n}")
        if n and int(self.columns[COMM_COLUMN][0]) != self.comm_hash:
            # the message key and the duplicate check name the batch by it
            raise RecordError("comm_hash must be the first row's communicator")
        if self.send.shape != self.recv.shape or self.send.ndim != 2 or self.send.shape[0] != n:
            raise RecordError(f"send/recv must both be ({n}, channels), got {self.send.shape}/{self.recv.shape}")
        if self.peaks.shape != self.send.shape:
            raise RecordError(f"peak_lag must be ({n}, channels) like send/recv, got {self.peaks.shape}")
        if self.send.shape[1] > MAX_CHANNELS:
            raise RecordError(f"at most {MAX_CHANNELS} channels per record, got {self.send.shape[1]}")
        if n and (int(self.columns["host_idx"].min()) < 0 or int(self.columns["host_idx"].max()) >= len(self.hosts)):
            raise RecordError("host_idx points outside the hosts table")
        if n and int(self.columns["rank"].min()) < 0:
            raise RecordError("a record without a rank (negative rank) is not accepted")

    @property
    def n(self) -> int:
        return int(self.columns["op_seq"].shape[0]) if "op_seq" in self.columns else 0

    @property
    def channels(self) -> int:
        return int(self.send.shape[1])

    @property
    def peaks(self) -> I64:
        """``peak_lag`` as a plain array (never None after construction)."""
        assert self.peak_lag is not None
        return self.peak_lag

    @property
    def one_comm(self) -> bool:
        """Whether every row is of communicator ``comm_hash`` (then the wire carries no ``comm`` column)."""
        comm = self.columns[COMM_COLUMN]
        return bool(comm.shape[0] == 0 or (comm == self.comm_hash).all())

    def col(self, name: str) -> I64:
        return self.columns[name]

    @classmethod
    def prebuilt(
        cls, *, job: str, incarnation: int, comm_hash: int, world_size: int, hosts: tuple[str, ...],
        columns: Mapping[str, I64], send: I64, recv: I64, peak_lag: I64, producer: str = "", batch_seq: int = 0,
    ) -> KernelBatch:
        """A batch from parts that already hold every rule ``__post_init__`` checks (every column of
        ``BATCH_COLUMNS``, ``OPTIONAL_BATCH_COLUMNS`` and ``COMM_COLUMN`` present, int64, of one length
        ``n``; ``comm_hash`` the first row's; send, recv and peak_lag ``(n, channels)``; host indexes
        and ranks in range): neither checked nor copied. For a maker that builds thousands of batches a
        simulated second from arrays it made itself (the simulator: the checks were half its time at
        8,192 ranks); its tests rebuild them through the constructor. Anything else uses the constructor."""
        b = object.__new__(cls)
        # a frozen dataclass: fields are set past its __setattr__, as its own __init__ does
        b.__dict__.update(job=job, incarnation=incarnation, comm_hash=comm_hash, world_size=world_size, hosts=hosts,
                          columns=columns, send=send, recv=recv, producer=producer, batch_seq=batch_seq,
                          peak_lag=peak_lag, lost_records=0, lost_ranks=(), cpu_wait=())
        return b

    @classmethod
    def from_records(
        cls, records: Sequence[KernelRecord], *, producer: str = "", batch_seq: int = 0
    ) -> KernelBatch:
        """Build a columnar batch from row records of one job and incarnation (any communicators)."""
        if not records:
            raise RecordError("a batch needs at least one record")
        first = records[0]
        if any((r.job, r.incarnation) != (first.job, first.incarnation) for r in records):
            raise RecordError("a batch holds records of one job and incarnation only")
        hosts: dict[str, int] = {}
        rows = []
        for r in records:
            h = hosts.setdefault(r.host, len(hosts))
            rows.append(
                (r.op_seq, int(r.op_type), int(r.dtype), r.count, r.peer, r.rank, r.comm_rank, r.comm_size,
                 int(r.status), h, r.t_enter_ns, r.t_exit_ns, r.t_sample_ns, r.t_prev_exit_ns, r.t_exit_err_ns)
            )
        names = (*BATCH_COLUMNS, "t_prev_exit_ns", "t_exit_err_ns")
        table = np.asarray(rows, dtype=np.int64).reshape(len(rows), len(names))
        channels = max(len(r.send_counts) for r in records)
        send = np.zeros((len(records), channels), dtype=np.int64)
        recv = np.zeros((len(records), channels), dtype=np.int64)
        peak = np.full((len(records), channels), -1, dtype=np.int64)
        for i, r in enumerate(records):
            send[i, : len(r.send_counts)] = r.send_counts
            recv[i, : len(r.recv_counts)] = r.recv_counts
            if r.peak_lag:
                peak[i, : len(r.peak_lag)] = r.peak_lag
        return cls(
            job=first.job,
            incarnation=first.incarnation,
            comm_hash=to_signed64(first.comm_hash),
            world_size=max(r.world_size for r in records),
            hosts=tuple(hosts),
            columns={
                **{name: np.ascontiguousarray(table[:, i]) for i, name in enumerate(names)},
                COMM_COLUMN: np.fromiter((to_signed64(r.comm_hash) for r in records), dtype=np.int64,
                                         count=len(records)),
            },
            send=send,
            recv=recv,
            producer=producer,
            batch_seq=batch_seq,
            peak_lag=peak,
        )

    @classmethod
    def concat(cls, batches: Sequence[KernelBatch], *, producer: str = "", batch_seq: int = 0) -> KernelBatch:
        """One batch holding the rows of several batches of the same job and incarnation."""
        if not batches:
            raise RecordError("concat needs at least one batch")
        first = batches[0]
        if any((b.job, b.incarnation) != (first.job, first.incarnation) for b in batches):
            raise RecordError("concat joins batches of one job and incarnation only")
        channels = max(b.channels for b in batches)
        hosts: dict[str, int] = {}
        names = (*BATCH_COLUMNS, *OPTIONAL_BATCH_COLUMNS, COMM_COLUMN)
        columns: dict[str, list[I64]] = {name: [] for name in names}
        send, recv, peak = [], [], []
        for b in batches:
            remap = np.array([hosts.setdefault(h, len(hosts)) for h in b.hosts], dtype=np.int64)
            for name in names:
                col = b.columns[name]
                columns[name].append(remap[col] if name == "host_idx" and b.n else col)
            pad = ((0, 0), (0, channels - b.channels))
            send.append(np.pad(b.send, pad))
            recv.append(np.pad(b.recv, pad))
            peak.append(np.pad(b.peaks, pad, constant_values=-1))
        return cls(
            job=first.job,
            incarnation=first.incarnation,
            comm_hash=first.comm_hash,
            world_size=max(b.world_size for b in batches),
            hosts=tuple(hosts),
            columns={name: np.concatenate(parts) for name, parts in columns.items()},
            send=np.concatenate(send),
            recv=np.concatenate(recv),
            producer=producer,
            batch_seq=batch_seq,
            peak_lag=np.concatenate(peak),
            lost_records=sum(b.lost_records for b in batches),
            lost_ranks=tuple(sorted({r for b in batches for r in b.lost_ranks})),
            cpu_wait=tuple(c for b in batches for c in b.cpu_wait),
        )

    def take(self, rows: npt.NDArray[np.int64], *, producer: str | None = None, batch_seq: int | None = None
             ) -> KernelBatch:
        """The batch of the given rows (in that order; at least one), the hosts table cut to their hosts.

        Cut, not kept whole: a rank's rows taken from a whole job's batch would otherwise carry every
        host of the job (512 names at 4,096 ranks), which its own producer never sends.
        """
        comm = self.columns[COMM_COLUMN][rows]
        if comm.shape[0] == 0:
            raise RecordError("take needs at least one row")
        columns = {k: v[rows] for k, v in self.columns.items()}
        used, inverse = np.unique(columns["host_idx"], return_inverse=True)
        columns["host_idx"] = inverse.astype(np.int64).reshape(-1)
        return KernelBatch(
            job=self.job, incarnation=self.incarnation, comm_hash=int(comm[0]), world_size=self.world_size,
            hosts=tuple(self.hosts[i] for i in used.tolist()), columns=columns, send=self.send[rows],
            recv=self.recv[rows], producer=self.producer if producer is None else producer,
            batch_seq=self.batch_seq if batch_seq is None else batch_seq, peak_lag=self.peaks[rows],
            lost_records=self.lost_records, lost_ranks=self.lost_ranks, cpu_wait=self.cpu_wait,
        )

    def by_rank(self) -> dict[int, KernelBatch]:
        """The rows of each rank as its own batch (what each rank's producer sends of these rows)."""
        rank = self.columns["rank"]
        order = np.argsort(rank, kind="stable")
        cuts = np.flatnonzero(np.diff(rank[order])) + 1
        return {int(rank[part[0]]): self.take(part) for part in np.split(order, cuts) if part.size}

    def by_group(self, groups: int) -> dict[int, KernelBatch]:
        """The rows of each communicator group (``comm_group``) as its own batch, same producer and
        sequence number (each group's analyzer remembers duplicates on its own); the batch itself
        when all its rows are in one group."""
        g = comm_group(self.columns[COMM_COLUMN], groups)
        if self.n == 0 or not (g != g[0]).any():
            return {int(g[0]) if self.n else 0: self}
        order = np.argsort(g, kind="stable")
        cuts = np.flatnonzero(np.diff(g[order])) + 1
        return {int(g[part[0]]): self.take(part) for part in np.split(order, cuts)}

    def records(self) -> list[KernelRecord]:
        """The row form (slow; for tests, dead letters and the archive, not the hot path)."""
        cols = {k: v.tolist() for k, v in self.columns.items()}
        out = []
        for i in range(self.n):
            out.append(
                KernelRecord(
                    job=self.job,
                    incarnation=self.incarnation,
                    comm_hash=cols[COMM_COLUMN][i],
                    op_seq=cols["op_seq"][i],
                    op_type=OpType(cols["op_type"][i]),
                    dtype=DType(cols["dtype"][i]),
                    count=cols["count"][i],
                    peer=cols["peer"][i],
                    rank=cols["rank"][i],
                    comm_rank=cols["comm_rank"][i],
                    comm_size=cols["comm_size"][i],
                    world_size=self.world_size,
                    host=self.hosts[cols["host_idx"][i]],
                    status=Status(cols["status"][i]),
                    t_enter_ns=cols["t_enter_ns"][i],
                    t_exit_ns=cols["t_exit_ns"][i],
                    t_sample_ns=cols["t_sample_ns"][i],
                    send_counts=tuple(self.send[i].tolist()),
                    recv_counts=tuple(self.recv[i].tolist()),
                    peak_lag=() if (self.peaks[i] < 0).all() else tuple(self.peaks[i].tolist()),
                    t_prev_exit_ns=cols["t_prev_exit_ns"][i],
                    t_exit_err_ns=cols["t_exit_err_ns"][i],
                )
            )
        return out


class Link(NamedTuple):
    """A directed link between two global ranks (data flows src -> dst); a pair, so ``src, dst = link`` works."""

    src: int
    dst: int


@dataclass(frozen=True, kw_only=True)
class Finding:
    """What the analyzer found: the class, the root cause, the evidence; a ``Verdict`` without its incident.

    The detectors' candidates (``streams.analysis.incidents.Candidate``) and the verdicts on the wire
    share these fields, so a field added here reaches both.
    """

    kind: AnomalyKind
    job: str
    communicator: str  # 16 hex digits
    op_seq: int
    op_type: str
    root_cause_ranks: tuple[int, ...]
    affected_ranks: tuple[int, ...]
    confidence: float
    evidence: str
    onset_time: float
    root_cause_hosts: tuple[str, ...] = ()
    link: Link | None = None
    channel: int | None = None
    p: float | None = None
    mismatch_field: str | None = None
    details: Mapping[str, str] = field(default_factory=dict)


#: the fields every finding has (a Verdict adds its incident, state and detection time)
FINDING_FIELDS = tuple(f.name for f in fields(Finding))


@dataclass(frozen=True, kw_only=True)
class Verdict(Finding):
    """One verdict about one incident: the class, the root cause, the evidence.

    ``onset_time`` and ``detected_time`` are seconds on the analyzer's clock (wall clock in
    the worker, simulated time in the simulator), never a rank's clock.
    """

    incident_id: str
    state: VerdictState
    detected_time: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "incident_id": self.incident_id,
            "state": self.state.value,
            "kind": self.kind.value,
            "job": self.job,
            "communicator": self.communicator,
            "op_seq": self.op_seq,
            "op_type": self.op_type,
            "root_cause_ranks": list(self.root_cause_ranks),
            "root_cause_hosts": list(self.root_cause_hosts),
            "affected_ranks": list(self.affected_ranks),
            "link": None if self.link is None else {"src": self.link.src, "dst": self.link.dst},
            "channel": self.channel,
            "p": self.p,
            "mismatch_field": self.mismatch_field,
            "confidence": self.confidence,
            "evidence": self.evidence,
            "onset_time": self.onset_time,
            "detected_time": self.detected_time,
            "details": dict(self.details),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        try:
            link = d.get("link")
            return cls(
                incident_id=str(d["incident_id"]),
                state=VerdictState(d["state"]),
                kind=AnomalyKind(d["kind"]),
                job=str(d["job"]),
                communicator=str(d["communicator"]),
                op_seq=int(d["op_seq"]),
                op_type=str(d["op_type"]),
                root_cause_ranks=tuple(int(x) for x in d["root_cause_ranks"]),
                root_cause_hosts=tuple(str(x) for x in d.get("root_cause_hosts") or ()),
                affected_ranks=tuple(int(x) for x in d["affected_ranks"]),
                link=None if link is None else Link(int(link["src"]), int(link["dst"])),
                channel=None if d.get("channel") is None else int(d["channel"]),
                p=None if d.get("p") is None else float(d["p"]),
                mismatch_field=d.get("mismatch_field"),
                confidence=float(d["confidence"]),
                evidence=str(d["evidence"]),
                onset_time=float(d["onset_time"]),
                detected_time=float(d["detected_time"]),
                details=dict(d.get("details") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"verdict lacks or mistypes a field: {exc}") from exc

    @property
    def dedupe_key(self) -> str:
        """Identity for de-duplication: an incident may have several distinct updates, never two equal ones.

        The class and the link are part of it: an ``update`` that refines S2 to S3, or names the link of
        an S2 found without one, keeps the incident's ranks and op, and must still reach the reader."""
        link = "" if self.link is None else f"{self.link.src}>{self.link.dst}"
        ranks = ",".join(map(str, self.root_cause_ranks))
        return f"{self.incident_id}/{self.state.value}/{self.op_seq}/{self.kind.value}/{ranks}/{link}"

    def describe(self) -> str:
        """One readable line, as `ccld verdicts` and `ccld demo` print it."""
        where = f"rank {','.join(map(str, self.root_cause_ranks))}" if self.root_cause_ranks else "root not localized"
        if self.root_cause_hosts:
            where += f" on {','.join(self.root_cause_hosts)}"
        extra = []
        if self.link is not None:
            extra.append(f"link {self.link.src}->{self.link.dst}")
        if self.channel is not None:
            extra.append(f"channel {self.channel}")
        if self.p is not None:
            extra.append(f"P={self.p:.2f}")
        if self.mismatch_field:
            extra.append(f"differs in {self.mismatch_field}")
        tail = f" ({'; '.join(extra)})" if extra else ""
        return (
            f"[{self.state.value}] {self.kind.value} {where}: {self.op_type} #{self.op_seq} of comm "
            f"{self.communicator}{tail}; {len(self.affected_ranks)} ranks affected; {self.evidence} "
            f"[incident {self.incident_id}, confidence {self.confidence:.2f}]"
        )


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message the pipeline could not use, kept with the reason and where it came from."""

    raw: bytes
    reason: str
    detail: str
    source_topic: str
    source_partition: int
    source_offset: int
    time_ms: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "raw": self.raw,
            "reason": self.reason,
            "detail": self.detail,
            "source_topic": self.source_topic,
            "source_partition": self.source_partition,
            "source_offset": self.source_offset,
            "time_ms": self.time_ms,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeadLetter:
        return cls(
            raw=bytes(d["raw"]),
            reason=str(d["reason"]),
            detail=str(d["detail"]),
            source_topic=str(d["source_topic"]),
            source_partition=int(d["source_partition"]),
            source_offset=int(d["source_offset"]),
            time_ms=int(d["time_ms"]),
        )


# --- value checks (appended for issue 11: impossible values are dead letters, never analysed) ------------------

#: A rank's clock reading above this (ns; about the year 2116 as epoch time) is a corrupt value, not a time.
MAX_TIME_NS = 1 << 62
#: Counters and element counts above this are corrupt values (int64-extreme), not measurements.
MAX_COUNT = 1 << 62
def _members(enum_type: type[enum.IntEnum]) -> npt.NDArray[np.bool_]:
    """A lookup table ``t[v]`` true for the enum's values (they are small non-negative ints)."""
    table = np.zeros(max(int(x) for x in enum_type) + 1, dtype=bool)
    table[[int(x) for x in enum_type]] = True
    return table


_OP_TYPES = _members(OpType)
_DTYPES = _members(DType)
_STATUSES = _members(Status)


def _not_member(v: I64, table: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    # a table lookup, not np.isin: isin sorts, and this runs on every batch the worker reads
    inside = (v >= 0) & (v < table.shape[0])
    return ~(inside & table[np.where(inside, v, 0)])


#: Columns the fast path bounds, with their lowest and highest possible values (None: the world size).
_BOUNDED: tuple[tuple[str, int, int | None], ...] = (
    ("rank", 0, None), ("comm_rank", 0, None), ("comm_size", 1, None), ("op_seq", 0, MAX_TIME_NS),
    ("op_type", 0, len(_OP_TYPES) - 1), ("dtype", 0, len(_DTYPES) - 1), ("status", 0, len(_STATUSES) - 1),
    ("count", 0, MAX_COUNT), ("peer", -1, MAX_TIME_NS), ("t_enter_ns", -1, MAX_TIME_NS),
    ("t_exit_ns", -1, MAX_TIME_NS), ("t_sample_ns", -1, MAX_TIME_NS), ("t_exit_err_ns", 0, MAX_TIME_NS),
)


_BOUNDED_LO = np.array([v for _, v, _ in _BOUNDED], dtype=np.int64)
_BOUNDED_HI = np.array([-1 if v is None else v for _, _, v in _BOUNDED], dtype=np.int64)
_BOUNDED_BY_WS = np.array([v is None and name != "comm_size" for name, _, v in _BOUNDED])
_BOUNDED_COMM_SIZE = np.array([name == "comm_size" for name, _, _ in _BOUNDED])


def _exit_before_enter(c: Mapping[str, I64]) -> npt.NDArray[np.bool_]:
    """Rows that left their op before they entered it, on the same rank clock, beyond the exit's own
    uncertainty: no source writes that; a producer that does mis-stamps its rows (a clock reset mid-op)."""
    enter, exit_ = c["t_enter_ns"], c["t_exit_ns"]
    return np.asarray((enter >= 0) & (exit_ >= 0) & (exit_ + c["t_exit_err_ns"] < enter))


def _all_plausible(batch: KernelBatch) -> bool:
    """Whether no value of ``batch`` can be impossible, in a handful of array operations.

    Every batch the worker reads passes here; only one that fails gets the detailed checks of
    ``batch_value_problems`` (which name the problem). Same rules, fewer passes: the per-column
    checks cost about as much as decoding the batch.
    """
    ws = batch.world_size
    c = batch.columns
    m = np.stack([c[name] for name, _, _ in _BOUNDED])
    hi = _BOUNDED_HI.copy()
    hi[_BOUNDED_BY_WS] = ws - 1
    hi[_BOUNDED_COMM_SIZE] = ws
    if (m.min(axis=1) < _BOUNDED_LO).any() or (m.max(axis=1) > hi).any():
        return False
    if not bool((c["comm_rank"] < c["comm_size"]).all()):
        return False
    if _exit_before_enter(c).any():
        return False
    for name, table in (("op_type", _OP_TYPES), ("dtype", _DTYPES), ("status", _STATUSES)):
        if not table.all() and _not_member(c[name], table).any():  # a gap in the enum's values
            return False
    if batch.channels:
        lo_c = min(int(batch.send.min()), int(batch.recv.min()))
        hi_c = max(int(batch.send.max()), int(batch.recv.max()))
        if lo_c < 0 or hi_c > MAX_COUNT:
            return False
        pk = batch.peaks
        if int(pk.min()) < -1 or int(pk.max()) > PEAK_LAG_MAX:
            return False
    return True


def batch_value_problems(batch: KernelBatch) -> list[str]:
    """Every impossible value of ``batch``, one readable line per kind of problem; empty when it is usable.

    Pure and vectorised (one pass per column), shared by the worker and the sink: a batch with
    any problem is dead-lettered whole, because a producer that writes one impossible row
    cannot be trusted for the rows beside it.
    """
    problems: list[str] = []

    def check(bad: npt.NDArray[np.bool_], what: str, col: I64 | None = None) -> None:
        if bad.any():
            rows = np.flatnonzero(bad)
            shown = f" (first row {int(rows[0])}" + (f": {int(col[rows[0]])})" if col is not None else ")")
            problems.append(f"{what} in {rows.size} of {batch.n} rows{shown}")

    if batch.world_size <= 0:
        problems.append(f"world_size {batch.world_size} <= 0")
    if batch.incarnation < 0:
        problems.append(f"incarnation {batch.incarnation} < 0")
    if batch.n == 0 or (not problems and _all_plausible(batch)):
        return problems
    c = batch.columns
    rank, comm_rank, comm_size = c["rank"], c["comm_rank"], c["comm_size"]
    check((rank < 0) | (rank >= max(batch.world_size, 0)), f"rank outside [0, world_size={batch.world_size})", rank)
    check(comm_size <= 0, "comm_size <= 0", comm_size)
    check(comm_size > max(batch.world_size, 0), "comm_size > world_size", comm_size)
    check((comm_rank < 0) | (comm_rank >= comm_size), "comm_rank outside [0, comm_size)", comm_rank)
    check(c["op_seq"] < 0, "negative op_seq", c["op_seq"])
    check(_not_member(c["op_type"], _OP_TYPES), "unknown op_type", c["op_type"])
    check(_not_member(c["dtype"], _DTYPES), "unknown dtype", c["dtype"])
    check(_not_member(c["status"], _STATUSES), "unknown status", c["status"])
    check((c["count"] < 0) | (c["count"] > MAX_COUNT), "element count negative or int64-extreme", c["count"])
    check(c["peer"] < -1, "peer below -1", c["peer"])
    for name in ("t_enter_ns", "t_exit_ns", "t_sample_ns"):
        t = c[name]
        # -1 is the documented "not observed"; any other negative value or an int64-extreme one is corrupt.
        check(((t < 0) & (t != -1)) | (t > MAX_TIME_NS), f"{name} negative or int64-extreme", t)
    err = c["t_exit_err_ns"]
    check((err < 0) | (err > MAX_TIME_NS), "t_exit_err_ns negative or int64-extreme", err)
    check(_exit_before_enter(c), "t_exit_ns before t_enter_ns (by more than t_exit_err_ns)", c["t_exit_ns"])
    if batch.channels:
        counters = np.concatenate([batch.send, batch.recv], axis=1)
        check(np.asarray(((counters < 0) | (counters > MAX_COUNT)).any(axis=1)),
              "send/recv counter negative or int64-extreme")
        pk = batch.peaks
        check(np.asarray(((pk < -1) | (pk > PEAK_LAG_MAX)).any(axis=1)), f"peak_lag outside [-1, {PEAK_LAG_MAX}]")
    return problems
