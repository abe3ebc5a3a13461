"""``ccld import-fr DIR [--json]``: name the broken ranks of a job from its PyTorch Flight Recorder dumps.

Post-mortem: one dump per rank (pickle or JSON, optionally gzip, format 2.x, NCCL or gloo) is
read (``load``), normalised (``model``) and diagnosed (``diagnose``): a wait-for graph of the
ranks' blocking ops whose roots are the broken ranks, one verdict per root cause, most
confident first. The facts about the dump set (ranks without a dump, unknown op names, notes)
go to stderr; verdicts to stdout, as text or one JSON object per line.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ccld.fr_dump.load import DumpError, load_dir
from ccld.fr_dump.model import DumpSet, build
from ccld.settings import Settings
from ccld.streams.flight_recorder.diagnose import Diagnosis, diagnose

__all__ = ["ImportResult", "analyse", "configure", "main"]


@dataclass
class ImportResult:
    """What ``import-fr`` found: the dump set, the diagnosis and the files it could not use."""

    dumps: DumpSet | None
    diagnosis: Diagnosis | None
    errors: list[DumpError]
    skipped: list[str]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, help="directory with one Flight Recorder dump per rank")
    parser.add_argument("--json", action="store_true", help="one verdict object per line")
    parser.add_argument("--world-size", dest="world_size", type=int, default=None,
                        help="ranks the job had (default: from pg_config or the highest rank seen)")  # fmt: skip


def analyse(directory: Path, *, job: str = "fr-import", world_size: int | None = None) -> ImportResult:
    """Load and diagnose one dump directory (no printing)."""
    loaded = load_dir(directory)
    if not loaded.dumps:
        return ImportResult(None, None, loaded.errors, loaded.skipped)
    dset = build(loaded.dumps, world_size=world_size)
    return ImportResult(dset, diagnose(dset, job=job), loaded.errors, loaded.skipped)


def summary(result: ImportResult) -> list[str]:
    """The facts about the dump set, one line each (what stderr shows)."""
    d, diag = result.dumps, result.diagnosis
    lines = [str(e) for e in result.errors]
    if result.skipped:
        lines.append(f"skipped (no rank number in the name): {', '.join(result.skipped)}")
    if d is None or diag is None:
        return lines
    lines.append(
        f"{len(d.present)} dumps (ranks {_ranks(d.present)}) of world size {d.world_size}; missing: "
        f"{_ranks(d.missing) or 'none'}; format {', '.join(d.versions)}; "
        f"{'with' if d.timing else 'no'} start/completion times"
    )
    n_unknown = sum(d.unknown_ops.values())
    if n_unknown:
        listed = ", ".join(f"{name!r} x{n}" for name, n in sorted(d.unknown_ops.items()))
        lines.append(
            f"{n_unknown} entries with unknown operation names (kept in sequence order, compared by name "
            f"as written): {listed}"
        )
    lines += [f"note: {n}" for n in d.notes[:20]]
    if len(d.notes) > 20:
        lines.append(f"note: ... and {len(d.notes) - 20} more")
    lines += [f"moving at dump time: {x}" for x in diag.live[:10]]
    lines += [f"note: {n}" for n in diag.notes]
    where: dict[str, list[int]] = {}
    for r, s in sorted(d.ranks.items()):
        if s.blocking:
            where.setdefault(s.blocking[0].describe(), []).append(r)
    for what, ranks in sorted(where.items(), key=lambda kv: kv[1][0]):
        lines.append(f"rank {_ranks(tuple(ranks))} blocked in {what}")
    return lines


def main(args: argparse.Namespace, settings: Settings) -> int:
    job = settings.job if args.job is not None else "fr-import"
    result = analyse(args.directory, job=job, world_size=args.world_size)
    for line in summary(result):
        print(f"ccld import-fr: {line}", file=sys.stderr)
    if result.diagnosis is None:
        print(f"ccld import-fr: no usable Flight Recorder dump in {args.directory}", file=sys.stderr)
        return 2
    for v in result.diagnosis.verdicts:
        print(json.dumps(v.to_dict(), sort_keys=True) if args.json else v.describe())
    if not result.diagnosis.verdicts and not args.json:
        print("no hang found in the dumps")
    return 1 if result.errors else 0


def _ranks(ranks: tuple[int, ...]) -> str:
    return ",".join(map(str, ranks))
