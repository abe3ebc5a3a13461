"""`ccld archive summary DIR`: what a Parquet archive holds, per topic, partition and topic incarnation."""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path

from ccld.errors import CcldError
from ccld.settings import Settings
from ccld.sinks.parquet import FileInfo, read_verdicts, scan


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    s = sub.add_parser("summary", help="files, rows and offsets per topic partition; verdicts by kind")
    s.add_argument("dir", type=Path)


def summarize(root: Path, verdicts_topic: str) -> str:
    if not root.is_dir():
        raise CcldError(f"{root} is not a directory")
    files = scan(root)
    if not files:
        return f"{root}: no Parquet files"
    lines = [f"archive {root.resolve()}: {len(files)} files, {sum(f.rows for f in files):,} rows, "
             f"{sum(f.bytes for f in files) / 1e6:.1f} MB"]
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
            lines.append(f"    {inc or 'before incarnations were kept'}: {len(ifs)} files, "
                         f"{sum(f.rows for f in ifs):,} rows, offsets from {ifs[0].start_offset}")
    if (root / verdicts_topic).is_dir():
        rows = read_verdicts(root, verdicts_topic)
        incidents = {r["incident_id"]: r for r in rows}
        kinds = Counter(r["kind"] for r in incidents.values())
        lines.append(f"  verdicts: {len(rows)} records, {len(incidents)} incidents "
                     f"({', '.join(f'{k}: {n}' for k, n in sorted(kinds.items())) or 'none'})")
    return "\n".join(lines)


def main(args: argparse.Namespace, settings: Settings) -> int:
    print(summarize(args.dir, settings.verdicts_topic))
    return 0
