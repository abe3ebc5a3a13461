"""Flight Recorder polling: the attachment's second source, for collectives Python never calls.

Why it exists: wrapping ``torch.distributed``'s functions (``torch_hooks``) sees only calls made
from Python. DDP's gradient all-reduce (its C++ ``Reducer``) and torch.compile's functional
collectives go to the process group directly, and in a data-parallel job they are most of the
traffic. PyTorch's Flight Recorder records every collective of every process group in C++, and
``torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives, onlyActive)`` reads it
while the job runs, and so does ``_dump_fr_trace(includeCollectives, includeStackTraces, onlyActive)``
(pickle) without stack traces: both return at once even while the training thread is blocked inside
a gloo collective (with stack traces the pickle dump does not), so a daemon thread can poll them
(``tests/integration/test_fr_dump_live.py``). Full reads take the pickle (a third of the JSON's
cost for the same entries), status-only reads the JSON (a few hundred bytes, compared as text).

How it maps: an entry's group name resolves to the live process group, whose communicator hash
comes from the same ``TorchHooks.group_state`` the wrapper uses; ``op_seq`` is the entry's
``collective_seq_id - 1`` (Flight Recorder counts from 1, the wrapper from 0, so a job whose
collectives all come from Python gets the same Trace IDs from either source). The key of an
operation is (process group, ``collective_seq_id``). When both sources run, collectives belong
to this poller and the wrapper records only point-to-point calls, so nothing is counted twice:
the wrapper cannot learn an operation's ``collective_seq_id`` before it starts (the status-only
dump's ``last_enqueued_collective`` also counts send/recv, and ``monitored_barrier`` advances the
collective counter without an entry), and a Trace ID must be right when the ENTERED record
leaves. Point-to-point entries carry a per-rank ``p2p_seq_id`` that matches nothing across
ranks: they become records only when the poller is the only source, numbered per directional
channel in the order the dump lists them, as the wrapper numbers them.

Times: an entry enters at its own ``time_created_ns`` (wall clock, converted to the tracker's
clock). Gloo writes no start or completion time, so an operation finishes, as far as we know,
between the poll that last saw it in flight (or its creation) and the poll that sees it retired:
the midpoint is used, and each exit says how far off it may be (``t_exit_err_ns``: half that
window; 0 for an exit Flight Recorder timed itself, ``time_discovered_completed_ns``), so the
analyzer does not take a midpoint's noise for a slower operation. The window is narrowed by the
status-only dump (microseconds, no ring): the thread reads it every ``status_s`` (25 ms) between
full polls while its counters move or a collective stands in flight, IDLE_STATUS_FACTOR times
less often while nothing does (:meth:`FrPoller._status_wait`), and a group's
``last_completed_collective`` moving from a to b between two reads says collectives a+1..b ended
between them. A full poll stretched to 200 ms on a busy host left
an exit +/-100 ms off, and the analyzer measures a rank's compute before its next op from that
exit: the noise hid a rank computing 150 ms longer than its peers (a slow rank named nobody).

Records: the poller only enters and exits calls in the tracker, which sends the bounded format
(each communicator's state every interval, an op in flight for a heartbeat at once, the DONE
records of the ops ``detail_sampled`` picks): the op rate it measures comes from the entries'
own creation times, so a poll that delivers a burst of entries is not a burst of ops.

When: a ring that keeps finished entries (gloo's) is dumped whole at every read, about 10 us an entry
(holding the GIL through torch's binding; not through its C++ function, ``fr_native``), so it is read
when the status-only dump says the ring needs it (refilled to RING_FILL, or less where the next burst
of collectives would overrun it; a collective standing in flight; a read worth its cost; RING_WAIT_S at
most: see :meth:`FrPoller._ring_due`), not on the clock; an active-only dump that drops finished
entries (NCCL's) is read every interval, or it would miss short ops.

Safety: the thread never raises (every failure is a counter in :class:`FrStats`), a poll that
costs more than ``max_duty`` of the time stretches the interval, and every table is bounded.
"""

from __future__ import annotations

import bisect
import functools
import gc
import json
import logging
import math
import operator
import os
import pickle  # noqa: S403 - torch's own dump of this process's Flight Recorder, nothing received
import re
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ccld.fr_dump.load import DumpError, validate
from ccld.fr_dump.model import fr_int, normalise_op, numel
from ccld.identity import P2P_RECEIVER, P2P_SENDER, dtype_code, p2p_hash
from ccld.producers.attach.fr_native import torch_native_dump
from ccld.producers.attach.op_tracker import OpCall, Tracker
from ccld.records import DType, OpType

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.1
#: between reads of the status-only dump, which time collectives' completions (see the docstring) ...
DEFAULT_STATUS_S = 0.025
#: ... while its counters move or a collective stands in flight; this many times longer while the job
#: computes with nothing in flight, where a read has no exit to time (each read wakes the thread and
#: takes the GIL from the training thread twice: about 150 us of CPU on a busy 2-core host, 6 ms a
#: second at 25 ms; see :meth:`FrPoller._status_wait`)
IDLE_STATUS_FACTOR = 4
#: completion windows kept per group (a full poll needs those since the one before it)
WINDOWS_KEPT = 512
#: the most of its time the poller may spend polling; a dearer poll stretches the interval
DEFAULT_MAX_DUTY = 0.02
#: the longest a stretched interval gets (a hang is still seen within seconds)
MAX_INTERVAL_S = 5.0
#: a ring that keeps finished entries (gloo's) is read by what the status-only dump says, not by the
#: clock (see :meth:`FrPoller._ring_due`): a full read once the collectives enqueued since the last
#: one fill this share of the ring (they are all still in it, 300 entries of 2,000 to spare: 0.15 s at
#: 2,000 collectives a second, while the status is read every 25 ms) ...
RING_FILL = 0.85
#: ... or sooner where the collectives come in bursts: once another burst as large as the largest
#: seen between two status reads (this read's cycle or the one before) would not fit in what is left
#: of the ring, with this margin; never before this share of the ring (bursts of more than most of a
#: ring between two reads lose entries whatever is done, and ``missed`` counts them) ...
BURST_MARGIN = 1.25
RING_FILL_MIN = 0.25
#: ... or once the counters have stood still this long after moving with a collective in flight (a
#: stall, a hang: the analyzer needs the op the rank waits in) ...
STALL_S = 1.0
#: ... or, with anything enqueued since the last full read, once the time since is worth its cost: a
#: read that costs ``c`` comes ``c / LATE_DUTY`` after the one before (a full ring of 2,000: 20 ms,
#: every 4 s; a small ring, sooner), never later than RING_WAIT_S (how late a record may be) ...
LATE_DUTY = 0.005
RING_WAIT_S = MAX_INTERVAL_S
#: ... or, with nothing at all since, this long (a group made or destroyed shows only in the full dump)
QUIET_MAX_S = 30.0
#: Flight Recorder's ring when neither TORCH_FR_BUFFER_SIZE nor its older name sets it
DEFAULT_RING = 2000
_LIVE = Path("<live flight recorder>")
_LAST = operator.itemgetter(1)  # a completion window's last collective
_UNRESOLVED: Any = object()  # a group name not looked up yet in this poll

#: canonical op name (``model.normalise_op``) -> op type; other names are counted as unmapped
OP_TYPES: dict[str, OpType] = {
    "all_reduce": OpType.ALL_REDUCE,
    "all_gather": OpType.ALL_GATHER,
    "all_gather_v": OpType.ALL_GATHER,
    "reduce_scatter": OpType.REDUCE_SCATTER,
    "reduce_scatter_v": OpType.REDUCE_SCATTER,
    "broadcast": OpType.BROADCAST,
    "reduce": OpType.REDUCE,
    "all_to_all": OpType.ALL_TO_ALL,
    "barrier": OpType.BARRIER,
    "send": OpType.SEND,
    "recv": OpType.RECV,
}
_P2P_TYPES = (OpType.SEND, OpType.RECV)


class GroupInfo(Protocol):
    """What the poller needs of a process group (``torch_hooks.GroupState`` has it)."""

    comm_hash: int
    ranks: tuple[int, ...]
    comm_rank: int
    size: int


#: fetches the dump: (includeCollectives, onlyActive) -> JSON bytes or str
DumpFn = Callable[[bool, bool], "bytes | str"]
#: fetches the whole dump with its collectives, decoded (torch's pickle form; see :func:`make_poller`)
FullDumpFn = Callable[[], Any]


@dataclass
class FrStats:
    """Counters of the poller (``Attachment.stats()`` reports them with an ``fr_`` prefix)."""

    polls: int = 0
    poll_errors: int = 0  # a poll step raised (counted, never raised)
    bad_dumps: int = 0  # not JSON, or not a Flight Recorder 2.x dump
    entered: int = 0  # entries turned into tracker calls
    exited: int = 0
    preexisting: int = 0  # entries finished before the poller started
    unknown_ops: int = 0  # entries whose operation has no op type (names in unknown_names)
    unresolved_groups: int = 0  # entries of a group this process cannot resolve
    p2p_skipped: int = 0  # p2p entries while the wrapper records p2p
    missed: int = 0  # record ids the ring buffer dropped between two polls
    wrapper_seen: int = 0  # entries the wrapper had already recorded before "auto" switched to polling
    untracked: int = 0  # in-flight entries beyond the open-call bound
    backoffs: int = 0  # polls that stretched the interval
    quiet: int = 0  # polls left out: no collective enqueued or completed since the last (status-only dump)
    ring_reads: int = 0  # full polls because the ring had refilled to RING_FILL since the last one
    stall_reads: int = 0  # full polls because the counters stood still after moving (an op in flight)
    late_reads: int = 0  # full polls because RING_WAIT_S (or QUIET_MAX_S) had passed
    tail_reads: int = 0  # polls that parsed only the entries from the oldest still of interest on
    full_dump_failures: int = 0  # the decoded (pickle) dump failed once: the JSON one from then on
    status_reads: int = 0  # status-only dumps read (each times the completions since the one before)
    timed_exits: int = 0  # exits narrowed by those reads
    poll_ns_total: int = 0
    native_dumps: int = 0  # full dumps taken without the GIL (fr_native)
    native_dump_ns: int = 0  # their CPU time (this thread's), which a Python training thread does not wait for
    native_failures: int = 0  # the native dump failed: the binding reads the ring from then on
    unknown_names: dict[str, int] = field(default_factory=dict)


def _checked(obj: Any) -> tuple[str, list[dict[str, Any]], Mapping[str, Any], Mapping[str, Any]]:
    """(version, entries, pg_config, pg_status) of a decoded live dump, or DumpError."""
    if not isinstance(obj, dict):
        raise DumpError(f"a dump is a dict, got {type(obj).__name__}")
    return validate(_LIVE, obj)


def _done(e: Mapping[str, Any], seq: int | None, completed: int | None) -> bool:
    """Finished, by the entry's own fields or by its group's ``last_completed_collective``."""
    if e.get("state") == "completed" or e.get("retired") is True or fr_int(e.get("time_discovered_completed_ns")):
        return True
    return seq is not None and completed is not None and seq <= completed


@functools.lru_cache(maxsize=1024)
def _kind(written: str) -> tuple[str, str, OpType | None, str]:
    """(op, what follows the name, op type or None, the name an unmapped one is counted under):
    ``normalise_op`` and the op type once per name, as a ring holds a few names many times over."""
    op, rest, known = normalise_op(written)
    return op, rest, OP_TYPES.get(op) if known else None, op if known else written


def _size_dtype(op: str, e: Mapping[str, Any]) -> tuple[DType, int]:
    """dtype and element count as the wrapper reports them (reduce_scatter: output; barrier: 1 float)."""
    if op == "barrier":
        return DType.FLOAT32, 1
    dtypes = e.get("input_dtypes") or e.get("output_dtypes") or []
    sizes = e.get("output_sizes") if op == "reduce_scatter" else e.get("input_sizes")
    dtype = _dtype(str(dtypes[0])) if isinstance(dtypes, list) and dtypes else DType.OTHER
    return dtype, _numel(sizes)


@functools.lru_cache(maxsize=64)
def _dtype(name: str) -> DType:
    return dtype_code(name)


def _numel(sizes: Any) -> int:
    """``numel`` (0 where unknown), without its checks where every dimension is an int (JSON dumps)."""
    if type(sizes) is list:
        total = 0
        for shape in sizes:
            if type(shape) is list and len(shape) == 1 and type(shape[0]) is int:  # one 1-D tensor: most
                total += shape[0]
                continue
            if type(shape) is not list or not all(type(d) is int for d in shape):
                return numel(sizes) or 0
            total += math.prod(shape)
        return total
    return numel(sizes) or 0


def _int(value: Any) -> int | None:
    """``fr_int`` with the JSON dump's own case first: a plain int."""
    return value if type(value) is int else fr_int(value)


def _p2p_local_peer(written: str) -> int | None:
    """The group-local peer of "send 0->1" (1) or "recv 1<-0" (0)."""
    _, _, meta = written.partition(" ")
    meta = meta.replace(" ", "")
    for arrow in ("->", "<-"):
        if arrow in meta:
            return fr_int(meta.split(arrow)[1])
    return None


class FrPoller:
    """Reads Flight Recorder every interval and feeds new and active entries to the tracker."""

    def __init__(
        self,
        tracker: Tracker,
        resolve_group: Callable[[str], GroupInfo | None],
        *,
        dump: DumpFn,
        full_dump: FullDumpFn | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        status_s: float = DEFAULT_STATUS_S,
        max_duty: float = DEFAULT_MAX_DUTY,
        p2p: bool = False,
        wall_clock: Callable[[], int] = time.time_ns,
        open_max: int = 10_000,
        names_max: int = 64,
        ring: int = DEFAULT_RING,
    ) -> None:
        self.tracker = tracker
        self.resolve_group = resolve_group
        self.dump = dump
        #: a full read's dump already decoded, where torch offers it (cheaper than the JSON: make_poller);
        #: None, or after it failed once: ``dump(True, True)``, parsed here
        self.full_dump = full_dump
        self.interval_s = interval_s
        self.status_s = min(status_s, interval_s) if status_s > 0 else interval_s  # 0: only before full polls
        self.max_duty = max_duty
        self.p2p = p2p  # True when the poller is the only source
        self.wall_clock = wall_clock
        self.stats = FrStats()
        self._open_max = open_max
        self._names_max = names_max
        self._open: dict[int, tuple[OpCall, str | None, int | None]] = {}  # record id -> (call, pg id, seq)
        self._channels: dict[tuple[int, int, int], int] = {}  # (group hash, src, dst) -> next seq
        self._warned: set[str] = set()
        self._last_rid = -1
        self._since_wall_ns: int | None = None
        self._last_poll_ns: int | None = None
        self._status_at_poll: bytes | str | None = None  # the status-only dump read before the last full one
        self._full_at = 0.0  # time.monotonic() of the last full poll of the thread
        #: the ring's size (entries), and whether its dump keeps finished entries (None: not seen yet)
        self.ring = max(1, ring)
        self._keeps_done: bool | None = None
        self._enq_at_poll = 0  # collectives enqueued (every group) at the status read before the last full poll
        self._enq_prev: int | None = None  # ... at the status read before this one
        self._burst = 0  # the most enqueued between two status reads, in the cycle before the last full poll
        self._burst_now = 0  # ... since it
        self._status_seen: bytes | str | None = None  # the latest status that differed from the one before
        self._moved_at = 0.0  # time.monotonic() when it was read
        self._ring_wait = RING_WAIT_S  # set by each read's cost (LATE_DUTY)
        self._in_flight = False  # the latest status showed a collective enqueued and not completed
        self._stop = threading.Event()
        self._polling = threading.Lock()  # the thread's polls and a flush's (:meth:`poll_now`) take turns
        self._thread: threading.Thread | None = None
        self._forked = False
        #: asked before each poll: True poll, None not yet (skip), False stop polling for good
        self.gate: Callable[[], bool | None] | None = None
        #: group name -> the highest ``collective_seq_id`` the wrapper already recorded (set when
        #: "auto" hands collectives from the wrapper to this poller): those entries are skipped
        self.wrapper_upto: dict[str, int] = {}
        #: pg_status key -> (last completed collective, tracker time) at the latest status read, and
        #: the windows (first, last collective, from, to) in which its completed counter moved
        self._completed_at: dict[str, tuple[int, int]] = {}
        self._noted: bytes | str | None = None  # the status those were read from, and its groups' keys
        self._noted_keys: list[str] = []
        self._windows: dict[str, list[tuple[int, int, int, int]]] = {}
        self._window_hint: dict[str, int] = {}  # per group: the index of the window its last exit was in

    # ---- thread ----
    def start(self) -> None:
        if self._thread is not None:
            return
        self._since_wall_ns = self.wall_clock()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="ccld-fr-poll", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread; one last poll if it was polling, so the last operations are recorded."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=timeout_s)
        self._thread = None
        if t is not None and not self._forked and (self.stats.polls or self._gate_open()):
            self.poll_once()

    def _gate_open(self) -> bool:
        """Whether the gate lets a poll through now (a source switched on after the thread's last look)."""
        try:
            return self.gate is None or self.gate() is True
        except Exception:  # noqa: BLE001
            self.stats.poll_errors += 1
            return False

    def after_fork_in_child(self) -> None:
        """A forked child has no poller thread and must not start one: forget everything."""
        self._forked = True
        self._stop.set()
        self._thread = None
        self._open.clear()

    def _run(self) -> None:
        wait = self.interval_s  # between full polls (stretched while one is dear)
        tick = self.status_s  # between status reads (likewise)
        due = time.monotonic() + wait
        sleep = tick
        while not self._stop.wait(sleep):
            sleep = tick
            if self.gate is not None:
                try:
                    go = self.gate()
                except Exception:  # noqa: BLE001
                    self.stats.poll_errors += 1
                    go = None
                if go is False:
                    return
                if go is None:  # not polling (yet): the gate is asked once an interval, as before
                    sleep = self.interval_s
                    continue
            t0 = time.perf_counter_ns()
            status = self.read_status()
            now = time.monotonic()
            self._note_moved(status, now)
            tick = sleep = min(self._stretch((time.perf_counter_ns() - t0) / 1e9, self._status_wait(status, now)), wait)
            if now < due:
                continue
            ring = self._ring_mode(status)
            if ring and not self._ring_due(status, now):
                continue
            if not ring and self._quiet(status):
                due = now + wait
                continue
            t0 = time.perf_counter_ns()
            self.poll_once()
            cost_s = (time.perf_counter_ns() - t0) / 1e9
            self._after_full(status, now)
            # the first read tells a ring that keeps finished entries: from it on, the ring's cadence (a
            # clock's wait stretched by that first read's cost, the whole ring, would let the ring overrun)
            ring = self._ring_mode(status)
            # how long records may wait for the next read, from what this one cost (every read, the
            # clock's too: the first ring-driven wait follows the last clock-driven read's cost)
            late = min(max(self.interval_s, cost_s / LATE_DUTY), RING_WAIT_S)
            if self.max_duty > 0:
                late = max(late, min(cost_s / self.max_duty, QUIET_MAX_S))  # a very dear poll
            self._ring_wait = late
            if ring:
                # the ring's own refill asks for this poll: up to five times the duty cap, so that a
                # fast job loses no entry (beyond that it does, and ``missed`` counts them)
                wait = self.interval_s
                if self.max_duty > 0:
                    wait = max(wait, cost_s / (5 * self.max_duty))
            else:
                wait = self._stretch(cost_s, self.interval_s)
                if wait > self.interval_s:
                    self.stats.backoffs += 1
            due = time.monotonic() + wait

    def _ring_mode(self, status: bytes | str | None) -> bool:
        """Whether the next full poll is due by what the ring holds (:meth:`_ring_due`) rather than
        by the clock: a dump that keeps finished entries (gloo's; an active-only NCCL dump drops
        them, so only a frequent poll sees them), a readable status, and collectives only (gloo's
        send/recv do not show in the status)."""
        return self._keeps_done is True and status is not None and not self.p2p

    def _ring_due(self, status: bytes | str | None, now: float) -> bool:
        """Whether a full poll is due. A full dump of gloo's ring costs about 10 us an entry, all of
        them each time (2,000 entries: 8-20 ms; holding the GIL through torch's binding, not through its
        C++ function: ``fr_native``; either way a read's cost, which paces the late reads, counts it),
        while a poll is only needed to read
        the entries since the last one before the ring drops them, to hand the analyzer an op in
        flight that is not moving, and to keep records from getting old: the status-only dump (3 us,
        read every ``status_s``) tells each. One full poll per refill of RING_FILL of the ring is
        about 20 us a collective all told (the dump's 12 at one per 1,700 entries, the poller's 6),
        where polling on a clock cost 2.5 % of a 1-s step at any rate (benchmarks/RESULTS.md)."""
        if status is None:
            return True
        # when the counters last moved (``_moved_at``) was noted at this status read (:meth:`_note_moved`)
        since = now - self._full_at
        if status == self._status_at_poll:  # nothing enqueued or completed since the last full poll
            if since >= QUIET_MAX_S:
                self.stats.late_reads += 1
                return True
            if self._last_poll_ns is not None:  # an op open at that poll is open now too
                self._last_poll_ns = self.tracker.clock()
            return False
        if enqueued_total(status) - self._enq_at_poll >= self._fill_at():
            self.stats.ring_reads += 1
            return True
        if since >= self._ring_wait:
            self.stats.late_reads += 1
            return True
        if self._in_flight and now - self._moved_at >= STALL_S:
            self.stats.stall_reads += 1
            return True
        return False

    def _note_moved(self, status: bytes | str | None, now: float) -> None:
        """Note when the status-only dump last changed (a collective enqueued or completed), and, for a
        ring read by what it holds, how many collectives came since the read before (:meth:`_fill_at`)."""
        if status is None or status == self._status_seen:
            return
        self._status_seen, self._moved_at = status, now
        if self._keeps_done:
            enq = enqueued_total(status)
            if self._enq_prev is not None and enq - self._enq_prev > self._burst_now:
                self._burst_now = enq - self._enq_prev
            self._enq_prev = enq

    def _fill_at(self) -> float:
        """Collectives since the last full read at which the next is due: RING_FILL of the ring, less where
        a burst as large as the largest seen between two status reads (BURST_MARGIN over) would not fit in
        what is left; RING_FILL_MIN of the ring at the least. A step of 500 collectives in 35 ms after
        900 ms of compute comes whole between two reads 100 ms apart."""
        burst = max(self._burst, self._burst_now)
        return max(RING_FILL_MIN * self.ring, min(RING_FILL * self.ring, self.ring - BURST_MARGIN * burst))

    def _status_wait(self, status: bytes | str | None, now: float) -> float:
        """How long until the next status read: ``status_s`` while the counters moved at the last read or
        a collective stands in flight (up to STALL_S after they last moved: its exit is what the reads
        time), IDLE_STATUS_FACTOR times that while the job computes with nothing in flight. The first
        collective after such a pause is timed from its own creation (the window starts there), so its
        exit is at most ``IDLE_STATUS_FACTOR * status_s`` wide, and says so (``t_exit_err_ns``); the
        reads tighten again at the next one. A status that cannot be read counts as moving."""
        if status is None or now - self._moved_at < self.status_s / 2:
            return self.status_s  # moved at this read (or unreadable)
        if self._in_flight and now - self._moved_at < STALL_S:
            return self.status_s
        return min(self.status_s * IDLE_STATUS_FACTOR, self.interval_s)

    def _after_full(self, status: bytes | str | None, now: float) -> None:
        """What the next :meth:`_ring_due` or :meth:`_quiet` compares with: the status read before this
        full poll."""
        if status is not None:
            self._status_at_poll, self._full_at = status, now
            self._enq_at_poll = self._enq_prev = enqueued_total(status)
            self._burst, self._burst_now = self._burst_now, 0

    def _stretch(self, cost_s: float, interval_s: float) -> float:
        """The interval after a read that cost ``cost_s``: stretched to keep to ``max_duty``."""
        if self.max_duty > 0 and cost_s > self.max_duty * interval_s:
            return min(max(interval_s, cost_s / self.max_duty), MAX_INTERVAL_S)
        return interval_s

    def read_status(self) -> bytes | str | None:
        """Read the status-only dump and note which collectives completed since the last read (the
        exit windows of :meth:`_window`); None when it cannot be read. Never raises."""
        try:
            status = self.dump(False, True)
            self.stats.status_reads += 1
            self._note_completions(status, self.tracker.clock())
            return status
        except Exception:  # noqa: BLE001
            self.stats.poll_errors += 1
            return None

    def _note_completions(self, status: bytes | str, now: int) -> None:
        if status == self._noted:  # nothing completed since the read before: the same counters, read later
            for key in self._noted_keys:
                seen = self._completed_at.get(key)
                if seen is not None:
                    self._completed_at[key] = (seen[0], now)
            return
        self._noted, self._noted_keys = status, []
        try:
            pgs = json.loads(status).get("pg_status")
        except (ValueError, AttributeError):
            return
        if not isinstance(pgs, Mapping):
            return
        in_flight = False
        for key, st in pgs.items():
            done = fr_int(st.get("last_completed_collective")) if isinstance(st, Mapping) else None
            if done is None:
                continue
            enq = fr_int(st.get("last_enqueued_collective"))
            in_flight = in_flight or (enq is not None and enq > done)
            before = self._completed_at.get(key)
            if before is None and len(self._completed_at) >= 4 * self._names_max:
                continue  # bounded (a job that makes groups without end): those exits stay midpoints
            self._completed_at[key] = (done, now)
            self._noted_keys.append(key)
            if before is not None and done < before[0]:  # a new group under the old key: counts restart
                self._windows.pop(key, None)
            elif before is not None and done > before[0]:
                q = self._windows.get(key)
                if q is None:
                    q = self._windows[key] = []
                q.append((before[0] + 1, done, before[1], now))
                if len(q) > 2 * WINDOWS_KEPT:
                    del q[:-WINDOWS_KEPT]
        self._in_flight = in_flight

    def _quiet(self, status: bytes | str | None) -> bool:
        """Whether this poll can be left out: the status-only dump (about 3 us, where a full gloo ring
        costs tens of ms holding the GIL) is the same as before the last full poll, so no collective
        was enqueued or completed since (each advances its group's counters) and the full dump would
        say nothing new. Only while the wrapper has send/recv (gloo does not show them in the
        status), and at least one full poll every MAX_INTERVAL_S anyway. While quiet, an operation
        still open was open at this poll too: its exit window starts here."""
        if self.p2p or status is None:
            return False
        now = time.monotonic()
        if status == self._status_at_poll and now - self._full_at < MAX_INTERVAL_S:
            self.stats.quiet += 1
            if self._last_poll_ns is not None:
                self._last_poll_ns = self.tracker.clock()
            return True
        return False  # the poll that follows notes this status (:meth:`_after_full`)

    # ---- one poll ----
    def poll_now(self) -> None:
        """A poll from another thread (the attachment's ``flush``), when this poller is polling: what
        Flight Recorder holds now reaches the tracker without waiting for the ring's cadence."""
        if not self._forked and (self.stats.polls or self._gate_open()):
            self.poll_once()

    def poll_once(self) -> None:
        """Read the recorder once and update the tracker; never raises."""
        with self._polling:
            self._poll_locked()

    def _poll_locked(self) -> None:
        t0 = time.perf_counter_ns()
        try:
            self._poll()
        except Exception:  # noqa: BLE001 - the poller must survive anything
            self.stats.poll_errors += 1
            log.debug("ccld flight recorder poll failed", exc_info=True)
        finally:
            self.stats.polls += 1
            self.stats.poll_ns_total += time.perf_counter_ns() - t0

    def _cut(self) -> int | None:
        """The oldest record id a poll still needs (the newest seen, or an older one still open)."""
        if self._last_rid < 0:
            return None
        cut = min(self._open, default=self._last_rid)
        return min(cut, self._last_rid) if cut >= 0 else None

    def _parse(self, raw: bytes | str) -> Any:
        """The dump as JSON; only the entries from :meth:`_cut` on when that works (see :func:`parse_tail`)."""
        text = raw.decode() if isinstance(raw, (bytes, bytearray)) else raw
        cut = self._cut()
        if cut is not None:
            obj = parse_tail(text, cut)
            if obj is not None:
                self.stats.tail_reads += 1
                return obj
        return decode_held(json.loads, text)

    def _read_full(self) -> tuple[str, list[dict[str, Any]], Mapping[str, Any], Mapping[str, Any]]:
        """The full dump, decoded and checked (``validate``): the cheaper decoded form while it works (one
        that fails, or is not a dump, gives way to the JSON for good, in this same poll), else the JSON."""
        if self.full_dump is not None:
            try:
                return _checked(self.full_dump())
            except Exception:  # noqa: BLE001 - a torch without it, or a form we cannot read: JSON from now on
                self.full_dump = None
                self.stats.full_dump_failures += 1
                log.debug("ccld flight recorder: decoded dump failed; reading the JSON dump", exc_info=True)
        return _checked(self._parse(self.dump(True, True)))

    def _poll(self) -> None:
        try:
            _version, entries, _pg_config, pg_status = self._read_full()
        except (ValueError, DumpError):  # JSONDecodeError is a ValueError
            self.stats.bad_dumps += 1
            return
        now = self.tracker.clock()
        offset = self.wall_clock() - now  # FR's wall-clock ns -> tracker clock
        since = self._since_wall_ns if self._since_wall_ns is not None else self.wall_clock()
        self._since_wall_ns = since
        prev = self._last_poll_ns
        completed: dict[str, int] = {}
        for key, st in pg_status.items():
            if isinstance(st, Mapping):
                c = fr_int(st.get("last_completed_collective"))
                if c is not None:
                    completed[str(key)] = c
        present: set[int] = set()
        new_rids: list[int] = []
        if self._keeps_done is None and len(entries) >= 4:
            # gloo's ring keeps every entry, finished ones included; NCCL's active-only dump drops them
            done = sum(_done(e, fr_int(e.get("collective_seq_id")), completed.get(str(e.get("pg_id"))))
                       for e in entries)  # fmt: skip
            self._keeps_done = 2 * done >= len(entries)
        if len(entries) > self.ring:
            self.ring = len(entries)
        groups: dict[str, GroupInfo | None] = {}  # resolved once a poll, not once an entry
        last_rid = self._last_rid
        opened_calls = self._open
        seen_rid = present.add
        new_rid = new_rids.append
        new = self._new
        # The hot loop of a ring read (1,500 entries or so each): locals, and the int case of _int inline
        for i in range(self._first_needed(entries), len(entries)):
            e = entries[i]
            rid = e.get("record_id")
            if type(rid) is not int:
                rid = fr_int(rid)
                if rid is None:
                    rid = -(i + 1)  # no id: never "new" twice, never matched
            seen_rid(rid)
            if opened_calls:
                opened = opened_calls.get(rid)
                if opened is not None:
                    if _done(e, opened[2], completed.get(opened[1] or "")):
                        self._exit(rid, *self._t_exit(e, offset, now, prev, opened[0].t_enter_ns, opened[1], opened[2]))
                    continue
            if rid <= last_rid:  # seen before (most of a full ring): nothing else to read
                continue
            pg_id = e.get("pg_id")
            seq = e.get("collective_seq_id")
            if type(seq) is not int:
                seq = fr_int(seq)
            new_rid(rid)
            new(e, rid, self._pg_name(e), None if pg_id is None else str(pg_id), seq, completed, offset, now, prev,
                since, groups)  # fmt: skip
        if new_rids:
            first, top = min(new_rids), max(new_rids)
            if self._last_rid >= 0 and first > self._last_rid + 1:
                self.stats.missed += first - self._last_rid - 1
            self._last_rid = max(self._last_rid, top)
        # calls whose entries left the dump (ring buffer, or active-only after completion)
        for rid, (call, pid, seq) in list(self._open.items()):
            if rid in present:
                continue
            last = completed.get(pid or "")
            if seq is None or (last is not None and seq <= last):
                self._exit(rid, *self._window(call.t_enter_ns, prev, now, pid, seq))
        self._last_poll_ns = now

    def _first_needed(self, entries: list[dict[str, Any]]) -> int:
        """The index of the entry holding :meth:`_cut`'s record id: those before it were read by an earlier
        poll and none of them is open (a full ring of 2,000 read every 1,700 new entries: 300 skipped
        unread). Record ids count up by one, oldest first, so it is found from the newest; 0 (read them
        all) when the list is not so."""
        cut = self._cut()
        if cut is None or not entries:
            return 0
        top = _int(entries[-1].get("record_id"))
        if top is None or top < cut:
            return 0
        k = len(entries) - 1 - (top - cut)
        if k <= 0 or _int(entries[k].get("record_id")) != cut:
            return 0
        return k

    @staticmethod
    def _pg_name(e: Mapping[str, Any]) -> str:
        pg = e.get("process_group")
        if isinstance(pg, (list, tuple)) and pg:
            return str(pg[0])
        return "" if pg is None else str(pg)

    def _window(self, t_enter: int, prev: int | None, now: int, pid: str | None, seq: int | None
                ) -> tuple[int, int]:  # fmt: skip
        """(exit time, +/- error): the op ended between ``lo`` (its creation, or the previous poll that
        saw it in flight) and this poll, and, for a collective, between the two status reads that saw
        its group's completed counter pass it; the midpoint, off by at most half that window."""
        lo = t_enter if prev is None or t_enter > prev else prev
        hi = now
        q = self._windows.get(pid or "") if seq is not None else None  # (p2p: no collective sequence)
        if q and seq is not None:
            # the windows follow the counter up, one after the other: the one that holds seq. A ring read
            # asks in seq order, so the window the last exit of this group found (or the next) most often
            # holds it; else by bisection (a poll seconds after the last reads up to a thousand exits
            # against hundreds of windows)
            key = pid or ""
            i = self._window_hint.get(key, 0)
            if not (i < len(q) and q[i][0] <= seq <= q[i][1]):
                i += 1
                if not (i < len(q) and q[i][0] <= seq <= q[i][1]):
                    i = bisect.bisect_left(q, seq, key=_LAST)
                self._window_hint[key] = i
            if i < len(q) and q[i][0] <= seq:
                _first, _last, t0, t1 = q[i]
                if max(lo, t0) <= min(hi, t1):
                    lo, hi = max(lo, t0), min(hi, t1)
                    self.stats.timed_exits += 1
        if hi < lo:
            return t_enter, 0
        t = lo + (hi - lo) // 2
        return t, t - lo

    def _t_exit(self, e: Mapping[str, Any], offset: int, now: int, prev: int | None, t_enter: int,
                pid: str | None, seq: int | None) -> tuple[int, int]:  # fmt: skip
        """(exit time, +/- error): Flight Recorder's own completion time when it wrote one (NCCL), else
        the midpoint of the window it ended in (:meth:`_window`)."""
        t = e.get("time_discovered_completed_ns")
        if t is not None and type(t) is not int:
            t = fr_int(t)
        if t:
            return max(t_enter, t - offset), 0
        return self._window(t_enter, prev, now, pid, seq)

    def _exit(self, rid: int, t: int, err: int) -> None:
        call = self._open.pop(rid)[0]
        self.tracker.exit(call, t, err_ns=err)
        self.stats.exited += 1

    def _new(self, e: Mapping[str, Any], rid: int, name: str, pid: str | None, seq: int | None,
             completed: Mapping[str, int], offset: int, now: int, prev: int | None, since: int,
             groups: dict[str, GroupInfo | None]) -> None:  # fmt: skip
        get = e.get  # once an entry for each of a ring read's 1,500 or so: no lookup more than needed
        created = get("time_created_ns")
        if type(created) is not int:
            created = fr_int(created)
        done = _done(e, seq, completed.get(pid or ""))
        stats = self.stats
        if done and created is not None and created < since:
            stats.preexisting += 1
            return
        is_p2p = get("is_p2p")
        if seq is not None and not is_p2p and seq <= self.wrapper_upto.get(name, 0):
            stats.wrapper_seen += 1
            return
        group = groups.get(name, _UNRESOLVED)
        if group is _UNRESOLVED:  # resolved once a poll
            group = groups[name] = self.resolve_group(name)
        if group is None:
            stats.unresolved_groups += 1
            return
        written = get("profiling_name", "")
        op, rest, op_type, unknown = _kind(written if type(written) is str else str(written))
        if op_type is None:
            self._unknown(unknown)
            return
        dtype, count = _size_dtype(op, e)
        p2p = bool(is_p2p) or op_type in _P2P_TYPES
        if p2p:
            if not self.p2p:
                stats.p2p_skipped += 1
                return
            spec = self._p2p_call(group, op_type, _p2p_local_peer(rest))
            if spec is None:
                stats.unresolved_groups += 1
                return
            chash, op_seq, comm_rank, peer, size = spec
        else:
            if seq is None:
                self._unknown(f"{written} (no collective_seq_id)")
                return
            chash, op_seq, comm_rank, peer, size = group.comm_hash, seq - 1, group.comm_rank, -1, group.size
        t_enter = created - offset if created is not None else now
        stats.entered += 1
        if done:
            t_exit, err = self._t_exit(e, offset, now, prev, t_enter, pid, None if p2p else seq)
            self.tracker.done(chash, op_seq, op_type, dtype, count, peer, comm_rank, size, t_enter, t_exit, err)
            stats.exited += 1
            return
        call = self.tracker.enter(chash, op_seq, op_type, dtype, count, peer, comm_rank, size, t_ns=t_enter)
        if len(self._open) < self._open_max:
            self._open[rid] = (call, pid, None if p2p else seq)
        else:
            stats.untracked += 1

    def _p2p_call(self, group: GroupInfo, op_type: OpType, local_peer: int | None
                  ) -> tuple[int, int, int, int, int] | None:  # fmt: skip
        if local_peer is None or not 0 <= local_peer < len(group.ranks):
            return None
        me, other = group.ranks[group.comm_rank], group.ranks[local_peer]
        src, dst = (me, other) if op_type is OpType.SEND else (other, me)
        chash = p2p_hash(group.comm_hash, src, dst)
        key = (group.comm_hash, src, dst)
        seq = self._channels.get(key, 0)
        if len(self._channels) < 65_536 or key in self._channels:
            self._channels[key] = seq + 1
        if op_type is OpType.SEND:
            return chash, seq, P2P_SENDER, P2P_RECEIVER, 2
        return chash, seq, P2P_RECEIVER, P2P_SENDER, 2

    def _unknown(self, name: str) -> None:
        self.stats.unknown_ops += 1
        names = self.stats.unknown_names
        if name in names or len(names) < self._names_max:
            names[name] = names.get(name, 0) + 1
        if name not in self._warned and len(self._warned) < self._names_max:
            self._warned.add(name)
            log.warning("ccld attach: Flight Recorder operation %r has no op type; its entries are counted, not sent",
                        name)  # fmt: skip


_DECODER = json.JSONDecoder()
_ENTRIES = '"entries":['


def decode_held(decode: Callable[[Any], Any], raw: Any) -> Any:
    """``decode(raw)`` with Python's cyclic garbage collector's automatic runs held off for the call.

    Why: a ring of 2,000 entries decodes into about 40,000 dicts and lists. With collections on,
    each 700 of them start a young collection that finds them all alive and moves them to the older
    generations, and enough promoted objects set off a full collection of the whole process (every
    torch module and tensor object: 90 ms on the poller's thread here, about one read in three).
    Measured in a 500-collectives/s job on this 2-core host: an unpickle of 18 ms plus 4.5 ms a step
    of full collections with them on, 3.7 ms and none held off. The decoded dump lives for one poll
    and dies young: nothing is left uncollected, only not scanned while it is being built.

    How: the young generation's threshold is 0 for the call (no automatic collection; CPython
    checks it beside the enabled flag) and put back after. The enabled flag is the job's own
    (``gc.disable()``, Megatron's manual GC) and is never touched. The decodes passed here run in C
    holding the GIL (``pickle.loads`` of torch's plain dicts and lists, ``json``'s C scanner), so
    another thread runs at most a few bytecodes in the window, and its next collection only comes
    a little later. A job that sets thresholds itself does so at its start, not while it trains.
    On CPython 3.12 and later collections wait for the bytecode loop, so none runs inside a C decode
    whether held or not: there the hold changes nothing (the project runs 3.11)."""
    thresholds = gc.get_threshold()
    if not thresholds[0]:
        return decode(raw)
    gc.set_threshold(0, *thresholds[1:])
    try:
        return decode(raw)
    finally:
        gc.set_threshold(*thresholds)


def parse_tail(text: str, cut: int) -> dict[str, Any] | None:
    """The dump with only the entries from record id ``cut`` on, parsed; None when the text is not
    as expected (the caller then parses it all).

    A full gloo ring is about 1 MB of JSON (2,000 entries) and ``json.loads`` of it costs as much
    as torch's dump itself (40 of 105 ms a poll here), while a poll needs only the entries newer
    than the last one it saw and those still open. Flight Recorder lists entries oldest first, in
    compact JSON with no object nested in an entry: the entry holding ``"record_id":cut`` is found
    as text, the entries from there to the end of the list are decoded in one call, and the rest of
    the dump (``pg_status``, ``version``...) is decoded with an empty list in place of them."""
    key = f'"record_id":{cut},'
    pos = text.find(key)
    arr = text.find(_ENTRIES)
    if pos < 0 or arr < 0 or pos < arr:
        return None
    start = text.rfind("{", arr, pos)
    if start < 0:
        return None
    try:
        # the entries from the cut to the end of the list in one call of the C decoder (it stops at
        # the list's closing bracket): about a third cheaper than one call per entry
        entries, end = decode_held(_DECODER.raw_decode, "[" + text[start:])
        close = start + end - 2  # the list's "]" in the text
        if not isinstance(entries, list) or not entries or text[close] != "]":
            return None
        if not all(isinstance(e, dict) for e in entries) or fr_int(entries[0].get("record_id")) != cut:
            return None  # the "{" found was not this entry's own
        obj = json.loads(text[: arr + len(_ENTRIES)] + text[close:])
    except (ValueError, IndexError):
        return None
    if not isinstance(obj, dict):
        return None
    obj["entries"] = entries
    return obj


_ENQUEUED = re.compile(rb'"last_enqueued_collective":\s*"?(-?\d+)')


def enqueued_total(status: bytes | str) -> int:
    """Collectives Flight Recorder has seen enqueued, over every process group, from a status-only
    dump (``_dump_fr_trace_json(False, True)``: a few hundred bytes, about 3 us on gloo, whatever
    the ring holds). Each group's ``last_enqueued_collective`` is its newest ``collective_seq_id``,
    a counter that send/recv also advance on gloo. A regular expression, not ``json.loads``: this
    runs before each Python collective while "auto" watches."""
    raw = status.encode() if isinstance(status, str) else status
    return sum(max(0, int(n)) for n in _ENQUEUED.findall(raw))


# ---- the live torch process ----
def make_poller(tracker: Tracker, hooks: Any, *, interval_s: float | None = None, p2p: bool = False,
                status_s: float | None = None) -> FrPoller | None:  # fmt: skip
    """A poller of this process's Flight Recorder whose groups resolve through ``hooks.group_state``
    (the wrapper's own Trace-ID derivation); None when this torch has no JSON dump."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    c10d_c = getattr(torch._C, "_distributed_c10d", None)
    dump = getattr(c10d_c, "_dump_fr_trace_json", None)
    if dump is None:
        return None
    # A full read as torch's pickle, without stack traces: the same entries for less (a ring of 2,000 on a
    # quiet machine here: 8-19 ms to dump and 3-5 ms to unpickle, against 22-33 ms for the JSON dump alone,
    # both bindings holding the GIL; the spread is between days), taken without the GIL where this torch's
    # C++ dump allows (_full_dump). The status-only reads stay JSON: a few hundred bytes, compared and
    # searched as text.
    pickled = getattr(c10d_c, "_dump_fr_trace", None)
    # weak, like the wrapper's group table: the attachment must never keep a destroyed group alive
    by_name: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()

    def names() -> dict[str, Any]:
        world = getattr(c10d, "_world", None)
        pg_names = getattr(world, "pg_names", None) or {}
        return {str(n): pg for pg, n in list(pg_names.items())}

    def resolve(name: str) -> Any:
        pg = by_name.get(name)
        if pg is None:
            by_name.clear()
            by_name.update(names())
            pg = by_name.get(name)
            if pg is None:
                return None
        return hooks.group_state(pg)

    poller = FrPoller(tracker, resolve, dump=dump, interval_s=interval_s or DEFAULT_INTERVAL_S, p2p=p2p,
                      status_s=DEFAULT_STATUS_S if status_s is None else status_s,
                      ring=ring_size(os.environ))  # fmt: skip
    if pickled is not None:
        poller.full_dump = _full_dump(poller.stats, pickled)
    return poller


def _full_dump(stats: FrStats, bound: Callable[[bool, bool, bool], bytes]) -> FullDumpFn:
    """The full read, decoded with the collector held off (:func:`decode_held`): through torch's C++ dump without
    the GIL (``fr_native``) where it is this torch's, counted in ``stats``; through ``bound``, the binding
    (holding the GIL), where it is not, and for good once the native one failed."""

    def bound_full() -> Any:
        return decode_held(pickle.loads, bound(True, False, True))  # (collectives, stack traces, only active)

    try:
        native = torch_native_dump(os.environ, bound)
    except Exception:  # noqa: BLE001 - whatever this torch is, the binding still reads the ring
        log.debug("ccld flight recorder: no native dump", exc_info=True)
        native = None
    if native is None:
        return bound_full
    failed = False

    def full_dump() -> Any:
        nonlocal failed
        if failed:
            return bound_full()
        t0 = time.thread_time_ns()
        try:
            raw = native(True, False, True)  # (collectives, stack traces, only active)
        except Exception:  # noqa: BLE001 - the binding from now on, counted
            failed = True
            stats.native_failures += 1
            log.debug("ccld flight recorder: native dump failed; the binding reads the ring", exc_info=True)
            return bound_full()
        stats.native_dump_ns += time.thread_time_ns() - t0
        stats.native_dumps += 1
        return decode_held(pickle.loads, raw)

    return full_dump


def ring_size(environ: Mapping[str, str]) -> int:
    """Flight Recorder's ring (entries) as the job's environment sets it (TORCH_FR_BUFFER_SIZE, or the
    older name); DEFAULT_RING when unset or unreadable (a dump with more entries raises it)."""
    try:
        n = int((fr_buffer_setting(environ) or "").strip())
    except ValueError:
        return DEFAULT_RING
    return n if n > 0 else DEFAULT_RING


def fr_buffer_setting(environ: Mapping[str, str]) -> str | None:
    """The job's Flight Recorder buffer size as written (TORCH_FR_BUFFER_SIZE, else the older
    TORCH_NCCL_TRACE_BUFFER_SIZE); None when neither is set."""
    return environ.get("TORCH_FR_BUFFER_SIZE", environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE"))
