"""What ``ccld archive compact`` does for a job-day of real-time flushes: files, bytes and the README's queries.

Writes ``--flushes`` one-message flushes of one job on one day through the sink's own writer
(``sinks.layout.write_offsets``: a flush every ``sink_max_age_s`` = 10 s is 8,640 a day), each of
``--rows`` kernel records, and ``--verdicts`` one-verdict flushes; times the README's two DuckDB
queries (median of ``--repeat``), compacts as ``ccld archive compact`` does (the ledger's newest flushes left),
checks that every row is there once, and times them again; then compacts as the sink's timer does, which
knows the offsets it has committed (every flush below them merged) and leaves files of 64 MB or more.

    python benchmarks/archive_compact.py [--flushes 8640] [--rows 40] [--verdicts 200] [--repeat 5] [--out F.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

DAY = int(dt.datetime(2026, 12, 2, tzinfo=dt.UTC).timestamp() * 1000)
M, V = "ccl-d.metrics", "ccl-d.verdicts"
INC = "id-" + "c" * 32
QUERIES = {
    "one job's verdicts": (
        "SELECT detected_ts, state, kind, root_cause_ranks, evidence FROM read_parquet("
        "'{root}/topic=ccl-d.verdicts/*/*/*.parquet', hive_partitioning = true) WHERE job = 'my-train' "
        "ORDER BY detected_ts"),
    "rank 3's collectives on one day": (
        "SELECT t_enter_ts, communicator, op_seq, op_type, (t_exit_ns - t_enter_ns) / 1e6 AS duration_ms "
        "FROM read_parquet('{root}/topic=ccl-d.metrics/job=my-train/*/*.parquet', hive_partitioning = true) "
        "WHERE date = DATE '2026-12-02' AND rank = 3 AND status = 'DONE' ORDER BY t_enter_ts"),
}  # fmt: skip


def build(root: Path, flushes: int, rows: int, verdicts: int) -> None:
    from ccld.records import AnomalyKind, DType, KernelBatch, KernelRecord, OpType, Status, Verdict, VerdictState
    from ccld.sinks.layout import write_offsets
    from ccld.sinks.parquet import metrics_table, verdicts_table

    for o in range(flushes):
        ts = DAY + o * 10_000
        recs = [KernelRecord(job="my-train", incarnation=0, rank=r % 8, world_size=8, comm_hash=0xABC, comm_rank=r % 8,
                             comm_size=8, op_seq=o * rows + r, op_type=OpType.ALL_REDUCE, dtype=DType.FLOAT32,
                             count=1024, peer=-1, status=Status.DONE, t_enter_ns=ts * 10**6 + r,
                             t_exit_ns=ts * 10**6 + r + 5000, t_sample_ns=ts * 10**6 + r + 5000, host="node-0",
                             send_counts=(4, 4), recv_counts=(4, 4))
                for r in range(rows)]  # fmt: skip
        write_offsets(root, M, 0, INC, o, o, metrics_table([(o, ts, KernelBatch.from_records(recs))]))
        if o and o % 1000 == 0:
            print(f"  {o:,} of {flushes:,} metric flushes written", file=sys.stderr, flush=True)
    for o in range(verdicts):
        v = Verdict(job="my-train", incident_id=f"h-{o:016x}", state=VerdictState.OPEN, kind=AnomalyKind.H1,
                    communicator="abc", op_seq=o, op_type="all_reduce", root_cause_ranks=(3,), affected_ranks=(0, 1),
                    evidence="rank 3 never entered", confidence=0.95, onset_time=DAY / 1e3 + o,
                    detected_time=DAY / 1e3 + o + 5)  # fmt: skip
        write_offsets(root, V, 0, INC, o, o, verdicts_table([(o, DAY + o * 1000, v)]))


def timed(root: Path, repeat: int) -> dict[str, float]:
    import duckdb

    out = {}
    for name, sql in QUERIES.items():
        ts = []
        for _ in range(repeat):
            con = duckdb.connect()  # a fresh connection: no cached file metadata
            t0 = time.perf_counter()
            con.execute(sql.format(root=root)).fetchall()
            ts.append(time.perf_counter() - t0)
            con.close()
        out[name] = statistics.median(ts)
    return out


def census(root: Path) -> dict[str, int]:
    files = list(root.rglob("*.parquet"))
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def rows(root: Path) -> dict[str, int]:
    """Rows per topic, and distinct (offset, op_seq or incident) keys: every row once means the two agree."""
    import duckdb

    con = duckdb.connect()
    out = {}
    for topic, key in ((M, "op_seq"), (V, "incident_id")):
        src = f"read_parquet('{root}/topic={topic}/*/*/*.parquet')"
        n, distinct = con.execute(f"SELECT count(*), count(DISTINCT ({key}, \"offset\")) FROM {src}").fetchall()[0]
        out[topic], out[f"{topic} distinct"] = int(n), int(distinct)
    con.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--flushes", type=int, default=8640, help="metric flushes of the job-day (8,640: one per 10 s)")
    p.add_argument("--rows", type=int, default=40, help="kernel records per flush")
    p.add_argument("--verdicts", type=int, default=200, help="verdicts, one flush each")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    from ccld.sinks.compact import compact

    with tempfile.TemporaryDirectory(prefix="ccld-compact-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        build(root, args.flushes, args.rows, args.verdicts)
        print(f"written in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        before = {**census(root), "rows": rows(root), "queries_s": timed(root, args.repeat)}
        t0 = time.perf_counter()
        r = compact(root)
        took = time.perf_counter() - t0
        after = {**census(root), "rows": rows(root), "queries_s": timed(root, args.repeat)}
        t0 = time.perf_counter()
        timer = compact(root, committed={(M, 0, INC): args.flushes, (V, 0, INC): args.verdicts},
                        max_source_bytes=64 << 20)
        timer_s = time.perf_counter() - t0
        on_timer = {**census(root), "rows": rows(root), "queries_s": timed(root, args.repeat)}
    result = {"flushes": args.flushes, "rows_per_flush": args.rows, "verdicts": args.verdicts, "before": before,
              "after": after, "compact_s": took, "merged_files": r.files_before, "left_in_ledger": r.skipped_in_ledger,
              "errors": r.errors + timer.errors, "sink_timer": on_timer, "sink_timer_s": timer_s,
              "sink_timer_merged_files": timer.files_before}  # fmt: skip
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    ok = before["rows"] == after["rows"] == on_timer["rows"] and not result["errors"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
