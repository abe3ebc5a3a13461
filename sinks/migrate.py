"""``ccld archive migrate``: move an archive of the old layout into the Hive layout, row for row.

Each old file (``<topic>/<partition>[/<incarnation>]/<offset>.parquet``) is read, given the timestamp columns,
and written as the sink would have written its messages (``sinks.layout.write_offsets``: one file per job and
day, named by the same partition, incarnation and first offset; files written before incarnations were kept
get the label ``legacy``). The old file is removed only after the new ones are durable and hold as many rows.
A file whose offsets the Hive layout already holds for the same incarnation (the sink replayed them after an
upgrade) is left where it is and counted, never merged: its rows would replace or duplicate the sink's.
Run it with the sink stopped; run again after a crash, it goes on where it stopped.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from ccld.errors import CcldError
from ccld.sinks.catalog import FileInfo, scan
from ccld.sinks.layout import LEGACY, entries, ledger_dir, marker_path, write_offsets
from ccld.sinks.parquet import with_timestamps

log = logging.getLogger(__name__)


@dataclass
class Migration:
    """What a migration did; ``rows_before == rows_after`` unless something else wrote meanwhile."""

    rows_before: int = 0  # every row of the archive, both layouts, before
    rows_after: int = 0
    files_moved: int = 0
    files_written: int = 0
    rows_moved: int = 0
    left: list[Path] = field(default_factory=list)  # old files whose offsets the Hive layout already holds


def _overlaps(root: Path, f: FileInfo, label: str, end: int, ours: set[int]) -> bool:
    """Whether the Hive layout holds offsets ``f.start_offset..end`` of the same incarnation, not written by us."""
    ledger = ledger_dir(root, f.topic, f.partition, label)
    return any(e.start <= end and e.end >= f.start_offset and e.start not in ours for e in entries(ledger))


def _move_marker(root: Path, f: FileInfo) -> None:
    """The sink's token for a broker without topic ids, from the old partition folder to the new place."""
    old = root / f.topic / str(f.partition) / ".incarnation"
    new = marker_path(root, f.topic, f.partition)
    if old.is_file() and not new.exists():
        new.parent.mkdir(parents=True, exist_ok=True)
        new.write_text(old.read_text())
    old.unlink(missing_ok=True)


def _remove_empty(folder: Path) -> None:
    """Remove the old layout's folders left empty (deepest first); a folder with anything in it stays."""
    for d in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def migrate(root: Path) -> Migration:
    """Move every old-layout file of ``root`` into the Hive layout (see the module docstring)."""
    if not root.is_dir():
        raise CcldError(f"{root} is not a directory")
    files = scan(root)
    m = Migration(rows_before=sum(f.rows for f in files))
    old = sorted((f for f in files if not f.hive), key=lambda f: (f.topic, f.partition, f.incarnation,
                                                                   f.start_offset))
    ours: dict[tuple[str, int, str], set[int]] = {}
    for f in old:
        label = f.incarnation or LEGACY
        table = pq.read_table(f.path)
        if table.num_rows == 0:
            f.path.unlink()
            m.files_moved += 1
            continue
        end = int(pc.max(table["offset"]).as_py())
        mine = ours.setdefault((f.topic, f.partition, label), set())
        if _overlaps(root, f, label, end, mine):
            log.warning("%s: offsets %d..%d of %s[%d] (%s) are in the Hive layout already; left in place",
                        f.path, f.start_offset, end, f.topic, f.partition, label)
            m.left.append(f.path)
            continue
        st = f.path.stat()
        paths = write_offsets(root, f.topic, f.partition, label, f.start_offset, end, with_timestamps(table))
        mine.add(f.start_offset)
        written = sum(pq.ParquetFile(p).metadata.num_rows for p in paths)
        if written != table.num_rows:
            raise CcldError(f"{f.path}: {table.num_rows} rows read, {written} written to the Hive layout; "
                            "the old file is kept")
        for p in paths:  # the age of the data, not of the migration (``scan`` orders incarnations by it)
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        f.path.unlink()
        _move_marker(root, f)
        m.files_moved += 1
        m.files_written += len(paths)
        m.rows_moved += written
    for topic in sorted({f.topic for f in old}):
        _remove_empty(root / topic)
    m.rows_after = sum(f.rows for f in scan(root))
    return m
