"""The sending side of the bounded record format, shared by every source that turns ops into records.

The format (docs/wire-format.md, "Record format and its cost"): per interval and communicator the newest state,
an op in flight shipped at once, and the DONE record of the ops ``ccld.records.detail_sampled``
picks at the communicator's stride K. What decides K, and what a record says beyond
``KernelRecord``, lives here, so the PyTorch attachment (``ccld.producers.attach.op_tracker``) and the
GPU probe's host side (``ccld.probe.frame_tracker``) pick the same K at the same op from the same rate,
and every rank of a communicator details the same ops whichever source it runs:

- :func:`op_sampled`: ``detail_sampled`` for one op, in plain Python;
- :class:`StrideWindow`: one communicator's op rate, measured at fixed op sequence numbers, and K;
- :class:`RunSample`: which op's sequence number decides: an op's own, or in a run of variable-size
  ops (an MoE layer's dispatch and combine all_to_all) the first of its pair, so a pair goes together;
- :class:`ExitLog`: where the rank's previous op ended (``KernelRecord.t_prev_exit_ns``, the compute gap).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ccld.records import DETAIL_OPS_PER_S, VARIABLE_SIZE_OPS, detail_one_in

#: "sampled": the bounded format; "all": a DONE record per op (debugging, one record per call)
DETAIL_MODES = ("sampled", "all")
#: how often each communicator's state is sent and its op rate measured (docs/configuration.md: sample_interval_s)
DEFAULT_INTERVAL_S = 1.0
#: a rate window counts as lasting this long at least (a burst of ops is not a rate)
RATE_MIN_S = 0.1
#: rate windows end at multiples of a power of two of op sequence numbers, at least this many
CHECK_EVERY = 8
#: ... about ``interval_s`` of ops at the stride in force, or, when the ops slowed down, at the
#: first multiple of CHECK_EVERY this many intervals after the window began
WINDOW_MAX = 2
#: K goes up when the rate exceeds its budget by this factor (details up to 10/s), down only when
#: the rate times ``LOWER_SLACK`` fits the lower K: a dead band, so a rate near a power-of-two
#: boundary does not flip K, and ranks measuring it a hair apart still agree
RAISE_SLACK = 1.25
LOWER_SLACK = 1.5
#: every this many windows (at multiples of RESYNC x W) K is set from the rate alone, so ranks
#: that ever disagreed (one saw an op the other did not) agree again
RESYNC = 16
#: exit times remembered to find an op's predecessor (``t_prev_exit_ns``)
EXITS_KEPT = 256
#: a source that sees only some ops checks at most this many skipped sequence numbers at once
#: (a longer gap: only the last check, the window then restarts there)
CHECKS_MAX = 64

_M64 = (1 << 64) - 1


def op_sampled(comm_hash: int, op_seq: int, one_in: int) -> bool:
    """``ccld.records.detail_sampled`` for one op in plain Python (a source asks it per op;
    numpy costs more than the mix itself for a scalar). Same 64-bit mix, same answer."""
    if one_in <= 1:
        return True
    x = (comm_hash & _M64) ^ ((op_seq * 0x9E3779B97F4A7C15) & _M64)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    x ^= x >> 31
    return x & (one_in - 1) == 0


@dataclass(slots=True)
class RunSample:
    """Per communicator: the sequence number and stride that decide whether an op is detailed.

    An op's own, except in a run of variable-size ops back to back (``VARIABLE_SIZE_OPS``: an MoE
    layer's dispatch and combine all_to_all, with nothing between them on the communicator): there the
    ops go in pairs from the run's start (places 0-1, 2-3, ...) and a pair's first op decides for both.
    The analyzer tells dispatch from combine only by the parity of an op's place in its run
    (``SlowDetector._phased``); with each op sampled on its own at a stride K > 1 it would see one op of
    a run in K, never two in a row, and judge dispatch and combine as one. A pair it sees alone starts
    at an even place, so its parity reads right; runs are never detailed whole (an expert-parallel
    communicator that runs nothing but all_to_all is one run from its first op: detailed whole, it
    would send every op or none). Every rank sees the same ops in the same order, so every rank details
    the same pairs; on average one pair in K, the same share of the ops as before.
    """

    prev_seq: int = -2
    prev_type: int = -1
    place: int = 0  # the op's place in its run of variable-size ops (0 for any other op)
    start_seq: int = -1
    start_one_in: int = 1

    def key(self, seq: int, op_type: int, one_in: int) -> tuple[int, int]:
        """Op ``seq`` of type ``op_type`` entered with stride ``one_in`` in force; returns the (sequence
        number, stride) ``op_sampled`` decides it on. A source that sees every op calls it for each, in order."""
        run = op_type in VARIABLE_SIZE_OPS and op_type == self.prev_type and seq == self.prev_seq + 1
        self.place = self.place + 1 if run else 0
        if self.place % 2 == 0:
            self.start_seq, self.start_one_in = seq, one_in
        self.prev_seq, self.prev_type = seq, op_type
        return self.start_seq, self.start_one_in


@dataclass(slots=True)
class StrideWindow:
    """One communicator's detail stride K, decided at op sequence numbers from its op rate.

    The rate is measured on the ops' own entry times. A window ends at a multiple of W, a power
    of two of about one interval's ops at the stride in force (W = 8 while K = 1, so a fast
    communicator gets its K within its first 8 ops): every rank of the communicator sees the
    same ops enter at the same pace, so all decide at the same op from about the same rate and
    pick the same K (a rank that disagreed would send some ops' details the others leave out).
    K has a dead band (``RAISE_SLACK``, ``LOWER_SLACK``) and is set from the rate alone every
    ``RESYNC`` windows, so ranks that ever disagreed (one saw the first ops, one did not) agree
    again. A window whose ops slowed down ends, at a multiple of 8, ``WINDOW_MAX`` intervals
    after it began.
    """

    interval_s: float = DEFAULT_INTERVAL_S
    budget: float = DETAIL_OPS_PER_S
    one_in: int = 1  # detail stride K
    anchor_seq: int = -1  # the op the rate window starts at, and when it entered (own clock)
    anchor_ns: int = -1
    checked_seq: int = -1  # the last op the rate was checked at

    def observe(self, seq: int, t_ns: int) -> int:
        """Op ``seq`` entered at ``t_ns``; returns the stride in force for it. A source that sees
        every op calls it for each, in order."""
        if self.anchor_seq < 0 or seq < self.anchor_seq:  # the first op, or a group made again
            self.anchor_seq, self.anchor_ns, self.checked_seq, self.one_in = seq, t_ns, seq, 1
            return self.one_in
        if seq // CHECK_EVERY <= self.checked_seq // CHECK_EVERY:
            return self.one_in
        self.checked_seq = seq
        budget = self.budget
        w = CHECK_EVERY
        while w < budget * self.one_in * self.interval_s:
            w <<= 1
        el_s = (t_ns - self.anchor_ns) / 1e9
        if seq // w > self.anchor_seq // w or el_s >= WINDOW_MAX * self.interval_s:
            rate = (seq - self.anchor_seq) / max(el_s, RATE_MIN_S)
            up = detail_one_in(rate / RAISE_SLACK, budget)
            if up > self.one_in or seq // (w * RESYNC) > self.anchor_seq // (w * RESYNC):
                self.one_in = up
            else:
                self.one_in = max(up, min(self.one_in, detail_one_in(rate * LOWER_SLACK, budget)))
            self.anchor_seq, self.anchor_ns = seq, t_ns
        return self.one_in

    def observe_upto(self, seq: int, t_of: Callable[[int], int]) -> int:
        """For a source that sees only some ops (the GPU probe: the last 8 kernels at each poll,
        entry times of the newest only): check at the op sequence numbers a source seeing every
        op would have checked at, up to ``seq``, with their entry times estimated by ``t_of``
        (the source interpolates between the ops whose times it knows). Returns the stride in
        force for op ``seq``; every rank decides at the same ops, as :meth:`observe` does."""
        if self.anchor_seq < 0 or seq < self.anchor_seq:
            return self.observe(seq, t_of(seq))
        first = (self.checked_seq // CHECK_EVERY + 1) * CHECK_EVERY
        if first > seq:
            return self.one_in
        last = seq - seq % CHECK_EVERY
        if (last - first) // CHECK_EVERY >= CHECKS_MAX:
            first = last
        for b in range(first, last + 1, CHECK_EVERY):
            self.observe(b, t_of(b))
        return self.one_in


class ExitLog:
    """The latest exit times of one rank's ops on any communicator (bounded): an op's predecessor
    ended at the latest of them before the op entered (``t_prev_exit_ns``; -1: unknown)."""

    def __init__(self, kept: int = EXITS_KEPT) -> None:
        self._exits: deque[int] = deque(maxlen=kept)

    def add(self, t_exit_ns: int) -> None:
        if t_exit_ns >= 0 and (not self._exits or self._exits[-1] != t_exit_ns):
            self._exits.append(t_exit_ns)

    def before(self, t_enter_ns: int) -> int:
        best = -1
        for t in self._exits:
            if best < t < t_enter_ns:
                best = t
        return best

    def clear(self) -> None:
        self._exits.clear()

    def __len__(self) -> int:
        return len(self._exits)
