"""Small hand-made Flight Recorder dumps (format 2.x fields, NCCL or gloo style) for the rule tests."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path
from typing import Any

T0 = 1_700_000_000_000_000_000


def op(
    group: str, seq: int, name: str = "all_reduce", *, state: str = "scheduled", backend: str = "nccl",
    p2p_seq: int = 0, dtype: str = "Float", numel: int = 1024, out_numel: int | None = None,
    retired: bool = False, completed_ns: int | None = None, desc: str = "undefined",
) -> dict[str, Any]:  # fmt: skip
    """One entry; ``record_id`` and ``pg_id`` are filled in by ``dump`` (entry order is record order)."""
    p2p = name.startswith(("send", "recv"))
    return {
        "process_group": [group, "default_pg" if group == "0" else desc], "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": p2p_seq if p2p else 0, "op_id": seq, "profiling_name": f"{backend}:{name}",
        "time_created_ns": 0, "input_sizes": [[numel]], "input_dtypes": [dtype],
        "output_sizes": [[numel if out_numel is None else out_numel]], "output_dtypes": [dtype], "state": state,
        "time_discovered_started_ns": None, "time_discovered_completed_ns": completed_ns, "retired": retired,
        "timeout_ms": 600000, "is_p2p": p2p, "frames": [],
    }  # fmt: skip


def dump(
    rank: int, groups: dict[str, list[int]], entries: list[dict[str, Any]],
    status: dict[str, tuple[int, int]] | None = None, *, version: str = "2.10", gloo: bool = False,
    unused: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    """A rank's dump. ``status``: group name -> (last enqueued, last completed) collective seq.

    pg_status is keyed by the rank-local pg id (the i-th group, by name order, this rank is
    in), pg_config by the group name, as torch writes them; gloo writes neither members nor names.
    ``unused``: groups the rank created but never used: they take a local id, yet torch writes
    them into neither pg_config nor pg_status.
    """
    mine = sorted((g for g, ranks in groups.items() if rank in ranks), key=int)
    local = {g: i for i, g in enumerate(mine)}
    groups = {g: r for g, r in groups.items() if g not in unused}
    out = []
    for i, e in enumerate(entries):
        e = dict(e, record_id=i, pg_id=local[e["process_group"][0]], time_created_ns=T0 + i * 1_000_000)
        out.append(e)
    pg_status = {
        str(local[g]): {"last_enqueued_collective": enq, "last_started_collective": -1, "last_completed_collective": c}
        for g, (enq, c) in (status or {}).items()
    }
    pg_config = {"": {"name": "", "desc": "", "ranks": "[]"}} if gloo else {
        g: {"name": g, "desc": "default_pg" if g == "0" else "sub", "ranks": json.dumps(r)} for g, r in groups.items()
    }  # fmt: skip
    return {"version": version, "comm_lib_version": "", "nccl_comm_state": {}, "pg_config": pg_config,
            "pg_status": pg_status, "entries": out}  # fmt: skip


def write(directory: Path, dumps: dict[int, dict[str, Any]], *, fmt: str = "json") -> Path:
    """One file per rank: "json", "pickle" or "json.gz"."""
    directory.mkdir(parents=True, exist_ok=True)
    for rank, d in dumps.items():
        if fmt == "pickle":
            (directory / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(d))
        elif fmt == "json.gz":
            (directory / f"rank{rank}.json.gz").write_bytes(gzip.compress(json.dumps(d).encode()))
        else:
            (directory / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(d))
    return directory


def done(group: str, upto: int, name: str = "all_reduce", **kw: Any) -> list[dict[str, Any]]:
    """Completed collectives 1..upto of ``group`` (a full dump's history)."""
    return [op(group, s, name, state="completed", retired=True, **kw) for s in range(1, upto + 1)]
