"""Topic incarnations in the archive: a recreated topic's rows never replace the old ones; a replay still rewrites.

In-memory stand-ins for the broker's answers (the topic id it reports) and for the consumer's commit;
the real broker and sink are in tests/chaos/test_sink_broker_restart.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ccld.records import KernelBatch
from ccld.schemas.codec import encode_batch
from ccld.settings import Settings
from ccld.sinks.archive_command import summarize
from ccld.sinks.archiver import Archiver
from ccld.sinks.catalog import read_table, scan
from ccld.sinks.incarnation import SinkTokens
from ccld.sinks.layout import write_offsets
from ccld.sinks.parquet import file_path, metrics_table, write_atomic
from factories import make_kernel_record

A, B = "id-" + "a" * 32, "id-" + "b" * 32


class Ids:
    """What the broker says a topic's incarnation is (``""``: no topic ids; missing: no answer)."""

    def __init__(self, label: str | None) -> None:
        self.label = label

    def labels(self, topics: Sequence[str], timeout_s: float) -> dict[str, str]:
        return {} if self.label is None else dict.fromkeys(topics, self.label)


class Commits:
    """The consumer's commit, recorded."""

    def __init__(self) -> None:
        self.offsets: list[tuple[str, int, int]] = []

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        self.offsets += [(tp.topic, tp.partition, tp.offset) for tp in offsets]


def archiver(root: Path, ids: Ids) -> tuple[Archiver, Settings]:
    # Every buffer is due at once (one row is a full file): flushed as while running, not as when stopping.
    s = Settings.load({}, bootstrap="127.0.0.1:1", archive_dir=str(root), sink_max_rows=1)
    arch = Archiver(s)
    arch._ids = ids
    return arch, s


def take(arch: Archiver, consumer: Commits, topic: str, offsets: range, job: str, ts_ms: int = 1_000) -> None:
    for o in offsets:
        b = KernelBatch.from_records([make_kernel_record(op_seq=o, job=job)])
        arch._take(consumer, topic, 0, o, ts_ms, encode_batch(b))


def rows(root: Path) -> set[tuple[str, str, int]]:
    """(folder, job, offset) of every archived row."""
    out = set()
    for f in scan(root):
        t = read_table(f, columns=["job", "offset"])
        out |= {(f.incarnation, j, o) for j, o in zip(t["job"].to_pylist(), t["offset"].to_pylist(), strict=True)}
    return out


def test_a_recreated_topic_gets_a_folder_of_its_own_and_the_old_rows_stay(tmp_path: Path) -> None:
    ids = Ids(A)
    arch, s = archiver(tmp_path, ids)
    c, m = Commits(), s.metrics_topic
    take(arch, c, m, range(0, 3), "old")
    arch._flush_all(c, force=False)
    take(arch, c, m, range(3, 5), "old")  # fetched, not yet written, when the topic is recreated
    ids.label = B
    take(arch, c, m, range(0, 2), "new")  # offsets went back: the old buffer is written under A first
    arch._flush_all(c, force=False)
    assert rows(tmp_path) == {(A, "old", o) for o in range(5)} | {(B, "new", o) for o in range(2)}
    # The old incarnation's last offsets are not committed to the new incarnation's group.
    assert c.offsets == [(m, 0, 3), (m, 0, 2)]
    assert arch.counters["offset_resets"] == 1
    assert "2 topic incarnations" in summarize(tmp_path, s.verdicts_topic)


def test_a_file_waiting_while_the_topic_was_recreated_is_kept_and_not_committed(tmp_path: Path) -> None:
    ids = Ids(A)
    arch, s = archiver(tmp_path, ids)
    c = Commits()
    take(arch, c, s.metrics_topic, range(0, 4), "old")
    ids.label = B  # recreated before the flush, the offsets not (yet) gone back
    arch._flush_all(c, force=False)
    assert rows(tmp_path) == {(A, "old", o) for o in range(4)} and c.offsets == []


def test_a_replay_of_the_same_incarnation_rewrites_its_files(tmp_path: Path) -> None:
    arch, s = archiver(tmp_path, Ids(A))
    c, m = Commits(), s.metrics_topic
    take(arch, c, m, range(0, 3), "job")
    arch._flush_all(c, force=False)
    take(arch, c, m, range(3, 6), "job")
    # Written, then killed before this commit landed:
    arch._flush_all(c, force=False)
    again, _ = archiver(tmp_path, Ids(A))  # restarted: re-reads from offset 3
    take(again, c, m, range(3, 6), "job")
    again._flush_all(c, force=False)
    files = scan(tmp_path)
    assert [(f.incarnation, f.start_offset, f.rows) for f in files] == [(A, 0, 3), (A, 3, 3)]


def test_the_old_layout_stays_readable_and_is_counted(tmp_path: Path) -> None:
    b = KernelBatch.from_records([make_kernel_record(op_seq=i) for i in range(5)])
    write_atomic(metrics_table([(0, 1, b)]), file_path(tmp_path, "m", 0, 0), 0)  # written before incarnations
    write_atomic(metrics_table([(0, 2, b), (1, 2, b)]), file_path(tmp_path, "m", 0, 0, A), 1)
    files = scan(tmp_path)
    assert [(f.incarnation, f.rows) for f in files] == [("", 5), (A, 10)]
    text = summarize(tmp_path, "v")
    assert "2 files, 15 rows" in text and "2 topic incarnations" in text, text
    assert "before incarnations were kept: 1 files, 5 rows" in text, text


def test_without_topic_ids_the_sink_tells_incarnations_apart_by_what_it_archived(tmp_path: Path) -> None:
    tokens = SinkTokens(tmp_path)
    first = tokens.label("m", 0, 0, 1_000)
    b = KernelBatch.from_records([make_kernel_record()])
    write_offsets(tmp_path, "m", 0, first, 0, 1, metrics_table([(0, 1_000, b), (1, 1_001, b)]))
    assert tokens.label("m", 0, 1, 1_001) == first, "a replay of the same messages is the same incarnation"
    assert tokens.label("m", 0, 2, 5_000) == first, "nothing archived at that offset: nothing to tell apart"
    second = tokens.label("m", 0, 0, 9_999)
    assert second != first and second.startswith("sink-")
    assert tokens.label("m", 0, 0, 9_999) == second


def test_a_broker_without_topic_ids_gets_sink_tokens(tmp_path: Path) -> None:
    ids = Ids("")
    arch, s = archiver(tmp_path, ids)
    c, m = Commits(), s.metrics_topic
    take(arch, c, m, range(0, 3), "old", ts_ms=1_000)
    arch._flush_all(c, force=False)
    again, _ = archiver(tmp_path, ids)  # restarted against a recreated topic: other messages at the same offsets
    take(again, c, m, range(0, 2), "new", ts_ms=2_000)
    again._flush_all(c, force=False)
    got = rows(tmp_path)
    assert {(j, o) for _, j, o in got} == {("old", 0), ("old", 1), ("old", 2), ("new", 0), ("new", 1)}
    assert len({inc for inc, _, _ in got}) == 2 and all(inc.startswith("sink-") for inc, _, _ in got)
