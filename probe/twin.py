"""The CPU twin of the probe: frames in numpy memory and a writer that plays the kernel's part.

``alloc_frames(n)`` gives frames with the exact bytes the GPU would write (the structured dtype
of ``layout``); ``TwinKernelWriter`` performs the device protocol of ``cuda/ccld_probe.cuh``
step for step — device scratch, seqlock, fold of channels beyond 8, live stores, each channel's
peak lead (bits 48-63 of the recv word, format v2), exact totals and slot peaks at the end — so
the poller, decoder, rates and records are tested byte for byte without a GPU,
and a simulator can write through it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from ccld.probe import layout
from ccld.probe.errors import FrameError, ProbeError
from ccld.records import TraceId

U8 = npt.NDArray[np.uint8]
ClockNs = Callable[[], int]


def alloc_frames(n: int) -> npt.NDArray[np.void]:
    """``n`` zeroed frames as a structured array (``frames.view(np.uint8)`` is the raw memory)."""
    return np.zeros(n, dtype=layout.FRAME_DTYPE)


def frame_bytes(frames: npt.NDArray[np.void], i: int) -> U8:
    """The raw 1,184-byte uint8 view of frame ``i`` (shares memory with ``frames``)."""
    raw: U8 = frames.view(np.uint8).reshape(len(frames), layout.FRAME_SIZE)[i]
    return raw


def set_enabled(buf: U8, enabled: bool = True) -> None:
    """The host's part: switch the probe of this frame on or off."""
    _frame(buf)["hdr"]["enabled"][0] = 1 if enabled else 0


def _frame(buf: U8) -> npt.NDArray[np.void]:
    if buf.dtype != np.uint8 or buf.shape != (layout.FRAME_SIZE,):
        raise FrameError(f"a frame is {layout.FRAME_SIZE} bytes of uint8, got {buf.dtype} {buf.shape}")
    return buf.view(layout.FRAME_DTYPE)


class TwinKernelWriter:
    """Plays the kernel side of one frame: ``begin``, ``count_send``/``count_recv``, ``end``.

    ``clock_ns`` stands in for ``%globaltimer``. ``on_write_open`` (tests) runs while the
    sequence counter is odd, i.e. in the middle of a begin or an end.
    """

    def __init__(
        self,
        buf: U8,
        clock_ns: ClockNs = time.time_ns,
        on_write_open: Callable[[], None] | None = None,
    ) -> None:
        self._f = _frame(buf)
        self._clock = clock_ns
        self._on_write_open = on_write_open
        # device scratch (ccld_probe_dev)
        self.dev_kernel_index = 0
        self.dev_seq = int(self._f["hdr"]["seq"][0])
        self._dev_send = [0] * layout.N_CHANNELS
        self._dev_recv = [0] * layout.N_CHANNELS
        self._dev_peak = [0] * layout.N_CHANNELS
        # the current kernel
        self._active = False
        self._enabled = False
        self._nch = 0
        self._send: list[int] = []
        self._recv: list[int] = []
        self._peak: list[int] = []  # per hardware channel: its largest recv - send so far

    @property
    def active(self) -> bool:
        return self._active

    def _seq_open(self) -> int:
        s = self.dev_seq + 1
        self._f["hdr"]["seq"][0] = s
        if self._on_write_open is not None:
            self._on_write_open()
        return s + 1

    def _seq_close(self, s: int) -> None:
        self._f["hdr"]["seq"][0] = s
        self.dev_seq = s

    def begin(self, trace: TraceId, n_channels: int) -> None:
        """Begin a kernel with ``n_channels`` hardware channels (0 for a marker pair)."""
        if self._active:
            raise ProbeError("begin inside a kernel: kernels on one frame are stream ordered")
        if n_channels < 0:
            raise ProbeError(f"n_channels must be >= 0, got {n_channels}")
        k = self.dev_kernel_index
        self._active = True
        self._nch = n_channels
        self._send = [0] * n_channels
        self._recv = [0] * n_channels
        self._peak = [0] * n_channels
        self._enabled = bool(self._f["hdr"]["enabled"][0])
        if not self._enabled:
            return
        s = self._seq_open()
        sub = k % layout.N_SUBBLOCKS
        self._f["sub"]["trace"][0, sub] = np.frombuffer(trace.pack(), dtype=np.uint8)
        self._f["sub"]["counters"]["send"][0, sub] = 0
        self._f["sub"]["counters"]["recv"][0, sub] = 0
        hdr = self._f["hdr"]
        hdr["version"][0] = layout.FORMAT_VERSION
        hdr["n_channels"][0] = min(n_channels, layout.MAX_HW_CHANNELS)
        hdr["t_begin_ns"][0] = self._clock()
        hdr["kernel_index"][0] = (k + 1) % (1 << 32)
        self._seq_close(s)

    def _count(self, channel: int, n: int, mine: list[int], dev: list[int], which: str) -> None:
        if not self._active:
            raise ProbeError("count outside a kernel")
        if not 0 <= channel < self._nch:
            raise ProbeError(f"channel {channel} outside 0..{self._nch - 1}")
        if not self._enabled:
            return
        mine[channel] += n
        slot = channel % layout.N_CHANNELS
        sub = self.dev_kernel_index % layout.N_SUBBLOCKS
        if self._nch > layout.N_CHANNELS:
            dev[slot] += n
            value = dev[slot]
        else:
            value = mine[channel]
        if which == "recv":  # the lead only grows on a receive; the live word carries this channel's peak
            lead = self._recv[channel] - self._send[channel]
            self._peak[channel] = max(self._peak[channel], min(lead, layout.PEAK_MAX))
            value = layout.pack_recv(value, self._peak[channel])
        self._f["sub"]["counters"][which][0, sub, slot] = value

    def count_send(self, channel: int, n: int = 1) -> None:
        self._count(channel, n, self._send, self._dev_send, "send")

    def count_recv(self, channel: int, n: int = 1) -> None:
        self._count(channel, n, self._recv, self._dev_recv, "recv")

    def end(self) -> None:
        """End the kernel: exact totals and ``kernels_done`` under the seqlock."""
        if not self._active:
            raise ProbeError("end outside a kernel")
        k = self.dev_kernel_index
        if self._enabled:
            if self._nch <= layout.N_CHANNELS:
                for c in range(self._nch):
                    self._dev_send[c] += self._send[c]
                    self._dev_recv[c] += self._recv[c]
            for c in range(self._nch):  # atomicMax of every channel's peak into its slot
                slot = c % layout.N_CHANNELS
                self._dev_peak[slot] = max(self._dev_peak[slot], self._peak[c])
            s = self._seq_open()
            sub = k % layout.N_SUBBLOCKS
            used = min(self._nch, layout.N_CHANNELS)
            self._f["sub"]["counters"]["send"][0, sub, :used] = self._dev_send[:used]
            self._f["sub"]["counters"]["recv"][0, sub, :used] = [
                layout.pack_recv(self._dev_recv[c], self._dev_peak[c]) for c in range(used)
            ]
            self._f["hdr"]["t_end_ns"][0] = self._clock()
            self._f["hdr"]["kernels_done"][0] = (k + 1) % (1 << 32)
            self._seq_close(s)
        self._dev_send = [0] * layout.N_CHANNELS
        self._dev_recv = [0] * layout.N_CHANNELS
        self._dev_peak = [0] * layout.N_CHANNELS
        self.dev_kernel_index = k + 1
        self._active = False
