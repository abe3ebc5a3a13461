"""The host poller: one thread per process reads every frame at an interval and emits records.

It reads frames with the seqlock (``frame.read_consistent``) every ``interval_s`` (100 ms),
turns the changes into records (``tracker.FrameTracker``) and hands each to ``sink`` — normally
``MetricsProducer.submit``, which never blocks — or, with ``batch_sink``, each poll's records as
one ``KernelBatch`` per job incarnation (all its communicators, as the batcher groups them).

What it sends is the bounded record format of every CCL-D source (docs/wire-format.md, "Record format and
its cost"; ``ccld.bounded``): per communicator and ``state_interval_s`` (1 s) its state
(PROGRESS of the kernel inside, else IDLE), the ENTERED + PROGRESS of a kernel a poll caught in
flight (at most one such look per communicator and interval), and the DONE of the kernels
``detail_sampled`` picks at the stride the attachment would pick. For a rank in C communicators
running r_c kernels per second: records per 1-s interval = sum over c of (at most 3 + min(r_c, 8)
on average; the hash picks a few more or fewer ops from one second to the next), whatever the
collective rate and the poll interval (the per-kernel format sent r_c). ``detail="all"`` sends
every kernel's DONE and a PROGRESS at every poll (the per-kernel format, for debugging).

The poller never raises into the training process: sink errors, torn reads and bad frames are
counted in ``stats`` and logged sparingly; ``missed_kernels`` counts kernels overwritten before
a poll saw them, ``unsampled`` those the sampling left out. Memory is bounded: fixed state per
frame and communicator and at most ``max_records_per_poll`` records per poll (the rest are
dropped and counted). It runs unchanged over GPU-mapped frames, the CPU twin and the NCCL plugin's tables.

Each poll reads every frame before it makes any record, and gives the rank's exit log every end it saw:
an op that began right after the rank's op on another frame ended (a pipeline stage's receive after its
send) gets that end as its predecessor whichever frame comes first (``t_prev_exit_ns``, the compute gap).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ccld.bounded import DEFAULT_INTERVAL_S as DEFAULT_STATE_INTERVAL_S
from ccld.bounded import DETAIL_MODES, ExitLog
from ccld.errors import ConfigError
from ccld.probe import layout
from ccld.probe.errors import FrameError
from ccld.probe.frame import read_consistent
from ccld.probe.frame_tracker import ClockMap, CountOf, FrameTracker, RankBinding, Rates
from ccld.records import DETAIL_OPS_PER_S, KernelBatch, KernelRecord, TraceId

log = logging.getLogger(__name__)

Sink = Callable[[KernelRecord], None]
BatchSink = Callable[[KernelBatch], None]
DEFAULT_INTERVAL_S = 0.1


@dataclass(frozen=True)
class FrameSource:
    """A frame to watch: its live bytes (uint8, 1,184) and who writes it."""

    buffer: npt.NDArray[np.uint8]
    binding: RankBinding
    clock_offset_ns: int = 0  # GPU clock minus host clock (``gpu.calibrate_clock``); 0 for the twin


def _check_source(s: FrameSource) -> None:
    if s.buffer.dtype != np.uint8 or s.buffer.shape != (layout.FRAME_SIZE,):
        raise FrameError(f"a frame source needs {layout.FRAME_SIZE} uint8 bytes, got {s.buffer.shape}")


class OpCounts:
    """Element counts of operations, registered by whoever launches them (bounded, LRU).

    The frame carries the Trace ID only; the element count travels in the record, so the
    launcher tells the poller (``register``) and the poller looks it up (-1 when unknown).
    """

    def __init__(self, max_entries: int = 4096) -> None:
        self._max = max_entries
        self._counts: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._lock = threading.Lock()

    def register(self, trace: TraceId, count: int) -> None:
        key = (trace.comm_hash, trace.op_seq)
        with self._lock:
            self._counts[key] = count
            self._counts.move_to_end(key)
            while len(self._counts) > self._max:
                self._counts.popitem(last=False)

    def __call__(self, trace: TraceId) -> int:
        with self._lock:
            return self._counts.get((trace.comm_hash, trace.op_seq), -1)


class ProbePoller:
    """Polls frames every ``interval_s`` on a daemon thread (or call ``poll_once`` yourself)."""

    def __init__(
        self,
        sources: Sequence[FrameSource],
        sink: Sink,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock_ns: Callable[[], int] = time.time_ns,
        count_of: CountOf | None = None,
        read_retries: int = 8,
        max_records_per_poll: int = 4096,
        detail: str = "sampled",
        state_interval_s: float = DEFAULT_STATE_INTERVAL_S,
        detail_budget: float = DETAIL_OPS_PER_S,
        batch_sink: BatchSink | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ConfigError(f"interval_s must be > 0, got {interval_s}")
        if state_interval_s <= 0:
            raise ConfigError(f"state_interval_s must be > 0, got {state_interval_s}")
        if detail not in DETAIL_MODES:
            raise ConfigError(f"unknown detail mode {detail!r}: use one of {', '.join(DETAIL_MODES)}")
        for s in sources:
            _check_source(s)
        self._sources = list(sources)
        self._sink = sink
        self._batch_sink = batch_sink
        self.interval_s = interval_s
        #: "sampled" (the bounded format) or "all" (every kernel's DONE, a PROGRESS every poll)
        self.detail = detail
        self.state_interval_s = state_interval_s
        self.detail_budget = detail_budget
        self._clock = clock_ns
        self._count_of = count_of
        self._exits: dict[int, ExitLog] = {}  # per rank: the ends its frames showed (t_prev_exit_ns)
        self._ends: dict[int, int] = {}  # per source: the kernels_done whose end went into the ExitLog
        self._trackers = [self._tracker(s.binding) for s in self._sources]
        self._clocks = [ClockMap(s.clock_offset_ns) for s in self._sources]
        self._retries = read_retries
        self._max_records = max_records_per_poll
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one poll at a time (thread and direct callers)
        self._last_error_log = 0.0
        self.stats: dict[str, int] = {
            "polls": 0,
            "records": 0,
            "dropped": 0,
            "sink_errors": 0,
            "torn_reads": 0,
            "bad_frames": 0,
            "missed_kernels": 0,
            "details": 0,
            "unsampled": 0,
            "errors": 0,
        }

    def _tracker(self, binding: RankBinding) -> FrameTracker:
        exits = self._exits.setdefault(binding.rank, ExitLog())
        return FrameTracker(binding, self._count_of, detail=self.detail, interval_s=self.state_interval_s,
                            detail_budget=self.detail_budget, exits=exits)  # fmt: skip

    def add_source(self, source: FrameSource) -> int:
        """Watch one more frame (e.g. a communicator created later); returns its index."""
        _check_source(source)
        with self._lock:
            self._sources.append(source)
            self._trackers.append(self._tracker(source.binding))
            self._clocks.append(ClockMap(source.clock_offset_ns))
            return len(self._sources) - 1

    def rates(self, index: int) -> Rates | None:
        """The latest per-channel rates of source ``index``'s open operation (None when none)."""
        return self._trackers[index].rates

    def _log_sparingly(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last_error_log >= 10.0:
            self._last_error_log = now
            log.warning(msg, *args)

    def poll_once(self, *, final: bool = False) -> int:
        """Read every frame once and hand the records to the sink; returns how many. Never raises.
        ``final``: every communicator's state goes out whether or not an interval ended."""
        with self._lock:
            try:
                return self._poll(final)
            except Exception as exc:  # noqa: BLE001 - the training process must never see the probe fail
                self.stats["errors"] += 1
                self._log_sparingly("probe poll failed: %r", exc)
                return 0

    def _poll(self, final: bool) -> int:
        self.stats["polls"] += 1
        records: list[KernelRecord] = []
        snaps = []
        for i, src in enumerate(self._sources):
            snap = read_consistent(src.buffer, self._retries)
            snaps.append((snap, self._clock()))
            if (snap is not None and snap.kernels_done and snap.version == layout.FORMAT_VERSION
                    and self._ends.get(i) != snap.kernels_done):  # fmt: skip
                self._ends[i] = snap.kernels_done
                # every end this poll sees, before any frame's records: a rank's op on one frame that began
                # right after its op on another ended (a pipeline stage's receive after its send) knows that
                # end as its predecessor, whichever frame the poll reads first
                self._exits.setdefault(src.binding.rank, ExitLog()).add(snap.t_end_ns)
        for src, tracker, clock, (snap, host_now) in zip(self._sources, self._trackers, self._clocks, snaps,
                                                          strict=True):  # fmt: skip
            if snap is None:
                self.stats["torn_reads"] += 1
                continue
            if snap.kernel_index == 0:  # nothing begun yet: the tracker notes that it saw it empty
                tracker.update(snap, host_now)
                continue
            if snap.version != layout.FORMAT_VERSION:
                self.stats["bad_frames"] += 1
                self._log_sparingly("frame of rank %d has version %d", src.binding.rank, snap.version)
                continue
            clock.observe(snap.last_update_ns, host_now)
            missed, details, unsampled = tracker.missed, tracker.details, tracker.unsampled
            records.extend(tracker.update(snap, clock.to_gpu(host_now), final=final))
            self.stats["missed_kernels"] += tracker.missed - missed
            self.stats["details"] += tracker.details - details
            self.stats["unsampled"] += tracker.unsampled - unsampled
        if len(records) > self._max_records:
            self.stats["dropped"] += len(records) - self._max_records
            records = records[: self._max_records]
        bs = self._batch_sink
        sent = self._deliver(records) if bs is None else self._deliver_batches(bs, records)
        self.stats["records"] += sent
        return sent

    def _deliver_batches(self, sink: BatchSink, records: list[KernelRecord]) -> int:
        """One batch per job incarnation, all of its communicators (as the producers' batcher groups)."""
        groups: dict[tuple[str, int], list[KernelRecord]] = {}
        for rec in records:
            groups.setdefault((rec.job, rec.incarnation), []).append(rec)
        sent = 0
        for recs in groups.values():
            try:
                sink(KernelBatch.from_records(recs))
                sent += len(recs)
            except Exception as exc:  # noqa: BLE001 - a broken sink costs records, never the training process
                self.stats["sink_errors"] += len(recs)
                self._log_sparingly("probe batch sink failed: %r", exc)
        return sent

    def _deliver(self, records: list[KernelRecord]) -> int:
        sent = 0
        for rec in records:
            try:
                self._sink(rec)
                sent += 1
            except Exception as exc:  # noqa: BLE001 - a broken sink costs records, never the training process
                self.stats["sink_errors"] += 1
                self._log_sparingly("probe sink failed: %r", exc)
        return sent

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            self.poll_once()
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (a slow sink): skip the missed ticks instead of bursting
                next_t = time.monotonic()
                delay = 0.0
            self._stop.wait(delay)

    def start(self) -> ProbePoller:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="ccld-probe-poller", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0, final_poll: bool = True) -> None:
        """Stop the thread; by default poll once more so the last ends and every communicator's
        state are reported."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if final_poll:
            self.poll_once(final=True)

    def __enter__(self) -> ProbePoller:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
