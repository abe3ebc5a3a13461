"""Without CuPy or without a device the GPU paths say so clearly (a CcldError subclass)."""

from __future__ import annotations

import sys
import types

import pytest

from ccld.errors import CcldError
from ccld.probe import gpu
from ccld.probe.errors import GpuUnavailableError


def test_missing_cupy_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with pytest.raises(GpuUnavailableError, match=r"pip install 'ccl-d\[gpu\]'") as info:
        gpu.load_cupy()
    assert isinstance(info.value, CcldError)
    assert gpu.gpu_available() is False


def _fake_cupy(get_count: object) -> types.ModuleType:
    cp = types.ModuleType("cupy")
    runtime = types.SimpleNamespace(getDeviceCount=get_count)
    cp.cuda = types.SimpleNamespace(runtime=runtime)  # type: ignore[attr-defined]
    return cp


def test_driver_errors_become_gpu_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> int:
        raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")

    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(boom))
    with pytest.raises(GpuUnavailableError, match="no usable CUDA device: cudaErrorInsufficientDriver"):
        gpu.require_device()
    with pytest.raises(GpuUnavailableError):
        gpu.ProbeFrames(2)
    with pytest.raises(GpuUnavailableError):
        gpu.compile_module("ccld_ring.cu")


def test_zero_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(lambda: 0))
    with pytest.raises(GpuUnavailableError, match="no CUDA device is visible"):
        gpu.require_device()


def test_ring_and_markers_need_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    from ccld.probe.markers import launch_marker
    from ccld.probe.ring import RingGroup

    with pytest.raises(GpuUnavailableError):
        RingGroup(nranks=4, channels=8)
    with pytest.raises(GpuUnavailableError):
        launch_marker(bytes(16), 0)
