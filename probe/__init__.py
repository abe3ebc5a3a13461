"""The GPU probe: probing frames in mapped host memory, the CUDA writer, the host poller, the CPU twin.

Nothing here imports CuPy at module load: the GPU parts (``ccld.probe.gpu``, ``.ring``,
``.markers``) import it when called and raise ``GpuUnavailableError`` without it.
"""

from __future__ import annotations

from ccld.probe.errors import GpuUnavailableError, ProbeError
from ccld.probe.poller import FrameSource, ProbePoller
from ccld.probe.tracker import RankBinding
from ccld.probe.twin import TwinKernelWriter, alloc_frames, frame_bytes

__all__ = [
    "FrameSource",
    "GpuUnavailableError",
    "ProbeError",
    "ProbePoller",
    "RankBinding",
    "TwinKernelWriter",
    "alloc_frames",
    "frame_bytes",
    "launch_marker",
]


def launch_marker(trace_id_bytes: bytes, phase: int) -> None:
    """Stream-ordered enter (phase 0) / exit (1) marker for a collective (needs CuPy and a GPU)."""
    from ccld.probe.markers import launch_marker as _launch

    _launch(trace_id_bytes, phase)
