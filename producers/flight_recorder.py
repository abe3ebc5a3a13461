"""``ccld import-fr DIR [--json]``: analyse PyTorch Flight Recorder dumps with the CCL-D analyzer.

Post-mortem: one dump per rank (pickle or JSON, format 2.x) is converted into the kernel
records the live attachment would have sent (``attach.fr_convert``) and replayed through the
same ``Analyzer`` the stream worker runs. The dump is a snapshot taken while the job was
stuck (or after it ended), so after the last record the analyzer's clock is advanced past
every hang threshold: an operation still in flight in the dump counts as stuck. A rank
without a dump is a rank that reported nothing, which is evidence in itself (it never
entered what its peers entered). Unusable files are reported on stderr, naming the file, and
the rest is still analysed.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ccld.producers.attach.fr_convert import Conversion, convert, to_batches
from ccld.producers.attach.fr_load import DumpError, load_dir
from ccld.records import Verdict
from ccld.settings import Settings
from ccld.streams.analysis.settings import AnalyzerSettings


@dataclass
class ImportResult:
    """What ``import-fr`` found: the verdicts and the facts about the dump set."""

    verdicts: list[Verdict]
    conversion: Conversion | None
    errors: list[DumpError]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, help="directory with one Flight Recorder dump per rank")
    parser.add_argument("--json", action="store_true", help="one verdict object per line")
    parser.add_argument("--world-size", dest="world_size", type=int, default=None,
                        help="ranks the job had (default: from pg_config or the highest rank seen)")  # fmt: skip


def final_times(settings: AnalyzerSettings, end: float) -> list[float]:
    """Analyzer times after the last record: a tick, then past every hang threshold."""
    longest = max(
        settings.hang_min_s, settings.h2_min_s, settings.h3_min_s, settings.barrier_hang_min_s, settings.hang_max_s
    )
    return [end + 1.0, end + settings.finalize_timeout_s + 1.0, end + longest + settings.wait_edge_min_s + 1.0]


def analyse(directory: Path, settings: Settings, *, world_size: int | None = None, tick_s: float = 1.0) -> ImportResult:
    """Load, convert and analyse one dump directory (no printing)."""
    from ccld.streams.analysis.analyzer import Analyzer

    dumps, errors = load_dir(directory)
    if not dumps:
        return ImportResult([], None, errors)
    conv = convert(dumps, job=settings.job, world_size=world_size)
    analyzer = Analyzer(settings.analyzer)
    got: list[Verdict] = []
    next_tick: float | None = None
    end = 0.0
    for now, batch in to_batches(conv.records):
        if next_tick is None:
            next_tick = now + tick_s
        while now >= next_tick:
            got.extend(analyzer.evaluate(next_tick))
            next_tick += tick_s
        analyzer.ingest(batch, now)
        end = now
    for t in final_times(settings.analyzer, end):
        got.extend(analyzer.evaluate(t))
    return ImportResult(latest_per_incident(got), conv, errors)


def latest_per_incident(verdicts: list[Verdict]) -> list[Verdict]:
    """The last word on each incident, in the order incidents opened (resolved ones included)."""
    last: dict[str, Verdict] = {}
    for v in verdicts:
        last[v.incident_id] = v
    return list(last.values())


def main(args: argparse.Namespace, settings: Settings) -> int:
    if args.job is None:
        settings = settings.replace(job="fr-import")
    result = analyse(args.directory, settings, world_size=args.world_size)
    for err in result.errors:
        print(f"ccld import-fr: {err}", file=sys.stderr)
    conv = result.conversion
    if conv is None:
        print(f"ccld import-fr: no usable Flight Recorder dump in {args.directory}", file=sys.stderr)
        return 2
    print(
        f"ccld import-fr: {len(conv.ranks_present)} dumps (ranks {_ranks(conv.ranks_present)}) of world size "
        f"{conv.world_size}; missing: {_ranks(conv.ranks_missing) or 'none'}; {len(conv.records)} records",
        file=sys.stderr,
    )
    for note in conv.notes[:20]:
        print(f"ccld import-fr: note: {note}", file=sys.stderr)
    for rank, ops in sorted(conv.inflight.items()):
        print(f"ccld import-fr: rank {rank} was inside {', '.join(ops[-3:])} at dump time", file=sys.stderr)
    for v in result.verdicts:
        if args.json:
            print(json.dumps(v.to_dict(), sort_keys=True))
        else:
            print(v.describe())
    if not result.verdicts and not args.json:
        print("no anomaly found")
    return 1 if result.errors else 0


def _ranks(ranks: tuple[int, ...]) -> str:
    return ",".join(map(str, ranks))
