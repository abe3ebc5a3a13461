"""Per-operation localization cost of the analyzer, from 8 to 16,384 ranks.

For one communicator of N ranks the benchmark builds the analyzer's state from N kernel records
and times, per operation (median of several runs):

* ``h1_ms``: diagnose a stalled op where one rank never entered + resolve the wait-for relation;
* ``h2_ms``: the same with one rank's signature differing (majority vote, differing field);
* ``h3_ms``: everyone inside with frozen counters (find the link and channel of the break);
* ``slow_ms``: fold N DONE records of one op, judge it against its baseline (P, late arriver,
  backlog rank) and name the culprit;
* ``evaluate_ms``: a whole ``Analyzer.evaluate`` of a tick that carries the N records of a stalled op
  (apply + diagnose + wait-for + verdict), the end-to-end cost per operation.

Usage: ``python benchmarks/localize_scaling.py [--out FILE.json] [--repeat 7] [--sizes 8,64,...]``.
``run()`` returns the rows for programmatic use. This is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ccld.records import BATCH_COLUMNS, DType, KernelBatch, OpType, Status
from ccld.settings import AnalyzerSettings
from ccld.streams.analysis.analyzer import Analyzer
from ccld.streams.analysis.hangs import diagnose
from ccld.streams.analysis.jobview import JobAnalysis
from ccld.streams.analysis.waitfor import resolve

SIZES = (8, 64, 512, 1024, 2048, 4096, 8192, 16384)
CHANNELS = 8
COMM = 0x5CA1E


def _batch(n: int, seq: np.ndarray, status: np.ndarray, *, op: np.ndarray | None = None,
           dtype: np.ndarray | None = None, send: np.ndarray | None = None, recv: np.ndarray | None = None,
           t_enter: np.ndarray | None = None, t_exit: np.ndarray | None = None, t_sample: float = 10.0,
           batch_seq: int = 0) -> KernelBatch:
    r = np.arange(n, dtype=np.int64)
    te = (np.full(n, 1.0) if t_enter is None else t_enter) * 1e9
    cols = {
        "op_seq": seq.astype(np.int64),
        "op_type": np.full(n, int(OpType.ALL_REDUCE), dtype=np.int64) if op is None else op,
        "dtype": np.full(n, int(DType.BFLOAT16), dtype=np.int64) if dtype is None else dtype,
        "count": np.full(n, 1 << 20, dtype=np.int64),
        "peer": np.full(n, -1, dtype=np.int64),
        "rank": r,
        "comm_rank": r,
        "comm_size": np.full(n, n, dtype=np.int64),
        "status": status.astype(np.int64),
        "host_idx": r // 8,
        "t_enter_ns": te.astype(np.int64),
        "t_exit_ns": (np.full(n, -1.0) if t_exit is None else t_exit * 1e9).astype(np.int64),
        "t_sample_ns": np.full(n, t_sample * 1e9, dtype=np.int64),
    }
    z = np.zeros((n, CHANNELS), dtype=np.int64)
    return KernelBatch(
        job="bench", incarnation=0, comm_hash=COMM, world_size=n,
        hosts=tuple(f"node-{i:05d}" for i in range((n + 7) // 8)),
        columns={k: cols[k] for k in BATCH_COLUMNS}, send=z if send is None else send,
        recv=z if recv is None else recv, producer="bench", batch_seq=batch_seq,
    )


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm caches
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _stalled_job(n: int, kind: str) -> JobAnalysis:
    """A job whose only communicator is stalled in op 1 the way ``kind`` describes."""
    ja = JobAnalysis("bench", 0, AnalyzerSettings())
    done = _batch(n, np.zeros(n), np.full(n, int(Status.DONE)), t_exit=np.full(n, 1.2), t_sample=1.2)
    seq = np.ones(n)
    status = np.full(n, int(Status.PROGRESS))
    dtype = None
    send = recv = None
    if kind == "h1":
        seq[n // 3] = 0
        status[n // 3] = int(Status.DONE)
    elif kind == "h2":
        dtype = np.full(n, int(DType.BFLOAT16), dtype=np.int64)
        dtype[n // 3] = int(DType.FLOAT32)
    else:
        send = np.full((n, CHANNELS), 28, dtype=np.int64)
        recv = send.copy()
        send[n // 3] = 20
        recv[(n // 3 + 1) % n] = 20
    stuck = _batch(n, seq, status, dtype=dtype, send=send, recv=recv, t_enter=np.full(n, 2.0), batch_seq=1)
    ja.js.queue(done, 1.5)
    ja.js.queue(stuck, 2.5)
    rows = ja.js.take_rows()
    if rows is not None:
        ja.js.apply_latest(rows)
    return ja


def _localize(ja: JobAnalysis) -> None:
    d = diagnose(ja.js, 0, ja.known_sigs(0))
    if d is None:
        raise RuntimeError("benchmark state is not stalled")
    resolve({0: d}, {0: 60.0})


def _slow_cost(n: int, repeat: int) -> float:
    """Fold and judge one op of N ranks (one late) against a warm baseline: ingest + evaluate."""
    a = Analyzer()
    rng = np.random.default_rng(0)

    def op_batch(s: int, late: bool) -> tuple[float, KernelBatch]:
        enter = 10.0 * s + 1.0 + rng.uniform(0, 0.01, n)
        if late:
            enter[n // 3] += 0.5
        exit_ = np.full(n, enter.max() + 0.1)
        b = _batch(n, np.full(n, s), np.full(n, int(Status.DONE)), t_enter=enter, t_exit=exit_,
                   t_sample=float(exit_[0]), batch_seq=s)
        return 10.0 * s + 2.0, b

    warm = 12
    batches = [op_batch(s, s >= warm) for s in range(warm + repeat + 1)]
    it = iter(batches)

    def one_op() -> None:
        now, b = next(it)
        a.ingest(b, now)
        a.evaluate(now)

    for _ in range(warm):
        one_op()
    return _median_ms(one_op, repeat)


def _evaluate_cost(n: int, repeat: int) -> float:
    """One whole evaluate() that applies N records of a stalled op and names the missing rank."""
    def once() -> None:
        a = Analyzer(AnalyzerSettings(hang_min_s=1.0, wait_edge_min_s=0.5))
        seq = np.ones(n)
        status = np.full(n, int(Status.PROGRESS))
        seq[n // 3] = 0
        status[n // 3] = int(Status.DONE)
        a.ingest(_batch(n, seq, status, t_enter=np.full(n, 2.0)), 0.0)
        a.evaluate(0.0)
        a.ingest(_batch(n, seq, status, t_enter=np.full(n, 2.0), t_sample=12.0, batch_seq=1), 5.0)
        if not a.evaluate(5.0):
            raise RuntimeError("no verdict in the evaluate benchmark")

    return _median_ms(once, repeat) / 2.0  # two evaluations per run


def run(sizes: Sequence[int] = SIZES, repeat: int = 7) -> list[dict[str, Any]]:
    """Median per-operation costs (ms) for each communicator size."""
    rows = []
    for n in sizes:
        row: dict[str, Any] = {"ranks": n}
        for kind in ("h1", "h2", "h3"):
            ja = _stalled_job(n, kind)
            row[f"{kind}_ms"] = round(_median_ms(functools.partial(_localize, ja), repeat), 4)
        row["slow_ms"] = round(_slow_cost(n, repeat), 4)
        row["evaluate_ms"] = round(_evaluate_cost(n, repeat), 4)
        row["per_rank_us"] = round(1e3 * max(row["h1_ms"], row["h2_ms"], row["h3_ms"], row["slow_ms"]) / n, 4)
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    args = ap.parse_args(argv)
    rows = run([int(x) for x in args.sizes.split(",")], args.repeat)
    cols = ["ranks", "h1_ms", "h2_ms", "h3_ms", "slow_ms", "evaluate_ms", "per_rank_us"]
    print(" ".join(f"{c:>12}" for c in cols))
    for r in rows:
        print(" ".join(f"{r[c]:>12}" for c in cols))
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "repeat": args.repeat}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
