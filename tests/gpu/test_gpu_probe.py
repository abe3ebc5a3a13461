"""The probe on a real GPU: RawModule compile, marker kernels, the instrumented ring, the poller."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from ccld.probe import frame
from ccld.probe.gpu import gpu_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device"),
]


@pytest.fixture(scope="module")
def ring() -> Any:
    from ccld.probe.gpu import compile_module

    return compile_module("ccld_ring.cu")


@pytest.fixture(scope="module")
def markers_module() -> Any:
    from ccld.probe.gpu import compile_module

    return compile_module("ccld_markers.cu")


def test_marker_pair_begins_and_ends_a_frame(markers_module: Any) -> None:
    import cupy as cp

    from ccld.probe.gpu import Markers, ProbeFrames, calibrate_clock
    from ccld.probe.gpu_scenarios import trace

    frames = ProbeFrames(2)
    try:
        m = Markers(frames, markers_module)
        stream = cp.cuda.Stream(non_blocking=True)
        m.enter(1, trace(7), stream=stream)
        stream.synchronize()
        snap = frame.read_consistent(frames.buffer(1))
        assert snap is not None and snap.inside and snap.kernel_index == 1
        assert snap.sub_for(1).trace() == trace(7) and snap.t_begin_ns > 0
        m.exit(1, stream=stream)
        stream.synchronize()
        snap = frame.read_consistent(frames.buffer(1))
        assert snap is not None and not snap.inside and snap.t_end_ns >= snap.t_begin_ns
        other = frame.decode(frames.buffer(0))  # the other frame was not touched
        assert (other.kernel_index, other.seq, other.enabled) == (0, 0, True)
        offset = calibrate_clock(markers_module)
        assert abs(snap.t_end_ns - (time.time_ns() + offset)) < 10_000_000_000
    finally:
        frames.close()


def test_marker_not_started_while_the_gpu_is_busy(markers_module: Any) -> None:
    """Enqueued behind a long kernel, the enter marker has not run: the host can tell."""
    import cupy as cp

    from ccld.probe.gpu import Markers, ProbeFrames
    from ccld.probe.gpu_scenarios import trace

    spin = cp.RawKernel(
        r"""extern "C" __global__ void spin(long long ns) {
            unsigned long long t0, t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
            do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < ns);
        }""",
        "spin",
    )
    frames = ProbeFrames(1)
    try:
        m = Markers(frames, markers_module)
        stream = cp.cuda.Stream(non_blocking=True)
        spin((1,), (1,), (np.int64(300_000_000),), stream=stream)
        m.enter(0, trace(0), stream=stream)
        time.sleep(0.05)
        snap = frame.read_consistent(frames.buffer(0))
        assert snap is not None and snap.kernel_index == 0  # called, but the GPU has not reached it
        stream.synchronize()
        snap = frame.read_consistent(frames.buffer(0))
        assert snap is not None and snap.kernel_index == 1 and snap.inside
    finally:
        frames.close()


def test_healthy_allreduce_records(ring: Any) -> None:
    from ccld.probe.gpu_scenarios import check_healthy

    c = check_healthy(ring, nranks=4, channels=8, n=300_001, ops=3, slot_elems=4096)
    assert c.ok, c.detail


def test_stopped_rank_freezes_as_planned(ring: Any) -> None:
    from ccld.probe.gpu_scenarios import check_stopped

    c = check_stopped(ring, nranks=4, channels=8, n=1 << 18, stop_rank=1, stop_step=3, slot_elems=2048)
    assert c.ok, c.detail


def test_slow_link_is_slow_and_correct(ring: Any) -> None:
    from ccld.probe.gpu_scenarios import check_slow_link

    c = check_slow_link(ring, nranks=4, channels=8, n=1 << 18, link_ns=30_000_000, slot_elems=8192)
    assert c.ok, c.detail


def test_allgather_and_folded_channels(ring: Any) -> None:
    import cupy as cp

    from ccld.probe.gpu_scenarios import trace
    from ccld.probe.ring import RingGroup
    from ccld.probe.ring_plan import RingOp, expected_counts, fold

    R, C, P, n = 3, 12, 1000, 50_001
    group = RingGroup(R, C, slot_elems=P, module=ring)
    try:
        host = [np.arange(n, dtype=np.float32) + 1000 * r for r in range(R)]
        ins = [cp.asarray(h) for h in host]
        outs = [cp.zeros(R * n, dtype=cp.float32) for _ in range(R)]
        group.launch(RingOp.ALL_GATHER, ins, trace(0), outs=outs)
        assert group.synchronize(timeout_s=30)
        for o in outs:
            np.testing.assert_array_equal(cp.asnumpy(o), np.concatenate(host))
        assert group.frames is not None
        snap = frame.read_consistent(group.frames.buffer(0))
        assert snap is not None and not snap.inside and snap.n_channels == C
        want = fold(expected_counts(RingOp.ALL_GATHER, n, R, C, P))
        assert snap.sub_for(1).send == want and snap.sub_for(1).recv == want
    finally:
        group.close()


def test_disabled_probe_leaves_frames_untouched(ring: Any) -> None:
    import cupy as cp

    from ccld.probe.gpu_scenarios import trace
    from ccld.probe.ring import RingGroup
    from ccld.probe.ring_plan import RingOp

    group = RingGroup(2, 4, slot_elems=512, module=ring)
    try:
        assert group.frames is not None
        for r in range(2):
            group.frames.set_enabled(r, False)
        bufs = [cp.ones(10_000, dtype=cp.float32) for _ in range(2)]
        group.launch(RingOp.ALL_REDUCE, bufs, trace(0))
        assert group.synchronize(timeout_s=30)
        assert all(float(b.sum()) == 20_000.0 for b in bufs)
        assert group.frames.buffer(0).tobytes() == bytes(1184)
    finally:
        group.close()
