"""Optional hook that brackets each collective on a CUDA stream with the probe's marker kernels.

On a GPU the host-side enter/exit times of an async NCCL call say little: the kernel runs
later on the stream. The probe (``ccld.probe``) owns stream-ordered marker kernels that stamp
``%globaltimer`` into mapped host memory; this hook launches one before and one after each
collective whose tensors live on CUDA. Without CUDA, or without the probe's marker API, the
loader returns None and the attachment runs without it (the CPU/gloo path never needs it).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from ccld.producers.attach.op_tracker import OpCall

log = logging.getLogger(__name__)


class MarkerHook(Protocol):
    """Called by the wrappers on the training thread; must be cheap and must not raise."""

    def on_enter(self, call: OpCall, tensors: Any) -> None: ...

    def on_launched(self, calls: list[OpCall]) -> None: ...


class CudaMarkerHook:
    """Launches ``launch(trace_id_bytes, phase)`` around collectives on CUDA tensors.

    ``launch`` is the probe's marker entry point; phase 0 = enter, 1 = exit. Failures are
    counted and switch the hook off, never raised.
    """

    def __init__(self, launch: Any) -> None:
        self._launch = launch
        self._cuda: set[int] = set()  # ids of calls whose tensors are on CUDA
        self.errors = 0
        self.enabled = True

    def on_enter(self, call: OpCall, tensors: Any) -> None:
        if not self.enabled:
            return
        first = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
        if not getattr(first, "is_cuda", False):
            return
        self._cuda.add(id(call))
        self._fire(call, 0)

    def on_launched(self, calls: list[OpCall]) -> None:
        if not self._cuda:
            return
        for call in calls:
            if id(call) in self._cuda:
                self._cuda.discard(id(call))
                self._fire(call, 1)

    def _fire(self, call: OpCall, phase: int) -> None:
        from ccld.records import TraceId

        try:
            tid = TraceId(call.comm_hash, call.op_seq, call.op_type, call.dtype, call.peer & 0xFFFF)
            self._launch(tid.pack(), phase)
        except Exception:  # noqa: BLE001 - a broken probe turns itself off
            self.errors += 1
            self.enabled = False
            log.warning("ccld attach: CUDA marker launch failed; markers disabled", exc_info=True)


def load_marker_hook() -> CudaMarkerHook | None:
    """The CUDA marker hook when CUDA and the probe's ``launch_marker`` exist, else None."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        import importlib

        launch = getattr(importlib.import_module("ccld.probe"), "launch_marker", None)
        if launch is None:
            log.info("ccld attach: CUDA present but ccld.probe has no launch_marker; no GPU markers")
            return None
        return CudaMarkerHook(launch)
    except Exception:  # noqa: BLE001
        log.debug("ccld attach: no marker hook", exc_info=True)
        return None
