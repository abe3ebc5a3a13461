"""The sink's archive upkeep: compaction on its timer below the offsets it committed, retention, one at a time."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from confluent_kafka import KafkaError, KafkaException

from ccld.records import KernelBatch
from ccld.schemas.codec import encode_batch
from ccld.settings import Settings
from ccld.sinks import layout
from ccld.sinks.archiver import Archiver
from factories import make_kernel_record

DAY = dt.datetime(2026, 12, 2, 10, 0, tzinfo=dt.UTC)


class Ids:
    def labels(self, topics: Sequence[str], timeout_s: float) -> dict[str, str]:
        return dict.fromkeys(topics, "id-" + "d" * 32)


class Commits:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        if self.fail:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))


def sink(tmp_path: Path, **kw: Any) -> Archiver:
    s = Settings.load({}, bootstrap="127.0.0.1:1", archive_dir=str(tmp_path), sink_max_rows=1, **kw)
    arch = Archiver(s)
    arch._ids = Ids()
    return arch


def take(arch: Archiver, commits: Commits, offsets: range, when: dt.datetime = DAY) -> None:
    """One message per offset, each its own flush (sink_max_rows 1): a file each, as in real time."""
    for o in offsets:
        t0 = int(when.timestamp() * 1e9) + o * 1_000_000_000
        b = KernelBatch.from_records([make_kernel_record(job="j", rank=r, op_seq=o, t_enter_ns=t0, t_exit_ns=t0 + 5)
                                      for r in range(2)])
        arch._take(commits, arch.settings.metrics_topic, 0, o, t0 // 1_000_000, encode_batch(b))
        arch._flush_all(commits, force=False)


def parquet(root: Path) -> list[Path]:
    return sorted(root.glob("topic=*/job=*/date=*/*.parquet"))


def rows(root: Path) -> Counter[tuple[int, int]]:
    """(offset, rank) of every metric row in the archive (a duplicate counts twice)."""
    out: Counter[tuple[int, int]] = Counter()
    for p in parquet(root):
        t = pq.read_table(p, columns=["offset", "rank"])
        out.update(zip(t["offset"].to_pylist(), t["rank"].to_pylist(), strict=True))
    return out


def test_the_timer_merges_every_flush_below_the_committed_offset(tmp_path: Path) -> None:
    arch = sink(tmp_path, sink_compact_every_s=60.0)
    c = Commits()
    take(arch, c, range(20))
    before = rows(tmp_path)
    assert len(parquet(tmp_path)) == 20 and set(before.values()) == {1} and len(before) == 40
    assert arch.committed == {(arch.settings.metrics_topic, 0, "id-" + "d" * 32): 20}
    assert not arch.upkeep.maybe_start(arch.committed), "a run started before it was due"
    assert arch.upkeep.maybe_start(arch.committed, now=arch.upkeep._due + 1)
    arch.upkeep.stop()
    # all 20 flushes are in the ledger (it keeps 64): only the committed offset frees them
    assert len(parquet(tmp_path)) == 1 and rows(tmp_path) == before
    assert arch.counters["compactions"] == 1 and arch.counters["compacted_files"] == 19
    take(arch, c, range(20, 23))  # the sink goes on; the next run merges the new files with the old one
    assert arch.upkeep.maybe_start(arch.committed, now=arch.upkeep._due + 1)
    arch.upkeep.stop()
    assert len(parquet(tmp_path)) == 1 and len(rows(tmp_path)) == 46 and set(rows(tmp_path).values()) == {1}


def test_files_whose_commit_failed_are_not_merged(tmp_path: Path) -> None:
    """A flush whose commit failed may be written again by a replay: it stays as it is."""
    arch = sink(tmp_path, sink_compact_every_s=60.0)
    take(arch, Commits(), range(5))
    take(arch, Commits(fail=True), range(5, 9))
    assert arch.counters["commit_errors"] == 4
    arch.upkeep.run_once(arch.committed)
    names = [p.name for p in parquet(tmp_path)]
    assert len(names) == 5 and names[0].endswith(f"o{0:019d}.parquet"), names
    assert len(rows(tmp_path)) == 18


def test_the_timer_prunes_past_the_retention_and_zero_turns_it_off(tmp_path: Path) -> None:
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    arch = sink(tmp_path, sink_compact_every_s=60.0, archive_retention_days=7.0)
    c = Commits()
    take(arch, c, range(3), when=old)
    take(arch, c, range(3, 5), when=dt.datetime.now(dt.UTC))
    arch.upkeep.run_once(arch.committed)
    assert arch.counters["pruned_folders"] == 1
    assert {p.parent.name for p in parquet(tmp_path)} == {f"date={dt.datetime.now(dt.UTC).date().isoformat()}"}
    off = sink(tmp_path / "off", sink_compact_every_s=0.0)
    assert not off.upkeep.maybe_start({}, now=1e12)


def test_a_compaction_held_by_another_process_skips_the_run(tmp_path: Path) -> None:
    from ccld.sinks.compact import _locked

    arch = sink(tmp_path, sink_compact_every_s=60.0)
    take(arch, Commits(), range(4))
    with _locked(tmp_path):
        arch.upkeep.run_once(arch.committed)
    assert len(parquet(tmp_path)) == 4 and arch.counters["compactions"] == 0 and arch.counters["compact_errors"] == 0
    assert layout.LEDGER_KEEP >= 4  # the four are in the ledger: only the committed offset lets them merge
    arch.upkeep.run_once(arch.committed)
    assert len(parquet(tmp_path)) == 1
