"""Marker kernels for collectives we cannot modify: one frame per communicator, on the current stream.

``launch_marker(trace_id_bytes, phase)`` (exported by ``ccld.probe``; the PyTorch attachment calls
it) launches the enter (phase 0) or exit (phase 1) marker on the current CUDA stream — PyTorch's
when torch is loaded, else CuPy's — into the frame of the Trace ID's communicator. Frames are
allocated at first use (``max_comms`` of them, pinned and mapped). ``attach_poller`` starts a
``ProbePoller`` over the frames (the bounded record format); frames of communicators seen later
join it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from ccld.bounded import DEFAULT_INTERVAL_S as DEFAULT_STATE_INTERVAL_S
from ccld.probe.errors import ProbeError
from ccld.probe.frame import read_consistent
from ccld.probe.frame_tracker import RankBinding
from ccld.probe.poller import FrameSource, ProbePoller, Sink
from ccld.records import TraceId

ENTER, EXIT = 0, 1


class MarkerSession:
    """Frames and marker kernels of one process."""

    def __init__(self, max_comms: int = 16) -> None:
        from ccld.probe.gpu import Markers, ProbeFrames, calibrate_clock, compile_module, require_device

        self.cp = require_device()
        module = compile_module("ccld_markers.cu")
        self.frames = ProbeFrames(max_comms)
        self.markers = Markers(self.frames, module)
        self.clock_offset_ns = calibrate_clock(module)
        self._index: dict[int, int] = {}
        self._entered: dict[int, int] = {}  # enter markers launched per frame (host side)
        self._lock = threading.Lock()
        self._poller: ProbePoller | None = None
        self._binding_for: Callable[[int], RankBinding] | None = None

    def _stream(self) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return self.cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        return self.cp.cuda.get_current_stream()

    def frame_of(self, comm_hash: int) -> int:
        with self._lock:
            i = self._index.get(comm_hash)
            if i is None:
                if len(self._index) >= self.frames.n:
                    raise ProbeError(f"more than {self.frames.n} communicators; raise max_comms")
                i = self._index[comm_hash] = len(self._index)
                if self._poller is not None and self._binding_for is not None:
                    self._poller.add_source(
                        FrameSource(self.frames.buffer(i), self._binding_for(comm_hash), self.clock_offset_ns)
                    )
            return i

    def launch(self, trace_id_bytes: bytes, phase: int) -> None:
        trace = TraceId.unpack(trace_id_bytes)
        i = self.frame_of(trace.comm_hash)
        if phase == ENTER:
            self.markers.enter(i, trace, stream=self._stream())
            with self._lock:
                self._entered[i] = self._entered.get(i, 0) + 1
        elif phase == EXIT:
            self.markers.exit(i, stream=self._stream())
        else:
            raise ProbeError(f"marker phase must be 0 (enter) or 1 (exit), got {phase}")

    def gpu_state(self, comm_hash: int) -> str:
        """Where the GPU stands on this communicator's collectives, from the host's side:
        ``queued`` (an enter marker was launched but the GPU has not reached it: busy before the
        collective), ``inside`` (begun, not ended), ``idle`` (every launched collective ended)."""
        i = self.frame_of(comm_hash)
        snap = read_consistent(self.frames.buffer(i))
        with self._lock:
            launched = self._entered.get(i, 0)
        if snap is None:
            return "unknown"
        if (launched - snap.kernel_index) % (1 << 32) > 0:
            return "queued"
        return "inside" if snap.inside else "idle"

    def attach_poller(
        self,
        binding_for: Callable[[int], RankBinding],
        sink: Sink,
        interval_s: float = 0.1,
        *,
        detail: str = "sampled",
        state_interval_s: float = DEFAULT_STATE_INTERVAL_S,
    ) -> ProbePoller:
        """Start a poller over this session's frames; ``binding_for(comm_hash)`` names the rank.
        It sends the bounded record format (``detail="all"``: every kernel, for debugging)."""
        with self._lock:
            self._binding_for = binding_for
            srcs = [
                FrameSource(self.frames.buffer(i), binding_for(h), self.clock_offset_ns) for h, i in self._index.items()
            ]
            self._poller = ProbePoller(srcs, sink, interval_s=interval_s, detail=detail,
                                       state_interval_s=state_interval_s)  # fmt: skip
        return self._poller.start()


_session: MarkerSession | None = None
_session_lock = threading.Lock()


def session() -> MarkerSession:
    """The process's marker session (created at first use; needs CuPy and a GPU)."""
    global _session
    with _session_lock:
        if _session is None:
            _session = MarkerSession()
        return _session


def launch_marker(trace_id_bytes: bytes, phase: int) -> None:
    """Enter (0) or exit (1) marker for the collective with this packed Trace ID."""
    session().launch(trace_id_bytes, phase)
