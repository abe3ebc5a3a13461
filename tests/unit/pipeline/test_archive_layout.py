"""The archive's Hive layout: one file per job and UTC day, replays and crashes, `--job`, and the migration."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from ccld.cli import main
from ccld.records import KernelBatch, Status, VerdictState
from ccld.sinks import layout
from ccld.sinks.catalog import read_table, scan
from ccld.sinks.layout import write_offsets
from ccld.sinks.migrate import migrate
from ccld.sinks.parquet import file_path, metrics_table, verdicts_table, write_atomic
from ccld.sinks.report_model import load_incident
from factories import make_kernel_record, make_verdict
from report_archive import H1_ID, S2_ID, write_archive

M, V = "ccl-d.metrics", "ccl-d.verdicts"
A, B = "id-" + "a" * 32, "id-" + "b" * 32
DAY1 = int(dt.datetime(2026, 12, 1, 23, 59, 59, tzinfo=dt.UTC).timestamp() * 1000)  # a second before midnight
DAY2 = DAY1 + 2_000


def batch(job: str, n: int = 2, first_seq: int = 0, **over: object) -> KernelBatch:
    return KernelBatch.from_records([make_kernel_record(job=job, op_seq=first_seq + i, rank=i % 4, **over)
                                     for i in range(n)])


def messages(*jobs_at: tuple[str, int], first: int = 0) -> list[tuple[int, int, KernelBatch]]:
    """One message per (job, Kafka timestamp ms), at consecutive offsets from ``first``."""
    return [(first + i, ts, batch(job, first_seq=10 * (first + i))) for i, (job, ts) in enumerate(jobs_at)]


def hive_rows(root: Path, topic: str = M) -> Counter[tuple[str, int, int]]:
    """(job, offset, op_seq) of every row the Hive layout holds, duplicates counted (what a query sees)."""
    folder = layout.topic_dir(root, topic)
    if not folder.is_dir():
        return Counter()
    t = ds.dataset(folder, format="parquet", partitioning="hive").to_table(columns=["job", "offset", "op_seq"])
    return Counter(zip(t["job"].to_pylist(), t["offset"].to_pylist(), t["op_seq"].to_pylist(), strict=True))


def all_rows(root: Path) -> Counter[tuple[str, str, int, int]]:
    """(topic, job, offset, op_seq or incident) of every row of both layouts, read file by file."""
    out: Counter[tuple[str, str, int, int]] = Counter()
    for f in scan(root):
        t = read_table(f)
        key = t["op_seq"] if "op_seq" in t.column_names else t["offset"]
        out.update((f.topic, j, o, k) for j, o, k in zip(t["job"].to_pylist(), t["offset"].to_pylist(),
                                                           key.to_pylist(), strict=True))
    return out


def test_a_flush_of_several_jobs_and_days_is_one_file_per_folder_named_by_its_first_offset(tmp_path: Path) -> None:
    msgs = messages(("a", DAY1), ("b", DAY1), ("a", DAY2), first=10)
    paths = write_offsets(tmp_path, M, 3, A, 10, 12, metrics_table(msgs))
    name = f"part-p3-{A}-o0000000000000000010.parquet"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in paths) == [
        f"topic=ccl-d.metrics/job=a/date=2026-12-01/{name}", f"topic=ccl-d.metrics/job=a/date=2026-12-02/{name}",
        f"topic=ccl-d.metrics/job=b/date=2026-12-01/{name}"]
    assert hive_rows(tmp_path) == Counter({("a", 10, 100): 1, ("a", 10, 101): 1, ("b", 11, 110): 1,
                                           ("b", 11, 111): 1, ("a", 12, 120): 1, ("a", 12, 121): 1})
    files = scan(tmp_path)
    assert [(f.job, f.date, f.partition, f.incarnation, f.start_offset, f.rows) for f in files] == [
        ("a", "2026-12-01", 3, A, 10, 2), ("a", "2026-12-02", 3, A, 10, 2), ("b", "2026-12-01", 3, A, 10, 2)]
    assert (tmp_path / "topic=ccl-d.metrics" / "_offsets" / "p3" / A / "0000000000000000010").read_text().split(
        "\n")[0] == "12"
    assert "job" not in pq.read_schema(paths[0]).names, "a Hive key that is a file column too breaks pandas, Spark"
    df = pd.read_parquet(layout.topic_dir(tmp_path, M))  # pandas reads the folders as columns
    assert sorted(zip(df["job"], df["date"], df["op_seq"], strict=True)) == [
        ("a", "2026-12-01", 100), ("a", "2026-12-01", 101), ("a", "2026-12-02", 120), ("a", "2026-12-02", 121),
        ("b", "2026-12-01", 110), ("b", "2026-12-01", 111)]


def test_timestamp_columns_are_utc_and_null_where_the_epoch_column_says_unknown(tmp_path: Path) -> None:
    entered = KernelBatch.from_records([make_kernel_record(job="a", status=Status.ENTERED, t_enter_ns=1_500_000_123,
                                                           t_exit_ns=-1, t_sample_ns=1_600_000_000)])
    t = metrics_table([(0, DAY1, entered)])
    utc = pa.timestamp("us", tz="UTC")
    assert all(t.schema.field(c).type == utc for c in ("kafka_ts", "t_enter_ts", "t_exit_ts", "t_sample_ts"))
    row = t.to_pylist()[0]
    assert row["kafka_ts"] == dt.datetime(2026, 12, 1, 23, 59, 59, tzinfo=dt.UTC)
    assert row["t_enter_ts"] == dt.datetime(1970, 1, 1, 0, 0, 1, 500_000, tzinfo=dt.UTC), "ns floored to us"
    assert row["t_exit_ts"] is None and row["t_exit_ns"] == -1, "no exit yet: null, the epoch column kept"
    v = verdicts_table([(0, DAY1, make_verdict(onset_time=DAY1 / 1e3 + 0.25, detected_time=DAY1 / 1e3 + 1.5))])
    vrow = v.to_pylist()[0]
    assert vrow["onset_ts"] == dt.datetime(2026, 12, 1, 23, 59, 59, 250_000, tzinfo=dt.UTC)
    assert vrow["detected_ts"] == dt.datetime(2026, 12, 2, 0, 0, 0, 500_000, tzinfo=dt.UTC)
    assert v.schema.field("detected_ts").type == utc and vrow["detected_time"] == DAY1 / 1e3 + 1.5


def test_a_replay_cut_at_other_offsets_replaces_the_first_flush_in_every_folder(tmp_path: Path) -> None:
    """Killed after writing 0..3 and before the commit, the sink reads 0.. again and flushes at 1 this time:
    job b's file of the first flush (only offset 3 has job b) must go, or offset 3 is archived twice."""
    msgs = messages(("a", DAY1), ("a", DAY1), ("a", DAY1), ("b", DAY1))
    write_offsets(tmp_path, M, 0, A, 0, 3, metrics_table(msgs))
    write_offsets(tmp_path, M, 0, A, 0, 1, metrics_table(msgs[:2]))
    assert not (tmp_path / "topic=ccl-d.metrics" / "job=b").exists() or not list(
        (tmp_path / "topic=ccl-d.metrics" / "job=b").rglob("*.parquet")), "the first flush's job b file stayed"
    write_offsets(tmp_path, M, 0, A, 2, 3, metrics_table(msgs[2:]))
    want = Counter({("a", o, 10 * o + i): 1 for o in range(3) for i in range(2)})
    want.update({("b", 3, 30): 1, ("b", 3, 31): 1})
    assert hive_rows(tmp_path) == want
    assert [(f.job, f.start_offset) for f in scan(tmp_path)] == [("a", 0), ("a", 2), ("b", 2)]


def test_a_crash_in_a_replay_leaves_nothing_the_next_replay_cannot_find(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first flush wrote 0..2 (job b only at 2); a replay of 0..1 (job a only) dies writing; the next one
    flushes 0..0 and 1..2: the first flush's job b file must be found and replaced, not kept twice."""
    msgs = messages(("a", DAY1), ("a", DAY1), ("b", DAY1))
    write_offsets(tmp_path, M, 0, A, 0, 2, metrics_table(msgs))

    def dies(table: pa.Table, path: Path) -> Path:
        raise OSError(28, "No space left on device", str(path))

    real = layout.write_file
    monkeypatch.setattr(layout, "write_file", dies)
    with pytest.raises(OSError):
        write_offsets(tmp_path, M, 0, A, 0, 1, metrics_table(msgs[:2]))
    monkeypatch.setattr(layout, "write_file", real)
    write_offsets(tmp_path, M, 0, A, 0, 0, metrics_table(msgs[:1]))
    write_offsets(tmp_path, M, 0, A, 1, 2, metrics_table(msgs[1:]))
    assert hive_rows(tmp_path) == Counter({("a", 0, 0): 1, ("a", 0, 1): 1, ("a", 1, 10): 1, ("a", 1, 11): 1,
                                           ("b", 2, 20): 1, ("b", 2, 21): 1})


def test_another_incarnation_never_replaces_or_removes_files(tmp_path: Path) -> None:
    old = messages(("a", DAY1), ("a", DAY1), ("a", DAY1))
    write_offsets(tmp_path, M, 0, A, 0, 2, metrics_table(old))
    new = [(o, ts, batch("a", first_seq=500 + o)) for o, ts, _ in old[:2]]
    write_offsets(tmp_path, M, 0, B, 0, 1, metrics_table(new))  # recreated: offsets from 0 again
    got = hive_rows(tmp_path)
    assert sum(got.values()) == 10 and got[("a", 2, 20)] == 1 and got[("a", 0, 500)] == 1
    assert {f.incarnation for f in scan(tmp_path)} == {A, B}


def test_job_names_are_percent_encoded_in_folders_and_read_back(tmp_path: Path) -> None:
    job = "team/x y=1"
    (p,) = write_offsets(tmp_path, M, 0, A, 0, 0, metrics_table(messages((job, DAY1))))
    assert p.parent.parent.name == "job=team%2Fx%20y%3D1"
    assert [f.job for f in scan(tmp_path)] == [job] and [f.job for f in scan(tmp_path, job=job)] == [job]
    assert set(hive_rows(tmp_path)) == {(job, 0, 0), (job, 0, 1)}


def old_archive(root: Path) -> None:
    """An archive of the layout before: files before incarnations and of one incarnation, several jobs each."""
    write_atomic(metrics_table(messages(("a", DAY1), ("b", DAY1))), file_path(root, M, 0, 0), 1)
    write_atomic(metrics_table(messages(("a", DAY1), ("b", DAY2), ("a", DAY2), first=2)), file_path(root, M, 0, 2),
                 4)
    write_atomic(metrics_table(messages(("b", DAY2), ("a", DAY2))), file_path(root, M, 1, 0, A), 1)
    vs = [(0, DAY1, make_verdict(job="a", incident_id="i1")),
          (1, DAY2, make_verdict(job="b", incident_id="i2", state=VerdictState.UPDATE))]
    write_atomic(verdicts_table(vs), file_path(root, V, 0, 0, A), 1)
    (root / M / "1" / ".incarnation").write_text("sink-00000000000000ab\n")


def test_summary_job_counts_only_that_jobs_rows_in_both_layouts(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    old_archive(tmp_path)
    write_offsets(tmp_path, M, 0, B, 0, 1, metrics_table(messages(("a", DAY2), ("c", DAY2))))
    assert main(["archive", "summary", str(tmp_path), "--job", "a"]) == 0
    out = capsys.readouterr().out
    # job a: 3 messages of the old metrics files, 1 of the partition-1 file, 1 Hive file: 2 rows each
    assert "(job a): 5 files, 11 rows" in out, out
    assert "1 jobs, 1 days (2026-12-02, UTC)" in out and "4 files in the old layout" in out, out
    assert "verdicts: 1 records, 1 incidents (H1: 1)" in out, out
    assert main(["archive", "summary", str(tmp_path), "--job", "c"]) == 0
    out = capsys.readouterr().out
    assert "(job c): 1 files, 2 rows" in out and "verdicts: 0 records" in out, out
    assert main(["archive", "summary", str(tmp_path), "--job", "nobody"]) == 0
    assert "no Parquet files (job nobody)" in capsys.readouterr().out


def test_migrate_moves_every_row_into_the_hive_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old_archive(tmp_path)
    before = all_rows(tmp_path)
    assert sum(before.values()) == 14 + 2
    assert main(["archive", "migrate", str(tmp_path)]) == 0
    assert "moved 4 files (16 rows) into 9 files" in capsys.readouterr().out
    assert all_rows(tmp_path) == before, "rows lost, duplicated or changed by the migration"
    assert not (tmp_path / M).exists() and not (tmp_path / V).exists(), "old folders left behind"
    files = scan(tmp_path)
    assert all(f.hive for f in files)
    assert {(f.partition, f.incarnation) for f in files if f.topic == M} == {(0, layout.LEGACY), (1, A)}
    assert sum(hive_rows(tmp_path).values()) == 14 and sum(hive_rows(tmp_path, V).values()) == 2
    verdicts = ds.dataset(layout.topic_dir(tmp_path, V), format="parquet", partitioning="hive").to_table()
    assert verdicts.schema.field("detected_ts").type == pa.timestamp("us", tz="UTC"), "no timestamp columns added"
    assert layout.marker_path(tmp_path, M, 1).read_text() == "sink-00000000000000ab\n", "the sink token was lost"
    assert main(["archive", "migrate", str(tmp_path)]) == 0  # again: nothing left to move
    assert "moved 0 files" in capsys.readouterr().out and all_rows(tmp_path) == before


def test_migrate_leaves_old_files_whose_offsets_the_sink_already_rewrote(tmp_path: Path) -> None:
    old_archive(tmp_path)
    # After an upgrade the sink replayed partition 1's offsets 1.. of incarnation A (not committed before).
    write_offsets(tmp_path, M, 1, A, 1, 1, metrics_table(messages(("a", DAY2), first=1)))
    before = sum(all_rows(tmp_path).values())
    m = migrate(tmp_path)
    assert m.left == [file_path(tmp_path, M, 1, 0, A)] and m.rows_after == m.rows_before == before
    assert file_path(tmp_path, M, 1, 0, A).is_file()


def test_report_reads_the_old_layout_and_the_migrated_archive_alike(tmp_path: Path) -> None:
    root = write_archive(tmp_path / "archive", old_layout=True)
    topics = {"verdicts_topic": V, "metrics_topic": M}
    before = {i: load_incident(root, i, **topics) for i in (H1_ID, S2_ID)}
    assert before[H1_ID].metric_rows > 0
    migrate(root)
    assert all(f.hive for f in scan(root))
    for i in (H1_ID, S2_ID):
        assert load_incident(root, i, **topics) == before[i]


def test_the_ledger_keeps_the_newest_flushes_and_every_file_stays(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A sink flushes every 10 s: the ledger folder, listed at every flush, held one entry per flush for ever.
    It keeps the newest ``LEDGER_KEEP`` now; every file and row stays, and a replay of the newest flushes
    still replaces their files instead of adding copies."""
    monkeypatch.setattr(layout, "LEDGER_KEEP", 5)
    msgs = messages(*[("a", DAY1)] * 30)
    for o in range(30):
        write_offsets(tmp_path, M, 0, A, o, o, metrics_table(msgs[o:o + 1]))
    ledger = layout.ledger_dir(tmp_path, M, 0, A)
    assert sorted(int(p.name) for p in ledger.iterdir() if p.name.isdigit()) == list(range(25, 30))
    assert len(list(layout.topic_dir(tmp_path, M).rglob("*.parquet"))) == 30
    write_offsets(tmp_path, M, 0, A, 27, 29, metrics_table(msgs[27:]))  # a replay of the last three, as one flush
    assert hive_rows(tmp_path) == Counter({("a", o, 10 * o + i): 1 for o in range(30) for i in range(2)})
