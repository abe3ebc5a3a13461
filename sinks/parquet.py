"""Parquet tables of metric records and verdicts, their timestamp columns, and atomic file writes.

``metrics_table`` and ``verdicts_table`` turn decoded messages into flat tables (the archive's schema,
docs/operations.md "The archive"); ``with_timestamps`` adds the UTC timestamp columns next to the epoch ones;
``write_file`` writes through a temporary name, fsyncs and renames, so readers never see a half-written file.
Where files go is ``sinks.layout`` (the Hive layout the sink writes); ``file_path`` and ``write_atomic`` are the
layout before it, ``<root>/<topic>/<partition>[/<incarnation>]/<start_offset:019d>.parquet``, which the sink no
longer writes (``ccld archive migrate`` moves such an archive to the Hive layout; readers read both).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ccld.records import BATCH_COLUMNS, COMM_COLUMN, DType, KernelBatch, OpType, Status, Verdict, comm_hex

#: Rows per row group: large enough for fast scans, small enough to read one group in little memory.
ROW_GROUP_ROWS = 128 * 1024


def file_path(root: Path, topic: str, partition: int, start_offset: int, incarnation: str = "") -> Path:
    """Where the file starting at ``start_offset`` goes (``incarnation`` "": the layout before incarnations)."""
    folder = root / topic / str(partition)
    return (folder / incarnation if incarnation else folder) / f"{start_offset:019d}.parquet"


def _names(codes: np.ndarray, enum_type: type[Any]) -> pa.Array:
    """Enum codes -> their names (codes no enum member has are kept as digits)."""
    names = {int(m): m.name for m in enum_type}
    uniq, inverse = np.unique(codes, return_inverse=True)
    return pa.array(np.array([names.get(int(u), str(int(u))) for u in uniq], dtype=object)[inverse], pa.string())


def _comm_names(codes: np.ndarray) -> pa.Array:
    """Each row's communicator hash in hex (a batch of several communicators)."""
    uniq, inverse = np.unique(codes, return_inverse=True)
    return pa.array(np.array([comm_hex(int(u)) for u in uniq], dtype=object)[inverse], pa.string())


def metrics_table(batches: Sequence[tuple[int, int, KernelBatch]]) -> pa.Table:
    """(offset, timestamp_ms, batch) triples -> one flat table, one row per kernel record."""
    parts: list[pa.Table] = []
    for offset, ts_ms, b in batches:
        n, c = b.n, b.channels
        cols: dict[str, Any] = {
            "offset": pa.array(np.full(n, offset, dtype=np.int64)),
            "kafka_ts_ms": pa.array(np.full(n, ts_ms, dtype=np.int64)),
            "job": pa.array([b.job] * n, pa.string()),
            "incarnation": pa.array(np.full(n, b.incarnation, dtype=np.int32)),
            "communicator": (pa.array([comm_hex(b.comm_hash)] * n, pa.string()) if b.one_comm
                             else _comm_names(b.columns[COMM_COLUMN])),
            "world_size": pa.array(np.full(n, b.world_size, dtype=np.int32)),
        }
        for name in BATCH_COLUMNS:
            if name == "host_idx":
                cols["host"] = pa.array(np.array(b.hosts, dtype=object)[b.columns[name]], pa.string())
            elif name == "op_type":
                cols[name] = _names(b.columns[name], OpType)
            elif name == "dtype":
                cols[name] = _names(b.columns[name], DType)
            elif name == "status":
                cols[name] = _names(b.columns[name], Status)
            else:
                cols[name] = pa.array(b.columns[name])
        offsets = pa.array(np.arange(n + 1, dtype=np.int32) * c)  # c may be 0 (sources without counters)
        cols["send_counts"] = pa.ListArray.from_arrays(offsets, pa.array(b.send.reshape(-1)))
        cols["recv_counts"] = pa.ListArray.from_arrays(offsets, pa.array(b.recv.reshape(-1)))
        parts.append(pa.table(cols))
    return with_timestamps(pa.concat_tables(parts)) if parts else pa.table({})


def verdicts_table(verdicts: Sequence[tuple[int, int, Verdict]]) -> pa.Table:
    rows = []
    for offset, ts_ms, v in verdicts:
        d = v.to_dict()
        link = d.pop("link")
        d["link_src"] = None if link is None else link["src"]
        d["link_dst"] = None if link is None else link["dst"]
        d["details"] = json.dumps(d["details"], sort_keys=True)
        rows.append({"offset": offset, "kafka_ts_ms": ts_ms, **d})
    schema = pa.schema([
        ("offset", pa.int64()), ("kafka_ts_ms", pa.int64()), ("incident_id", pa.string()), ("state", pa.string()),
        ("kind", pa.string()), ("job", pa.string()), ("communicator", pa.string()), ("op_seq", pa.int64()),
        ("op_type", pa.string()), ("root_cause_ranks", pa.list_(pa.int32())),
        ("root_cause_hosts", pa.list_(pa.string())), ("affected_ranks", pa.list_(pa.int32())),
        ("channel", pa.int32()), ("p", pa.float64()), ("mismatch_field", pa.string()),
        ("confidence", pa.float64()), ("evidence", pa.string()), ("onset_time", pa.float64()),
        ("detected_time", pa.float64()), ("details", pa.string()), ("link_src", pa.int32()),
        ("link_dst", pa.int32()),
    ])
    return with_timestamps(pa.Table.from_pylist(rows, schema=schema))


#: epoch column -> (its timestamp column, its unit): each row's time as a UTC timestamp, for date queries
TIMESTAMPS: dict[str, tuple[str, str]] = {
    "kafka_ts_ms": ("kafka_ts", "ms"),  # when the message reached Kafka (the analyzer's clock); its day is ``date``
    "t_enter_ns": ("t_enter_ts", "ns"),  # metrics: the rank's own clock
    "t_exit_ns": ("t_exit_ts", "ns"),
    "t_sample_ns": ("t_sample_ts", "ns"),
    "onset_time": ("onset_ts", "s"),  # verdicts: the analyzer's clock
    "detected_time": ("detected_ts", "s"),
}
UTC_US = pa.timestamp("us", tz="UTC")


def _to_us(values: np.ndarray, unit: str) -> tuple[np.ndarray, np.ndarray]:
    """(microseconds since the epoch, which are unknown) for an epoch column."""
    if unit == "s":
        v = values.astype(np.float64)
        bad = ~np.isfinite(v) | (v <= 0)
        return np.where(bad, 0, np.round(v * 1e6)).astype(np.int64), bad
    v = values.astype(np.int64)
    bad = v <= 0  # -1: no exit yet, no entry (an idle heartbeat), no sample; 0: no Kafka timestamp
    return (v * 1000 if unit == "ms" else v // 1000), bad


def with_timestamps(table: pa.Table) -> pa.Table:
    """``table`` with a ``timestamp[us, tz=UTC]`` column for each epoch column it has (null where unknown).

    The epoch columns stay: they are exact (ns) and ``ccld report`` reads them. A table that already has a
    timestamp column keeps it (an archive written by this version, migrated again)."""
    for src, (name, unit) in TIMESTAMPS.items():
        if src not in table.column_names or name in table.column_names:
            continue
        col = table[src]
        values = col.to_numpy(zero_copy_only=False) if col.null_count == 0 else \
            pc.fill_null(col, 0).to_numpy(zero_copy_only=False)
        us, bad = _to_us(values, unit)
        table = table.append_column(name, pa.array(us, UTC_US, mask=bad))
    return table


def write_file(table: pa.Table, path: Path) -> Path:
    """Write ``table`` to ``path`` through a temporary file, durable before the rename (and the rename after)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    pq.write_table(table, tmp, row_group_size=ROW_GROUP_ROWS, compression="zstd")
    # Durable before the rename and before the caller commits offsets: a power loss must not
    # leave an empty file whose messages Kafka already counts as archived.
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def write_atomic(table: pa.Table, path: Path, end_offset: int) -> Path:
    """The layout before the Hive one: write ``path`` (``file_path``), remove older files it now covers.

    ``end_offset`` is the last offset in the file: files of the same folder (partition and
    incarnation) that start after ``path``'s start and at or before ``end_offset`` hold a subset
    and are removed. The sink writes ``sinks.layout.write_offsets`` instead; this stays for tests
    and tools that make an archive of the old layout (what ``ccld archive migrate`` reads).
    """
    write_file(table, path)
    start = int(path.stem)
    for other in path.parent.glob("*.parquet"):
        try:
            o = int(other.stem)
        except ValueError:
            continue
        if start < o <= end_offset:
            other.unlink(missing_ok=True)
    return path
