"""Factories for test data shared by every tier (like the flight recorder's create_one_event)."""

from __future__ import annotations

from typing import Any

from ccld.records import DType, KernelRecord, OpType, Status


def make_kernel_record(**over: Any) -> KernelRecord:
    """A valid DONE all-reduce record of rank 1 of 4; any field can be overridden."""
    fields: dict[str, Any] = dict(
        job="job-a", incarnation=0, comm_hash=0x1234_5678_9ABC_DEF0, op_seq=7, op_type=OpType.ALL_REDUCE,
        dtype=DType.BFLOAT16, count=1 << 20, peer=-1, rank=1, comm_rank=1, comm_size=4, world_size=4,
        host="node-0000", status=Status.DONE, t_enter_ns=1_000_000, t_exit_ns=3_500_000, t_sample_ns=3_500_000,
        send_counts=(4, 4), recv_counts=(4, 3),
    )
    fields.update(over)
    return KernelRecord(**fields)
