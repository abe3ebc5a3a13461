"""Decentralised identity of communication rounds: communicator hashes and op/dtype codes.

Every rank computes the same communicator hash from facts all members agree on without
talking to each other: the group's global ranks and its creation-order name (torch names
process groups "0", "1", ... in the order ``new_group`` is called, which every rank must do
in the same order). Point-to-point traffic gets one directional channel communicator per
(group, sender, receiver): the k-th send from A to B pairs with B's k-th receive from A, which
is the only order torch guarantees. The same functions serve the live attachment and the
Flight Recorder importer, so live and post-mortem hashes agree when the ranks are known.
This module imports nothing from torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from ccld.records import DType, OpType, to_signed64

#: Comm rank of the sender / receiver inside a p2p channel communicator (size 2).
P2P_SENDER = 0
P2P_RECEIVER = 1


def _hash64(text: str) -> int:
    digest = hashlib.blake2b(text.encode(), digest_size=8, person=b"ccld-comm").digest()
    return to_signed64(int.from_bytes(digest, "little"))


def comm_hash(global_ranks: Iterable[int], group_name: str) -> int:
    """Signed 64-bit hash of a process group: its global ranks (in group order) and its name."""
    return _hash64(f"group|{group_name}|{','.join(str(int(r)) for r in global_ranks)}")


def p2p_hash(group_hash: int, src: int, dst: int) -> int:
    """Hash of the directional p2p channel src -> dst (global ranks) inside a group."""
    return _hash64(f"p2p|{group_hash & 0xFFFF_FFFF_FFFF_FFFF:016x}|{int(src)}>{int(dst)}")


#: torch.distributed function name -> op type. Gather/scatter have no op type of their own.
FUNCTION_OPS: dict[str, OpType] = {
    "all_reduce": OpType.ALL_REDUCE,
    "all_reduce_coalesced": OpType.ALL_REDUCE,
    "all_gather": OpType.ALL_GATHER,
    "all_gather_into_tensor": OpType.ALL_GATHER,
    "all_gather_single": OpType.ALL_GATHER,
    "_all_gather_base": OpType.ALL_GATHER,
    "all_gather_coalesced": OpType.ALL_GATHER,
    "reduce_scatter": OpType.REDUCE_SCATTER,
    "reduce_scatter_tensor": OpType.REDUCE_SCATTER,
    "reduce_scatter_single": OpType.REDUCE_SCATTER,
    "_reduce_scatter_base": OpType.REDUCE_SCATTER,
    "broadcast": OpType.BROADCAST,
    "reduce": OpType.REDUCE,
    "all_to_all": OpType.ALL_TO_ALL,
    "all_to_all_single": OpType.ALL_TO_ALL,
    "barrier": OpType.BARRIER,
    "monitored_barrier": OpType.BARRIER,
    "send": OpType.SEND,
    "isend": OpType.SEND,
    "recv": OpType.RECV,
    "irecv": OpType.RECV,
}

#: Flight Recorder ``profiling_name`` suffix (after "nccl:" / "gloo:") -> op type.
FR_OPS: dict[str, OpType] = {
    **{k.lstrip("_"): v for k, v in FUNCTION_OPS.items()},
    "allreduce": OpType.ALL_REDUCE,
    "allreduce_coalesced": OpType.ALL_REDUCE,
    "allgather": OpType.ALL_GATHER,
    "_allgather_base": OpType.ALL_GATHER,
    "allgather_base": OpType.ALL_GATHER,
    "allgather_into_tensor_coalesced": OpType.ALL_GATHER,
    "allgather_coalesced": OpType.ALL_GATHER,
    "reduce_scatter_base": OpType.REDUCE_SCATTER,
    "reduce_scatter_tensor_coalesced": OpType.REDUCE_SCATTER,
    "_reduce_scatter_base": OpType.REDUCE_SCATTER,
    "alltoall": OpType.ALL_TO_ALL,
    "alltoall_base": OpType.ALL_TO_ALL,
    "recv_anysource": OpType.RECV,
}

#: Names torch uses for dtypes: ``str(torch.float32)`` minus "torch." and the Flight
#: Recorder's ScalarType names ("Float", "Half", ...).
_DTYPES: dict[str, DType] = {
    "float32": DType.FLOAT32, "float": DType.FLOAT32, "Float": DType.FLOAT32,
    "float16": DType.FLOAT16, "half": DType.FLOAT16, "Half": DType.FLOAT16,
    "bfloat16": DType.BFLOAT16, "BFloat16": DType.BFLOAT16,
    "float64": DType.FLOAT64, "double": DType.FLOAT64, "Double": DType.FLOAT64,
    "int32": DType.INT32, "int": DType.INT32, "Int": DType.INT32,
    "int64": DType.INT64, "long": DType.INT64, "Long": DType.INT64,
    "int8": DType.INT8, "Char": DType.INT8,
    "uint8": DType.UINT8, "Byte": DType.UINT8,
    "bool": DType.BOOL, "Bool": DType.BOOL,
}  # fmt: skip


def dtype_code(name: str) -> DType:
    """DType of a torch dtype name ("torch.float32", "float32") or an FR name ("Float")."""
    short = name.removeprefix("torch.")
    found = _DTYPES.get(short)
    if found is not None:
        return found
    if short.lower().startswith("float8"):
        return DType.FLOAT8
    return DType.OTHER


def fr_op_type(profiling_name: str) -> OpType | None:
    """Op type of a Flight Recorder ``profiling_name`` such as "nccl:all_reduce"; None if unknown."""
    _, _, op = profiling_name.rpartition(":")
    op = op.lower().lstrip("_")  # "_all_gather_base": the table's keys carry no leading underscore
    return FR_OPS.get(op)
