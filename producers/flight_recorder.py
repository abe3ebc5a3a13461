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
import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ccld.producers.attach.fr_convert import Conversion, convert, to_batches
from ccld.producers.attach.fr_load import DumpError, load_dir
from ccld.records import AnomalyKind, KernelRecord, Status, Verdict, VerdictState, comm_hex
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
    parser.add_argument("--all", action="store_true", help="also print incidents that resolved before the dump")
    parser.add_argument("--world-size", dest="world_size", type=int, default=None,
                        help="ranks the job had (default: from pg_config or the highest rank seen)")  # fmt: skip


def final_times(settings: AnalyzerSettings, end: float) -> list[float]:
    """Analyzer times after the last record: doubling steps until past every hang threshold.

    Each verdict then opens at the first step beyond its threshold, so its stated stall is
    the least the dump implies, not an arbitrary large number.
    """
    longest = (
        max(settings.hang_min_s, settings.h2_min_s, settings.h3_min_s, settings.barrier_hang_min_s, settings.hang_max_s)
        + settings.wait_edge_min_s
        + settings.finalize_timeout_s
    )
    out, step = [], 1.0
    while step < 2 * longest:
        out.append(end + step)
        step *= 1.25
    return out


def analyse(directory: Path, settings: Settings, *, world_size: int | None = None, tick_s: float = 1.0) -> ImportResult:
    """Load, convert and analyse one dump directory (no printing)."""
    from ccld.streams.analysis.analyzer import analyze_batches

    dumps, errors = load_dir(directory)
    if not dumps:
        return ImportResult([], None, errors)
    conv = convert(dumps, job=settings.job, world_size=world_size)
    pairs = list(to_batches(conv.records))
    end = pairs[-1][0] if pairs else 0.0
    then = final_times(settings.analyzer, end)
    got = analyze_batches(pairs, settings.analyzer, tick_s, then=then)
    end = then[-1] if then else end
    # dumps named without a host leave the host empty: do not print "rank 2 on "
    verdicts = [
        dataclasses.replace(v, root_cause_hosts=tuple(h for h in v.root_cause_hosts if h))
        for v in latest_per_incident(got)
    ]
    verdicts.extend(silent_member_verdicts(conv, verdicts, settings.job, end))
    return ImportResult(verdicts, conv, errors)


def silent_member_verdicts(conv: Conversion, verdicts: list[Verdict], job: str, now: float) -> list[Verdict]:
    """H1 for members that left no record in a communicator whose other members were stuck in it.

    That member wrote no dump, or its dump never mentions the communicator (it never posted
    the matching recv, never called a collective of that group). The analyzer names culprits
    by the global rank their own records carry, so it cannot name a member that sent none;
    the importer, which knows every group's members, does. Communicators the analyzer already
    judged a hang are left alone.
    """
    judged = {v.communicator for v in verdicts if v.kind.is_hang}
    latest: dict[tuple[int, int], KernelRecord] = {}
    for r in conv.records:
        key = (r.comm_hash, r.rank)
        if key not in latest or (r.op_seq, int(r.status)) >= (latest[key].op_seq, int(latest[key].status)):
            latest[key] = r
    out = []
    for chash, (what, ranks) in sorted(conv.communicators().items()):
        silent = [r for r in ranks if (chash, r) not in latest]
        if not silent or comm_hex(chash) in judged:
            continue
        stuck = [latest[(chash, r)] for r in ranks if (chash, r) in latest]
        stuck = [r for r in stuck if r.status is not Status.DONE]
        if not stuck:
            continue
        k = max(r.op_seq for r in stuck)
        op = next(r.op_type for r in stuck if r.op_seq == k).name.lower()
        waiting = sorted(r.rank for r in stuck if r.op_seq == k)
        why = [
            f"rank {r} wrote no dump" if r in conv.ranks_missing else f"rank {r}'s dump has no entry for it"
            for r in silent
        ]
        incident = hashlib.blake2b(f"{job}|{comm_hex(chash)}|{k}|silent".encode(), digest_size=8).hexdigest()
        out.append(
            Verdict(
                incident_id=incident, state=VerdictState.OPEN, kind=AnomalyKind.H1, job=job,
                communicator=comm_hex(chash), op_seq=k, op_type=op, root_cause_ranks=tuple(silent),
                affected_ranks=tuple(waiting), confidence=0.8, onset_time=now, detected_time=now,
                evidence=(f"ranks {','.join(map(str, waiting))} were inside {op} #{k} of {what} at dump time; "
                          f"{'; '.join(why)}: it never entered"),
                details={"source": "import-fr", "communicator": what},
            )
        )  # fmt: skip
    return out


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
    shown = [v for v in result.verdicts if args.all or v.state is not VerdictState.RESOLVED]
    if len(shown) < len(result.verdicts):
        hidden = len(result.verdicts) - len(shown)
        print(f"ccld import-fr: {hidden} incidents resolved before the dump (--all shows them)", file=sys.stderr)
    for v in shown:
        if args.json:
            print(json.dumps(v.to_dict(), sort_keys=True))
        else:
            print(v.describe())
    if not shown and not args.json:
        print("no anomaly found")
    return 1 if result.errors else 0


def _ranks(ranks: tuple[int, ...]) -> str:
    return ",".join(map(str, ranks))
