"""Factories for test data shared by every tier (like the flight recorder's create_one_event)."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import fastavro
import numpy as np

from ccld.records import AnomalyKind, DType, KernelBatch, KernelRecord, OpType, Status, Verdict, VerdictState
from ccld.schemas.codec import Schema


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


def written_by(old: Schema, b: KernelBatch) -> bytes:
    """``b`` as a writer with the older KernelBatch schema ``old`` sent it: only the columns ``old`` has."""
    fields = {f["name"] for f in old.raw["fields"]}
    rec: dict[str, Any] = dict.fromkeys(fields)
    rec.update(job=b.job, incarnation=b.incarnation, comm_hash=b.comm_hash, world_size=b.world_size, producer="p",
               batch_seq=1, n=b.n, channels=b.channels, hosts=list(b.hosts),
               send=b.send.astype("<i8").tobytes(), recv=b.recv.astype("<i8").tobytes())
    if "peak_lag" in fields:
        rec["peak_lag"] = b.peaks.astype("<i8").tobytes()
    if "lost_records" in fields:
        rec.update(lost_records=b.lost_records, lost_ranks=np.asarray(b.lost_ranks, dtype="<i8").tobytes())
    for name, col in b.columns.items():
        if name in fields:
            rec[name] = col.astype("<i8").tobytes()
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, old.parsed, rec)
    return old.header + buf.getvalue()


def make_verdict(**over: Any) -> Verdict:
    """A small valid verdict (an H1 naming rank 1); ``over`` replaces fields."""
    base: dict[str, Any] = dict(incident_id="a", state=VerdictState.OPEN, kind=AnomalyKind.H1, job="j",
                                communicator="0", op_seq=0, op_type="barrier", root_cause_ranks=(1,),
                                affected_ranks=(0,), confidence=1.0, evidence="", onset_time=0.0, detected_time=0.0)
    base.update(over)
    return Verdict(**base)


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str, module: str) -> ModuleType:
    """``benchmarks/<name>.py`` (a script, not a package) as module ``module``, registered in ``sys.modules``:
    pickling (a process pool) and dataclasses look their module up there."""
    spec = importlib.util.spec_from_file_location(module, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


class FakeBatchSink:
    """In-memory stand-in for the aggregator's Kafka sink (and for a rank's fallback)."""

    def __init__(self, ok: bool = True) -> None:
        self.batches: list[KernelBatch] = []
        self.ok = ok
        self.closed = False

    def submit_batch(self, batch: KernelBatch) -> bool:
        self.batches.append(batch)
        return self.ok

    def flush(self, timeout_s: float = 0.0) -> int:
        return 0

    def close(self, timeout_s: float = 0.0) -> None:
        self.closed = True
