"""`ccld archive summary DIR [--job J]`: what an archive holds; `migrate DIR`: to the Hive layout; `compact DIR`:
a folder's small files merged into one; `prune DIR --older-than DAYS`: whole old days removed (``sinks.compact``)."""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

from ccld.errors import CcldError
from ccld.settings import Settings
from ccld.sinks.catalog import FileInfo, has_topic, read_verdicts, scan
from ccld.sinks.layout import LEGACY


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    s = sub.add_parser("summary", help="files, rows and offsets per topic partition; verdicts by kind")
    s.add_argument("dir", type=Path)
    s.epilog = "--job J: only that job's files and rows"
    m = sub.add_parser("migrate", help="move files of the old layout (<topic>/<partition>/...) into the Hive layout")
    m.add_argument("dir", type=Path)
    c = sub.add_parser("compact", help="merge each folder's small files (per partition) into one, rows in time order")
    c.add_argument("dir", type=Path)
    p = sub.add_parser("prune", help="remove the days older than --older-than (UTC), every topic and job")
    p.add_argument("dir", type=Path)
    p.add_argument("--older-than", type=float, default=None, metavar="DAYS",
                   help="days to keep before today (default: the archive_retention_days setting)")
    p.add_argument("--dry-run", action="store_true", help="only say what would be removed")


def summarize(root: Path, verdicts_topic: str, job: str | None = None) -> str:
    if not root.is_dir():
        raise CcldError(f"{root} is not a directory")
    files = scan(root, job=job)
    of = "" if job is None else f" (job {job})"
    if not files:
        return f"{root}: no Parquet files{of}"
    lines = [f"archive {root.resolve()}{of}: {len(files)} files, {sum(f.rows for f in files):,} rows, "
             f"{sum(f.bytes for f in files) / 1e6:.1f} MB"]
    days = sorted({f.date for f in files if f.date is not None})
    if days:
        lines.append(f"  {len({f.job for f in files if f.hive})} jobs, {len(days)} days "
                     f"({days[0]}{'' if len(days) == 1 else ' to ' + days[-1]}, UTC)")
    old = [f for f in files if not f.hive]
    if old:
        lines.append(f"  {len(old)} files in the old layout (`ccld archive migrate {root}` moves them)")
    by_tp: dict[tuple[str, int], list[FileInfo]] = defaultdict(list)
    for f in files:
        by_tp[(f.topic, f.partition)].append(f)
    for (topic, part), fs in sorted(by_tp.items()):
        # scan() keeps each incarnation's files together, oldest incarnation first
        by_inc: dict[str, list[FileInfo]] = defaultdict(list)
        for f in fs:
            by_inc[f.incarnation].append(f)
        if len(by_inc) == 1:
            lines.append(f"  {topic}[{part}]: {len(fs)} files, {sum(f.rows for f in fs):,} rows, "
                         f"offsets from {fs[0].start_offset}")
            continue
        # A topic recreated (or a memory broker restarted) numbers offsets from 0 again: one line per incarnation.
        lines.append(f"  {topic}[{part}]: {len(fs)} files, {sum(f.rows for f in fs):,} rows, "
                     f"{len(by_inc)} topic incarnations")
        for inc, ifs in by_inc.items():
            lines.append(f"    {'before incarnations were kept' if inc in ('', LEGACY) else inc}: {len(ifs)} files, "
                         f"{sum(f.rows for f in ifs):,} rows, offsets from {ifs[0].start_offset}")
    if has_topic(root, verdicts_topic):
        rows = read_verdicts(root, verdicts_topic, job)
        incidents = {r["incident_id"]: r for r in rows}
        kinds = Counter(r["kind"] for r in incidents.values())
        lines.append(f"  verdicts: {len(rows)} records, {len(incidents)} incidents "
                     f"({', '.join(f'{k}: {n}' for k, n in sorted(kinds.items())) or 'none'})")
    return "\n".join(lines)


def migrate_archive(root: Path) -> str:
    """Run the migration; the line it prints. Rows lost or gained is an error (exit 2)."""
    from ccld.sinks.migrate import migrate

    m = migrate(root)
    line = (f"moved {m.files_moved} files ({m.rows_moved:,} rows) into {m.files_written} files of the Hive layout; "
            f"the archive holds {m.rows_after:,} rows (before: {m.rows_before:,})")
    if m.left:
        line += f"; {len(m.left)} files left in the old layout (their offsets are in the Hive layout already)"
    if m.rows_after != m.rows_before:
        raise CcldError(f"{line}: row counts differ (was a sink writing to {root}?)")
    return line


def compact_archive(root: Path) -> str:
    """Run the compaction; the line it prints. A folder that failed is an error (exit 2), the others are done."""
    import sys

    from ccld.sinks.compact import compact

    r = compact(root, progress=lambda line: print(line, file=sys.stderr, flush=True))
    line = (f"merged {r.files_before:,} files in {r.folders:,} folders into {r.files_after:,} ({r.rows:,} rows, "
            f"every one kept); {r.skipped_in_ledger:,} files of the newest flushes left as they are")
    if r.recovered:
        line += f"; {r.recovered} interrupted merges completed"
    if r.errors:
        raise CcldError(f"{line}; {len(r.errors)} folders not merged: " + "; ".join(r.errors[:5]))
    return line


def prune_archive(root: Path, older_than: float | None, retention_days: float, dry_run: bool) -> str:
    from ccld.sinks.compact import prune

    days = older_than if older_than is not None else retention_days
    if days <= 0 and older_than is None:
        raise CcldError("ccld archive prune needs --older-than DAYS (or the archive_retention_days setting)")
    r = prune(root, days, dry_run=dry_run)
    what = "would remove" if dry_run else "removed"
    span = f" ({r.days[0]} to {r.days[-1]}, UTC)" if r.days else ""
    return f"{what} {r.folders:,} day folders of {len(r.days)} days{span}: {r.files:,} files, {r.bytes / 1e6:.1f} MB"


def main(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "migrate":
        print(migrate_archive(args.dir))
        return 0
    if args.action == "compact":
        print(compact_archive(args.dir))
        return 0
    if args.action == "prune":
        print(prune_archive(args.dir, args.older_than, settings.archive_retention_days, args.dry_run))
        return 0
    print(summarize(args.dir, settings.verdicts_topic, getattr(args, "job", None)))
    return 0
