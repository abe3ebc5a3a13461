"""The archive's Hive layout: one folder per topic, job and UTC day, each file named by partition, incarnation, offset.

A file is ``<root>/topic=<topic>/job=<job>/date=<YYYY-MM-DD>/part-p<partition>-<incarnation>-o<first offset>.parquet``
(``<job>`` and ``<topic>`` percent-encoded where they hold characters a path cannot). ``date`` is the UTC day of
the Kafka timestamp of the message a row came in (``kafka_ts``), so all rows of one message share a folder, and
a query for one job or one day reads only its folders (DuckDB, pyarrow, pandas and Spark read ``key=value``
folders as columns; the files themselves hold no ``job`` column, ``sinks.catalog.read_table`` adds it back).
``<incarnation>`` is the topic incarnation's label (``sinks.incarnation``): a recreated topic numbers its
offsets from 0 again, and its files get other names, never the old ones'.

The messages one flush of a partition writes (offsets ``start`` to ``end``) may hold several jobs and days: they
become one file per folder, all named by ``start``. A replay after a crash rewrites the same names. Which files
a flush wrote is kept in a small ledger, ``topic=<topic>/_offsets/p<partition>/<incarnation>/<start>`` (the last
offset, then the files, one a line; Hive readers skip folders starting with ``_``): a later flush whose offsets
cover another's start replaces that flush's files in every folder, as the single-folder layout did by name.
The ledger keeps a partition's newest ``LEDGER_KEEP`` flushes, all a replay can write again.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ccld.errors import CcldError
from ccld.sinks.parquet import write_file

#: the sink's file names; the label in the middle may itself hold dashes (``id-<hex>``)
FILE_RE = re.compile(r"^part-p(\d+)-(.+)-o(\d{19})\.parquet$")
#: the ledger's folder under a topic's folder (a ``_`` prefix: Hive readers skip it)
LEDGER = "_offsets"
#: the incarnation label ``ccld archive migrate`` gives files written before incarnations were kept
LEGACY = "legacy"
#: flushes a partition's ledger remembers, newest first. A replay after a crash starts at the committed
#: offset, past every flush but the last few (the sink commits after each write), so only those can be
#: written again; older entries were listed and sorted at every flush for nothing (207 ms at 100,000 of
#: them, about 12 days of 10-s flushes). Their files stay: the ledger only says which files a flush wrote.
LEDGER_KEEP = 64

_MS_PER_DAY = 86_400_000
_EPOCH = dt.date(1970, 1, 1)


def encode(value: str) -> str:
    """A value as a path segment: percent-encoded (``/``, ``=``, spaces ...), as Hive readers decode it."""
    return quote(value, safe="")


def topic_dir(root: Path, topic: str) -> Path:
    return root / f"topic={encode(topic)}"


def file_name(partition: int, incarnation: str, start_offset: int) -> str:
    return f"part-p{partition}-{incarnation}-o{start_offset:019d}.parquet"


def file_rel(job: str, date: str, partition: int, incarnation: str, start_offset: int) -> Path:
    """A file's path below its topic's folder."""
    return Path(f"job={encode(job)}", f"date={date}", file_name(partition, incarnation, start_offset))


def ledger_dir(root: Path, topic: str, partition: int, incarnation: str) -> Path:
    return topic_dir(root, topic) / LEDGER / f"p{partition}" / incarnation


def marker_path(root: Path, topic: str, partition: int) -> Path:
    """Where the sink keeps the token of a partition's incarnation on a broker without topic ids."""
    return topic_dir(root, topic) / LEDGER / f"p{partition}" / "incarnation"


@dataclass(frozen=True)
class Name:
    """What a file's path in the Hive layout says about it."""

    topic: str
    job: str
    date: str
    partition: int
    incarnation: str
    start_offset: int


def parse(topic_folder: Path, path: Path) -> Name | None:
    """The parts of a Hive-layout file's path (``topic_folder``: its ``topic=...`` folder); None: not a sink file."""
    m = FILE_RE.match(path.name)
    rel = path.relative_to(topic_folder).parts
    if m is None or len(rel) != 3 or not rel[0].startswith("job=") or not rel[1].startswith("date="):
        return None
    return Name(unquote(topic_folder.name.removeprefix("topic=")), unquote(rel[0].removeprefix("job=")),
                rel[1].removeprefix("date="), int(m.group(1)), m.group(2), int(m.group(3)))


def day(ts_ms: int) -> str:
    """The UTC day of a Kafka timestamp in milliseconds, ``YYYY-MM-DD``."""
    return (_EPOCH + dt.timedelta(days=ts_ms // _MS_PER_DAY)).isoformat()


def split(table: pa.Table) -> list[tuple[str, str, pa.Table]]:
    """(job, day, rows) per folder the rows go to, each part's rows in the table's order."""
    if table.num_rows == 0:
        return []
    jobs = pc.dictionary_encode(table["job"].combine_chunks())
    job_idx = jobs.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    days = table["kafka_ts_ms"].to_numpy() // _MS_PER_DAY
    keys = np.stack([job_idx, days], axis=1)
    out = []
    for jd in np.unique(keys, axis=0):
        rows = np.flatnonzero((job_idx == jd[0]) & (days == jd[1]))
        out.append((str(jobs.dictionary[int(jd[0])]), day(int(jd[1]) * _MS_PER_DAY), table.take(pa.array(rows))))
    return out


@dataclass(frozen=True)
class Entry:
    """One flush in the ledger: its first and last offset, and the files it wrote (below the topic's folder)."""

    start: int
    end: int
    files: tuple[Path, ...]


def entries(ledger: Path, lo: int = 0, hi: int = 2**63 - 1) -> Iterator[Entry]:
    """The ledger's flushes whose first offset is in ``lo..hi``, in offset order."""
    if not ledger.is_dir():
        return
    starts = sorted(int(p.name) for p in ledger.iterdir() if p.name.isdigit())
    for s in starts:
        if lo <= s <= hi:
            try:
                lines = (ledger / f"{s:019d}").read_text().split("\n")
            except FileNotFoundError:  # removed by a flush that covered it meanwhile
                continue
            yield Entry(s, int(lines[0]), tuple(Path(x) for x in lines[1:] if x))


def _write_entry(ledger: Path, start: int, end: int, files: list[Path], *, durable: bool) -> None:
    ledger.mkdir(parents=True, exist_ok=True)
    path = ledger / f"{start:019d}"
    tmp = ledger / f".{path.name}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write("\n".join([str(end), *(p.as_posix() for p in sorted(set(files)))]) + "\n")
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        dir_fd = os.open(ledger, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def write_offsets(root: Path, topic: str, partition: int, incarnation: str, start: int, end: int,
                  table: pa.Table) -> list[Path]:
    """Write the rows of one partition's messages ``start..end`` (one incarnation): one file per job and day.

    Files of earlier flushes of the same partition and incarnation whose first offset is in ``start..end``
    hold a subset of these messages (a replay after a crash, perhaps cut at other offsets): they are
    removed, whatever folder they are in. Another incarnation's files have other names and another
    ledger: never touched. The ledger entry names the old files too until they are gone, so a crash at
    any point leaves every file findable by the next replay.
    """
    if not incarnation or "/" in incarnation:
        raise CcldError(f"not an incarnation label: {incarnation!r}")
    tdir = topic_dir(root, topic)
    ledger = ledger_dir(root, topic, partition, incarnation)
    old = list(entries(ledger, start, end))
    old_files = {p for e in old for p in e.files}
    parts = split(table)
    new_files = [file_rel(job, date, partition, incarnation, start) for job, date, _ in parts]
    _write_entry(ledger, start, end, [*new_files, *old_files], durable=True)
    # The job is the folder's: a Hive key is not a file column too (Spark and pandas refuse one that is both).
    out = [write_file(rows.drop_columns(["job"]), tdir / rel)
           for rel, (_, _, rows) in zip(new_files, parts, strict=True)]
    stale = old_files - set(new_files)
    for rel in stale:
        (tdir / rel).unlink(missing_ok=True)
    for e in old:
        if e.start != start:
            (ledger / f"{e.start:019d}").unlink(missing_ok=True)
    if stale:
        _write_entry(ledger, start, end, new_files, durable=False)
    _prune(ledger, start)
    return out


def _prune(ledger: Path, newest: int) -> None:
    """Forget all but the ``LEDGER_KEEP`` newest flushes at or below ``newest`` (their files stay)."""
    starts = sorted(int(p.name) for p in ledger.iterdir() if p.name.isdigit() and int(p.name) <= newest)
    for s in starts[:-LEDGER_KEEP]:
        (ledger / f"{s:019d}").unlink(missing_ok=True)


def files_holding(root: Path, topic: str, partition: int, incarnation: str, offset: int) -> list[Path]:
    """The files of the flush whose offsets include ``offset`` (none: the archive holds nothing there)."""
    tdir = topic_dir(root, topic)
    holding = [e for e in entries(ledger_dir(root, topic, partition, incarnation), 0, offset) if e.end >= offset]
    return [tdir / p for p in holding[-1].files if (tdir / p).is_file()] if holding else []
