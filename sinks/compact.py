"""Keeping the archive on a schedule: ``compact`` merges a folder's small files, ``prune`` drops whole old days.

The sink writes a file per flush, job and day (``sinks.layout``): in real time about 8,640 metric files per
job-day, and a verdict file per verdict, while DuckDB pays about half a millisecond per file it opens.

``compact`` merges, in each ``topic=/job=/date=`` folder, the files of one partition and incarnation into one,
its rows sorted by Kafka timestamp and offset (row groups in time order), named by the smallest first offset
among them, and only files no ledger entry names: a replay after a crash rewrites exactly the files of the
flushes its partition's ledger still holds (``layout.write_offsets``), so those stay as they are, and a merged
file is never written again. A folder's files are listed before its ledger is read: the sink writes a flush's
ledger entry before its files, so a file seen is already in the ledger when it is the sink's newest.

Atomic and crash-safe: the merged table is written under a temporary name, read back and compared with what was
merged (rows and content), and a journal (``topic=T/_compact/<id>.json``: the sources, the target, the row count
and the file's SHA-256) made durable before the target is renamed into place and the sources removed. A crash
before the rename leaves the sources (the temporary file and the journal are cleared by the next run); after it,
the next ``compact`` sees the journal, checks the target against it and removes what is left of the sources.
Between the rename and the removal (and after a crash there, until the next run) a reader sees the sources'
rows twice; nothing is ever lost.

The sink runs it on a timer (``Archiver``) with what it knows better than the ledger: the offsets it has
committed. A replay starts at a partition's committed offset, so a flush that ended below it is never written
again, ledger or not (``committed``); and files of ``max_source_bytes`` or more are left as they are, so a day's
merged file is not read and written again at every run once it is large (a day becomes a few large files).
One compaction of an archive at a time: a lock file (``.compact.lock``) makes a second one say so and stop.

``prune`` removes the ``date=`` folders of days before a cutoff, every topic and job.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import hashlib
import json
import os
import shutil
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from ccld.errors import CcldError
from ccld.sinks.layout import LEDGER, Name, entries, file_name, parse
from ccld.sinks.parquet import write_file

#: the journal's folder under a topic's folder (``_``: Hive readers skip it)
JOURNAL = "_compact"
#: a folder with fewer files than this of one partition and incarnation is left as it is
MIN_FILES = 2
#: the lock file one compaction of an archive holds (a second one stops with ``CompactBusy``)
LOCK = ".compact.lock"
#: the columns merged rows are sorted by (those a file has): time first, then the message and its rows' order
SORT_KEYS = ("kafka_ts_ms", "offset")


@dataclass
class CompactResult:
    folders: int = 0  # folders merged in
    files_before: int = 0  # files merged
    files_after: int = 0  # files they became
    rows: int = 0  # rows merged (the same after)
    recovered: int = 0  # journals of an interrupted run completed
    skipped_in_ledger: int = 0  # files left because a replay may rewrite them
    errors: list[str] = field(default_factory=list)


class CompactBusy(CcldError):
    """Another compaction of the same archive holds its lock."""


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    with open(root / LOCK, "a") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise CompactBusy(f"another compaction of {root} is running") from None
            raise
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def compact(root: Path, *, progress: Callable[[str], None] | None = None, min_files: int = MIN_FILES,
            committed: Mapping[tuple[str, int, str], int] | None = None,
            max_source_bytes: int | None = None) -> CompactResult:
    """Merge every folder's small files (see the module's doc); returns what was done.

    ``committed``: (topic, partition, incarnation) -> the offset the sink has committed there; the files of
    flushes that ended below it are merged even while the ledger still names them. ``max_source_bytes``: files
    this large or larger are left as they are. Raises ``CompactBusy`` while another compaction runs."""
    if not root.is_dir():
        raise CcldError(f"{root} is not a directory")
    with _locked(root):
        return _compact(root, progress, min_files, committed or {}, max_source_bytes)


def _compact(root: Path, progress: Callable[[str], None] | None, min_files: int,
             committed: Mapping[tuple[str, int, str], int], max_source_bytes: int | None) -> CompactResult:
    res = CompactResult()
    for tdir in sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("topic=")):
        res.recovered += _recover(tdir)
        groups: dict[tuple[Path, int, str], list[tuple[Name, Path]]] = defaultdict(list)
        # the files first, the ledgers after (module doc)
        for path in sorted(tdir.glob("job=*/date=*/*.parquet")):
            n = parse(tdir, path)
            if n is not None and (max_source_bytes is None or _size(path) < max_source_bytes):
                groups[(path.parent, n.partition, n.incarnation)].append((n, path))
        topic = unquote(tdir.name.removeprefix("topic="))
        named = _in_ledgers(tdir, {(p, i): o for (t, p, i), o in committed.items() if t == topic})
        todo = []
        for (folder, part, inc), files in sorted(groups.items()):
            free = [(n, p) for n, p in files if (part, inc, p.relative_to(tdir).as_posix()) not in named]
            res.skipped_in_ledger += len(files) - len(free)
            if len(free) >= min_files:
                todo.append((folder, free))
        for i, (folder, free) in enumerate(todo):
            try:
                rows = _merge(tdir, folder, free)
            except (OSError, pa.ArrowException, CcldError) as exc:
                res.errors.append(f"{folder}: {exc}")
                continue
            res.folders += 1
            res.files_before += len(free)
            res.files_after += 1
            res.rows += rows
            if progress is not None and (i + 1) % 100 == 0:
                progress(f"{tdir.name}: {i + 1} of {len(todo)} folders merged")
    return res


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # replaced by the sink meanwhile: not merged this time
        return 2**62


def _in_ledgers(tdir: Path, committed: Mapping[tuple[int, str], int]) -> set[tuple[int, str, str]]:
    """(partition, incarnation, file below the topic's folder) of every file a ledger entry names, but those of
    flushes that ended below the offset committed for their partition and incarnation (never replayed)."""
    out: set[tuple[int, str, str]] = set()
    ledger_root = tdir / LEDGER
    if not ledger_root.is_dir():
        return out
    for pdir in ledger_root.iterdir():
        if not (pdir.is_dir() and pdir.name.startswith("p") and pdir.name[1:].isdigit()):
            continue
        for idir in pdir.iterdir():
            if idir.is_dir():
                part = int(pdir.name[1:])
                below = committed.get((part, idir.name), -1)
                for e in entries(idir):
                    if e.end >= below:
                        out.update((part, idir.name, f.as_posix()) for f in e.files)
    return out


def _sorted_concat(tables: Iterable[pa.Table]) -> pa.Table:
    t = pa.concat_tables(list(tables), promote_options="default")
    keys = [(k, "ascending") for k in SORT_KEYS if k in t.column_names]
    return t.sort_by(keys) if keys else t


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _merge(tdir: Path, folder: Path, files: list[tuple[Name, Path]]) -> int:
    """Merge ``files`` (one folder, partition and incarnation) into one; the rows merged."""
    first = min(n.start_offset for n, _ in files)
    n0 = files[0][0]
    target = folder / file_name(n0.partition, n0.incarnation, first)
    merged = _sorted_concat(pq.read_table(p) for _, p in files)
    rows = sum(pq.ParquetFile(p).metadata.num_rows for _, p in files)
    if merged.num_rows != rows:
        raise CcldError(f"read {merged.num_rows} rows of {rows}")
    tmp = folder / f".compact-{os.getpid()}-{first}.parquet.tmp"
    write_file(merged, tmp)  # written, fsynced and renamed to tmp: durable under its temporary name
    back = pq.read_table(tmp)
    if back.num_rows != rows or not back.equals(merged.cast(back.schema)):
        tmp.unlink(missing_ok=True)
        raise CcldError("the merged file does not read back as what was merged")
    journal = tdir / JOURNAL / f"{hashlib.sha1(str(target).encode()).hexdigest()[:16]}.json"
    _write_json(journal, {"target": target.relative_to(tdir).as_posix(), "tmp": tmp.relative_to(tdir).as_posix(),
                          "sources": [p.relative_to(tdir).as_posix() for _, p in files],
                          "rows": rows, "sha256": _sha256(tmp)})  # fmt: skip
    _finish(tdir, journal)
    return rows


def _write_json(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _finish(tdir: Path, journal: Path) -> None:
    """Put a journal's target in place and remove its sources (again, after a crash: every step may be done)."""
    j = json.loads(journal.read_text())
    target, tmp = tdir / j["target"], tdir / j["tmp"]
    if tmp.exists():
        if _sha256(tmp) != j["sha256"]:
            raise CcldError(f"{tmp} is not the file its journal {journal.name} describes")
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    elif not target.exists() or _sha256(target) != j["sha256"]:
        # neither the merged file nor its temporary one: the rename never happened and the sources are whole
        journal.unlink()
        return
    for src in j["sources"]:
        if src != j["target"]:
            (tdir / src).unlink(missing_ok=True)
    _fsync_dir(target.parent)
    journal.unlink()


def _recover(tdir: Path) -> int:
    """Complete (or undo) the journals an interrupted run left; clear its stray temporary files."""
    jdir = tdir / JOURNAL
    done = 0
    if jdir.is_dir():
        for journal in sorted(jdir.glob("*.json")):
            _finish(tdir, journal)
            done += 1
    # every journal is finished now: a temporary file left was written before its journal, its sources are whole
    for tmp in tdir.glob("job=*/date=*/.compact-*.parquet.tmp"):
        tmp.unlink(missing_ok=True)
    return done


@dataclass(frozen=True)
class PruneResult:
    folders: int
    files: int
    bytes: int
    days: tuple[str, ...]


def prune(root: Path, older_than_days: float, *, today: dt.date | None = None, dry_run: bool = False) -> PruneResult:
    """Remove the ``date=`` folders of UTC days more than ``older_than_days`` before ``today``, every topic and
    job (``dry_run``: only say what would go)."""
    if older_than_days < 0:
        raise CcldError(f"--older-than must be 0 or more days, not {older_than_days:g}")
    if not root.is_dir():
        raise CcldError(f"{root} is not a directory")
    today = today or dt.datetime.now(dt.UTC).date()
    cutoff = (today - dt.timedelta(days=older_than_days)).isoformat()
    folders = files = size = 0
    days: set[str] = set()
    for ddir in sorted(root.glob("topic=*/job=*/date=*")):
        d = ddir.name.removeprefix("date=")
        if not ddir.is_dir() or d >= cutoff:
            continue
        try:
            dt.date.fromisoformat(d)
        except ValueError:
            continue  # not a folder the sink wrote
        fs = [p for p in ddir.rglob("*") if p.is_file()]
        folders += 1
        files += len(fs)
        size += sum(p.stat().st_size for p in fs)
        days.add(d)
        if not dry_run:
            shutil.rmtree(ddir)
            job_dir = ddir.parent
            if not any(job_dir.iterdir()):
                job_dir.rmdir()
    return PruneResult(folders, files, size, tuple(sorted(days)))
