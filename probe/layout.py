"""The byte layout of the probing frame: the one place both the CUDA header and the decoder follow.

A frame is 1,184 bytes per rank in pinned host memory mapped into the GPU: a 32-byte header
and 8 sub-blocks of 144 bytes. Sub-block ``(kernel_index - 1) % 8`` belongs to the latest
kernel (``kernel_index`` counts kernels begun). Each sub-block holds the 16-byte Trace ID
(``ccld.records.TraceId.pack()`` bytes) and 8 channels of ``{u64 send, u64 recv}``; hardware
channels beyond 8 fold onto ``channel % 8``. All integers are little-endian.

Counter words (format v2). ``send`` is the SendCount. ``recv`` packs two fields:

======= ===== ==========================================================================================
bits    name  meaning
======= ===== ==========================================================================================
0-47    count RecvCount (``COUNT_MASK``; counts never reach 2^48)
48-63   peak  the kernel's peak send backlog on this slot: the largest RecvCount - SendCount one
              channel of the slot had at any moment of the kernel (counter units, saturating at
              ``PEAK_MAX``; 0 when it never received ahead of sending)
======= ===== ==========================================================================================

The kernel keeps the peak itself (both counters are its own), so an op that begins and ends
between two host polls still reports its backlog with its end: a slow link's source rank receives
faster than it forwards and its peak reaches the in-flight depth, where a healthy ring rank's
stays at a step or two. Live words carry the peak so far of the channel that wrote them; the end
writes each slot's exact peak (the largest over the slot's channels) with the final counts.
v1 frames had the plain RecvCount in all 64 bits.

Header (32 bytes):

====== ==== ================ =====================================================================
offset size field            meaning
====== ==== ================ =====================================================================
0      4    seq              seqlock: odd while the GPU writes a begin or an end, even otherwise
4      2    version          ``FORMAT_VERSION``
6      1    n_channels       hardware channels of the latest kernel (before folding; 255 at most)
7      1    enabled          written by the host: 0 makes the kernels skip every probe write
8      4    kernel_index     kernels begun on this frame (u32, wraps)
12     4    kernels_done     kernels ended on this frame (u32, wraps); inside a kernel iff differ
16     8    t_begin_ns       ``%globaltimer`` at the begin of the latest kernel
24     8    t_end_ns         ``%globaltimer`` at the end of the most recently ended kernel
====== ==== ================ =====================================================================

The "last update time" of the paper's header is ``max(t_begin_ns, t_end_ns)``. Per-channel
counters are written live by each channel's thread block (single 8-byte stores, monotonic) and
are not covered by the seqlock; a begin (Trace ID, zeroed counters) and an end (final counters,
``kernels_done``) are, so a reader never sees a new Trace ID with the counters of the kernel the
sub-block held eight kernels earlier.

Beside each frame the GPU keeps ``DEV_SCRATCH_SIZE`` bytes of device memory (kernel index,
seqlock copy, begin flag, block arrivals, exact per-slot totals and peaks); the host never reads it.

``ccld probe layout --c`` prints the ``#define`` block that ``cuda/ccld_probe.cuh`` must contain
verbatim (a unit test compares them; nvcc's ``static_assert`` ties the defines to the structs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FORMAT_VERSION = 2
FRAME_SIZE = 1184
HEADER_SIZE = 32
SUBBLOCK_SIZE = 144
N_SUBBLOCKS = 8
N_CHANNELS = 8
TRACE_SIZE = 16
COUNTER_PAIR_SIZE = 16
DEV_SCRATCH_SIZE = 176
#: the recv word: RecvCount in bits 0-47, the kernel's peak RecvCount - SendCount in bits 48-63
COUNT_BITS = 48
COUNT_MASK = (1 << COUNT_BITS) - 1
PEAK_SHIFT = COUNT_BITS
PEAK_MAX = 0xFFFF
#: hdr.n_channels is one byte
MAX_HW_CHANNELS = 255


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a fixed-layout struct: name, byte offset, numpy type (little-endian)."""

    name: str
    offset: int
    dtype: str  # numpy type string, e.g. "<u4"

    @property
    def size(self) -> int:
        return int(np.dtype(self.dtype).itemsize)


HEADER_FIELDS: tuple[Field, ...] = (
    Field("seq", 0, "<u4"),
    Field("version", 4, "<u2"),
    Field("n_channels", 6, "u1"),
    Field("enabled", 7, "u1"),
    Field("kernel_index", 8, "<u4"),
    Field("kernels_done", 12, "<u4"),
    Field("t_begin_ns", 16, "<u8"),
    Field("t_end_ns", 24, "<u8"),
)

#: one channel's counters inside a sub-block
COUNTER_FIELDS: tuple[Field, ...] = (
    Field("send", 0, "<u8"),
    Field("recv", 8, "<u8"),
)

#: offsets inside a sub-block
SUB_TRACE_OFFSET = 0
SUB_COUNTERS_OFFSET = TRACE_SIZE


def header_dtype() -> np.dtype:
    return np.dtype(
        {
            "names": [f.name for f in HEADER_FIELDS],
            "formats": [f.dtype for f in HEADER_FIELDS],
            "offsets": [f.offset for f in HEADER_FIELDS],
            "itemsize": HEADER_SIZE,
        }
    )


def counter_dtype() -> np.dtype:
    return np.dtype(
        {
            "names": [f.name for f in COUNTER_FIELDS],
            "formats": [f.dtype for f in COUNTER_FIELDS],
            "offsets": [f.offset for f in COUNTER_FIELDS],
            "itemsize": COUNTER_PAIR_SIZE,
        }
    )


def subblock_dtype() -> np.dtype:
    return np.dtype(
        {
            "names": ["trace", "counters"],
            "formats": [(np.uint8, (TRACE_SIZE,)), (counter_dtype(), (N_CHANNELS,))],
            "offsets": [SUB_TRACE_OFFSET, SUB_COUNTERS_OFFSET],
            "itemsize": SUBBLOCK_SIZE,
        }
    )


def frame_dtype() -> np.dtype:
    """The numpy structured dtype of one frame: exactly the bytes the GPU writes."""
    return np.dtype(
        {
            "names": ["hdr", "sub"],
            "formats": [header_dtype(), (subblock_dtype(), (N_SUBBLOCKS,))],
            "offsets": [0, HEADER_SIZE],
            "itemsize": FRAME_SIZE,
        }
    )


FRAME_DTYPE = frame_dtype()


def header_offset(name: str) -> int:
    """Byte offset of a header field by name."""
    for f in HEADER_FIELDS:
        if f.name == name:
            return f.offset
    raise KeyError(name)


def subblock_offset(kernel_index: int) -> int:
    """Byte offset in the frame of the sub-block written by kernel number ``kernel_index`` (1-based)."""
    return HEADER_SIZE + ((kernel_index - 1) % N_SUBBLOCKS) * SUBBLOCK_SIZE


def counter_offset(sub: int, channel: int, which: str) -> int:
    """Byte offset in the frame of one counter (``which`` is ``send`` or ``recv``)."""
    field = next(f for f in COUNTER_FIELDS if f.name == which)
    return (
        HEADER_SIZE
        + sub * SUBBLOCK_SIZE
        + SUB_COUNTERS_OFFSET
        + (channel % N_CHANNELS) * COUNTER_PAIR_SIZE
        + field.offset
    )


def pack_recv(count: int, peak: int) -> int:
    """The recv word of a counter pair: ``count`` in bits 0-47, ``peak`` (saturated) in bits 48-63."""
    return (min(max(peak, 0), PEAK_MAX) << PEAK_SHIFT) | (count & COUNT_MASK)


def unpack_recv(word: int) -> tuple[int, int]:
    """``(RecvCount, peak backlog)`` of a recv word."""
    return word & COUNT_MASK, (word >> PEAK_SHIFT) & PEAK_MAX


def c_defines() -> dict[str, int]:
    """Every layout constant as the CUDA header names it."""
    out = {
        "CCLD_PROBE_VERSION": FORMAT_VERSION,
        "CCLD_FRAME_SIZE": FRAME_SIZE,
        "CCLD_HEADER_SIZE": HEADER_SIZE,
        "CCLD_SUBBLOCK_SIZE": SUBBLOCK_SIZE,
        "CCLD_N_SUBBLOCKS": N_SUBBLOCKS,
        "CCLD_N_CHANNELS": N_CHANNELS,
        "CCLD_TRACE_SIZE": TRACE_SIZE,
        "CCLD_COUNTER_PAIR_SIZE": COUNTER_PAIR_SIZE,
        "CCLD_DEV_SCRATCH_SIZE": DEV_SCRATCH_SIZE,
        "CCLD_MAX_HW_CHANNELS": MAX_HW_CHANNELS,
        "CCLD_COUNT_BITS": COUNT_BITS,
        "CCLD_PEAK_SHIFT": PEAK_SHIFT,
        "CCLD_PEAK_MAX": PEAK_MAX,
    }
    out.update({f"CCLD_HDR_{f.name.upper()}": f.offset for f in HEADER_FIELDS})
    out["CCLD_SUB_TRACE"] = SUB_TRACE_OFFSET
    out["CCLD_SUB_COUNTERS"] = SUB_COUNTERS_OFFSET
    out.update({f"CCLD_COUNTER_{f.name.upper()}": f.offset for f in COUNTER_FIELDS})
    return out


C_BEGIN = "// BEGIN LAYOUT (generated by `ccld probe layout --c`; checked by tests/unit/probe)"
C_END = "// END LAYOUT"


def c_block() -> str:
    """The ``#define`` block the CUDA header carries verbatim between ``C_BEGIN`` and ``C_END``."""
    lines = [C_BEGIN]
    lines += [f"#define {name} {value}" for name, value in c_defines().items()]
    lines.append(C_END)
    return "\n".join(lines)


def describe() -> str:
    """A readable table of every byte range of a frame (``ccld probe layout``)."""
    rows = [f"probing frame v{FORMAT_VERSION}: {FRAME_SIZE} bytes per rank, little-endian", ""]
    rows.append(f"{'offset':>6} {'size':>4}  field")
    for f in HEADER_FIELDS:
        rows.append(f"{f.offset:>6} {f.size:>4}  header.{f.name} ({f.dtype.lstrip('<')})")
    for s in range(N_SUBBLOCKS):
        base = HEADER_SIZE + s * SUBBLOCK_SIZE
        rows.append(f"{base:>6} {TRACE_SIZE:>4}  sub[{s}].trace_id (TraceId.pack())")
        rows.append(
            f"{base + SUB_COUNTERS_OFFSET:>6} {N_CHANNELS * COUNTER_PAIR_SIZE:>4}  "
            f"sub[{s}].channel[0..{N_CHANNELS - 1}] {{u64 send, u64 recv}}"
        )
    rows.append("")
    rows.append(
        f"recv word: bits 0-{COUNT_BITS - 1} RecvCount, bits {PEAK_SHIFT}-63 the kernel's peak RecvCount - SendCount "
        f"on the slot (saturating at {PEAK_MAX})"
    )
    rows.append("")
    rows.append(f"sub-block of kernel k (1-based) = (k - 1) % {N_SUBBLOCKS}; channel c counts into c % {N_CHANNELS}")
    rows.append(f"device scratch beside each frame: {DEV_SCRATCH_SIZE} bytes (never read by the host)")
    return "\n".join(rows)
