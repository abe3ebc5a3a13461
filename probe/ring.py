"""Launching the reference ring collectives on a GPU: R ranks as R concurrent kernels.

``RingGroup`` owns the FIFOs, flags, fault knobs, abort flag and (optionally) the probe frames of
R ranks on the current device, and launches ``ccld_ring_allreduce_f32`` / ``_allgather_f32``
from ``cuda/ccld_ring.cu`` on one stream per rank. After a hang scenario (a stopped rank) call
``release()`` and build a fresh group: the flags of an aborted operation are not reusable.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ccld.probe import layout
from ccld.probe.errors import ProbeError
from ccld.probe.frame import trace_words
from ccld.probe.gpu import MappedHostBuffer, ProbeFrames, calibrate_clock, compile_module, require_device
from ccld.probe.ring_plan import Faults, RingOp, check_ring
from ccld.records import TraceId

FLAG_STRIDE = 32  # u64 words per (rank, channel) flag record (CCLD_FLAG_STRIDE)
THREADS = 512


class RingGroup:
    """R ranks x C channels of the reference ring on one GPU."""

    def __init__(
        self,
        nranks: int = 4,
        channels: int = 8,
        nslots: int = 4,
        slot_elems: int = 64 * 1024,
        probe: bool = True,
        module: Any | None = None,
        threads: int = THREADS,
    ) -> None:
        check_ring(nranks, nslots)
        if channels < 1 or slot_elems < 1:
            raise ProbeError("channels and slot_elems must be >= 1")
        cp = require_device()
        self.cp = cp
        self.nranks, self.channels, self.nslots, self.slot_elems = nranks, channels, nslots, slot_elems
        self.threads = threads
        self.module = module if module is not None else compile_module("ccld_ring.cu")
        self._allreduce = self.module.get_function("ccld_ring_allreduce_f32")
        self._allgather = self.module.get_function("ccld_ring_allgather_f32")
        try:
            self.slots = cp.zeros(nranks * channels * nslots * slot_elems, dtype=cp.float32)
            self.flags = cp.zeros(nranks * channels * FLAG_STRIDE, dtype=cp.uint64)
            self.faults = cp.asarray(Faults().as_array())
        except Exception as exc:
            raise ProbeError(f"cannot allocate the ring's device buffers: {exc}") from exc
        self.abort = MappedHostBuffer(8)
        self.frames: ProbeFrames | None = ProbeFrames(nranks) if probe else None
        #: GPU %globaltimer minus host time.time_ns(), for the pollers of these frames
        self.clock_offset_ns = calibrate_clock(self.module) if probe else 0
        self.streams = [cp.cuda.Stream(non_blocking=True) for _ in range(nranks)]
        cp.cuda.runtime.deviceSynchronize()  # zero-filled flags before any rank stream starts

    def set_faults(self, faults: Faults) -> None:
        self.faults[...] = self.cp.asarray(faults.as_array())
        self.cp.cuda.runtime.deviceSynchronize()

    def _probe_args(self, rank: int, trace: TraceId, probe: bool) -> tuple[np.uint64, ...]:
        lo, hi = trace_words(trace)
        if self.frames is None or not probe:  # null frame: the probe calls return at once
            return np.uint64(0), np.uint64(0), np.uint64(lo), np.uint64(hi)
        return self.frames.frame_ptr(rank), self.frames.dev_ptr(rank), np.uint64(lo), np.uint64(hi)

    def _common(self, rank: int) -> tuple[Any, ...]:
        return (
            np.int32(rank),
            np.int32(self.nranks),
            self.slots,
            self.flags,
            np.int32(self.nslots),
            np.int32(self.slot_elems),
            self.faults,
            np.uint64(self.abort.device_ptr),
        )

    def launch(
        self,
        op: RingOp,
        bufs: list[Any],
        trace: TraceId,
        outs: list[Any] | None = None,
        probe: bool = True,
        after_current: bool = True,
    ) -> None:
        """Launch one operation on every rank's stream (returns at once; see ``synchronize``).

        ``probe=False`` passes a null frame, the probe-off baseline of the overhead benchmark.
        ``after_current``: the rank streams (non-blocking) first wait for the work queued so far
        on the current stream, e.g. the copies that filled ``bufs``."""
        if len(bufs) != self.nranks:
            raise ProbeError(f"{self.nranks} ranks need {self.nranks} buffers, got {len(bufs)}")
        if after_current:
            ready = self.cp.cuda.Event()
            ready.record(self.cp.cuda.get_current_stream())
            for s in self.streams:
                s.wait_event(ready)
        n = int(bufs[0].size)
        for r in range(self.nranks):
            grid, block = (self.channels,), (self.threads,)
            if op is RingOp.ALL_REDUCE:
                args = (bufs[r], np.uint64(n), *self._common(r), *self._probe_args(r, trace, probe))
                self._allreduce(grid, block, args, stream=self.streams[r])
            else:
                if outs is None or len(outs) != self.nranks:
                    raise ProbeError("all-gather needs one output buffer of nranks * n per rank")
                args = (bufs[r], outs[r], np.uint64(n), *self._common(r), *self._probe_args(r, trace, probe))
                self._allgather(grid, block, args, stream=self.streams[r])

    def synchronize(self, timeout_s: float | None = None) -> bool:
        """Wait for every rank's kernel; False if ``timeout_s`` passed first (a hang)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for s in self.streams:
            if deadline is None:
                s.synchronize()
                continue
            while not s.done:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.001)
        return True

    def release(self) -> None:
        """Raise the abort flag so stopped and waiting kernels return, and wait for them."""
        self.abort.array.view(np.uint32)[0] = 1
        for s in self.streams:
            s.synchronize()

    def close(self) -> None:
        if self.frames is not None:
            self.frames.close()
        self.abort.close()


def probe_bytes_per_rank(group: RingGroup) -> int:
    """Bytes of probe state per rank (host frame + device scratch), for reports."""
    return layout.FRAME_SIZE + (layout.DEV_SCRATCH_SIZE if group.frames is not None else 0)
