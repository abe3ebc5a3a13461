"""Hand-built Flight Recorder dumps (NCCL-style fields), written the way torch writes them."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

MS = 1_000_000
T0 = 1_700_000_000_000_000_000  # ns, wall clock like the real recorder


def entry(
    seq: int, *, name: str = "nccl:all_reduce", state: str = "completed", dtype: str = "Float",
    numel: int = 1024, step_ms: float = 50.0, op_ms: float = 2.0, pg: str = "0", p2p_seq: int = 0,
    is_p2p: bool = False, t_ms: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    created = T0 + int(((seq * step_ms) if t_ms is None else t_ms) * MS)
    started = created + MS if state in ("started", "completed") else None
    completed = started + int(op_ms * MS) if state == "completed" and started else None
    return {
        "record_id": seq, "pg_id": int(pg), "process_group": [pg, "default_pg" if pg == "0" else "undefined"],
        "collective_seq_id": 0 if is_p2p else seq, "p2p_seq_id": p2p_seq if is_p2p else 0, "op_id": seq,
        "profiling_name": name, "time_created_ns": created, "input_sizes": [[numel]], "input_dtypes": [dtype],
        "output_sizes": [[numel]], "output_dtypes": [dtype], "state": state,
        "time_discovered_started_ns": started, "time_discovered_completed_ns": completed,
        "retired": state == "completed", "timeout_ms": 600000, "is_p2p": is_p2p,
        "frames": [{"name": "train_step", "filename": "train.py", "line": 42}],
    }  # fmt: skip


def dump(
    entries: list[dict[str, Any]], *, ranks: tuple[int, ...] = (0, 1, 2, 3), version: str = "2.10"
) -> dict[str, Any]:
    done = [e["collective_seq_id"] for e in entries if e["state"] == "completed" and not e["is_p2p"]]
    return {
        "version": version,
        "comm_lib_version": "2.21.5",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(ranks))}},
        "pg_status": {"0": {"last_enqueued_collective": max([e["collective_seq_id"] for e in entries], default=-1),
                            "last_started_collective": -1, "last_completed_collective": max(done, default=-1)}},
        "nccl_comm_state": {},
        "entries": entries,
    }  # fmt: skip


def write(directory: Path, dumps: dict[int, dict[str, Any]], *, fmt: str = "pickle") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for rank, d in dumps.items():
        if fmt == "json":
            (directory / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(d))
        else:
            (directory / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(d))
    return directory


def healthy(upto: int, **kw: Any) -> list[dict[str, Any]]:
    return [entry(s, **kw) for s in range(1, upto + 1)]
