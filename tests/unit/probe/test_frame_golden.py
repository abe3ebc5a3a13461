"""Golden bytes: the twin writes exactly the bytes the layout promises, and the decoder reads them."""

from __future__ import annotations

import struct

import pytest

from ccld.probe import frame, layout
from ccld.probe.errors import FrameError
from ccld.probe.twin import TwinKernelWriter, alloc_frames, frame_bytes, set_enabled
from ccld.records import DType, OpType, TraceId

TRACE = TraceId(0x0123456789ABCDEF, 5, OpType.ALL_GATHER, DType.FLOAT16, 0xFFFF)

# seq 4 (two write sections), version 2, 2 channels, enabled, kernel 1 begun and done, t_begin, t_end
# fmt: off
GOLDEN_HEADER = bytes.fromhex(
    "04000000" "0200" "02" "01" "01000000" "01000000" "1111000000000000" "2222000000000000"
)
GOLDEN_TRACE = bytes.fromhex("efcdab8967452301" "05000000" "01" "01" "ffff")
# fmt: on


def _written() -> bytes:
    frames = alloc_frames(2)
    buf = frame_bytes(frames, 1)
    set_enabled(buf)
    times = iter([0x1111, 0x2222])
    w = TwinKernelWriter(buf, clock_ns=lambda: next(times))
    w.begin(TRACE, 2)
    for _ in range(3):
        w.count_send(0)
    w.count_recv(1, 2)
    w.end()
    assert frame_bytes(frames, 0).tobytes() == bytes(1184), "writing frame 1 touched frame 0"
    return buf.tobytes()


def test_golden_frame_bytes() -> None:
    raw = _written()
    assert len(raw) == 1184
    assert raw[:32] == GOLDEN_HEADER
    assert raw[32:48] == GOLDEN_TRACE == TRACE.pack()
    # channel 1 received 2 before sending anything: its recv word carries peak 2 in bits 48-63
    counters = struct.pack("<16Q", 3, 0, 0, (2 << 48) | 2, *([0] * 12))
    assert raw[48:176] == counters
    assert raw[48 + 24 : 48 + 32] == bytes.fromhex("0200000000000200")
    assert raw[176:] == bytes(1184 - 176)


def test_decode_golden_frame() -> None:
    snap = frame.decode(_written())
    assert (snap.seq, snap.version, snap.n_channels, snap.enabled) == (4, 2, 2, True)
    assert (snap.kernel_index, snap.kernels_done, snap.inside) == (1, 1, False)
    assert (snap.t_begin_ns, snap.t_end_ns, snap.last_update_ns) == (0x1111, 0x2222, 0x2222)
    sub = snap.sub_for(1)
    assert sub.trace() == TraceId(TRACE.comm_hash, 5, OpType.ALL_GATHER, DType.FLOAT16, 0xFFFF)
    assert sub.send[:2] == (3, 0) and sub.recv[:2] == (0, 2)
    assert sub.peak[:2] == (0, 2)
    assert snap.sub_for(9) is sub


def test_ninth_kernel_reuses_the_first_sub_block() -> None:
    frames = alloc_frames(1)
    buf = frame_bytes(frames, 0)
    set_enabled(buf)
    w = TwinKernelWriter(buf, clock_ns=lambda: 7)
    for k in range(9):
        w.begin(TraceId(1, k, OpType.ALL_REDUCE, DType.FLOAT32), 1)
        w.count_send(0, k + 1)
        w.end()
    snap = frame.decode(buf)
    assert snap.kernel_index == 9
    assert snap.sub_for(9).trace().op_seq == 8 and snap.sub_for(9).send[0] == 9
    assert snap.sub_for(2).trace().op_seq == 1 and snap.sub_for(2).send[0] == 2


def test_more_than_eight_channels_fold() -> None:
    frames = alloc_frames(1)
    buf = frame_bytes(frames, 0)
    set_enabled(buf)
    w = TwinKernelWriter(buf, clock_ns=lambda: 1)
    w.begin(TRACE, 20)
    for c in range(20):
        w.count_send(c, c + 1)
    live = frame.decode(buf).sub_for(1)
    w.end()
    snap = frame.decode(buf)
    want = [sum(c + 1 for c in range(20) if c % 8 == s) for s in range(8)]
    assert list(snap.sub_for(1).send) == want == list(live.send)
    assert snap.n_channels == 20 and snap.channels == 8


def test_disabled_frame_is_never_written() -> None:
    frames = alloc_frames(1)
    buf = frame_bytes(frames, 0)
    w = TwinKernelWriter(buf, clock_ns=lambda: 1)
    w.begin(TRACE, 2)
    w.count_send(0)
    w.end()
    assert buf.tobytes() == bytes(1184)
    set_enabled(buf)
    w.begin(TRACE, 2)
    w.end()
    # the device kept counting kernels: the second one lands in sub-block 1
    assert frame.decode(buf).kernel_index == 2


def test_decode_rejects_wrong_sizes() -> None:
    with pytest.raises(FrameError):
        frame.decode(bytes(100))


def test_trace_words_round_trip() -> None:
    lo, hi = frame.trace_words(TRACE)
    assert struct.pack("<QQ", lo, hi) == TRACE.pack()
    assert lo == 0x0123456789ABCDEF and hi == 0xFFFF01010000_0005


def test_layout_constants_used_by_golden_offsets() -> None:
    assert layout.HEADER_SIZE == len(GOLDEN_HEADER)


def test_decoder_agrees_with_the_numpy_view_on_random_bytes() -> None:
    import numpy as np

    rng = np.random.default_rng(1)
    frames = alloc_frames(1)
    raw = frame_bytes(frames, 0)
    raw[:] = rng.integers(0, 256, layout.FRAME_SIZE, dtype=np.uint8)
    snap = frame.decode(raw)
    view = frames[0]
    for f in layout.HEADER_FIELDS:
        want = int(view["hdr"][f.name])
        assert getattr(snap, f.name) == (bool(want) if f.name == "enabled" else want), f.name
    for s in range(layout.N_SUBBLOCKS):
        assert snap.subs[s].trace_raw == view["sub"][s]["trace"].tobytes()
        assert snap.subs[s].send == tuple(int(x) for x in view["sub"][s]["counters"]["send"])
        words = [int(x) for x in view["sub"][s]["counters"]["recv"]]
        assert snap.subs[s].recv == tuple(w & (2**48 - 1) for w in words)
        assert snap.subs[s].peak == tuple(w >> 48 for w in words)
