"""`ccld archive compact` and `prune`: a folder's small files merged once each row, crashes midway, whole days gone."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_archive_layout import DAY1, DAY2, A, M, hive_rows, messages

from ccld.cli import main
from ccld.sinks import compact as compact_mod
from ccld.sinks import layout
from ccld.sinks.compact import compact, prune
from ccld.sinks.layout import write_offsets
from ccld.sinks.parquet import metrics_table


class Crash(BaseException):
    """The process dies here (not an error compact handles)."""


def flushes(root: Path, n: int, *, job: str = "a", ts: int = DAY1, partition: int = 0) -> Counter[tuple[str, int, int]]:
    """``n`` one-message flushes of ``job`` (the sink in real time: a file per flush); the rows they hold."""
    for o in range(n):
        write_offsets(root, M, partition, A, o, o, metrics_table(messages((job, ts + o), first=o)))
    return hive_rows(root)


def files(root: Path) -> list[Path]:
    return sorted(layout.topic_dir(root, M).glob("job=*/date=*/*.parquet"))


def test_old_flushes_become_one_file_in_time_order_and_the_newest_stay_for_a_replay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """30 flushes, the ledger keeping the newest 4: the 26 others are merged into one file (named by the first
    offset, rows sorted by Kafka timestamp), the 4 stay as they are; every row once, before and after, and after
    the sink replays its newest flush again (a crash before its commit)."""
    monkeypatch.setattr(layout, "LEDGER_KEEP", 4)
    before = flushes(tmp_path, 30)
    assert len(files(tmp_path)) == 30 and set(before.values()) == {1}
    r = compact(tmp_path)
    assert (r.files_before, r.files_after, r.skipped_in_ledger, r.rows, r.errors) == (26, 1, 4, 52, [])
    after = files(tmp_path)
    assert len(after) == 5 and after[0].name == f"part-p0-{A}-o{0:019d}.parquet"
    assert hive_rows(tmp_path) == before
    ts = pq.read_table(after[0], columns=["kafka_ts_ms"])["kafka_ts_ms"].to_pylist()
    assert ts == sorted(ts) and len(ts) == 52
    write_offsets(tmp_path, M, 0, A, 29, 29, metrics_table(messages(("a", DAY1 + 29), first=29)))
    assert hive_rows(tmp_path) == before
    again = compact(tmp_path)  # nothing more to merge: the merged file and the ledger's four
    assert (again.files_before, again.files_after) == (0, 0) and hive_rows(tmp_path) == before


def test_each_folder_and_partition_is_merged_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout, "LEDGER_KEEP", 1)
    flushes(tmp_path, 6)
    flushes(tmp_path, 6, job="b", ts=DAY2, partition=1)
    before = hive_rows(tmp_path)
    r = compact(tmp_path)
    assert (r.folders, r.files_before, r.files_after) == (2, 10, 2)
    assert hive_rows(tmp_path) == before
    assert {p.parent.parent.name for p in files(tmp_path)} == {"job=a", "job=b"}


@pytest.mark.parametrize("crash_at", [1, 2], ids=["before-the-rename", "before-the-sources-go"])
def test_a_compaction_killed_midway_loses_nothing_and_the_next_run_finishes_it(
        crash_at: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed with the merged file written and its journal durable (1) or with the merged file in place and the
    sources not yet removed (2): no row is lost (in 2 a reader sees the merged rows twice until the next run);
    the next run completes the journal, and every row is there once."""
    monkeypatch.setattr(layout, "LEDGER_KEEP", 1)
    before = flushes(tmp_path, 8)
    real = compact_mod._fsync_dir
    calls = 0

    def dies(path: Path) -> None:
        nonlocal calls
        real(path)
        calls += 1
        if calls == crash_at:
            raise Crash

    monkeypatch.setattr(compact_mod, "_fsync_dir", dies)
    with pytest.raises(Crash):
        compact(tmp_path)
    monkeypatch.setattr(compact_mod, "_fsync_dir", real)
    seen = hive_rows(tmp_path)
    assert set(before) == set(seen), "a row lost"
    if crash_at == 1:
        assert seen == before  # the merged file is still under its temporary name, which no reader reads
    else:
        assert seen != before and set(seen.values()) == {1, 2}, "the merged rows twice until the next run"
    assert list((layout.topic_dir(tmp_path, M) / compact_mod.JOURNAL).glob("*.json"))
    r = compact(tmp_path)
    assert r.recovered == 1 and hive_rows(tmp_path) == before
    assert len(files(tmp_path)) == 2  # the merged one and the ledger's newest
    assert not list(layout.topic_dir(tmp_path, M).rglob("*.tmp")), "a temporary file left"


def test_prune_removes_exactly_the_days_past_retention(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flushes(tmp_path, 3)  # 2026-12-01
    flushes(tmp_path, 3, job="b", ts=DAY2, partition=1)  # 2026-12-02
    today = dt.date(2026, 12, 3)
    dry = prune(tmp_path, 1, today=today, dry_run=True)
    assert (dry.folders, dry.files, dry.days) == (1, 3, ("2026-12-01",)) and len(files(tmp_path)) == 6
    done = prune(tmp_path, 1, today=today)
    assert done.days == ("2026-12-01",)
    assert {p.parent.name for p in files(tmp_path)} == {"date=2026-12-02"}
    assert not (layout.topic_dir(tmp_path, M) / "job=a").exists(), "an empty job folder left"
    assert prune(tmp_path, 0, today=dt.date(2026, 12, 2)).folders == 0  # today's own day is kept
    assert prune(tmp_path, 0, today=dt.date(2026, 12, 3)).days == ("2026-12-02",)


def test_the_cli_compacts_and_prune_needs_a_retention(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(layout, "LEDGER_KEEP", 2)
    flushes(tmp_path, 5)
    assert main(["archive", "compact", str(tmp_path)]) == 0
    assert "merged 3 files in 1 folders into 1 (6 rows, every one kept)" in capsys.readouterr().out
    assert main(["archive", "prune", str(tmp_path)]) == 2
    assert "--older-than" in capsys.readouterr().err
    assert main(["archive", "prune", str(tmp_path), "--older-than", "36500", "--dry-run"]) == 0
    assert "would remove 0 day folders" in capsys.readouterr().out


def test_the_sinks_committed_offsets_free_the_files_its_ledger_still_names(tmp_path: Path) -> None:
    """The sink's timer knows its committed offset: every flush that ended below it is merged (no replay can
    write it again), ledger or not; the flushes at and above it stay as they are, and a replay of them keeps
    every row once."""
    before = flushes(tmp_path, 12)  # all 12 in the ledger (it keeps 64)
    assert compact(tmp_path).files_before == 0, "the ledger's files merged with no committed offset given"
    r = compact(tmp_path, committed={(M, 0, A): 9, (M, 1, A): 12, ("other", 0, A): 12})
    assert (r.files_before, r.files_after, r.skipped_in_ledger) == (9, 1, 3)
    assert [p.name for p in files(tmp_path)] == [f"part-p0-{A}-o{o:019d}.parquet" for o in (0, 9, 10, 11)]
    write_offsets(tmp_path, M, 0, A, 9, 11, metrics_table(messages(*[("a", DAY1 + o) for o in (9, 10, 11)],
                                                                   first=9)))
    assert hive_rows(tmp_path) == before


def test_large_files_are_left_as_they_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files of ``max_source_bytes`` or more are not merged again: a day becomes a few large files instead of one
    file read and written whole at every run."""
    monkeypatch.setattr(layout, "LEDGER_KEEP", 1)
    before = flushes(tmp_path, 6)
    assert compact(tmp_path).files_after == 1
    big = files(tmp_path)[0]  # flushes 0-4 merged; 5 stays, in the ledger
    for o in range(6, 10):
        write_offsets(tmp_path, M, 0, A, o, o, metrics_table(messages(("a", DAY1 + o), first=o)))
    after = hive_rows(tmp_path)
    r = compact(tmp_path, max_source_bytes=big.stat().st_size)
    assert (r.files_before, r.files_after) == (4, 1), "the large file merged again, or the small ones not"
    assert big in files(tmp_path) and len(files(tmp_path)) == 3 and hive_rows(tmp_path) == after
    assert set(before) <= set(after)


def test_one_compaction_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second compaction of the same archive while one runs (the sink's timer and an operator's command) stops
    at once, saying so, and merges nothing."""
    monkeypatch.setattr(layout, "LEDGER_KEEP", 1)
    before = flushes(tmp_path, 4)
    with compact_mod._locked(tmp_path):
        with pytest.raises(compact_mod.CompactBusy, match="another compaction"):
            compact(tmp_path)
        assert len(files(tmp_path)) == 4
    assert compact(tmp_path).files_before == 3 and hive_rows(tmp_path) == before
