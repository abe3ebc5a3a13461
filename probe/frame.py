"""Decoding probing frames, and consistent (seqlock) reads of a frame that the GPU is writing.

``decode`` is pure (1,184 bytes in, a ``FrameSnapshot`` out). ``read_consistent`` copies a live
frame and keeps the copy only if the sequence counter was even and unchanged around the copy,
so a begin or an end that was half written is never reported; it retries a few times and
returns None if the writer kept it busy (the caller counts that as a torn read).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ccld.probe import layout
from ccld.probe.errors import FrameError
from ccld.records import TraceId

U8 = npt.NDArray[np.uint8]
_TRACE_WORDS = struct.Struct("<QQ")
U32_WRAP = 1 << 32


@dataclass(frozen=True, slots=True)
class SubBlock:
    """One kernel's slot: the raw Trace ID and 8 channels of cumulative counters."""

    trace_raw: bytes
    send: tuple[int, ...]
    recv: tuple[int, ...]

    def trace(self) -> TraceId:
        """The decoded Trace ID (raises ``RecordError`` on bytes no rank would write)."""
        return TraceId.unpack(self.trace_raw)


@dataclass(frozen=True, slots=True)
class FrameSnapshot:
    """A consistent copy of one frame (header fields by name, then the 8 sub-blocks)."""

    seq: int
    version: int
    n_channels: int
    enabled: bool
    kernel_index: int
    kernels_done: int
    t_begin_ns: int
    t_end_ns: int
    subs: tuple[SubBlock, ...]

    @property
    def inside(self) -> bool:
        """A kernel has begun and not ended."""
        return self.kernel_index != self.kernels_done

    @property
    def last_update_ns(self) -> int:
        """The paper's "last update time": the latest begin or end."""
        return max(self.t_begin_ns, self.t_end_ns)

    @property
    def channels(self) -> int:
        """Counter slots in use by the latest kernel (hardware channels folded onto 8)."""
        return min(self.n_channels, layout.N_CHANNELS)

    def sub_for(self, kernel_number: int) -> SubBlock:
        """The sub-block of kernel number ``kernel_number`` (1-based, as ``kernel_index`` counts)."""
        return self.subs[(kernel_number - 1) % layout.N_SUBBLOCKS]


def _as_u8(raw: bytes | bytearray | memoryview | U8) -> U8:
    arr = np.frombuffer(raw, dtype=np.uint8) if not isinstance(raw, np.ndarray) else raw
    if arr.dtype != np.uint8 or arr.ndim != 1 or arr.shape[0] != layout.FRAME_SIZE:
        raise FrameError(f"a frame is {layout.FRAME_SIZE} bytes of uint8, got {arr.dtype} {arr.shape}")
    return arr


def decode(raw: bytes | bytearray | memoryview | U8) -> FrameSnapshot:
    """Decode one frame's bytes through the numpy structured dtype of ``layout``."""
    f = _as_u8(raw).view(layout.FRAME_DTYPE)[0]
    hdr = f["hdr"]
    subs = []
    for s in range(layout.N_SUBBLOCKS):
        sb = f["sub"][s]
        counters = sb["counters"]
        subs.append(
            SubBlock(
                trace_raw=sb["trace"].tobytes(),
                send=tuple(int(x) for x in counters["send"]),
                recv=tuple(int(x) for x in counters["recv"]),
            )
        )
    return FrameSnapshot(
        seq=int(hdr["seq"]),
        version=int(hdr["version"]),
        n_channels=int(hdr["n_channels"]),
        enabled=bool(hdr["enabled"]),
        kernel_index=int(hdr["kernel_index"]),
        kernels_done=int(hdr["kernels_done"]),
        t_begin_ns=int(hdr["t_begin_ns"]),
        t_end_ns=int(hdr["t_end_ns"]),
        subs=tuple(subs),
    )


_SEQ = layout.header_offset("seq")


def _seq(buf: U8) -> int:
    return int(buf[_SEQ : _SEQ + 4].view("<u4")[0])


def read_consistent(buf: U8, retries: int = 8) -> FrameSnapshot | None:
    """Copy a live frame under its seqlock; None when every attempt met a write in progress."""
    buf = _as_u8(buf)
    for _ in range(max(1, retries)):
        before = _seq(buf)
        if before & 1:
            continue
        copy = buf.copy()
        if _seq(buf) == before and _seq(copy) == before:
            return decode(copy)
    return None


def trace_words(trace: TraceId) -> tuple[int, int]:
    """The Trace ID as the two little-endian u64 words the kernels take (lo, hi)."""
    lo, hi = _TRACE_WORDS.unpack(trace.pack())
    return int(lo), int(hi)


def unwrap_u32(previous: int, raw: int) -> int:
    """Extend a wrapping u32 counter: the unbounded value nearest after ``previous``."""
    return previous + ((raw - previous) % U32_WRAP)
