"""A stand-in for NCCL's side of the profiler interface: load a plugin with ``dlopen`` and call it as NCCL does.

NCCL looks up ``ncclProfiler_v6`` (then v5, v4, ...) in the library, calls ``init`` per communicator
(the plugin answers with the events it wants), then for each op ``startEvent`` of the collective or
point-to-point op (parent: its API event), ``stopEvent`` of it once enqueued; from its proxy thread
``startEvent`` of each kernel channel (parent: the op, with the GPU's start time),
``recordEventState(KernelChStop)`` with the stop time and ``stopEvent``; ``startEvent`` of each proxy
op (parent: the op, with the posting process's pid), of each of its steps, their state transitions
and stops; ``finalize`` per communicator. ``NcclDriver`` makes exactly those calls through ctypes with
descriptors laid out as NCCL lays them out (``nccl_abi_offsets.json``; a unit test checks this module's
structures against it), so a plugin is tested without a GPU or NCCL.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from typing import Any

EV_COLL = 1 << 1
EV_P2P = 1 << 2
EV_PROXY_OP = 1 << 3
EV_PROXY_STEP = 1 << 4
EV_KERNEL_CH = 1 << 6
ST_SEND_GPU_WAIT = 8
ST_SEND_WAIT = 9
ST_RECV_WAIT = 10
ST_RECV_FLUSH_WAIT = 11
ST_RECV_GPU_WAIT = 12
ST_SEND_PEER_WAIT = 20
ST_KERNEL_CH_STOP = 22


class _Coll(ctypes.Structure):
    _fields_ = [("seqNumber", ctypes.c_uint64), ("func", ctypes.c_char_p), ("sendBuff", ctypes.c_void_p),
                ("recvBuff", ctypes.c_void_p), ("count", ctypes.c_size_t), ("root", ctypes.c_int),
                ("datatype", ctypes.c_char_p), ("nChannels", ctypes.c_uint8), ("nWarps", ctypes.c_uint8),
                ("algo", ctypes.c_char_p), ("proto", ctypes.c_char_p), ("parentGroup", ctypes.c_void_p)]  # fmt: skip


class _P2p(ctypes.Structure):
    _fields_ = [("func", ctypes.c_char_p), ("buff", ctypes.c_void_p), ("datatype", ctypes.c_char_p),
                ("count", ctypes.c_size_t), ("peer", ctypes.c_int), ("nChannels", ctypes.c_uint8),
                ("parentGroup", ctypes.c_void_p)]  # fmt: skip


class _ProxyOp(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_int32), ("channelId", ctypes.c_uint8), ("peer", ctypes.c_int),
                ("nSteps", ctypes.c_int), ("chunkSize", ctypes.c_int), ("isSend", ctypes.c_int)]  # fmt: skip


class _ProxyStep(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int)]


class _KernelCh(ctypes.Structure):
    _fields_ = [("channelId", ctypes.c_uint8), ("pTimer", ctypes.c_uint64)]


class _Body(ctypes.Union):
    # v6's union is larger (its CE members): the padding keeps a plugin that copies it in bounds
    _fields_ = [("coll", _Coll), ("p2p", _P2p), ("proxyOp", _ProxyOp), ("proxyStep", _ProxyStep),
                ("kernelCh", _KernelCh), ("_pad", ctypes.c_char * 128)]  # fmt: skip


class DescrV4(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint8), ("parentObj", ctypes.c_void_p), ("rank", ctypes.c_int), ("u", _Body)]


class DescrV5(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint64), ("parentObj", ctypes.c_void_p), ("rank", ctypes.c_int), ("u", _Body)]


class StateArgs(ctypes.Union):
    _fields_ = [("transSize", ctypes.c_size_t), ("pTimer", ctypes.c_uint64)]


_LOGGER = ctypes.CFUNCTYPE(None)
_INIT_V4 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int),
                            ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
_INIT_V5 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64,
                            ctypes.POINTER(ctypes.c_int),
                            ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
_START = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
_STOP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_RECORD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
_FINALIZE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


def _profiler_struct(init: Any) -> type[ctypes.Structure]:
    class Profiler(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char_p), ("init", init), ("startEvent", _START), ("stopEvent", _STOP),
                    ("recordEventState", _RECORD), ("finalize", _FINALIZE)]  # fmt: skip

    return Profiler


PROFILER_V4 = _profiler_struct(_INIT_V4)
PROFILER_V5 = _profiler_struct(_INIT_V5)


def structure_offsets() -> dict[str, int]:
    """This module's layout under the names of ``nccl_abi_offsets.json`` (checked by a unit test)."""
    out: dict[str, int] = {}
    body = DescrV5.u.offset
    for tag, d in (("descr_v4", DescrV4), ("descr_v5", DescrV5), ("descr_v6", DescrV5)):
        out[f"{tag}.type"] = d.type.offset
        out[f"{tag}.parent"] = d.parentObj.offset
        out[f"{tag}.rank"] = d.rank.offset
        out[f"{tag}.sizeof_type"] = ctypes.sizeof(d._fields_[0][1])
        for name, cls, member in (("coll.seq_number", _Coll, "seqNumber"), ("coll.func", _Coll, "func"),
                                  ("coll.count", _Coll, "count"), ("coll.root", _Coll, "root"),
                                  ("coll.datatype", _Coll, "datatype"), ("coll.n_channels", _Coll, "nChannels"),
                                  ("p2p.func", _P2p, "func"), ("p2p.datatype", _P2p, "datatype"),
                                  ("p2p.count", _P2p, "count"), ("p2p.peer", _P2p, "peer"),
                                  ("p2p.n_channels", _P2p, "nChannels"), ("proxy_op.pid", _ProxyOp, "pid"),
                                  ("proxy_op.channel", _ProxyOp, "channelId"), ("proxy_op.peer", _ProxyOp, "peer"),
                                  ("proxy_op.n_steps", _ProxyOp, "nSteps"), ("proxy_op.is_send", _ProxyOp, "isSend"),
                                  ("proxy_step.step", _ProxyStep, "step"),
                                  ("kernel_ch.channel", _KernelCh, "channelId"),
                                  ("kernel_ch.gpu_time_ns", _KernelCh, "pTimer")):  # fmt: skip
            out[f"{tag}.{name}"] = d.u.offset + getattr(cls, member).offset
    assert body == DescrV4.u.offset
    out["state_args.kernel_ch.gpu_time_ns"] = StateArgs.pTimer.offset
    out["state_args.proxy_step.trans_size"] = StateArgs.transSize.offset
    out["state_args.sizeof"] = ctypes.sizeof(StateArgs)
    for tag in ("profiler_v4", "profiler_v5", "profiler_v6"):
        p = PROFILER_V4 if tag == "profiler_v4" else PROFILER_V5
        for name, member in (("name", "name"), ("init", "init"), ("start_event", "startEvent"),
                             ("stop_event", "stopEvent"), ("record_event_state", "recordEventState"),
                             ("finalize", "finalize")):  # fmt: skip
            out[f"{tag}.{name}"] = getattr(p, member).offset
        out[f"{tag}.sizeof"] = ctypes.sizeof(p)
    return out


@dataclass
class Comm:
    """One communicator as NCCL holds it: the plugin's context and the sequence numbers per function."""

    context: int
    comm_hash: int
    rank: int
    nranks: int
    seq: dict[str, int] = field(default_factory=dict)


class NcclDriver:
    """Loads a profiler plugin (``path``) and drives it through interface version ``version`` (6, 5 or 4).

    ``NcclDriver.load`` returns None where NCCL would find no usable symbol (the plugin does not export
    that version); ``init`` returns None where the plugin does not watch the communicator (an error, or no
    context: NCCL then runs it without the plugin; ``mask`` holds the events it asked for). Handles are
    plain integers (0: the plugin declined the event).
    """

    def __init__(self, lib: ctypes.CDLL, version: int, profiler: Any) -> None:
        self.lib = lib
        self.version = version
        self.p = profiler
        self._descr_type = DescrV4 if version == 4 else DescrV5
        self._keep: list[bytes] = []  # strings NCCL would keep alive while an event is open

    @classmethod
    def load(cls, path: str | os.PathLike[str], version: int = 6) -> NcclDriver | None:
        lib = ctypes.CDLL(os.fspath(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        try:
            sym = getattr(lib, f"ncclProfiler_v{version}")
        except AttributeError:
            return None
        struct = PROFILER_V4 if version == 4 else PROFILER_V5
        return cls(lib, version, struct.in_dll(lib, f"ncclProfiler_v{version}") if sym is not None else None)

    @property
    def name(self) -> str:
        return (self.p.name or b"").decode()

    def init(self, comm_hash: int, nranks: int, rank: int, n_nodes: int = 1, name: str = "") -> Comm | None:
        ctx = ctypes.c_void_p()
        mask = ctypes.c_int(0)
        h = comm_hash & 0xFFFF_FFFF_FFFF_FFFF
        if self.version == 4:
            rc = self.p.init(ctypes.byref(ctx), ctypes.byref(mask), name.encode(), h, n_nodes, nranks, rank, None)
        else:
            rc = self.p.init(ctypes.byref(ctx), h, ctypes.byref(mask), name.encode(), n_nodes, nranks, rank, None)
        self.mask = mask.value
        if rc != 0 or not ctx.value:  # refused, or accepted without a context: NCCL runs it without the plugin
            return None
        return Comm(ctx.value, comm_hash, rank, nranks)

    def _start(self, comm: Comm, d: ctypes.Structure) -> int:
        handle = ctypes.c_void_p()
        self.p.startEvent(comm.context, ctypes.byref(handle), ctypes.cast(ctypes.byref(d), ctypes.c_void_p))
        return handle.value or 0

    def _descr(self, type_: int, parent: int, rank: int) -> ctypes.Structure:
        d = self._descr_type()
        d.type = type_
        d.parentObj = parent or None
        d.rank = rank
        return d

    def coll(self, comm: Comm, func: str, count: int, datatype: str = "ncclFloat32", n_channels: int = 1,
             root: int = 0) -> int:  # fmt: skip
        """The collective's own event (NCCL starts it when the op is enqueued with its group)."""
        d = self._descr(EV_COLL, 0, comm.rank)
        seq = comm.seq.get(func, 0)
        comm.seq[func] = seq + 1
        f, dt = func.encode(), datatype.encode()
        self._keep[:] = [f, dt]
        d.u.coll.seqNumber, d.u.coll.func, d.u.coll.count, d.u.coll.root = seq, f, count, root
        d.u.coll.datatype, d.u.coll.nChannels, d.u.coll.nWarps = dt, n_channels, 16
        return self._start(comm, d)

    def p2p(self, comm: Comm, func: str, peer: int, count: int, datatype: str = "ncclFloat32",
            n_channels: int = 1) -> int:  # fmt: skip
        d = self._descr(EV_P2P, 0, comm.rank)
        f, dt = func.encode(), datatype.encode()
        self._keep[:] = [f, dt]
        d.u.p2p.func, d.u.p2p.datatype, d.u.p2p.count, d.u.p2p.peer, d.u.p2p.nChannels = f, dt, count, peer, n_channels
        return self._start(comm, d)

    def raw_event(self, comm: Comm, type_: int, parent: int = 0) -> int:
        """An event of any type (e.g. one a newer NCCL defines), with an empty body."""
        return self._start(comm, self._descr(type_, parent, comm.rank))

    def stop(self, handle: int) -> None:
        self.p.stopEvent(handle or None)

    def record(self, handle: int, state: int, *, p_timer: int = 0, trans_size: int = 0) -> None:
        args = StateArgs()
        if p_timer:
            args.pTimer = p_timer
        else:
            args.transSize = trans_size
        self.p.recordEventState(handle or None, state, ctypes.cast(ctypes.byref(args), ctypes.c_void_p))

    def kernel_ch_start(self, comm: Comm, op: int, channel: int, gpu_ns: int) -> int:
        d = self._descr(EV_KERNEL_CH, op, comm.rank)
        d.u.kernelCh.channelId, d.u.kernelCh.pTimer = channel, gpu_ns
        return self._start(comm, d)

    def kernel_ch_stop(self, handle: int, gpu_ns: int) -> None:
        self.record(handle, ST_KERNEL_CH_STOP, p_timer=gpu_ns)
        self.stop(handle)

    def proxy_op_start(self, comm: Comm, op: int, channel: int, peer: int, n_steps: int, is_send: bool,
                       pid: int | None = None) -> int:  # fmt: skip
        d = self._descr(EV_PROXY_OP, op, comm.rank)
        po = d.u.proxyOp
        po.pid, po.channelId, po.peer = os.getpid() if pid is None else pid, channel, peer
        po.nSteps, po.chunkSize, po.isSend = n_steps, 1 << 19, int(is_send)
        return self._start(comm, d)

    def proxy_step(self, comm: Comm, proxy_op: int, step: int, is_send: bool, size: int = 1 << 19) -> None:
        """One network transfer from its post to its completion, with the states NCCL records on the way."""
        d = self._descr(EV_PROXY_STEP, proxy_op, comm.rank)
        d.u.proxyStep.step = step
        h = self._start(comm, d)
        states = (ST_SEND_GPU_WAIT, ST_SEND_PEER_WAIT, ST_SEND_WAIT) if is_send else (
            ST_RECV_WAIT, ST_RECV_FLUSH_WAIT, ST_RECV_GPU_WAIT)  # fmt: skip
        for s in states:
            self.record(h, s, trans_size=size)
        self.stop(h)

    def proxy_step_posted(self, comm: Comm, proxy_op: int, step: int, size: int = 1 << 19) -> int:
        """A send step whose data the GPU has produced: posted, then waiting for the peer's buffers."""
        d = self._descr(EV_PROXY_STEP, proxy_op, comm.rank)
        d.u.proxyStep.step = step
        h = self._start(comm, d)
        self.record(h, ST_SEND_GPU_WAIT, trans_size=size)
        self.record(h, ST_SEND_PEER_WAIT, trans_size=size)
        return h

    def proxy_step_sent(self, handle: int, size: int = 1 << 19) -> None:
        """... handed to the network and completed."""
        self.record(handle, ST_SEND_WAIT, trans_size=size)
        self.stop(handle)

    def finalize(self, comm: Comm) -> None:
        self.p.finalize(comm.context or None)
