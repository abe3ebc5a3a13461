"""Operations in flight on one process, and the background thread that turns them into records.

The training thread does as little as possible: ``enter`` builds one small object and appends
it to a deque, ``exit`` stamps a time and appends again (both O(1), no lock, no I/O). A daemon
thread drains the deque every tick (``tick_s``, 50 ms, while an async ``Work`` waits to be asked
whether it finished; ``IDLE_TICK_FACTOR`` times that otherwise) and sends the bounded record format
(docs/wire-format.md, "Record format and its cost"), so the record rate does not grow with the
collective rate:

- **state**, every ``interval_s`` (1 s) and communicator: ``PROGRESS`` of the newest op in
  flight while the rank is inside one, else ``IDLE`` (``Status.IDLE``) with the last op's
  signature and exit time. An op still in flight ``heartbeat_s`` after it entered is shipped at
  once as well (a "look": at most one per communicator and interval, never twice for one op),
  so a rank stuck in a new op shows up within ``heartbeat_s`` and a tick, not at the next interval;
- **detail**: the ``DONE`` record of an op only when ``ccld.records.detail_sampled(comm_hash,
  op_seq, K)`` picks it (``ccld.bounded.op_sampled``, the same rule in plain Python), with ``K =
  detail_one_in(op rate)`` per communicator: the rate is measured over about ``interval_s`` of
  its ops' own entry times and checked at fixed op sequence numbers (raised as soon as the ops
  seen so far need it; ``ccld.bounded.StrideWindow``, which the GPU probe's poller shares), so
  every rank of the communicator picks the same K from the same op on; all_to_all back to back (an
  MoE layer's dispatch and combine) are picked in pairs, by the pair's first op (``ccld.bounded.RunSample``);
  at most about ``DETAIL_OPS_PER_S`` (8) details per communicator and second, and every op when
  a communicator runs at most 8 per second. It carries
  ``t_prev_exit_ns``, the end of this rank's previous op on any communicator (the compute gap
  before the op, whose predecessor was probably not sent), and ``t_exit_err_ns``, how far off its
  exit time may be (0 for the function wrapper; the Flight Recorder poller sees an exit only
  between two polls). Ops not picked cost no record.

``detail="all"`` sends the DONE record of every op and a PROGRESS every ``heartbeat_s`` for
every op in flight (the per-call format, for debugging). Async operations whose ``Work``
nobody waits on are completed by polling ``is_completed`` from this thread. Every table is
bounded. Nothing here raises into the caller; every failure is counted.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ccld.bounded import DEFAULT_INTERVAL_S, DETAIL_MODES, ExitLog, RunSample, StrideWindow, op_sampled
from ccld.producers.attach.cpu_wait import CpuWaitSampler
from ccld.records import DETAIL_OPS_PER_S, DType, KernelBatch, KernelRecord, OpType, Status

log = logging.getLogger(__name__)

class RecordSink(Protocol):
    """Where records go: ``MetricsProducer`` satisfies it, so do the file and list sinks. A sink
    that also has ``submit_batch(KernelBatch)`` (the Kafka sink) gets each pump's records as one
    batch of all its communicators: one message per pump rather than one per communicator."""

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
    t_exit_err_ns: int = 0  # the exit happened within +/- this of t_exit_ns (0: timed exactly)
    done_queued: bool = False  # set by the training thread after t_exit_ns
    seen: bool = False  # the emitter has counted its entry
    done_seen: bool = False  # the emitter has handled its exit
    last_sample_ns: int = -1  # time of the last record sent for this call (heartbeat spacing)
    t_prev_ns: int = -2  # end of the rank's previous op (-1 unknown, -2 not looked up yet)
    one_in: int = 1  # the detail stride in force when it entered (set by the emitter)
    sample_seq: int = -1  # the op whose sequence number decides its detail (RunSample; -1: its own)


@dataclass(slots=True, eq=False)
class _Comm:
    """What the emitter keeps per communicator: its stride, rate window and newest states."""

    active_ns: int  # the last time one of its ops entered or left
    stride: StrideWindow  # its op rate and detail stride K
    run: RunSample  # all_to_all back to back are detailed in pairs
    last: OpCall | None = None  # the newest finished op (the IDLE state)
    looked: OpCall | None = None  # the last op in flight shipped by a look
    look_idx: int = -1  # interval of that look


@dataclass
class TrackerStats:
    """Counters the attachment reports (``ccld.detach()`` returns them as a dict)."""

    calls: int = 0
    records: int = 0
    progress: int = 0  # PROGRESS records (states and looks of ops in flight)
    idle: int = 0  # IDLE state records
    details: int = 0  # DONE records (the sampled ops)
    unsampled: int = 0  # finished ops the sampling left out (no record)
    dropped: int = 0  # events dropped because the queue was full
    sink_errors: int = 0
    internal_errors: int = 0
    unobserved: int = 0  # calls we could not identify (e.g. recv from any source)
    comms_forgotten: int = 0  # communicators dropped from the bounded table
    deferred: int = 0  # calls NCCL runs, left to the NCCL profiler plugin (``ccld run --nccl-plugin``)


@dataclass(frozen=True)
class Identity:
    """Who this process is: fixed once torch.distributed is initialised."""

    job: str
    incarnation: int
    rank: int
    world_size: int
    host: str


_Clock = Callable[[], int]


#: the emitter's tick is this many times ``tick_s`` while no async work waits to be asked whether it
#: finished: its other work (the queued calls, the looks at ops in flight for ``heartbeat_s``, the
#: states each ``interval_s``) needs no finer tick, and each wake takes the GIL from the training
#: thread (about 80 us of CPU on a busy 2-core host: 1.6 ms a second at 50 ms)
IDLE_TICK_FACTOR = 4


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
    #: state interval and rate window (seconds)
    interval_s: float = DEFAULT_INTERVAL_S
    #: "sampled" (the bounded format) or "all" (a DONE record per op)
    detail: str = "sampled"
    #: detailed ops per second and communicator at most
    detail_budget: float = DETAIL_OPS_PER_S
    #: communicators remembered (their states are sent every interval); the least recently used goes
    comms_max: int = 1024
    #: a communicator without ops this long is no longer reported
    forget_s: float = 600.0
    #: the host's CPU stall (PSI), sampled once per state interval and sent with the next batch
    #: (None: not measured)
    cpu_wait: CpuWaitSampler | None = field(default_factory=CpuWaitSampler)

    def __post_init__(self) -> None:
        if self.detail not in DETAIL_MODES:
            raise ValueError(f"unknown detail mode {self.detail!r}: use one of {', '.join(DETAIL_MODES)}")
        self._events: deque[OpCall] = deque()
        self._inflight: dict[int, OpCall] = {}
        self._works: dict[int, tuple[Any, list[OpCall]]] = {}  # id(work) -> (work, its calls)
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._kick = threading.Event()  # wakes the emitter early: stop, or a work while it sleeps idle
        self._idle = False  # the emitter sleeps its idle tick
        self._thread: threading.Thread | None = None
        self._emit_lock = threading.Lock()
        self._comms: dict[int, _Comm] = {}
        self._exits = ExitLog()
        self._next_state_ns: int | None = None
        self._out: list[KernelRecord] = []  # this pump's records, delivered at its end
        self._cpu: tuple[int, int] | None = None  # (wait ns, span ns) not sent yet

    @property
    def per_call(self) -> bool:
        return self.detail == "all"

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

    def done(self, comm_hash: int, op_seq: int, op_type: OpType, dtype: DType, count: int, peer: int,
             comm_rank: int, comm_size: int, t_enter_ns: int, t_exit_ns: int, err_ns: int = 0) -> None:  # fmt: skip
        """A call that had ended when first seen (most Flight Recorder entries): ``enter`` and ``exit``
        in one event, never in the in-flight table."""
        self.stats.calls += 1
        self._push(OpCall(comm_hash, op_seq, op_type, dtype, count, peer, comm_rank, comm_size, t_enter_ns,
                          t_exit_ns, max(err_ns, 0), True))  # fmt: skip

    def exit(self, call: OpCall, t_ns: int | None = None, *, err_ns: int = 0) -> None:
        """The call ended now, or at ``t_ns``, known to within +/- ``err_ns`` (a source that sees the end
        only between two looks, as the Flight Recorder poller does; 0: timed exactly)."""
        if call.done_queued:
            return
        call.t_exit_ns = self.clock() if t_ns is None else t_ns
        call.t_exit_err_ns = max(err_ns, 0)
        call.done_queued = True  # after the time: the emitter reads them in this order
        self._inflight.pop(id(call), None)
        self._push(call)

    def register_work(self, work: Any, calls: list[OpCall]) -> None:
        """An async op returned ``work``: its calls complete when someone sees it complete (the emitter
        asks every ``tick_s``, so one sleeping its idle tick is woken)."""
        self._works[id(work)] = (work, calls)
        if self._idle:
            self._idle = False
            self._kick.set()

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
        """Stop the thread, emit what is queued and every communicator's state, flush the sink."""
        self._stop.set()
        self._kick.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=flush_timeout_s)
        self._thread = None
        self.pump(final=True)
        # nobody polls them any more; a Work (and its tensors) kept to interpreter exit would be
        # freed during finalization, by a thread that can no longer take the GIL
        self._works.clear()
        try:
            self.sink.flush(flush_timeout_s)
        except Exception:  # noqa: BLE001 - a dying sink must not hurt the job
            self.stats.sink_errors += 1

    def _run(self) -> None:
        while True:
            # the long tick only with no async work to ask: its exit is timed by these asks. The flag
            # goes up before the look at the table, so a work registered in between still wakes us
            self._idle = True
            if self._works:
                self._idle = False
            self._kick.wait(self.tick_s if not self._idle else self.tick_s * IDLE_TICK_FACTOR)
            self._kick.clear()
            if self._stop.is_set():
                return
            self.pump()

    def pump(self, now_ns: int | None = None, *, final: bool = False) -> None:
        """One emitter step: poll async works, drain events, ship looks and (when due, or
        ``final``) every communicator's state."""
        with self._emit_lock:
            try:
                now = self.clock() if now_ns is None else now_ns
                self._poll_works(now)
                self._drain(now)
                newest = self._newest_inflight()
                self._states(now, newest, final)
                self._look(now, newest)
            except Exception:  # noqa: BLE001 - the emitter must survive anything
                self.stats.internal_errors += 1
                log.debug("ccld attach emitter step failed", exc_info=True)
            self._deliver()

    def _deliver(self) -> None:
        out, self._out = self._out, []
        if not out:
            return
        submit_batch = getattr(self.sink, "submit_batch", None)
        if callable(submit_batch):
            # a batch holds one job incarnation; the identity changes at most between pumps
            by_job: dict[tuple[str, int], list[KernelRecord]] = {}
            for r in out:
                by_job.setdefault((r.job, r.incarnation), []).append(r)
            for recs in by_job.values():
                try:
                    batch = KernelBatch.from_records(recs)
                    if self._cpu is not None and self.identity is not None:
                        batch = dataclasses.replace(batch, cpu_wait=((self.identity.rank, *self._cpu),))
                        self._cpu = None
                    submit_batch(batch)
                except Exception:  # noqa: BLE001 - a dying sink must not hurt the job
                    self.stats.sink_errors += len(recs)
                    continue
                for r in recs:
                    self._count(r.status)
            return
        for r in out:
            try:
                self.sink.submit(r)
            except Exception:  # noqa: BLE001 - MetricsProducer never raises, other sinks might
                self.stats.sink_errors += 1
                continue
            self._count(r.status)

    def _count(self, status: Status) -> None:
        self.stats.records += 1
        if status is Status.PROGRESS:
            self.stats.progress += 1
        elif status is Status.IDLE:
            self.stats.idle += 1

    def _poll_works(self, now: int) -> None:
        for work, _calls in list(self._works.values()):
            try:
                done = bool(self.is_completed(work))
            except Exception:  # noqa: BLE001 - a failed work counts as finished
                done = True
            if done:
                self.complete_work(work, now)

    def _drain(self, now: int) -> None:
        # Each call is queued twice (enter, exit); whichever copy comes first counts its entry,
        # and its exit is handled once it has one (a call already finished when first seen: both).
        events = self._events
        while events:
            call = events.popleft()
            if not call.seen:
                call.seen = True
                self._entered(call, now)
            if call.done_queued and not call.done_seen:
                call.done_seen = True
                self._finished(call, now)

    def _comm(self, comm_hash: int, now: int) -> _Comm:
        c = self._comms.get(comm_hash)
        if c is None:
            if len(self._comms) >= self.comms_max:
                oldest = min(self._comms, key=lambda h: self._comms[h].active_ns)
                del self._comms[oldest]
                self.stats.comms_forgotten += 1
            c = self._comms[comm_hash] = _Comm(active_ns=now, stride=StrideWindow(self.interval_s, self.detail_budget),
                                               run=RunSample())
        return c

    def _entered(self, call: OpCall, now: int) -> None:
        c = self._comm(call.comm_hash, now)
        c.active_ns = now
        if not self.per_call:  # K at op sequence numbers, from the ops' own entry times (StrideWindow)
            one_in = c.stride.observe(call.op_seq, call.t_enter_ns)
            call.sample_seq, call.one_in = c.run.key(call.op_seq, int(call.op_type), one_in)

    def _finished(self, call: OpCall, now: int) -> None:
        self._exits.add(call.t_exit_ns)
        c = self._comm(call.comm_hash, now)
        c.active_ns = now
        last = c.last
        if last is None or call.op_seq >= last.op_seq or call.t_enter_ns >= last.t_exit_ns:
            c.last = call  # the newest op (a group made again under the same hash starts at 0)
        key = call.sample_seq if call.sample_seq >= 0 else call.op_seq
        if self.per_call or op_sampled(call.comm_hash, key, call.one_in):
            self._emit(call, Status.DONE, call.t_exit_ns)
            self.stats.details += 1
        else:
            self.stats.unsampled += 1

    def _newest_inflight(self) -> dict[int, OpCall]:
        """The op in flight with the highest sequence number of each communicator."""
        newest: dict[int, OpCall] = {}
        for call in list(self._inflight.values()):
            cur = newest.get(call.comm_hash)
            if cur is None or call.op_seq > cur.op_seq:
                newest[call.comm_hash] = call
        return newest

    def _look(self, now: int, newest: dict[int, OpCall]) -> None:
        """Ship an op in flight for ``heartbeat_s`` now (a rank stuck in it is seen at once)."""
        gap = int(self.heartbeat_s * 1e9)
        if self.per_call:  # the per-call format: a PROGRESS every heartbeat for every op in flight
            for call in list(self._inflight.values()):
                if now - call.t_enter_ns >= gap and now - call.last_sample_ns >= gap:
                    self._emit(call, Status.PROGRESS, now)
            return
        idx = now // self._interval_ns()
        for h, call in newest.items():
            if now - call.t_enter_ns < gap:
                continue
            c = self._comm(h, now)
            if c.looked is call or c.look_idx == idx:
                continue
            c.looked, c.look_idx = call, idx
            self._emit(call, Status.PROGRESS, now)

    def _interval_ns(self) -> int:
        return max(int(self.interval_s * 1e9), 1)

    def _states(self, now: int, newest: dict[int, OpCall], final: bool) -> None:
        """Every interval (intervals are aligned to the clock), each communicator's newest state."""
        iv = self._interval_ns()
        due = self._next_state_ns
        if due is None:
            self._next_state_ns = (now // iv + 1) * iv
            if not final:
                return
        elif now < due and not final:
            return
        self._next_state_ns = (now // iv + 1) * iv
        if self.cpu_wait is not None:
            cpu = self.cpu_wait.sample()
            if cpu is not None:  # added to a sample not sent yet (no batch went out since)
                held = self._cpu or (0, 0)
                self._cpu = (held[0] + cpu[0], held[1] + cpu[1])
        for h in newest:
            self._comm(h, now)
        forget = int(self.forget_s * 1e9)
        for h, c in list(self._comms.items()):
            call = newest.get(h)
            if call is not None:
                self._emit(call, Status.PROGRESS, now)
                c.looked = call  # shipped: no look for it now
            elif c.last is not None:
                self._emit(c.last, Status.IDLE, now)
            if call is None and now - c.active_ns > forget:
                del self._comms[h]
                self.stats.comms_forgotten += 1

    def _t_prev(self, call: OpCall) -> int:
        """End of this rank's previous op on any communicator: the latest exit before ``call`` entered."""
        if call.t_prev_ns == -2:
            call.t_prev_ns = self._exits.before(call.t_enter_ns)
        return call.t_prev_ns

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
                t_exit_ns=call.t_exit_ns if status in (Status.DONE, Status.IDLE) else -1,
                t_sample_ns=t_sample_ns,
                t_prev_exit_ns=self._t_prev(call),
                t_exit_err_ns=call.t_exit_err_ns if status in (Status.DONE, Status.IDLE) else 0,
            )
        except Exception:  # noqa: BLE001
            self.stats.internal_errors += 1
            return
        self._out.append(record)

    def detach_after_fork(self) -> None:
        """In a forked child: forget the parent's queue and thread, and send nothing."""
        self._events.clear()
        self._inflight.clear()
        self._works.clear()
        self._comms.clear()
        self._exits.clear()
        self._next_state_ns = None
        self._out = []
        self._thread = None
        self._emit_lock = threading.Lock()  # the parent's emitter may have held it at fork time
        self.sink = NullSink()

    def inflight(self) -> list[OpCall]:
        return list(self._inflight.values())

    def strides(self) -> dict[int, int]:
        """The detail stride K of each communicator now (tests, stats)."""
        return {h: c.stride.one_in for h, c in self._comms.items()}
