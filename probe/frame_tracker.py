"""From successive frame snapshots of one rank to kernel records (pure; no threads, no I/O).

``FrameTracker.update(snapshot, now_ns)`` returns the records the change since the previous
snapshot implies, in the bounded record format every CCL-D source sends (docs/wire-format.md, "Record format
and its cost"), so the record rate does not grow with the collective rate:

- **in flight**: the first poll that finds a kernel inside ships its ``ENTERED`` (``t_enter =
  t_sample = t_begin``, zero counters) and a ``PROGRESS`` with the live counters (a "look": at
  most one per communicator and ``interval_s``, never twice for one kernel; a kernel the look
  budget of its interval left out gets it in the next interval), so a rank stuck in a kernel
  shows up within a poll or an interval;
- **state**, every ``interval_s`` (1 s, intervals aligned to the frame's clock) and
  communicator: ``PROGRESS`` of the kernel inside (a heartbeat even when the counters are
  frozen: hangs are judged on these), else ``IDLE`` with the last kernel's signature, times
  and final counters;
- **detail**: the ``DONE`` record of a kernel only when ``ccld.records.detail_sampled(comm_hash,
  op_seq, K)`` picks it, with K decided per communicator by ``ccld.bounded.StrideWindow`` (the
  attachment's rule): at the same op sequence numbers, from the op rate measured on the
  kernels' begin times (only the newest kernel's is in the frame; a check between two polls
  interpolates), so every rank picks the same K from the same op on and details the same ops.
  A DONE carries the kernel's final counters and its own per-channel peak backlog
  (``peak_lag``, frame format v2), and ``t_prev_exit_ns``: the latest end of a kernel of this
  rank (any of its frames) that a poll saw before this one began. Kernels not picked cost no
  record (``unsampled``).

``detail="all"`` is the per-kernel format, for debugging: ENTERED once when a kernel is first
seen inside, PROGRESS at every poll while it stays inside, the DONE of every kernel, and the
states. Kernels that were overwritten before a poll saw them (more than 8 behind) are counted as
missed, sampled or not: at more than 8 kernels per poll interval a rank's details are a subset
of the sampled ops (poll faster to see them all; it costs no records).

Times are on the GPU clock of the frame (``%globaltimer``), the rank's own clock; ``now_ns`` must
be mapped onto it (``ClockMap``). Only the latest kernel's begin, the latest end, and what this
tracker saw itself are known: a DONE of an earlier kernel that no poll saw inside carries
``t_enter_ns = t_exit_ns = t_sample_ns = -1`` (not observed) with its final counters.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ccld.bounded import DEFAULT_INTERVAL_S, DETAIL_MODES, ExitLog, StrideWindow, op_sampled
from ccld.errors import ConfigError, RecordError
from ccld.probe import layout
from ccld.probe.frame import FrameSnapshot, unwrap_u32
from ccld.records import DETAIL_OPS_PER_S, KernelRecord, Status, TraceId

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


@dataclass(frozen=True, slots=True)
class _Kernel:
    """A finished kernel as the state of its communicator (IDLE) remembers it."""

    trace: TraceId
    enter: int
    exit: int
    send: tuple[int, ...]
    recv: tuple[int, ...]
    prev: int


@dataclass(slots=True)
class _Comm:
    """What the tracker keeps per communicator: its stride, rate point, newest kernel, look."""

    active_ns: int  # the last poll that saw one of its kernels
    stride: StrideWindow
    pt_seq: int = -1  # the newest op whose begin time is known (the rate's last point)
    pt_ns: int = -1
    last: _Kernel | None = None  # the newest finished kernel (the IDLE state)
    look_idx: int = -1  # the interval of its last look


class FrameTracker:
    """Record state machine of one frame (one rank, one communicator stream)."""

    def __init__(
        self,
        binding: RankBinding,
        count_of: CountOf | None = None,
        *,
        detail: str = "sampled",
        interval_s: float = DEFAULT_INTERVAL_S,
        detail_budget: float = DETAIL_OPS_PER_S,
        exits: ExitLog | None = None,
        comms_max: int = 64,
        forget_s: float = 600.0,
    ) -> None:
        if detail not in DETAIL_MODES:
            raise ConfigError(f"unknown detail mode {detail!r}: use one of {', '.join(DETAIL_MODES)}")
        if interval_s <= 0:
            raise ConfigError(f"interval_s must be > 0, got {interval_s}")
        self.binding = binding
        self._count_of = count_of
        self.detail = detail
        self.interval_s = interval_s
        self.detail_budget = detail_budget
        self._exits = ExitLog() if exits is None else exits  # shared by the frames of one rank
        self._comms_max = max(1, comms_max)
        self._forget_ns = int(forget_s * 1e9)
        self._comms: dict[int, _Comm] = {}
        self._next_state_ns: int | None = None
        self._last_end_ns = -1
        self._k_raw: int | None = None  # last raw kernel_index
        self._k = 0  # unwrapped kernel_index
        self._done = 0  # unwrapped kernels_done
        self._reported = 0  # kernels up to this number have had their DONE (or were skipped)
        self._open: int | None = None  # kernel number seen inside
        self._open_trace: TraceId | None = None
        self._open_enter_ns = -1
        self._open_channels = 0
        self._open_send: tuple[int, ...] = ()
        self._open_recv: tuple[int, ...] = ()
        self._open_one_in = 1  # its detail stride
        self._open_prev = -1  # where the rank's previous kernel ended
        self._open_entered = False  # its ENTERED has been sent
        self._last_sample_ns = -1
        self.rates: Rates | None = None
        self.missed = 0
        self.bad_traces = 0
        self.details = 0  # DONE records sent
        self.unsampled = 0  # finished kernels the sampling left out (no record)
        self.comms_forgotten = 0

    @property
    def per_call(self) -> bool:
        return self.detail == "all"

    def strides(self) -> dict[int, int]:
        """The detail stride K of each communicator now (tests, stats)."""
        return {h: c.stride.one_in for h, c in self._comms.items()}

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
        prev: int = -1,
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
            t_prev_exit_ns=prev,
        )

    def _comm(self, comm_hash: int, now_ns: int) -> _Comm:
        c = self._comms.get(comm_hash)
        if c is None:
            if len(self._comms) >= self._comms_max:
                oldest = min(self._comms, key=lambda h: self._comms[h].active_ns)
                del self._comms[oldest]
                self.comms_forgotten += 1
            c = self._comms[comm_hash] = _Comm(now_ns, StrideWindow(self.interval_s, self.detail_budget))
        c.active_ns = now_ns
        return c

    def update(self, snap: FrameSnapshot, now_ns: int, *, final: bool = False) -> list[KernelRecord]:
        """Records implied by ``snap`` (taken at ``now_ns`` on the frame's clock); ``final``: the
        last poll, which sends every communicator's state whether or not an interval ended."""
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
        if self._done > 0 and snap.t_end_ns != self._last_end_ns:
            self._last_end_ns = snap.t_end_ns  # the latest end (the kernel before the one inside, if any)
            self._exits.add(snap.t_end_ns)
        out: list[KernelRecord] = []
        first = self._reported + 1
        oldest = self._k - layout.N_SUBBLOCKS + 1
        if first < oldest:
            self.missed += oldest - first
            if self._open is not None and self._open < oldest:
                self._open = None
            first = oldest
        visible: list[tuple[int, TraceId]] = []
        for j in range(first, self._k + 1):
            try:
                visible.append((j, snap.sub_for(j).trace()))
            except RecordError as exc:
                self.bad_traces += 1
                log.debug("frame of rank %d: kernel %d has a bad Trace ID: %s", self.binding.rank, j, exc)
        # the rate's newest point of each communicator: its newest op here, at the newest begin
        # (the frame's latest kernel's own begin; an earlier kernel began before it)
        points = {trace.comm_hash: (trace.op_seq, snap.t_begin_ns) for _, trace in visible}
        for j, trace in visible:
            c = self._comm(trace.comm_hash, now_ns)
            one_in = self._stride(c, trace.op_seq, points[trace.comm_hash]) if self._open != j else self._open_one_in
            sub = snap.sub_for(j)
            latest = j == self._k
            width = snap.channels if latest or self._open != j else self._open_channels
            send, recv = sub.send[:width], sub.recv[:width]
            if latest and inside:
                self._inside(j, trace, snap, now_ns, width, send, recv, one_in)
                continue
            was_open = self._open == j
            enter = self._open_enter_ns if was_open else -1
            exit_ = -1
            if latest:
                enter, exit_ = snap.t_begin_ns, snap.t_end_ns
            elif j == self._k - 1 and inside:
                exit_ = snap.t_end_ns  # the most recent end is this kernel's
            prev = self._open_prev if was_open else (self._exits.before(enter) if enter >= 0 else -1)
            if was_open:
                send = tuple(max(a, b) for a, b in zip(send, self._open_send, strict=False))
                recv = tuple(max(a, b) for a, b in zip(recv, self._open_recv, strict=False))
                self._open = None
                self.rates = None
            c.last = _Kernel(trace, enter, exit_, send, recv, prev)
            if self.per_call or op_sampled(trace.comm_hash, trace.op_seq, one_in):
                out.append(self._record(trace, Status.DONE, enter, exit_, exit_, send, recv, sub.peak[:width], prev))
                self.details += 1
            else:
                self.unsampled += 1
        for h, (seq, t) in points.items():
            pc = self._comms.get(h)
            if pc is not None:
                pc.pt_seq, pc.pt_ns = seq, t
        self._reported = self._k - 1 if inside else self._k
        in_flight = self._open_trace if inside and self._open == self._k else None
        shipped = self._look(out, in_flight, now_ns)
        if self._state_due(now_ns, final):
            self._states(out, in_flight, shipped, now_ns)
        return out

    def _stride(self, c: _Comm, seq: int, point: tuple[int, int]) -> int:
        """The stride in force for op ``seq``: checked where a source seeing every op would check,
        each check's begin time interpolated between the last poll's point and this poll's."""
        if self.per_call:
            return 1
        p0s, p0t = c.pt_seq, c.pt_ns
        p1s, p1t = point

        def t_of(b: int) -> int:
            if p0s < 0 or b <= p0s or p1s <= p0s or b >= p1s or p1t <= p0t:
                return p1t
            return p0t + (p1t - p0t) * (b - p0s) // (p1s - p0s)

        return c.stride.observe_upto(seq, t_of)

    def _inside(
        self,
        j: int,
        trace: TraceId,
        snap: FrameSnapshot,
        now_ns: int,
        width: int,
        send: tuple[int, ...],
        recv: tuple[int, ...],
        one_in: int,
    ) -> None:
        if self._open != j:
            self._open = j
            self._open_trace = trace
            self._open_enter_ns = snap.t_begin_ns
            self._open_channels = width
            self._open_send = (0,) * width
            self._open_recv = (0,) * width
            self._open_one_in = one_in
            self._open_prev = self._exits.before(snap.t_begin_ns)
            self._open_entered = False
            self._last_sample_ns = snap.t_begin_ns
            self.rates = None
        # Live counters are monotonic except for a fold race on the GPU; never report a step back.
        send = tuple(max(a, b) for a, b in zip(send, self._open_send, strict=True))
        recv = tuple(max(a, b) for a, b in zip(recv, self._open_recv, strict=True))
        sample = max(now_ns, self._last_sample_ns, snap.t_begin_ns)
        rs, rr = rates_between(self._last_sample_ns, self._open_send, self._open_recv, sample, send, recv)
        self.rates = Rates(trace.op_seq, sample - self._last_sample_ns, rs, rr)
        self._open_send, self._open_recv, self._last_sample_ns = send, recv, sample

    def _progress(self, trace: TraceId) -> KernelRecord:
        return self._record(trace, Status.PROGRESS, self._open_enter_ns, -1, self._last_sample_ns,
                            self._open_send, self._open_recv, prev=self._open_prev)  # fmt: skip

    def _look(self, out: list[KernelRecord], trace: TraceId | None, now_ns: int) -> bool:
        """Ship the kernel inside: ENTERED + PROGRESS at its first look (per communicator and
        interval at most one), and in the per-kernel format a PROGRESS at every poll."""
        if trace is None:
            return False
        c = self._comm(trace.comm_hash, now_ns)
        idx = now_ns // self._interval_ns()
        if not self._open_entered and (self.per_call or c.look_idx != idx):
            zeros = (0,) * self._open_channels
            enter = self._open_enter_ns
            out.append(self._record(trace, Status.ENTERED, enter, -1, enter, zeros, zeros, prev=self._open_prev))
            self._open_entered = True
            c.look_idx = idx
        elif not self.per_call:
            return False
        out.append(self._progress(trace))
        return True

    def _interval_ns(self) -> int:
        return max(int(self.interval_s * 1e9), 1)

    def _state_due(self, now_ns: int, final: bool) -> bool:
        """Whether the states are due now (intervals aligned to the clock; never at the first poll)."""
        iv = self._interval_ns()
        due = self._next_state_ns
        if due is not None and now_ns < due and not final:
            return False
        self._next_state_ns = (now_ns // iv + 1) * iv
        return due is not None or final

    def _states(self, out: list[KernelRecord], in_flight: TraceId | None, shipped: bool, now_ns: int) -> None:
        """Each communicator's newest state: PROGRESS of the kernel inside, else IDLE of the last."""
        for h, c in list(self._comms.items()):
            if in_flight is not None and in_flight.comm_hash == h:
                if not shipped:
                    out.append(self._progress(in_flight))
            elif c.last is not None:
                k = c.last
                out.append(self._record(k.trace, Status.IDLE, k.enter, k.exit, now_ns, k.send, k.recv, prev=k.prev))
            if (in_flight is None or in_flight.comm_hash != h) and now_ns - c.active_ns > self._forget_ns:
                del self._comms[h]
                self.comms_forgotten += 1
