"""The GPU side from Python: CuPy loading, RawModule compilation, mapped frames, marker kernels.

CuPy is optional (``pip install 'ccl-d[gpu]'``) and imported only inside these functions; a
missing CuPy, driver or device raises ``GpuUnavailableError`` with a sentence saying which.
Frames live in pinned host memory allocated with ``cudaHostAlloc(Mapped | Portable)``; under
unified addressing (every 64-bit CUDA platform) the host pointer is the device pointer.
"""

from __future__ import annotations

import ctypes
import logging
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from ccld.probe import layout, sources
from ccld.probe.errors import CudaCompileError, GpuUnavailableError, ProbeError
from ccld.probe.frame import trace_words
from ccld.probe.frame_tracker import RankBinding
from ccld.probe.poller import FrameSource
from ccld.records import TraceId

log = logging.getLogger(__name__)

INSTALL_HINT = "install the GPU extra: pip install 'ccl-d[gpu]'"


def load_cupy() -> Any:
    """Import CuPy, or explain that it is missing."""
    try:
        import cupy
    except ImportError as exc:
        raise GpuUnavailableError(f"CuPy is not installed ({exc}); {INSTALL_HINT}") from exc
    return cupy


def require_device() -> Any:
    """CuPy with at least one usable CUDA device, or ``GpuUnavailableError`` saying why not."""
    cp = load_cupy()
    try:
        count = int(cp.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError: no driver, driver too old, no device
        raise GpuUnavailableError(f"no usable CUDA device: {exc}") from exc
    if count < 1:
        raise GpuUnavailableError("no CUDA device is visible (CUDA_VISIBLE_DEVICES?)")
    return cp


def gpu_available() -> bool:
    """True when CuPy imports and a CUDA device answers; never raises."""
    try:
        require_device()
    except GpuUnavailableError:
        return False
    return True


def compile_module(name: str) -> Any:
    """A ``cupy.RawModule`` of ``probe/cuda/<name>``, compiled now (NVRTC), from ``module_source``."""
    cp = require_device()
    code = sources.module_source(name)
    try:
        module = cp.RawModule(code=code, options=("-std=c++17",))
        module.compile()
    except Exception as exc:  # CompileException, NVRTC missing or too new
        raise CudaCompileError(f"NVRTC could not compile {name}: {exc}") from exc
    return module


class MappedHostBuffer:
    """Pinned host memory mapped into the GPU (zero-copy), with a numpy view for the host."""

    def __init__(self, nbytes: int) -> None:
        cp = require_device()
        rt = cp.cuda.runtime
        self._rt = rt
        self.nbytes = nbytes
        try:
            dev = cp.cuda.Device().id
            if not rt.deviceGetAttribute(rt.cudaDevAttrCanMapHostMemory, dev):
                raise ProbeError(f"device {dev} cannot map host memory; the probe needs zero-copy frames")
            self.ptr = int(rt.hostAlloc(nbytes, rt.hostAllocMapped | rt.hostAllocPortable))
        except ProbeError:
            raise
        except Exception as exc:
            raise ProbeError(f"cannot allocate {nbytes} bytes of pinned mapped host memory: {exc}") from exc
        self.device_ptr = self._device_pointer()
        raw = (ctypes.c_uint8 * nbytes).from_address(self.ptr)
        self.array: npt.NDArray[np.uint8] = np.ctypeslib.as_array(raw)
        self.array[:] = 0

    def _device_pointer(self) -> int:
        try:
            attrs = self._rt.pointerGetAttributes(self.ptr)
            dptr = int(getattr(attrs, "devicePointer", 0) or self.ptr)
        except Exception:  # noqa: BLE001 - older CuPy: unified addressing makes host and device pointers equal
            dptr = self.ptr
        return dptr

    def close(self) -> None:
        if getattr(self, "ptr", 0):
            try:
                self._rt.freeHost(self.ptr)
            finally:
                self.ptr = 0

    def __enter__(self) -> MappedHostBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProbeFrames:
    """``n`` frames in mapped host memory plus their device scratch; hand ``frame_ptr``/``dev_ptr``
    to kernels and ``sources(...)`` to a ``ProbePoller``."""

    def __init__(self, n: int, enabled: bool = True) -> None:
        cp = require_device()
        self.n = n
        self.host = MappedHostBuffer(n * layout.FRAME_SIZE)
        try:
            self.scratch = cp.zeros(n * layout.DEV_SCRATCH_SIZE, dtype=cp.uint8)
        except Exception as exc:
            self.host.close()
            raise ProbeError(f"cannot allocate the probe's device scratch: {exc}") from exc
        for i in range(n):
            self.set_enabled(i, enabled)

    def buffer(self, i: int) -> npt.NDArray[np.uint8]:
        return self.host.array[i * layout.FRAME_SIZE : (i + 1) * layout.FRAME_SIZE]

    def set_enabled(self, i: int, enabled: bool) -> None:
        self.buffer(i)[layout.header_offset("enabled")] = 1 if enabled else 0

    def frame_ptr(self, i: int) -> np.uint64:
        return np.uint64(self.host.device_ptr + i * layout.FRAME_SIZE)

    def dev_ptr(self, i: int) -> np.uint64:
        return np.uint64(int(self.scratch.data.ptr) + i * layout.DEV_SCRATCH_SIZE)

    def sources(self, bindings: list[RankBinding], clock_offset_ns: int = 0) -> list[FrameSource]:
        if len(bindings) != self.n:
            raise ProbeError(f"{self.n} frames need {self.n} bindings, got {len(bindings)}")
        return [FrameSource(self.buffer(i), b, clock_offset_ns) for i, b in enumerate(bindings)]

    def close(self) -> None:
        self.host.close()


class Markers:
    """Stream-ordered enter/exit marker kernels around a collective we cannot modify (NCCL)."""

    def __init__(self, frames: ProbeFrames, module: Any | None = None) -> None:
        self.frames = frames
        self.module = module if module is not None else compile_module("ccld_markers.cu")
        self._enter = self.module.get_function("ccld_marker_enter")
        self._exit = self.module.get_function("ccld_marker_exit")

    def enter(self, i: int, trace: TraceId, stream: Any = None) -> None:
        lo, hi = trace_words(trace)
        args = (self.frames.frame_ptr(i), self.frames.dev_ptr(i), np.uint64(lo), np.uint64(hi))
        self._enter((1,), (1,), args, stream=stream)

    def exit(self, i: int, stream: Any = None) -> None:
        self._exit((1,), (1,), (self.frames.frame_ptr(i), self.frames.dev_ptr(i)), stream=stream)


def calibrate_clock(module: Any | None = None, samples: int = 5) -> int:
    """GPU ``%globaltimer`` minus host ``time.time_ns()``, from the tightest of a few round trips.

    ``module`` is any compiled probe module (``ccld_read_globaltimer`` comes with the header)."""
    cp = require_device()
    module = module if module is not None else compile_module("ccld_markers.cu")
    kernel = module.get_function("ccld_read_globaltimer")
    best: tuple[int, int] | None = None
    with MappedHostBuffer(8) as buf:
        view = buf.array.view(np.uint64)
        for _ in range(max(1, samples)):
            t0 = time.time_ns()
            kernel((1,), (1,), (np.uint64(buf.device_ptr),))
            cp.cuda.runtime.deviceSynchronize()
            t1 = time.time_ns()
            span = t1 - t0
            if best is None or span < best[0]:
                best = (span, int(view[0]) - (t0 + t1) // 2)
    if best is None:
        raise ProbeError("clock calibration took no sample")
    log.debug("GPU clock offset %d ns (round trip %d ns)", best[1], best[0])
    return best[1]
