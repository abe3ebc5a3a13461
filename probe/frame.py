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
    """One kernel's slot: the raw Trace ID and 8 channels of cumulative counters, and per channel
    the kernel's peak RecvCount - SendCount (bits 48-63 of the recv word; ``recv`` is bits 0-47)."""

    trace_raw: bytes
    send: tuple[int, ...]
    recv: tuple[int, ...]
    peak: tuple[int, ...] = (0,) * layout.N_CHANNELS

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


def _struct_of(fields: tuple[layout.Field, ...], size: int) -> struct.Struct:
    """A little-endian ``struct`` equal to a gap-free field table of ``layout``."""
    codes = {"u1": "B", "<u2": "H", "<u4": "I", "<u8": "Q"}
    offset, fmt = 0, "<"
    for f in sorted(fields, key=lambda f: f.offset):
        if f.offset != offset:
            raise FrameError(f"layout field {f.name} leaves a gap at {offset}")
        fmt += codes[f.dtype]
        offset += f.size
    if offset != size:
        raise FrameError(f"layout fields cover {offset} of {size} bytes")
    return struct.Struct(fmt)


_HEADER = _struct_of(layout.HEADER_FIELDS, layout.HEADER_SIZE)
_HEADER_NAMES = tuple(f.name for f in sorted(layout.HEADER_FIELDS, key=lambda f: f.offset))
_COUNTERS = struct.Struct(f"<{2 * layout.N_CHANNELS}Q")
_SEND = next(f.offset for f in layout.COUNTER_FIELDS if f.name == "send") // 8
_RECV = next(f.offset for f in layout.COUNTER_FIELDS if f.name == "recv") // 8


def decode(raw: bytes | bytearray | memoryview | U8) -> FrameSnapshot:
    """Decode one frame's bytes (offsets from ``layout``; the twin's numpy view reads the same)."""
    data = _as_u8(raw).tobytes() if isinstance(raw, np.ndarray) else bytes(raw)
    if len(data) != layout.FRAME_SIZE:
        raise FrameError(f"a frame is {layout.FRAME_SIZE} bytes, got {len(data)}")
    hdr = dict(zip(_HEADER_NAMES, _HEADER.unpack_from(data, 0), strict=True))
    subs = []
    for s in range(layout.N_SUBBLOCKS):
        base = layout.HEADER_SIZE + s * layout.SUBBLOCK_SIZE
        counters = _COUNTERS.unpack_from(data, base + layout.SUB_COUNTERS_OFFSET)
        words = counters[_RECV::2]
        subs.append(
            SubBlock(
                trace_raw=data[base + layout.SUB_TRACE_OFFSET : base + layout.SUB_TRACE_OFFSET + layout.TRACE_SIZE],
                send=counters[_SEND::2],
                recv=tuple(w & layout.COUNT_MASK for w in words),
                peak=tuple((w >> layout.PEAK_SHIFT) & layout.PEAK_MAX for w in words),
            )
        )
    return FrameSnapshot(
        seq=hdr["seq"],
        version=hdr["version"],
        n_channels=hdr["n_channels"],
        enabled=bool(hdr["enabled"]),
        kernel_index=hdr["kernel_index"],
        kernels_done=hdr["kernels_done"],
        t_begin_ns=hdr["t_begin_ns"],
        t_end_ns=hdr["t_end_ns"],
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
