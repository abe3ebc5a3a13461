"""The schedule of the reference ring collectives (``cuda/ccld_ring.cu``) as pure functions.

The kernels and this module follow the same plan, so what the GPU run must show can be computed
on any machine: the per-channel element ranges, rounds and steps, the counter values of a
healthy operation, the counters at which a ring freezes when one rank stops, and a numpy
emulation of the kernels step by step (the CPU twin of the reference collectives).

Plan (per channel c of C; R ranks; slots of P elements; a FIFO of S slots per receiver):

* channel c owns ``[n*c//C, n*(c+1)//C)``;
* all-reduce: rounds of ``R*P`` elements, each split into R chunks of ``ceil(len/R)``;
  per round ``2R - 1`` steps: send, ``R-2`` x recv-reduce-send, recv-reduce-copy-send,
  ``R-2`` x recv-copy-send, recv-copy: ``2(R-1)`` sends and receives;
* all-gather: rounds of ``P`` elements of each rank's input; per round ``R`` steps:
  send own, ``R-2`` x recv-copy-send, recv-copy: ``R-1`` sends and receives.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, fields

import numpy as np
import numpy.typing as npt

from ccld.probe.errors import ProbeError

#: Order of the int64 fault array the kernels read (``CCLD_FAULT_*`` in ccld_ring.cu).
FAULT_FIELDS: tuple[str, ...] = (
    "delay_rank",
    "delay_ns",
    "stop_rank",
    "stop_step",
    "link_src",
    "link_channel",
    "link_ns",
    "late_rank",
    "late_ns",
)


class RingOp(enum.Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"


@dataclass(frozen=True, slots=True)
class Faults:
    """Fault knobs of the reference kernels; -1 (rank) means off.

    ``delay_*``: rank waits ``delay_ns`` before each of its sends (every channel).
    ``stop_*``: rank hangs before its step ``stop_step`` (0-based, counted per channel over the op).
    ``link_*``: sends on the link ``link_src -> link_src+1`` wait ``link_ns`` (one channel or all: -1).
    ``late_*``: rank enters the kernel ``late_ns`` late (a late arriver).
    """

    delay_rank: int = -1
    delay_ns: int = 0
    stop_rank: int = -1
    stop_step: int = -1
    link_src: int = -1
    link_channel: int = -1
    link_ns: int = 0
    late_rank: int = -1
    late_ns: int = 0

    def as_array(self) -> npt.NDArray[np.int64]:
        if tuple(f.name for f in fields(self)) != FAULT_FIELDS:
            raise ProbeError("Faults fields and FAULT_FIELDS disagree")
        return np.asarray(astuple(self), dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Step:
    """One ring step of one rank: receive? send? and which chunk of the round it touches."""

    recv: bool
    send: bool
    chunk: int  # chunk index inside the round (all-reduce) or origin rank (all-gather)
    reduce: bool  # received value is added to the local one
    write: bool  # the value is written to the local buffer


def check_ring(nranks: int, nslots: int) -> None:
    """Every step after the first receives before it sends, so one slot per FIFO would deadlock."""
    if nranks < 2:
        raise ProbeError(f"a ring needs at least 2 ranks, got {nranks}")
    if nslots < 2:
        raise ProbeError(f"the ring needs at least 2 slots per FIFO (1 deadlocks), got {nslots}")


def channel_range(n: int, channel: int, channels: int) -> tuple[int, int]:
    """(begin, length) of the elements channel ``channel`` owns."""
    begin = n * channel // channels
    return begin, n * (channel + 1) // channels - begin


def round_elems(op: RingOp, nranks: int, slot_elems: int) -> int:
    return nranks * slot_elems if op is RingOp.ALL_REDUCE else slot_elems


def rounds(op: RingOp, seg_len: int, nranks: int, slot_elems: int) -> int:
    per = round_elems(op, nranks, slot_elems)
    return -(-seg_len // per)


def round_steps(op: RingOp, rank: int, nranks: int) -> list[Step]:
    """The steps of one round for ``rank``, in kernel order."""
    r, n = rank, nranks
    if n < 2:
        raise ProbeError("a ring needs at least 2 ranks")
    if op is RingOp.ALL_REDUCE:
        steps = [Step(False, True, r, False, False)]
        steps += [Step(True, True, (r - j) % n, True, False) for j in range(1, n - 1)]
        steps.append(Step(True, True, (r + 1) % n, True, True))
        steps += [Step(True, True, (r + 1 - j) % n, False, True) for j in range(1, n - 1)]
        steps.append(Step(True, False, (r + 2 - n) % n, False, True))
        return steps
    steps = [Step(False, True, r, False, True)]
    steps += [Step(True, True, (r - j) % n, False, True) for j in range(1, n - 1)]
    steps.append(Step(True, False, (r + 1) % n, False, True))
    return steps


def op_steps(op: RingOp, n: int, rank: int, nranks: int, channel: int, channels: int, slot_elems: int) -> list[Step]:
    """Every step of one rank on one channel for a whole operation."""
    _, seg_len = channel_range(n, channel, channels)
    return round_steps(op, rank, nranks) * rounds(op, seg_len, nranks, slot_elems)


def expected_counts(op: RingOp, n: int, nranks: int, channels: int, slot_elems: int) -> list[int]:
    """Messages each rank sends (and receives) per hardware channel in a healthy operation."""
    per_round = 2 * (nranks - 1) if op is RingOp.ALL_REDUCE else nranks - 1
    return [per_round * rounds(op, channel_range(n, c, channels)[1], nranks, slot_elems) for c in range(channels)]


def fold(counts: Sequence[int], width: int = 8) -> tuple[int, ...]:
    """Hardware-channel counts folded onto ``width`` slots (channel c adds into c % width)."""
    out = [0] * min(len(counts), width)
    for c, v in enumerate(counts):
        out[c % width] += v
    return tuple(out)


def fold_columns(counts: npt.NDArray[np.int64], width: int = 8) -> npt.NDArray[np.int64]:
    """``fold`` for a whole ``(rows, hardware channels)`` block at once (the simulator's records)."""
    c = counts.shape[1]
    if c <= width:
        return counts
    out = np.zeros((counts.shape[0], width), dtype=np.int64)
    np.add.at(out.T, np.arange(c) % width, counts.T)
    return out


def fold_peaks(peaks: npt.NDArray[np.int64], width: int = 8) -> npt.NDArray[np.int64]:
    """Per-channel kernel peaks folded onto ``width`` slots as the probe does: a slot's peak is the
    largest of its hardware channels' peaks (each channel's thread block keeps its own)."""
    c = peaks.shape[1]
    if c <= width:
        return peaks
    out = np.full((peaks.shape[0], width), -1, dtype=np.int64)
    np.maximum.at(out.T, np.arange(c) % width, peaks.T)
    return out


CountHook = Callable[[int, int, str], None]  # (rank, channel, "send"|"recv")


def frozen_counts(
    op: RingOp,
    n: int,
    nranks: int,
    channels: int,
    slot_elems: int,
    nslots: int,
    stop_rank: int,
    stop_step: int,
) -> list[list[tuple[int, int]]]:
    """(sends, receives) per rank per channel once a ring whose ``stop_rank`` hangs before
    ``stop_step`` has made every move it can. The protocol is monotone, so this fixpoint is
    what the GPU shows however the kernels interleave."""
    check_ring(nranks, nslots)
    out = [[(0, 0)] * channels for _ in range(nranks)]
    for c in range(channels):
        plans = [op_steps(op, n, r, nranks, c, channels, slot_elems) for r in range(nranks)]
        limits = [stop_step if r == stop_rank and stop_step >= 0 else len(plans[r]) for r in range(nranks)]
        pos = [0] * nranks
        delivered = [0] * nranks  # messages put into rank r's FIFO
        consumed = [0] * nranks  # messages rank r took out of its FIFO
        sent = [0] * nranks
        moved = True
        while moved:
            moved = False
            for r in range(nranks):
                nxt = (r + 1) % nranks
                while pos[r] < min(limits[r], len(plans[r])):
                    s = plans[r][pos[r]]
                    if s.recv and delivered[r] <= consumed[r]:
                        break
                    if s.send and sent[r] - consumed[nxt] >= nslots:
                        break
                    if s.recv:
                        consumed[r] += 1
                    if s.send:
                        sent[r] += 1
                        delivered[nxt] += 1
                    pos[r] += 1
                    moved = True
        for r in range(nranks):
            out[r][c] = (sent[r], consumed[r])
    return out


def emulate(
    op: RingOp,
    inputs: Sequence[npt.NDArray[np.float32]],
    channels: int,
    slot_elems: int,
    nslots: int,
    on_count: CountHook | None = None,
    stop: tuple[int, int] | None = None,
) -> list[npt.NDArray[np.float32]]:
    """Run the kernels' schedule in numpy: all-reduce returns the reduced buffers, all-gather the
    gathered ones. ``on_count(rank, channel, kind)`` is called where the kernel counts.
    ``stop=(rank, step)`` hangs that rank before that step; the emulation then returns once
    nothing can move (the buffers are partial), as the GPU would sit until released."""
    nranks = len(inputs)
    n = int(inputs[0].shape[0])
    check_ring(nranks, nslots)
    if op is RingOp.ALL_REDUCE:
        bufs = [np.array(x, dtype=np.float32, copy=True) for x in inputs]
    else:
        bufs = [np.zeros(nranks * n, dtype=np.float32) for _ in inputs]
    for c in range(channels):
        seg, seg_len = channel_range(n, c, channels)
        per = round_elems(op, nranks, slot_elems)
        plans = [op_steps(op, n, r, nranks, c, channels, slot_elems) for r in range(nranks)]
        if stop is not None and stop[1] >= 0:
            plans[stop[0]] = plans[stop[0]][: stop[1]]
        steps_per_round = len(round_steps(op, 0, nranks))
        fifo: list[deque[npt.NDArray[np.float32]]] = [deque() for _ in range(nranks)]
        pos = [0] * nranks
        while any(pos[r] < len(plans[r]) for r in range(nranks)):
            moved = False
            for r in range(nranks):
                if pos[r] >= len(plans[r]):
                    continue
                s = plans[r][pos[r]]
                nxt = (r + 1) % nranks
                if (s.recv and not fifo[r]) or (s.send and len(fifo[nxt]) >= nslots):
                    continue
                rnd = pos[r] // steps_per_round
                base = seg + rnd * per
                lt = min(per, seg_len - rnd * per)
                if op is RingOp.ALL_REDUCE:
                    cs = -(-lt // nranks)
                    lo = base + min(s.chunk * cs, lt)
                    hi = base + min((s.chunk + 1) * cs, lt)
                    local = bufs[r][lo:hi]
                else:
                    lo, hi = base, base + lt
                    local = bufs[r][s.chunk * n + lo : s.chunk * n + hi]
                    if not s.recv:
                        local = np.asarray(inputs[r][lo:hi], dtype=np.float32)
                if s.recv:
                    got = fifo[r].popleft()
                    value = got + local if s.reduce else got.copy()
                else:
                    value = local.copy()
                if s.write:
                    if op is RingOp.ALL_REDUCE:
                        bufs[r][lo:hi] = value
                    else:
                        bufs[r][s.chunk * n + lo : s.chunk * n + hi] = value
                if s.send:
                    fifo[nxt].append(value)
                    if on_count is not None:
                        on_count(r, c, "send")
                if s.recv and on_count is not None:
                    on_count(r, c, "recv")
                pos[r] += 1
                moved = True
            if not moved:
                if stop is not None:
                    break
                raise ProbeError(f"ring emulation deadlocked on channel {c} at steps {pos}")
    return bufs
