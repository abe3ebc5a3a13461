"""Frame format v2: each kernel keeps, per channel, its peak RecvCount - SendCount in bits 48-63 of
the recv word; the twin writes it as the CUDA does, the decoder masks it out of the count, the tracker
reports it with DONE (even for a kernel no poll saw inside), and it survives the wire."""

from __future__ import annotations

import struct

from ccld.probe import frame, layout
from ccld.probe.frame_tracker import FrameTracker, RankBinding
from ccld.probe.twin import TwinKernelWriter, alloc_frames, frame_bytes, set_enabled
from ccld.records import DType, KernelBatch, KernelRecord, OpType, Status, TraceId
from ccld.schemas.codec import decode_metrics, encode_batch

BINDING = RankBinding(job="j", rank=3, comm_rank=3, comm_size=8, world_size=8, host="h0")


def _trace(seq: int) -> TraceId:
    return TraceId(0x77, seq, OpType.ALL_REDUCE, DType.BFLOAT16, 0xFFFF)


def _writer() -> tuple[TwinKernelWriter, object]:
    buf = frame_bytes(alloc_frames(1), 0)
    set_enabled(buf)
    return TwinKernelWriter(buf, clock_ns=lambda: 5), buf


def test_layout_v2_keeps_the_paper_size_and_packs_the_recv_word() -> None:
    assert layout.FORMAT_VERSION == 2 and layout.FRAME_SIZE == 1184 and layout.FRAME_DTYPE.itemsize == 1184
    assert (layout.COUNT_BITS, layout.PEAK_SHIFT, layout.PEAK_MAX) == (48, 48, 0xFFFF)
    assert layout.pack_recv(5, 3) == (3 << 48) | 5
    assert layout.unpack_recv(layout.pack_recv(2**48 - 1, 7)) == (2**48 - 1, 7)
    assert layout.pack_recv(1, 1 << 20) >> 48 == 0xFFFF  # the peak saturates
    assert layout.pack_recv(2**48 + 4, 0) == 4  # the count never spills into the peak
    assert "bits 48-63" in layout.describe()
    defines = layout.c_defines()
    assert (defines["CCLD_PROBE_VERSION"], defines["CCLD_PEAK_SHIFT"], defines["CCLD_PEAK_MAX"]) == (2, 48, 0xFFFF)


def test_the_kernel_keeps_its_peak_lead_live_and_at_the_end() -> None:
    w, buf = _writer()
    w.begin(_trace(0), 2)
    # channel 0 receives three ahead of forwarding, then drains: the peak stays at 3
    w.count_recv(0, 3)
    live = frame.decode(buf).sub_for(1)  # type: ignore[arg-type]
    assert (live.recv[0], live.peak[0]) == (3, 3)
    w.count_send(0, 3)
    w.count_recv(0, 1)
    w.count_send(0, 1)
    # channel 1 sends first (the ring's own chunk): never ahead, peak 0
    w.count_send(1, 2)
    w.count_recv(1, 2)
    w.end()
    sub = frame.decode(buf).sub_for(1)  # type: ignore[arg-type]
    assert sub.send[:2] == (4, 2) and sub.recv[:2] == (4, 2) and sub.peak[:2] == (3, 0)
    off = layout.counter_offset(0, 0, "recv")
    assert struct.unpack_from("<Q", bytes(buf), off)[0] == (3 << 48) | 4  # type: ignore[call-overload]


def test_folded_channels_keep_the_largest_peak_of_their_slot() -> None:
    w, buf = _writer()
    w.begin(_trace(0), 16)
    w.count_recv(1, 2)  # slot 1
    w.count_recv(9, 6)  # slot 1 too: the slot's peak is the larger, 6
    w.count_send(9, 6)
    w.count_recv(4, 1)
    w.end()
    sub = frame.decode(buf).sub_for(1)  # type: ignore[arg-type]
    assert sub.recv[1] == 8 and sub.peak[1] == 6 and sub.peak[4] == 1 and sub.peak[0] == 0
    # the next kernel starts from zero
    w.begin(_trace(1), 16)
    w.end()
    assert frame.decode(buf).sub_for(2).peak == (0,) * 8  # type: ignore[arg-type]


def test_a_short_kernel_no_poll_saw_reports_its_peak_with_done_and_it_travels() -> None:
    w, buf = _writer()
    t = FrameTracker(BINDING, lambda trace: 1024)
    w.begin(_trace(0), 2)
    w.end()
    snap = frame.read_consistent(buf)  # type: ignore[arg-type]
    assert snap is not None
    t.update(snap, 10)
    # a 100-us op between two polls: the link behind channel 1 was slow, the rank ran 8 ahead
    w.begin(_trace(1), 2)
    w.count_recv(0, 1)
    w.count_send(0, 1)
    w.count_recv(1, 8)
    w.count_send(1, 8)
    w.end()
    w.begin(_trace(2), 2)
    w.end()
    snap = frame.read_consistent(buf)  # type: ignore[arg-type]
    assert snap is not None
    recs = t.update(snap, 20)
    assert [(r.status, r.op_seq) for r in recs] == [(Status.DONE, 1), (Status.DONE, 2)]
    assert recs[0].peak_lag == (1, 8) and recs[0].recv_counts == (1, 8) and recs[1].peak_lag == (0, 0)
    got = decode_metrics(encode_batch(KernelBatch.from_records(recs)))
    assert got.peaks.tolist() == [[1, 8], [0, 0]]
    assert [r.to_dict() | {"peak_lag": r.peak_lag} for r in got.records()] == [
        KernelRecord.to_dict(r) | {"peak_lag": r.peak_lag} for r in recs]
