"""Wrap torch.distributed's collective and p2p functions so every call becomes an OpCall.

Process-group hooks are NCCL-only, so the functions themselves are replaced, in
``torch.distributed.distributed_c10d`` (which torch's own helpers call through its module
globals) and in ``torch.distributed``. ``Work.wait`` and ``Work.is_completed`` are patched on
the class so an async op completes when the training code observes it. A wrapper never lets
an exception of ours reach the caller: identification errors are counted and the original
function runs untouched. Calls nested inside a wrapped call (``send`` calls ``isend``) pass
straight through, so each user call is one record.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any

from ccld.identity import (
    FUNCTION_OPS,
    P2P_RECEIVER,
    P2P_SENDER,
    comm_hash,
    dtype_code,
    p2p_hash,
)
from ccld.producers.attach.cost import HookTime
from ccld.producers.attach.op_tracker import Identity, OpCall, Tracker
from ccld.records import DType, OpType

log = logging.getLogger(__name__)


class _Local(threading.local):
    depth = 0


@dataclass(slots=True)
class GroupState:
    """What this rank knows about one process group (cached on first use)."""

    # weak: a group kept alive past destroy_process_group is destroyed at interpreter exit,
    # when gloo's worker threads can no longer take the GIL to free their last work's tensors
    # (std::terminate, after the job had finished: seen on a rank whose last op was its own)
    pg: weakref.ref[Any]
    comm_hash: int
    ranks: tuple[int, ...]
    comm_rank: int
    size: int
    to_group: dict[int, int]
    seq: int = 0
    name: str = ""  # the group's name ("0", "1", ...: creation order), as Flight Recorder writes it
    #: operations issued on this group through the wrappers (collectives, send/recv, the send/recv
    #: inside monitored_barrier, gather/scatter), counted as the group's own sequence number counts
    #: them (``_get_sequence_number_for_group``, Flight Recorder's ``collective_seq_id``), from its
    #: number when this process attached: "auto" compares the two (session.Attachment)
    issued: int = 0
    p2p: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (src, dst) -> [hash, seq]


def _a(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str, default: Any = None) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


# Each extractor returns (group, tensor-or-list for dtype and count, root in global ranks or
# None, root in group ranks or None, async_op).
_Ext = tuple[Any, Any, Any, Any, bool]


def _x_first(group_i: int, async_i: int) -> Callable[[tuple[Any, ...], dict[str, Any]], _Ext]:
    def ext(args: tuple[Any, ...], kw: dict[str, Any]) -> _Ext:
        return (
            _a(args, kw, group_i, "group"),
            _a(args, kw, 0, "tensor"),
            None,
            None,
            bool(_a(args, kw, async_i, "async_op", False)),
        )

    return ext


def _x_second(group_i: int, async_i: int, name: str) -> Callable[[tuple[Any, ...], dict[str, Any]], _Ext]:
    def ext(args: tuple[Any, ...], kw: dict[str, Any]) -> _Ext:
        return (
            _a(args, kw, group_i, "group"),
            _a(args, kw, 1, name),
            None,
            None,
            bool(_a(args, kw, async_i, "async_op", False)),
        )

    return ext


def _x_output(group_i: int, async_i: int) -> Callable[[tuple[Any, ...], dict[str, Any]], _Ext]:
    def ext(args: tuple[Any, ...], kw: dict[str, Any]) -> _Ext:
        return (
            _a(args, kw, group_i, "group"),
            _a(args, kw, 0, "output"),
            None,
            None,
            bool(_a(args, kw, async_i, "async_op", False)),
        )

    return ext


def _x_broadcast(args: tuple[Any, ...], kw: dict[str, Any]) -> _Ext:
    return (_a(args, kw, 2, "group"), _a(args, kw, 0, "tensor"), _a(args, kw, 1, "src"),
            _a(args, kw, 4, "group_src"), bool(_a(args, kw, 3, "async_op", False)))  # fmt: skip


def _x_reduce(args: tuple[Any, ...], kw: dict[str, Any]) -> _Ext:
    return (_a(args, kw, 3, "group"), _a(args, kw, 0, "tensor"), _a(args, kw, 1, "dst"),
            _a(args, kw, 5, "group_dst"), bool(_a(args, kw, 4, "async_op", False)))  # fmt: skip


_BARRIER = object()


def _x_barrier(args: tuple[Any, ...], kw: dict[str, Any]) -> _Ext:
    return _a(args, kw, 0, "group"), _BARRIER, None, None, bool(_a(args, kw, 1, "async_op", False))


def _x_monitored_barrier(args: tuple[Any, ...], kw: dict[str, Any]) -> _Ext:
    return _a(args, kw, 0, "group"), _BARRIER, None, None, False


COLLECTIVES: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], _Ext]] = {
    "all_reduce": _x_first(2, 3),
    "all_reduce_coalesced": _x_first(2, 3),
    "all_gather": _x_second(2, 3, "tensor"),
    "all_gather_into_tensor": _x_second(2, 3, "input_tensor"),
    "all_gather_single": _x_second(2, 3, "input_tensor"),
    "_all_gather_base": _x_second(2, 3, "input_tensor"),
    "all_gather_coalesced": _x_second(2, 3, "input_tensor_list"),
    "reduce_scatter": _x_output(3, 4),
    "reduce_scatter_tensor": _x_output(3, 4),
    "reduce_scatter_single": _x_output(3, 4),
    "_reduce_scatter_base": _x_output(3, 4),
    "broadcast": _x_broadcast,
    "reduce": _x_reduce,
    "all_to_all": _x_second(2, 3, "input_tensor_list"),
    "all_to_all_single": _x_second(4, 5, "input"),
    "barrier": _x_barrier,
    "monitored_barrier": _x_monitored_barrier,
}
#: collectives with no op type of ours (no record), each one Flight Recorder collective: counted
#: only, so that "auto" does not take them for collectives the wrapper cannot see
COUNTED_ONLY = {"gather": 3, "scatter": 3}  # name -> position of the group argument
P2P: dict[str, tuple[OpType, str, str, bool]] = {  # name -> (op, peer kw, group-peer kw, async)
    "send": (OpType.SEND, "dst", "group_dst", False),
    "isend": (OpType.SEND, "dst", "group_dst", True),
    "recv": (OpType.RECV, "src", "group_src", False),
    "irecv": (OpType.RECV, "src", "group_src", True),
}


_DTYPE_CACHE: dict[Any, DType] = {}


def _dtype(torch_dtype: Any) -> DType:
    code = _DTYPE_CACHE.get(torch_dtype)
    if code is None:
        code = _DTYPE_CACHE[torch_dtype] = dtype_code(str(torch_dtype))
    return code


def _size_dtype(obj: Any) -> tuple[DType, int]:
    """dtype code and element count of a tensor or a list of tensors (lists: summed)."""
    if obj is _BARRIER:
        return DType.FLOAT32, 1
    if isinstance(obj, (list, tuple)):
        if not obj:
            return DType.OTHER, 0
        return _dtype(obj[0].dtype), sum(int(t.numel()) for t in obj)
    return _dtype(obj.dtype), obj.numel()


class TorchHooks:
    """Installs and removes the wrappers; owns the per-group state of this process."""

    def __init__(self, tracker: Tracker, *, job: str, incarnation: int, marker: Any = None) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        self.dist = dist
        self.c10d = c10d
        self.tracker = tracker
        self.job = job
        self.incarnation = incarnation
        self.marker = marker  # optional CUDA marker hook (probe_hook.MarkerHook)
        self.enabled = True
        self._local = _Local()
        self._groups: dict[int, GroupState] = {}
        self._lock = threading.Lock()
        self._originals: dict[tuple[Any, str], Any] = {}
        #: where collectives get their op_seq: None, this wrapper's own counter per group; else a
        #: function of (group, name) returning the op_seq, or None to leave the call to another
        #: source (the Flight Recorder poller, see fr_poll and session)
        self.seq_source: Callable[[GroupState, str], int | None] | None = None
        #: operations this process issued through the wrappers (collectives and p2p, counted before
        #: torch runs them): "auto" compares it with Flight Recorder's count to find the ones it
        #: cannot see (DDP's reducer, FSDP, torch.compile, calls on the process group itself)
        self.issued = 0
        #: group name -> its sequence number when this process attached (an attachment after some
        #: collectives ran): where the group's ``issued`` starts
        self.seq_base: dict[str, int] = {}
        #: the training thread's time inside these hooks (set before ``install``; None: not measured)
        self.cost: HookTime | None = None
        #: the NCCL profiler plugin reports every op NCCL runs (``ccld run --nccl-plugin``): calls that go to
        #: NCCL are left to it (counted in ``deferred``), so no collective is counted twice
        self.defer_nccl = False

    # ---- install / uninstall ----
    def install(self) -> None:
        c10d, dist = self.c10d, self.dist
        for name in COUNTED_ONLY:
            orig = getattr(c10d, name, None)
            if orig is None or getattr(orig, "__ccld_wrapped__", False):
                continue
            counted = self._make_counted(orig, COUNTED_ONLY[name])
            for mod in (c10d, dist):
                if getattr(mod, name, None) is orig:
                    self._originals[(mod, name)] = orig
                    setattr(mod, name, counted)
        for name in [*COLLECTIVES, *P2P, "batch_isend_irecv"]:
            orig = getattr(c10d, name, None)
            if orig is None or getattr(orig, "__ccld_wrapped__", False):
                continue
            wrapper = self._make(name, orig)
            for mod in (c10d, dist):
                if getattr(mod, name, None) is orig:
                    self._originals[(mod, name)] = orig
                    setattr(mod, name, wrapper)
        work_cls = c10d.Work
        orig_wait = work_cls.wait
        orig_done = work_cls.is_completed
        self._originals[(work_cls, "wait")] = orig_wait
        self._originals[(work_cls, "is_completed")] = orig_done
        tracker = self.tracker
        cost = self.cost

        def seen_complete(work: Any) -> None:
            t0 = perf_counter_ns() if cost is not None else 0
            try:
                tracker.complete_work(work)
            except Exception:  # noqa: BLE001 - never our exception in the training code
                tracker.stats.internal_errors += 1
            if cost is not None:
                cost.add(perf_counter_ns() - t0)

        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return orig_wait(work, *args, **kwargs)
            finally:  # returned or raised (timeout, aborted peer): either way the op is over here
                if tracker._works:
                    seen_complete(work)

        def is_completed(work: Any) -> Any:
            result = orig_done(work)
            if result and tracker._works:
                seen_complete(work)
            return result

        work_cls.wait = wait
        work_cls.is_completed = is_completed
        tracker.is_completed = lambda w: bool(orig_done(w))

    def uninstall(self) -> None:
        self.enabled = False
        for (owner, name), orig in self._originals.items():
            try:
                setattr(owner, name, orig)
            except Exception:  # noqa: BLE001
                log.debug("cannot restore %s", name, exc_info=True)
        self._originals.clear()

    # ---- wrappers ----
    def _make(self, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        local = self._local
        if name == "batch_isend_irecv":
            begin: Callable[[tuple[Any, ...], dict[str, Any]], tuple[list[OpCall], bool] | None] = self._begin_batch
        elif name in P2P:
            begin = functools.partial(self._begin_p2p, P2P[name])
        else:
            begin = functools.partial(self._begin_coll, FUNCTION_OPS[name], COLLECTIVES[name])

        cost = self.cost

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if local.depth or not self.enabled:
                return orig(*args, **kwargs)
            t0 = perf_counter_ns() if cost is not None else 0
            try:
                started = begin(args, kwargs)
            except Exception:  # noqa: BLE001 - never our exception in the training code
                self.tracker.stats.internal_errors += 1
                log.debug("ccld attach: cannot identify %s", name, exc_info=True)
                started = None
            self.issued += 1  # after begin(): "auto" compares Flight Recorder with the calls before this one
            local.depth += 1
            # torch's own time in the call is the job's, not ours: measured around our two parts only
            ours = perf_counter_ns() - t0 if cost is not None else 0
            try:
                result = orig(*args, **kwargs)
            except BaseException:
                local.depth -= 1
                self._finish(started, None)
                raise
            local.depth -= 1
            if cost is None:
                self._finish(started, result)
            else:
                t1 = perf_counter_ns()
                self._finish(started, result)
                cost.add(ours + perf_counter_ns() - t1)
            return result

        wrapper.__ccld_wrapped__ = True  # type: ignore[attr-defined]
        return wrapper

    def _make_counted(self, orig: Callable[..., Any], group_i: int) -> Callable[..., Any]:
        """A pass-through that only counts the call (see :data:`COUNTED_ONLY`)."""
        local = self._local
        cost = self.cost

        @functools.wraps(orig)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if not local.depth and self.enabled:
                t0 = perf_counter_ns() if cost is not None else 0
                self.issued += 1
                try:
                    st = self.group_state(_a(args, kwargs, group_i, "group"))
                    if st is not None:
                        st.issued += 1
                except Exception:  # noqa: BLE001 - never our exception in the training code
                    self.tracker.stats.internal_errors += 1
                if cost is not None:
                    cost.add(perf_counter_ns() - t0)
            return orig(*args, **kwargs)

        counted.__ccld_wrapped__ = True  # type: ignore[attr-defined]
        return counted

    def _finish(self, started: tuple[list[OpCall], bool] | None, result: Any) -> None:
        if started is None:
            return
        calls, is_async = started
        try:
            if self.marker is not None:
                self.marker.on_launched(calls)
            if is_async and result is not None:
                works = result if isinstance(result, list) else [result]
                if len(works) == len(calls):
                    for w, c in zip(works, calls, strict=True):
                        self.tracker.register_work(w, [c])
                elif works:
                    # coalesced (NCCL-style) batches return fewer works: the last one ends them all
                    self.tracker.register_work(works[-1], calls)
                else:
                    for c in calls:
                        self.tracker.exit(c)
            else:
                t = self.tracker.clock()
                for c in calls:
                    self.tracker.exit(c, t)
        except Exception:  # noqa: BLE001
            self.tracker.stats.internal_errors += 1

    # ---- identification ----
    def group_state(self, group: Any) -> GroupState | None:
        c10d = self.c10d
        if group is None:
            group = c10d.GroupMember.WORLD  # the default group (None before init: torch will raise)
            if group is None:
                return None
        st = self._groups.get(id(group))
        if st is not None and st.pg() is group:
            return st
        if group is c10d.GroupMember.NON_GROUP_MEMBER:
            return None
        with self._lock:
            ranks = tuple(int(r) for r in c10d.get_process_group_ranks(group))
            name = str(getattr(group, "group_name", "") or c10d._get_process_group_name(group))
            st = GroupState(
                pg=weakref.ref(group),
                comm_hash=comm_hash(ranks, name),
                ranks=ranks,
                comm_rank=int(group.rank()),
                size=int(group.size()),
                to_group={r: i for i, r in enumerate(ranks)},
                name=name,
                issued=self.seq_base.get(name, 0),
            )
            self._groups[id(group)] = st
            if self.tracker.identity is None:
                self.tracker.identity = Identity(
                    job=self.job,
                    incarnation=self.incarnation,
                    rank=int(c10d.get_rank()),
                    world_size=int(c10d.get_world_size()),
                    host=socket.gethostname(),
                )
        return st

    def _deferred(self, group: Any, tensors: Any) -> bool:
        """True when the NCCL profiler plugin sees this call (NCCL runs it): this wrapper leaves it alone."""
        if not self.defer_nccl:
            return False
        try:
            backend = str(self.c10d.get_backend(group)).lower()
        except Exception:  # noqa: BLE001 - not a group torch knows: not NCCL's
            return False
        if "nccl" not in backend:
            return False
        if ":" in backend:  # "cpu:gloo,cuda:nccl": NCCL runs the call when its tensors are on a GPU
            first = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
            if not bool(getattr(getattr(first, "device", None), "type", "") == "cuda"):
                return False
        self.tracker.stats.deferred += 1
        return True

    def _begin_coll(
        self,
        op_type: OpType,
        ext: Callable[[tuple[Any, ...], dict[str, Any]], _Ext],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> tuple[list[OpCall], bool] | None:
        group, tensors, root_global, root_group, is_async = ext(args, kwargs)
        st = self.group_state(group)
        if st is None or self._deferred(group, tensors):
            return None
        if self.seq_source is not None and ext is _x_monitored_barrier:
            # Flight Recorder has no entry for it (gloo runs it as send/recv): the other source
            # cannot see it and it has no number in that source's sequence. Those send/recv advance
            # the group's collective counter (group rank 0: a recv from and a send to every other
            # rank; the others: one of each), which "auto" compares with this wrapper's count: count
            # them here, before they run (the call itself is counted once by the wrapper)
            inner = 2 * (st.size - 1) if st.comm_rank == 0 else 2
            self.issued += inner - 1
            st.issued += inner
            self.tracker.stats.unobserved += 1
            return None
        if self.seq_source is None:
            seq = st.seq
            st.seq = st.seq + 1
            st.issued += 1
        else:
            sourced = self.seq_source(st, st.name)  # may compare st.issued, before this call, with torch's
            st.issued += 1
            if sourced is None:  # the other source's (once "auto" has switched, every collective)
                return None
            seq = sourced
        dtype, count = _size_dtype(tensors)
        if root_group is not None:
            peer = int(root_group)
        elif root_global is not None:
            peer = st.to_group.get(int(root_global), -1)
        else:
            peer = -1
        call = self.tracker.enter(st.comm_hash, seq, op_type, dtype, count, peer, st.comm_rank, st.size)
        if self.marker is not None:
            self.marker.on_enter(call, tensors)
        return [call], is_async

    def _p2p_call(self, st: GroupState, op_type: OpType, other_group_rank: int, tensor: Any) -> OpCall:
        me = st.ranks[st.comm_rank]
        other = st.ranks[other_group_rank]
        src, dst = (me, other) if op_type is OpType.SEND else (other, me)
        chan = st.p2p.get((src, dst))
        if chan is None:
            chan = st.p2p[(src, dst)] = [p2p_hash(st.comm_hash, src, dst), 0]
        seq = chan[1]
        chan[1] = seq + 1
        dtype, count = _size_dtype(tensor)
        if op_type is OpType.SEND:
            comm_rank, peer = P2P_SENDER, P2P_RECEIVER
        else:
            comm_rank, peer = P2P_RECEIVER, P2P_SENDER
        return self.tracker.enter(chan[0], seq, op_type, dtype, count, peer, comm_rank, 2)

    def _begin_p2p(
        self, spec: tuple[OpType, str, str, bool], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[list[OpCall], bool] | None:
        op_type, peer_kw, group_peer_kw, is_async = spec
        group = _a(args, kwargs, 2, "group")
        st = self.group_state(group)
        tensor = _a(args, kwargs, 0, "tensor")
        if st is None or self._deferred(group, tensor):
            return None
        st.issued += 1
        group_peer = _a(args, kwargs, 4, group_peer_kw)
        if group_peer is None:
            peer_global = _a(args, kwargs, 1, peer_kw)
            if peer_global is None:  # recv from any source: the channel is unknown until it completes
                self.tracker.stats.unobserved += 1
                return None
            group_peer = st.to_group[int(peer_global)]
        return [self._p2p_call(st, op_type, int(group_peer), tensor)], is_async

    def _begin_batch(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[OpCall], bool] | None:
        ops = _a(args, kwargs, 0, "p2p_op_list") or []
        self.issued += max(0, len(ops) - 1)  # each op is one of gloo's; the wrapper counts the call once
        calls = []
        for op in ops:
            st = self.group_state(op.group)
            if st is None or self._deferred(op.group, op.tensor):
                continue
            st.issued += 1
            op_type = OpType.SEND if getattr(op.op, "__name__", "") in ("isend", "send") else OpType.RECV
            calls.append(self._p2p_call(st, op_type, int(op.group_peer), op.tensor))
        return calls, True
