"""Consistent reads: a half-written begin or end is never reported."""

from __future__ import annotations

import sys
import threading
import time

from ccld.probe import frame
from ccld.probe.twin import TwinKernelWriter, alloc_frames, frame_bytes, set_enabled
from ccld.records import DType, OpType, TraceId


def _trace(seq: int) -> TraceId:
    return TraceId(42, seq, OpType.ALL_REDUCE, DType.FLOAT32)


def test_read_during_a_begin_is_refused() -> None:
    frames = alloc_frames(1)
    buf = frame_bytes(frames, 0)
    set_enabled(buf)
    seen: list[object] = []
    w = TwinKernelWriter(buf, clock_ns=lambda: 5, on_write_open=lambda: seen.append(frame.read_consistent(buf, 3)))
    w.begin(_trace(0), 1)
    assert seen == [None], "a reader saw the frame while the seqlock was odd"
    snap = frame.read_consistent(buf)
    assert snap is not None and snap.kernel_index == 1


def test_read_racing_a_writer_never_mixes_kernels() -> None:
    """A writer thread runs kernels whose counters and times encode their number; every
    consistent read must show a header whose times belong to its kernel_index / kernels_done
    and a sub-block whose counters belong to its Trace ID."""
    frames = alloc_frames(1)
    buf = frame_bytes(frames, 0)
    set_enabled(buf)
    stop = threading.Event()

    calls = [0]

    def clock() -> int:  # begin of kernel k (1-based): 1000k + 1, its end: 1000k + 2
        calls[0] += 1
        return 1000 * ((calls[0] + 1) // 2) + (2 - calls[0] % 2)

    def write() -> None:
        w = TwinKernelWriter(buf, clock_ns=clock)
        k = 0
        while not stop.is_set():
            w.begin(_trace(k), 2)
            w.count_send(0, k + 1)
            w.count_recv(1, k + 1)
            w.end()
            k += 1

    t = threading.Thread(target=write, daemon=True)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # interleave reader and writer finely, as the GPU and host do
    t.start()
    good = torn = 0
    deadline = time.monotonic() + 0.8
    try:
        while good < 4000 and time.monotonic() < deadline:
            snap = frame.read_consistent(buf, retries=4)
            if snap is None:
                torn += 1
                continue
            if snap.kernel_index == 0:
                continue
            good += 1
            assert snap.t_begin_ns == 1000 * snap.kernel_index + 1, snap
            if snap.kernels_done:
                assert snap.t_end_ns == 1000 * snap.kernels_done + 2, snap
            sub = snap.sub_for(snap.kernel_index)
            op = sub.trace().op_seq
            # counters are 0 (just begun) or op+1; never those of the kernel 8 earlier
            assert sub.send[0] in (0, op + 1) and sub.recv[1] in (0, op + 1), (op, sub)
            if not snap.inside:
                assert sub.send[0] == op + 1 and sub.recv[1] == op + 1
    finally:
        stop.set()
        t.join(2)
        sys.setswitchinterval(old)
    assert good >= 100, (good, torn)
