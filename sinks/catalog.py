"""What an archive holds: every Parquet file of both layouts, with its topic, partition, incarnation and offsets.

The sink writes the Hive layout (``sinks.layout``: ``topic=T/job=J/date=D/part-p<P>-<incarnation>-o<offset>``).
Archives written before it have ``<topic>/<partition>/<incarnation>/<offset>.parquet`` (or, before incarnations
were kept, ``<topic>/<partition>/<offset>.parquet``); they are read as they are until ``ccld archive migrate``
moves them. A query for one job reads only that job's folders of the Hive layout, and the rows of that job of
the old one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ccld.sinks.layout import LEGACY, encode, parse


@dataclass(frozen=True)
class FileInfo:
    topic: str
    partition: int
    start_offset: int
    rows: int  # with a job asked for: that job's rows
    row_groups: int
    bytes: int
    path: Path
    incarnation: str = ""  # "": an archive written before incarnations were kept
    job: str | None = None  # None: the old layout (a file may hold several jobs)
    date: str | None = None  # the UTC day of the rows' Kafka timestamps; None: the old layout

    @property
    def hive(self) -> bool:
        """Whether the file is in the Hive layout (the sink writes no other)."""
        return self.job is not None


def _old_files(topic_dir: Path) -> Iterator[tuple[Path, int, str]]:
    """(path, partition, incarnation) of the old layout: ``<p>/<offset>`` and ``<p>/<incarnation>/<offset>``."""
    for path in sorted([*topic_dir.glob("*/*.parquet"), *topic_dir.glob("*/*/*.parquet")]):
        parts = path.relative_to(topic_dir).parts
        if parts[0].isdigit() and path.stem.isdigit():
            yield path, int(parts[0]), parts[1] if len(parts) == 3 else ""


def _job_rows(path: Path, job: str) -> int:
    t = pq.read_table(path, columns=["job"])
    return int(pc.sum(pc.equal(t["job"], job)).as_py() or 0)


def scan(root: Path, *, job: str | None = None, topic: str | None = None) -> list[FileInfo]:
    """Every Parquet file of an archive (of ``topic``; holding rows of ``job``), both layouts.

    In topic/partition order, each incarnation's files together; incarnations of a partition oldest first:
    those written before incarnations were kept, then by the time of each one's oldest file.
    """
    out: list[FileInfo] = []
    born: dict[tuple[str, int, str], float] = {}
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))) \
        if root.is_dir() else []
    for folder in folders:
        if folder.name.startswith("topic="):
            if topic is not None and folder.name != f"topic={encode(topic)}":
                continue
            jobs = f"job={encode(job)}" if job is not None else "job=*"
            for path in sorted(folder.glob(f"{jobs}/date=*/part-*.parquet")):
                name = parse(folder, path)
                if name is None:
                    continue
                md = pq.ParquetFile(path).metadata
                st = path.stat()
                f = FileInfo(name.topic, name.partition, name.start_offset, md.num_rows, md.num_row_groups,
                             st.st_size, path, name.incarnation, name.job, name.date)
                _add(out, born, f, 0.0 if f.incarnation == LEGACY else st.st_mtime)
            continue
        if topic is not None and folder.name != topic:
            continue
        for path, partition, incarnation in _old_files(folder):
            md = pq.ParquetFile(path).metadata
            rows = md.num_rows if job is None else _job_rows(path, job)
            if job is not None and not rows:
                continue
            st = path.stat()
            f = FileInfo(folder.name, partition, int(path.stem), rows, md.num_row_groups, st.st_size, path,
                         incarnation)
            _add(out, born, f, st.st_mtime if incarnation else 0.0)
    return sorted(out, key=lambda f: (f.topic, f.partition, born[(f.topic, f.partition, f.incarnation)],
                                      f.incarnation, f.start_offset, f.job or "", f.date or ""))


def _add(out: list[FileInfo], born: dict[tuple[str, int, str], float], f: FileInfo, t: float) -> None:
    k = (f.topic, f.partition, f.incarnation)
    born[k] = min(born.get(k, float("inf")), t)
    out.append(f)


def has_topic(root: Path, topic: str) -> bool:
    """Whether the archive has a folder for ``topic`` in either layout."""
    return (root / f"topic={encode(topic)}").is_dir() or (root / topic).is_dir()


def read_table(f: FileInfo, columns: Sequence[str] | None = None,
               filters: list[tuple[str, str, Any]] | None = None) -> pa.Table:
    """One file's rows (``columns``, rows passing ``filters``) with a ``job`` column in either layout.

    A Hive-layout file holds no ``job`` column (its folder says it): it is added, and a filter on it is
    decided by the folder."""
    if not f.hive:
        return pq.read_table(f.path, columns=None if columns is None else list(columns), filters=filters or None)
    rest = [x for x in filters or [] if x[0] != "job"]
    empty = any(op != "=" or value != f.job for name, op, value in filters or [] if name == "job")
    names = None if columns is None else [c for c in columns if c != "job"]
    t = pq.read_table(f.path, columns=names, filters=rest or None)
    if empty:
        t = t.slice(0, 0)
    if columns is None or "job" in columns:
        t = t.append_column("job", pa.array([f.job] * t.num_rows, pa.string()))
    return t if columns is None else t.select(list(columns))


def read_rows(files: list[FileInfo], job: str | None = None) -> list[dict[str, Any]]:
    """The rows of ``files`` (of ``job`` only, when given) as dicts, with their ``job`` (no other Hive key)."""
    rows: list[dict[str, Any]] = []
    for f in files:
        rows.extend(read_table(f, filters=None if job is None else [("job", "=", job)]).to_pylist())
    return rows


def read_verdicts(root: Path, topic: str, job: str | None = None) -> list[dict[str, Any]]:
    """Every verdict row of the archive (of ``job``), both layouts, in file order."""
    return read_rows(scan(root, topic=topic, job=job), job)
