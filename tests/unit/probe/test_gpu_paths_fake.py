"""The GPU-side Python (gpu, ring, markers, gpu_scenarios, the benchmark) over a fake CuPy whose
kernels are the CPU twin: argument order, pointers, streams and checks, without a device."""

from __future__ import annotations

import importlib.util
import json
import types
from pathlib import Path

import numpy as np
import pytest

from ccld.probe import frame, gpu_scenarios
from ccld.probe.gpu import Markers, ProbeFrames, calibrate_clock, compile_module, gpu_available
from ccld.probe.ring import RingGroup
from ccld.probe.ring_plan import RingOp, expected_counts, fold
from ccld.records import Status

BENCH = Path(__file__).parents[3] / "benchmarks" / "gpu_probe.py"


def test_fake_device_is_seen(fake_cupy: types.ModuleType) -> None:
    assert gpu_available()


def test_markers_write_the_frame(fake_cupy: types.ModuleType) -> None:
    frames = ProbeFrames(2)
    m = Markers(frames, compile_module("ccld_markers.cu"))
    m.enter(1, gpu_scenarios.trace(3))
    snap = frame.read_consistent(frames.buffer(1))
    assert snap is not None and snap.inside and snap.sub_for(1).trace() == gpu_scenarios.trace(3)
    m.exit(1)
    snap = frame.read_consistent(frames.buffer(1))
    assert snap is not None and not snap.inside
    assert frame.decode(frames.buffer(0)).kernel_index == 0
    assert abs(calibrate_clock()) < 1_000_000_000


def test_launch_marker_entry_point(fake_cupy: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    from ccld.probe import markers
    from ccld.probe.markers import launch_marker

    monkeypatch.setattr(markers, "_session", None)
    t = gpu_scenarios.trace(0)
    launch_marker(t.pack(), 0)
    s = markers.session()
    out: list[object] = []
    poller = s.attach_poller(lambda h: gpu_scenarios.bindings(1)[0], out.append, interval_s=0.01)
    launch_marker(t.pack(), 1)
    poller.stop()
    # the bounded format: the op's DONE (stride 1 at first), then the final poll's IDLE state
    assert [(getattr(r, "status", None), getattr(r, "op_seq", None)) for r in out][-2:] == [
        (Status.DONE, 0), (Status.IDLE, 0)]


def test_ring_allreduce_and_allgather(fake_cupy: types.ModuleType) -> None:
    cp = fake_cupy
    group = RingGroup(3, 4, slot_elems=100)
    host = [np.arange(1000, dtype=np.float32) * (r + 1) for r in range(3)]
    bufs = [cp.asarray(h) for h in host]
    group.launch(RingOp.ALL_REDUCE, bufs, gpu_scenarios.trace(0))
    assert group.synchronize(timeout_s=10)
    for b in bufs:
        np.testing.assert_array_equal(cp.asnumpy(b), np.sum(np.stack(host), axis=0))
    outs = [cp.zeros(3000, dtype=cp.float32) for _ in range(3)]
    group.launch(RingOp.ALL_GATHER, [cp.asarray(h) for h in host], gpu_scenarios.trace(1), outs=outs)
    assert group.synchronize(timeout_s=10)
    np.testing.assert_array_equal(cp.asnumpy(outs[2]), np.concatenate(host))
    assert group.frames is not None
    snap = frame.read_consistent(group.frames.buffer(2))
    assert snap is not None and snap.kernel_index == 2 and not snap.inside
    assert snap.sub_for(2).send[:4] == fold(expected_counts(RingOp.ALL_GATHER, 1000, 3, 4, 100))
    group.close()


def test_scenarios_pass_on_the_twin(fake_cupy: types.ModuleType) -> None:
    ring = compile_module("ccld_ring.cu")
    healthy = gpu_scenarios.check_healthy(ring, 4, 8, n=20_000, ops=2, slot_elems=512)
    assert healthy.ok, healthy.detail
    stopped = gpu_scenarios.check_stopped(ring, 4, 8, n=20_000, stop_rank=2, stop_step=3, slot_elems=512, watch_s=0.25)
    assert stopped.ok, stopped.detail
    slow = gpu_scenarios.check_slow_link(ring, 4, 2, n=4_000, link_ns=10_000_000, slot_elems=256)
    assert slow.ok, slow.detail


def test_stopped_scenario_catches_a_wrong_freeze(fake_cupy: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: against the plan of a different stop step it reports the mismatch."""
    ring = compile_module("ccld_ring.cu")
    real = gpu_scenarios.frozen_counts
    monkeypatch.setattr(gpu_scenarios, "frozen_counts", lambda *a: real(*a[:-1], a[-1] + 1))
    c = gpu_scenarios.check_stopped(ring, 4, 8, n=20_000, stop_rank=2, stop_step=3, slot_elems=512, watch_s=0.2)
    assert not c.ok and "frozen at" in c.detail


def test_timing_runs(fake_cupy: types.ModuleType) -> None:
    row = gpu_scenarios.time_ops(compile_module("ccld_ring.cu"), 1 << 14, iters=2, warmup=1, slot_elems=1024)
    assert row["median_off_ms"] > 0 and row["median_on_ms"] > 0 and row["iters"] == 2


def test_benchmark_script_end_to_end(
    fake_cupy: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location("gpu_probe_bench", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # shrink the scenarios so the twin plays them quickly
    for name, kw in {
        "check_healthy": {"n": 8_000, "slot_elems": 256, "ops": 2},
        "check_stopped": {"n": 8_000, "slot_elems": 256, "watch_s": 0.2},
        "check_slow_link": {"n": 2_000, "slot_elems": 128, "link_ns": 2_000_000},
    }.items():
        real = getattr(gpu_scenarios, name)
        monkeypatch.setattr(gpu_scenarios, name, lambda *a, _r=real, _kw=kw, **k: _r(*a, **{**k, **_kw}))
    real_time = gpu_scenarios.time_ops
    monkeypatch.setattr(
        gpu_scenarios, "time_ops", lambda m, size, iters, *a: real_time(m, 1 << 12, 2, *a, slot_elems=256, warmup=1)
    )
    out = tmp_path / "gpu.json"
    assert bench.main(["--out", str(out), "--sizes-mib", "1", "4"]) == 0
    doc = json.loads(out.read_text())
    assert doc["device"] == "Fake GPU" and len(doc["timing"]) == 2
    assert [c["name"] for c in doc["checks"]] == ["healthy", "stopped_rank", "slow_link"]
    assert all(c["ok"] for c in doc["checks"])
    assert "overhead" in capsys.readouterr().out


def test_benchmark_without_gpu_exits_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "cupy", None)
    spec = importlib.util.spec_from_file_location("gpu_probe_bench2", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main([]) == 2
    assert "no GPU, nothing measured" in capsys.readouterr().err


def test_marker_session_tells_queued_inside_idle(fake_cupy: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    from ccld.probe import markers

    monkeypatch.setattr(markers, "_session", None)
    s = markers.session()
    t = gpu_scenarios.trace(0)
    assert s.gpu_state(t.comm_hash) == "idle"
    s.launch(t.pack(), markers.ENTER)
    assert s.gpu_state(t.comm_hash) == "inside"
    s.launch(t.pack(), markers.EXIT)
    assert s.gpu_state(t.comm_hash) == "idle"
    s._entered[s.frame_of(t.comm_hash)] += 1  # as if an enter marker waited behind busy work
    assert s.gpu_state(t.comm_hash) == "queued"
    with pytest.raises(markers.ProbeError):
        s.launch(t.pack(), 5)
