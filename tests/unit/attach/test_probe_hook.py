"""The CUDA marker hook: brackets CUDA collectives with the probe's markers, switches off on failure."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ccld.producers.attach.op_tracker import OpCall
from ccld.producers.attach.probe_hook import CudaMarkerHook, load_marker_hook
from ccld.records import DType, OpType, TraceId


def call(seq: int) -> OpCall:
    return OpCall(-42, seq, OpType.BROADCAST, DType.FLOAT16, 8, 3, 1, 4, 100)


def test_markers_bracket_cuda_calls_only() -> None:
    fired: list[tuple[TraceId, int]] = []
    hook = CudaMarkerHook(lambda tid, phase: fired.append((TraceId.unpack(tid), phase)))
    gpu, cpu = SimpleNamespace(is_cuda=True), SimpleNamespace(is_cuda=False)
    a, b = call(0), call(1)
    hook.on_enter(a, [gpu])
    hook.on_enter(b, cpu)
    hook.on_launched([a, b])
    assert fired == [
        (TraceId(-42, 0, OpType.BROADCAST, DType.FLOAT16, 3), 0),
        (TraceId(-42, 0, OpType.BROADCAST, DType.FLOAT16, 3), 1),
    ]


def test_a_failing_probe_turns_itself_off() -> None:
    def boom(tid: bytes, phase: int) -> None:
        raise RuntimeError("no driver")

    hook = CudaMarkerHook(boom)
    hook.on_enter(call(0), SimpleNamespace(is_cuda=True))
    hook.on_enter(call(1), SimpleNamespace(is_cuda=True))
    assert (hook.errors, hook.enabled) == (1, False)


def test_no_hook_without_cuda() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the hook loads there")
    assert load_marker_hook() is None
