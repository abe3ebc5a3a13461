"""Parquet files of metric records and verdicts: deterministic names, atomic writes.

A file holds consecutive messages of one topic partition and is named by the offset of its
first message, ``<root>/<topic>/<partition>/<incarnation>/<start_offset:019d>.parquet``, so a
replay after a crash rewrites the same file instead of adding a second copy. ``<incarnation>``
names the topic's incarnation (``sink.incarnation``): a topic recreated with offsets from 0
again gets a folder of its own and never overwrites the old one's rows. Archives written before
incarnations were kept have their files straight in the partition folder; they are read as
they are and never written to. Files are written to a temporary name and renamed, and files
of the same folder the new one covers are removed, so readers never see a half-written file or
the same message twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
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
    return pa.concat_tables(parts) if parts else pa.table({})


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
    return pa.Table.from_pylist(rows, schema=schema)


def write_atomic(table: pa.Table, path: Path, end_offset: int) -> Path:
    """Write ``table`` to ``path`` through a temp file; remove older files it now covers.

    ``end_offset`` is the last offset in the file: files of the same folder (partition and
    incarnation) that start after ``path``'s start and at or before ``end_offset`` hold a subset
    and are removed. Another incarnation's files are in another folder: never touched.
    """
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
    start = int(path.stem)
    for other in path.parent.glob("*.parquet"):
        try:
            o = int(other.stem)
        except ValueError:
            continue
        if start < o <= end_offset:
            other.unlink(missing_ok=True)
    return path


@dataclass(frozen=True)
class FileInfo:
    topic: str
    partition: int
    start_offset: int
    rows: int
    row_groups: int
    bytes: int
    path: Path
    incarnation: str = ""  # "": an archive written before incarnations were kept


def _files(folder: Path) -> list[Path]:
    """Parquet files of ``folder``'s partitions, both layouts: ``<p>/<offset>`` and ``<p>/<incarnation>/<offset>``."""
    return sorted([*folder.glob("*/*.parquet"), *folder.glob("*/*/*.parquet")])


def scan(root: Path) -> list[FileInfo]:
    """Every Parquet file of an archive, in topic/partition order, each incarnation's files together.

    Incarnations of a partition come oldest first: the old layout's files, then by the time of
    each folder's oldest file.
    """
    out = []
    born: dict[tuple[str, int, str], float] = {}
    for topic_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        for path in _files(topic_dir):
            parts = path.relative_to(topic_dir).parts
            if not parts[0].isdigit() or not path.stem.isdigit():
                continue  # not an archive file
            md = pq.ParquetFile(path).metadata
            st = path.stat()
            f = FileInfo(topic_dir.name, int(parts[0]), int(path.stem), md.num_rows, md.num_row_groups,
                         st.st_size, path, parts[1] if len(parts) == 3 else "")
            k = (f.topic, f.partition, f.incarnation)
            born[k] = min(born.get(k, float("inf")), st.st_mtime if f.incarnation else 0.0)
            out.append(f)
    return sorted(out, key=lambda f: (f.topic, f.partition, born[(f.topic, f.partition, f.incarnation)],
                                      f.incarnation, f.start_offset))


def read_verdicts(root: Path, topic: str) -> list[dict[str, Any]]:
    files: Iterable[Path] = _files(root / topic)
    rows: list[dict[str, Any]] = []
    for f in files:
        rows.extend(pq.read_table(f).to_pylist())
    return rows
