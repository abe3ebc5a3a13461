"""A fake ``cupy`` for the probe's GPU code paths: kernels run as the CPU twin.

The fake gives "device" arrays backed by numpy, pinned "mapped" memory backed by ctypes buffers
(host pointer = device pointer, as under unified addressing), streams whose work runs on Python
threads, and a RawModule whose kernels are played by ``ring_plan.emulate`` and
``TwinKernelWriter`` writing into the very frame bytes the poller reads. It checks the Python
around the kernels (argument order, pointers, streams, scenario logic), not the CUDA code.
"""

from __future__ import annotations

import ctypes
import struct
import sys
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from ccld.probe import layout
from ccld.probe.ring_plan import FAULT_FIELDS, RingOp, emulate
from ccld.probe.twin import TwinKernelWriter
from ccld.records import TraceId

_KEEP: list[Any] = []  # host allocations live for the session: addresses are never reused
_WRITERS: dict[int, TwinKernelWriter] = {}
_THREADS: list[threading.Thread] = []


def _view(ptr: int, nbytes: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))


class FakeArray:
    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        self.data = types.SimpleNamespace(ptr=a.ctypes.data)
        _KEEP.append(a)

    @property
    def size(self) -> int:
        return int(self.a.size)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.a[key] = value.a if isinstance(value, FakeArray) else value

    def sum(self) -> Any:
        return self.a.sum()


class FakeEvent:
    def __init__(self) -> None:
        self.jobs: list[threading.Thread] = []
        self.t_record = 0.0
        self.t_done = 0.0

    def record(self, stream: FakeStream | None = None) -> None:
        self.jobs = list(stream.jobs) if stream is not None else list(_THREADS)
        self.t_record = time.perf_counter()

    def synchronize(self) -> None:
        for t in self.jobs:
            t.join()
        self.t_done = time.perf_counter()


class FakeStream:
    def __init__(self, non_blocking: bool = False) -> None:
        self.jobs: list[threading.Thread] = []

    @property
    def done(self) -> bool:
        return not any(t.is_alive() for t in self.jobs)

    def synchronize(self) -> None:
        for t in self.jobs:
            t.join()

    def wait_event(self, ev: FakeEvent) -> None:
        self.jobs.extend(ev.jobs)


_CURRENT = FakeStream()


def _writer(frame_ptr: int) -> TwinKernelWriter:
    w = _WRITERS.get(frame_ptr)
    if w is None:
        w = _WRITERS[frame_ptr] = TwinKernelWriter(_view(frame_ptr, layout.FRAME_SIZE), clock_ns=time.time_ns)
    return w


def _trace(lo: Any, hi: Any) -> TraceId:
    return TraceId.unpack(struct.pack("<QQ", int(lo), int(hi)))


class _RingOp:
    """Collects the R launches of one operation, then plays it on a thread."""

    pending: dict[int, dict[int, tuple[Any, ...]]] = {}

    @classmethod
    def launch(cls, op: RingOp, grid: tuple[int, ...], args: tuple[Any, ...], stream: FakeStream) -> None:
        if op is RingOp.ALL_REDUCE:
            buf, n, rank, nranks, slots, _flags, nslots, slot_elems, faults, abort, frame, _dev, lo, hi = args
            out = None
        else:
            buf, out, n, rank, nranks, slots, _flags, nslots, slot_elems, faults, abort, frame, _dev, lo, hi = args
        key = slots.data.ptr
        group = cls.pending.setdefault(key, {})
        group[int(rank)] = (buf, out, int(frame), stream)
        if len(group) < int(nranks):
            return
        del cls.pending[key]
        ranks = [group[r] for r in range(int(nranks))]
        f = dict(zip(FAULT_FIELDS, faults.a.tolist(), strict=True))
        abort_view = _view(int(abort), 4).view(np.uint32)
        trace, channels = _trace(lo, hi), int(grid[0])

        def play() -> None:
            writers = [_writer(fr) if fr else None for _, _, fr, _ in ranks]
            for w in writers:
                if w is not None:
                    w.begin(trace, channels)

            def hook(r: int, ch: int, kind: str) -> None:
                w = writers[r]
                if kind == "send":
                    if r == f["delay_rank"]:
                        time.sleep(f["delay_ns"] / 1e9)
                    if r == f["link_src"] and f["link_channel"] in (-1, ch):
                        time.sleep(f["link_ns"] / 1e9)
                if w is not None:
                    (w.count_send if kind == "send" else w.count_recv)(ch)

            stop = (f["stop_rank"], f["stop_step"]) if f["stop_rank"] >= 0 else None
            res = emulate(op, [b.a for b, _, _, _ in ranks], channels, int(slot_elems), int(nslots), hook, stop)
            if stop is not None:
                while abort_view[0] == 0:  # hung until the host releases it
                    time.sleep(0.001)
                return
            for (b, o, _, _), r in zip(ranks, res, strict=True):
                (b if o is None else o).a[:] = r
            for w in writers:
                if w is not None:
                    w.end()

        t = threading.Thread(target=play, daemon=True)
        _THREADS.append(t)
        t.start()
        for *_, s in ranks:
            s.jobs.append(t)


class FakeKernel:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(
        self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], stream: FakeStream | None = None
    ) -> None:
        stream = stream or _CURRENT
        if self.name == "ccld_marker_enter":
            frame, _dev, lo, hi = args
            if int(frame):
                _writer(int(frame)).begin(_trace(lo, hi), 0)
        elif self.name == "ccld_marker_exit":
            if int(args[0]):
                _writer(int(args[0])).end()
        elif self.name == "ccld_read_globaltimer":
            _view(int(args[0]), 8).view(np.uint64)[0] = time.time_ns()
        elif self.name == "ccld_ring_allreduce_f32":
            _RingOp.launch(RingOp.ALL_REDUCE, grid, args, stream)
        elif self.name == "ccld_ring_allgather_f32":
            _RingOp.launch(RingOp.ALL_GATHER, grid, args, stream)
        else:
            raise AssertionError(f"unknown kernel {self.name}")


class FakeRawModule:
    def __init__(self, code: str, options: tuple[str, ...] = ()) -> None:
        assert '#include "' not in code, "RawModule must get the expanded source"
        self.code = code

    def compile(self) -> None:
        pass

    def get_function(self, name: str) -> FakeKernel:
        assert f"void {name}(" in self.code, name
        return FakeKernel(name)


def _host_alloc(nbytes: int, flags: int) -> int:
    buf = (ctypes.c_uint8 * nbytes)()
    _KEEP.append(buf)
    return ctypes.addressof(buf)


def _sync_all() -> None:
    for t in list(_THREADS):
        t.join()


def make_fake_cupy() -> types.ModuleType:
    cp = types.ModuleType("cupy")
    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1,
        cudaDevAttrCanMapHostMemory=19,
        deviceGetAttribute=lambda attr, dev: 1,
        hostAllocMapped=2,
        hostAllocPortable=1,
        hostAlloc=_host_alloc,
        freeHost=lambda ptr: None,
        pointerGetAttributes=lambda ptr: types.SimpleNamespace(devicePointer=ptr),
        deviceSynchronize=_sync_all,
        getDeviceProperties=lambda dev: {"name": b"Fake GPU"},
    )
    cp.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        runtime=runtime,
        Device=lambda: types.SimpleNamespace(id=0, compute_capability="90"),
        Stream=FakeStream,
        Event=FakeEvent,
        ExternalStream=lambda ptr: _CURRENT,
        get_current_stream=lambda: _CURRENT,
        get_elapsed_time=lambda a, b: (b.t_done - a.t_record) * 1000.0,
    )
    cp.RawModule = FakeRawModule  # type: ignore[attr-defined]
    cp.__version__ = "fake"  # type: ignore[attr-defined]
    cp.float32, cp.uint8, cp.uint64 = np.float32, np.uint8, np.uint64  # type: ignore[attr-defined]
    cp.zeros = lambda n, dtype=np.float32: FakeArray(np.zeros(n, dtype=dtype))  # type: ignore[attr-defined]
    cp.ones = lambda n, dtype=np.float32: FakeArray(np.ones(n, dtype=dtype))  # type: ignore[attr-defined]
    cp.asarray = lambda a: a if isinstance(a, FakeArray) else FakeArray(np.array(a))  # type: ignore[attr-defined]
    cp.asnumpy = lambda a: np.array(a.a)  # type: ignore[attr-defined]
    return cp


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    cp = make_fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    yield cp
    _sync_all()
