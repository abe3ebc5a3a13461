"""`ccld archive summary DIR [--job J]`: what an archive holds; `ccld archive migrate DIR`: to the Hive layout."""

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


def main(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "migrate":
        print(migrate_archive(args.dir))
        return 0
    print(summarize(args.dir, settings.verdicts_topic, getattr(args, "job", None)))
    return 0
