"""Parquet archive files: names, atomic replacement, replays, and readers (pandas)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ccld.records import AnomalyKind, KernelBatch, Link, Verdict, VerdictState
from ccld.sinks.archive_command import summarize
from ccld.sinks.catalog import scan
from ccld.sinks.parquet import file_path, metrics_table, verdicts_table, write_atomic
from factories import make_kernel_record


def batch(first_seq: int, n: int) -> KernelBatch:
    return KernelBatch.from_records([make_kernel_record(op_seq=first_seq + i, rank=i % 4, comm_rank=i % 4,
                                                        host=f"node-{i % 2}") for i in range(n)])


def test_metrics_rows_match_records(tmp_path: Path) -> None:
    t = metrics_table([(10, 1000, batch(0, 3)), (11, 1001, batch(3, 2))])
    path = write_atomic(t, file_path(tmp_path, "ccl-d.metrics", 2, 10), end_offset=11)
    assert path == tmp_path / "ccl-d.metrics" / "2" / "0000000000000000010.parquet"
    df = pd.read_parquet(path)
    assert list(df["op_seq"]) == [0, 1, 2, 3, 4] and list(df["offset"]) == [10, 10, 10, 11, 11]
    assert list(df["host"]) == ["node-0", "node-1", "node-0", "node-0", "node-1"]
    assert df["op_type"].iloc[0] == "ALL_REDUCE" and df["status"].iloc[0] == "DONE"
    assert list(df["send_counts"].iloc[0]) == [4, 4] and df["communicator"].iloc[0] == "123456789abcdef0"
    assert not list(tmp_path.rglob("*.tmp-*")), "temporary file left behind"


def test_replay_rewrites_instead_of_duplicating(tmp_path: Path) -> None:
    small = [(100, 0, batch(0, 1)), (101, 0, batch(1, 1))]
    write_atomic(metrics_table(small[:1]), file_path(tmp_path, "m", 0, 100), 100)
    write_atomic(metrics_table(small[1:]), file_path(tmp_path, "m", 0, 101), 101)
    # After a crash before the commit, offsets 100..101 come back as one file starting at 100.
    write_atomic(metrics_table(small), file_path(tmp_path, "m", 0, 100), 101)
    files = scan(tmp_path)
    assert [(f.start_offset, f.rows) for f in files] == [(100, 2)]
    assert sum(len(pd.read_parquet(f.path)) for f in files) == 2


def test_verdict_rows_and_summary(tmp_path: Path) -> None:
    v = Verdict(incident_id="inc-1", state=VerdictState.OPEN, kind=AnomalyKind.H3, job="j", communicator="ab",
                op_seq=4, op_type="ALL_REDUCE", root_cause_ranks=(5,), affected_ranks=(4, 5), confidence=0.8,
                evidence="frozen", onset_time=1.0, detected_time=2.0, link=Link(5, 6), channel=3)
    resolved = Verdict(**{**v.__dict__, "state": VerdictState.RESOLVED})
    write_atomic(verdicts_table([(0, 5, v), (1, 6, resolved)]), file_path(tmp_path, "ccl-d.verdicts", 0, 0), 1)
    write_atomic(metrics_table([(0, 0, batch(0, 7))]), file_path(tmp_path, "ccl-d.metrics", 1, 0), 0)
    df = pd.read_parquet(tmp_path / "ccl-d.verdicts")
    assert list(df["state"]) == ["open", "resolved"] and df["link_src"].iloc[0] == 5
    text = summarize(tmp_path, "ccl-d.verdicts")
    assert "2 files, 9 rows" in text and "2 records, 1 incidents (H3: 1)" in text


def test_batches_without_counters_archive_fine(tmp_path: Path) -> None:
    """Sources without per-channel counters (the PyTorch attachment, Flight Recorder) send 0 channels."""
    b = KernelBatch.from_records([make_kernel_record(send_counts=(), recv_counts=(), op_seq=i) for i in range(3)])
    assert b.channels == 0
    path = write_atomic(metrics_table([(0, 0, b)]), file_path(tmp_path, "m", 0, 0), 0)
    df = pd.read_parquet(path)
    assert len(df) == 3 and all(len(x) == 0 for x in df["send_counts"])
