"""From successive frame snapshots of one rank to kernel records (pure; no threads, no I/O).

``FrameTracker.update(snapshot, now_ns)`` returns the records the change since the previous
snapshot implies, following the record semantics every CCL-D source shares: ENTERED once when a
kernel is first seen inside (``t_enter = t_sample = t_begin``), PROGRESS at every poll while it
stays inside (a heartbeat even when the counters are frozen), DONE once when it has ended. A
kernel that begins and ends between two polls yields only its DONE. Kernels that were overwritten
before a poll saw them (more than 8 behind) are counted as missed.

Times are on the GPU clock of the frame (``%globaltimer``), the rank's own clock; ``now_ns`` must
be mapped onto it (``ClockMap``). Only the latest kernel's begin, the latest end, and what this
tracker saw itself are known: a DONE of an earlier kernel that no poll saw inside carries
``t_enter_ns = t_exit_ns = t_sample_ns = -1`` (not observed) with its final counters.
Every DONE carries the kernel's own per-channel peak backlog (``peak_lag``, frame format v2), so a
kernel no poll saw inside still reports how far it received ahead of sending.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ccld.errors import RecordError
from ccld.probe import layout
from ccld.probe.frame import FrameSnapshot, unwrap_u32
from ccld.records import KernelRecord, Status, TraceId

log = logging.getLogger(__name__)

NO_ROOT = 0xFFFF
CountOf = Callable[[TraceId], int]


@dataclass(frozen=True, slots=True)
class RankBinding:
    """Who writes a frame: the identity fields of every record made from it."""

    job: str
    rank: int
    comm_rank: int
    comm_size: int
    world_size: int
    host: str
    incarnation: int = 0


@dataclass(frozen=True, slots=True)
class Rates:
    """Per-channel send and receive rates (chunks per second) between two samples of one op."""

    op_seq: int
    window_ns: int
    send: tuple[float, ...]
    recv: tuple[float, ...]


def rates_between(
    t0_ns: int,
    send0: tuple[int, ...],
    recv0: tuple[int, ...],
    t1_ns: int,
    send1: tuple[int, ...],
    recv1: tuple[int, ...],
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Counter deltas over the window, per second of the rank's own clock (0 for an empty window)."""
    dt = t1_ns - t0_ns
    if dt <= 0:
        return tuple(0.0 for _ in send1), tuple(0.0 for _ in recv1)
    scale = 1e9 / dt
    return (
        tuple((b - a) * scale for a, b in zip(send0, send1, strict=True)),
        tuple((b - a) * scale for a, b in zip(recv0, recv1, strict=True)),
    )


class ClockMap:
    """Maps host time onto the frame's GPU clock: ``gpu = host + offset_ns``.

    Starts from a calibrated offset (0 when the GPU timer runs on the host's clock, as for the
    twin) and only ever raises it, when the GPU has written a time the mapping says is still in
    the future: a write can never postdate the read that sees it.
    """

    def __init__(self, offset_ns: int = 0) -> None:
        self.offset_ns = offset_ns
        self.corrections = 0

    def observe(self, gpu_written_ns: int, host_now_ns: int) -> None:
        if gpu_written_ns > host_now_ns + self.offset_ns:
            self.offset_ns = gpu_written_ns - host_now_ns
            self.corrections += 1

    def to_gpu(self, host_ns: int) -> int:
        return host_ns + self.offset_ns


class FrameTracker:
    """Record state machine of one frame (one rank, one communicator stream)."""

    def __init__(self, binding: RankBinding, count_of: CountOf | None = None) -> None:
        self.binding = binding
        self._count_of = count_of
        self._k_raw: int | None = None  # last raw kernel_index
        self._k = 0  # unwrapped kernel_index
        self._done = 0  # unwrapped kernels_done
        self._reported = 0  # kernels up to this number have had their DONE (or were skipped)
        self._open: int | None = None  # kernel number seen inside (ENTERED emitted)
        self._open_enter_ns = -1
        self._open_channels = 0
        self._open_send: tuple[int, ...] = ()
        self._open_recv: tuple[int, ...] = ()
        self._last_sample_ns = -1
        self.rates: Rates | None = None
        self.missed = 0
        self.bad_traces = 0

    def _record(
        self,
        trace: TraceId,
        status: Status,
        enter: int,
        exit_: int,
        sample: int,
        send: tuple[int, ...],
        recv: tuple[int, ...],
        peak: tuple[int, ...] = (),
    ) -> KernelRecord:
        b = self.binding
        count = -1 if self._count_of is None else self._count_of(trace)
        return KernelRecord(
            job=b.job,
            incarnation=b.incarnation,
            comm_hash=trace.comm_hash,
            op_seq=trace.op_seq,
            op_type=trace.op_type,
            dtype=trace.dtype,
            count=count,
            peer=-1 if trace.root == NO_ROOT else trace.root,
            rank=b.rank,
            comm_rank=b.comm_rank,
            comm_size=b.comm_size,
            world_size=b.world_size,
            host=b.host,
            status=status,
            t_enter_ns=enter,
            t_exit_ns=exit_,
            t_sample_ns=sample,
            send_counts=send,
            recv_counts=recv,
            peak_lag=peak,
        )

    def update(self, snap: FrameSnapshot, now_ns: int) -> list[KernelRecord]:
        """Records implied by ``snap`` (taken at ``now_ns`` on the frame's clock)."""
        if self._k_raw is None:
            # First sight: every kernel from here on is ours; of the history before, only the
            # latest kernel is reported (an empty frame has none).
            self._k = snap.kernel_index
            self._reported = max(self._k - 1, 0)
        else:
            self._k = unwrap_u32(self._k, snap.kernel_index)
        self._k_raw = snap.kernel_index
        self._done = self._k - ((snap.kernel_index - snap.kernels_done) % (1 << 32))
        inside = self._done < self._k
        out: list[KernelRecord] = []
        first = self._reported + 1
        oldest = self._k - layout.N_SUBBLOCKS + 1
        if first < oldest:
            self.missed += oldest - first
            if self._open is not None and self._open < oldest:
                self._open = None
            first = oldest
        for j in range(first, self._k + 1):
            sub = snap.sub_for(j)
            try:
                trace = sub.trace()
            except RecordError as exc:
                self.bad_traces += 1
                log.debug("frame of rank %d: kernel %d has a bad Trace ID: %s", self.binding.rank, j, exc)
                continue
            latest = j == self._k
            width = snap.channels if latest or self._open != j else self._open_channels
            send, recv = sub.send[:width], sub.recv[:width]
            if latest and inside:
                out.extend(self._inside(j, trace, snap, now_ns, width, send, recv))
                continue
            enter = self._open_enter_ns if self._open == j else -1
            exit_ = -1
            if latest:
                enter, exit_ = snap.t_begin_ns, snap.t_end_ns
            elif j == self._k - 1 and inside:
                exit_ = snap.t_end_ns  # the most recent end is this kernel's
            if self._open == j:
                send = tuple(max(a, b) for a, b in zip(send, self._open_send, strict=False))
                recv = tuple(max(a, b) for a, b in zip(recv, self._open_recv, strict=False))
                self._open = None
                self.rates = None
            out.append(self._record(trace, Status.DONE, enter, exit_, exit_, send, recv, sub.peak[:width]))
        self._reported = self._k - 1 if inside else self._k
        return out

    def _inside(
        self,
        j: int,
        trace: TraceId,
        snap: FrameSnapshot,
        now_ns: int,
        width: int,
        send: tuple[int, ...],
        recv: tuple[int, ...],
    ) -> list[KernelRecord]:
        out = []
        if self._open != j:
            self._open = j
            self._open_enter_ns = snap.t_begin_ns
            self._open_channels = width
            self._open_send = (0,) * width
            self._open_recv = (0,) * width
            self._last_sample_ns = snap.t_begin_ns
            self.rates = None
            zeros = (0,) * width
            out.append(self._record(trace, Status.ENTERED, snap.t_begin_ns, -1, snap.t_begin_ns, zeros, zeros))
        # Live counters are monotonic except for a fold race on the GPU; never report a step back.
        send = tuple(max(a, b) for a, b in zip(send, self._open_send, strict=True))
        recv = tuple(max(a, b) for a, b in zip(recv, self._open_recv, strict=True))
        sample = max(now_ns, self._last_sample_ns, snap.t_begin_ns)
        rs, rr = rates_between(self._last_sample_ns, self._open_send, self._open_recv, sample, send, recv)
        self.rates = Rates(trace.op_seq, sample - self._last_sample_ns, rs, rr)
        self._open_send, self._open_recv, self._last_sample_ns = send, recv, sample
        out.append(self._record(trace, Status.PROGRESS, self._open_enter_ns, -1, sample, send, recv))
        return out
