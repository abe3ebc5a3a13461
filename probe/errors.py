"""Errors of the GPU probe (all subclasses of ``ccld.errors.CcldError``)."""

from __future__ import annotations

from ccld.errors import CcldError


class ProbeError(CcldError, RuntimeError):
    """Something about the probe failed: a frame, a launch, an allocation."""


class GpuUnavailableError(ProbeError):
    """CuPy is not installed, or no usable CUDA device/driver is present."""


class FrameError(ProbeError, ValueError):
    """A frame buffer has the wrong size or version, or stays torn across every retry."""


class CudaCompileError(ProbeError):
    """nvcc or NVRTC rejected a CUDA source of the probe."""
