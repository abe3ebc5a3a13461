"""Operations in flight on one process, and the background thread that turns them into records.

The training thread does as little as possible: ``enter`` builds one small object and appends
it to a deque, ``exit`` stamps a time and appends again (both O(1), no lock, no I/O). A daemon
thread drains the deque every tick, builds ``KernelRecord`` rows and hands them to the sink,
and every heartbeat interval emits a PROGRESS sample for each operation still in flight: that
heartbeat is what shows the analyzer a rank waiting inside a collective. Async operations
whose ``Work`` nobody waits on are completed by polling ``is_completed`` from this thread.
Nothing here raises into the caller; every failure is counted.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ccld.records import DType, KernelRecord, OpType, Status

log = logging.getLogger(__name__)


class RecordSink(Protocol):
    """Where records go: ``MetricsProducer`` satisfies it, so do the file and list sinks."""

    def submit(self, record: KernelRecord) -> None: ...

    def flush(self, timeout_s: float = ...) -> Any: ...

    def close(self, timeout_s: float = ...) -> None: ...


class NullSink:
    """Discards everything (a forked child's sink)."""

    def submit(self, record: KernelRecord) -> None:
        pass

    def flush(self, timeout_s: float = 0.0) -> int:
        return 0

    def close(self, timeout_s: float = 0.0) -> None:
        pass


@dataclass(slots=True, eq=False)
class OpCall:
    """One operation on this rank, from entry to completion (mutable: exit time arrives later)."""

    comm_hash: int
    op_seq: int
    op_type: OpType
    dtype: DType
    count: int
    peer: int
    comm_rank: int
    comm_size: int
    t_enter_ns: int
    t_exit_ns: int = -1
    entered_sent: bool = False
    done_queued: bool = False
    done_sent: bool = False
    last_sample_ns: int = -1  # time of the last record sent for this call (heartbeat spacing)


@dataclass
class TrackerStats:
    """Counters the attachment reports (``ccld.detach()`` returns them as a dict)."""

    calls: int = 0
    records: int = 0
    progress: int = 0
    dropped: int = 0  # events dropped because the queue was full
    sink_errors: int = 0
    internal_errors: int = 0
    unobserved: int = 0  # calls we could not identify (e.g. recv from any source)


@dataclass(frozen=True)
class Identity:
    """Who this process is: fixed once torch.distributed is initialised."""

    job: str
    incarnation: int
    rank: int
    world_size: int
    host: str


_Clock = Callable[[], int]


@dataclass
class Tracker:
    """In-flight table + event queue + emitter thread for one process."""

    sink: RecordSink
    heartbeat_s: float = 0.2
    tick_s: float = 0.05
    queue_max: int = 100_000
    clock: _Clock = time.monotonic_ns
    stats: TrackerStats = field(default_factory=TrackerStats)
    identity: Identity | None = None
    #: how the emitter asks a Work whether it finished (the attachment passes the unpatched method)
    is_completed: Callable[[Any], bool] = field(default=lambda work: bool(work.is_completed()))

    def __post_init__(self) -> None:
        self._events: deque[OpCall] = deque()
        self._inflight: dict[int, OpCall] = {}
        self._works: dict[int, tuple[Any, list[OpCall]]] = {}  # id(work) -> (work, its calls)
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._emit_lock = threading.Lock()

    # ---- training-thread side (cheap, never raises) ----
    def enter(
        self,
        comm_hash: int,
        op_seq: int,
        op_type: OpType,
        dtype: DType,
        count: int,
        peer: int,
        comm_rank: int,
        comm_size: int,
        *,
        t_ns: int | None = None,
    ) -> OpCall:
        """A call starts now, or at ``t_ns`` on this tracker's clock (Flight Recorder's own time)."""
        t = self.clock() if t_ns is None else t_ns
        call = OpCall(comm_hash, op_seq, op_type, dtype, count, peer, comm_rank, comm_size, t)
        self.stats.calls += 1
        self._inflight[id(call)] = call
        self._push(call)
        return call

    def exit(self, call: OpCall, t_ns: int | None = None) -> None:
        if call.done_queued:
            return
        call.t_exit_ns = self.clock() if t_ns is None else t_ns
        call.done_queued = True  # after the time: the emitter reads them in this order
        self._inflight.pop(id(call), None)
        self._push(call)

    def register_work(self, work: Any, calls: list[OpCall]) -> None:
        """An async op returned ``work``: its calls complete when someone sees it complete."""
        self._works[id(work)] = (work, calls)

    def complete_work(self, work: Any, t_ns: int | None = None) -> None:
        entry = self._works.pop(id(work), None)
        if entry is None or entry[0] is not work:
            return
        t = self.clock() if t_ns is None else t_ns
        for call in entry[1]:
            self.exit(call, t)

    def _push(self, call: OpCall) -> None:
        if len(self._events) >= self.queue_max:
            self.stats.dropped += 1
            return
        self._events.append(call)

    # ---- emitter side ----
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="ccld-attach", daemon=True)
        self._thread.start()

    def stop(self, flush_timeout_s: float = 2.0) -> None:
        """Stop the thread, emit what is queued and flush the sink (bounded by the timeout)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=flush_timeout_s)
        self._thread = None
        self.pump()
        try:
            self.sink.flush(flush_timeout_s)
        except Exception:  # noqa: BLE001 - a dying sink must not hurt the job
            self.stats.sink_errors += 1

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.pump()

    def pump(self, now_ns: int | None = None) -> None:
        """One emitter step: poll async works, drain events, send heartbeats if due."""
        with self._emit_lock:
            try:
                now = self.clock() if now_ns is None else now_ns
                self._poll_works(now)
                self._drain()
                self._heartbeat(now)
            except Exception:  # noqa: BLE001 - the emitter must survive anything
                self.stats.internal_errors += 1
                log.debug("ccld attach emitter step failed", exc_info=True)

    def _poll_works(self, now: int) -> None:
        for work, _calls in list(self._works.values()):
            try:
                done = bool(self.is_completed(work))
            except Exception:  # noqa: BLE001 - a failed work counts as finished
                done = True
            if done:
                self.complete_work(work, now)

    def _drain(self) -> None:
        # Each call is queued twice (enter, exit). Whatever copy comes first decides: a call
        # already finished when first seen is sent as one DONE row carrying both times.
        events = self._events
        while events:
            call = events.popleft()
            if call.done_queued:
                if not call.done_sent:
                    call.done_sent = call.entered_sent = True
                    self._emit(call, Status.DONE, call.t_exit_ns)
            elif not call.entered_sent:
                call.entered_sent = True
                self._emit(call, Status.ENTERED, call.t_enter_ns)

    def _heartbeat(self, now: int) -> None:
        gap = int(self.heartbeat_s * 1e9)
        for call in list(self._inflight.values()):
            if call.entered_sent and not call.done_queued and now - call.last_sample_ns >= gap:
                self._emit(call, Status.PROGRESS, now)
                self.stats.progress += 1

    def _emit(self, call: OpCall, status: Status, t_sample_ns: int) -> None:
        call.last_sample_ns = t_sample_ns
        ident = self.identity
        if ident is None:
            self.stats.unobserved += 1
            return
        try:
            record = KernelRecord(
                job=ident.job,
                incarnation=ident.incarnation,
                comm_hash=call.comm_hash,
                op_seq=call.op_seq,
                op_type=call.op_type,
                dtype=call.dtype,
                count=call.count,
                peer=call.peer,
                rank=ident.rank,
                comm_rank=call.comm_rank,
                comm_size=call.comm_size,
                world_size=ident.world_size,
                host=ident.host,
                status=status,
                t_enter_ns=call.t_enter_ns,
                t_exit_ns=call.t_exit_ns if status is Status.DONE else -1,
                t_sample_ns=t_sample_ns,
            )
        except Exception:  # noqa: BLE001
            self.stats.internal_errors += 1
            return
        try:
            self.sink.submit(record)
            self.stats.records += 1
        except Exception:  # noqa: BLE001 - MetricsProducer never raises, other sinks might
            self.stats.sink_errors += 1

    def detach_after_fork(self) -> None:
        """In a forked child: forget the parent's queue and thread, and send nothing."""
        self._events.clear()
        self._inflight.clear()
        self._works.clear()
        self._thread = None
        self._emit_lock = threading.Lock()  # the parent's emitter may have held it at fork time
        self.sink = NullSink()

    def inflight(self) -> list[OpCall]:
        return list(self._inflight.values())
