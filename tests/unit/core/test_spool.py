"""The on-disk spool: order, commit, bounds, torn frames, slots shared by processes (files only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccld.producers.spool import Spool, SpooledMessage


def msg(i: int, *, size: int = 10, written_s: float = 0.0) -> SpooledMessage:
    return SpooledMessage(key=f"k{i}".encode(), value=bytes([i % 256]) * size, partition=i % 3, records=i + 1,
                          timestamp_ms=None if i % 2 else 1000 + i, written_s=written_s)


def test_frames_come_back_in_order_with_every_field(tmp_path: Path) -> None:
    s = Spool(tmp_path, max_bytes=1 << 20, max_age_s=60)
    for i in range(5):
        assert s.append(msg(i, written_s=123.0))
    got = [m for _p, m in s.peek(10)]
    assert got == [msg(i, written_s=123.0) for i in range(5)]
    assert (s.pending_messages, s.pending_records) == (5, sum(range(1, 6)))


def test_commit_advances_the_head_and_drops_old_segments(tmp_path: Path) -> None:
    s = Spool(tmp_path, max_bytes=1 << 20, max_age_s=60, segment_bytes=4096)
    for i in range(40):  # ~ 40 x 1 KB: several segments
        assert s.append(msg(i, size=1000))
    first = s.peek(25)
    s.commit(first[-1][0], 25, sum(m.records for _p, m in first))
    assert [m.key for _p, m in s.peek(100)] == [f"k{i}".encode() for i in range(25, 40)]
    assert s.pending_messages == 15
    rest = s.peek(100)
    s.commit(rest[-1][0], 15, sum(m.records for _p, m in rest))
    assert s.pending_messages == 0 and s.pending_records == 0 and s.peek(5) == []
    assert len(list(s.dir.glob("*.seg"))) <= 1, "delivered segments were kept"
    assert s.append(msg(99)) and [m.key for _p, m in s.peek(5)] == [b"k99"]


def test_size_bound_refuses_instead_of_growing(tmp_path: Path) -> None:
    s = Spool(tmp_path, max_bytes=8192, max_age_s=60)
    results = [s.append(msg(i, size=1000)) for i in range(20)]
    assert results[:5] == [True] * 5 and not results[-1]
    assert s.bytes_used <= 8192 and s.pending_messages == sum(results)


def test_a_new_process_adopts_what_a_dead_one_left(tmp_path: Path) -> None:
    s = Spool(tmp_path, max_bytes=1 << 20, max_age_s=60)
    for i in range(3):
        s.append(msg(i))
    first = s.peek(1)
    s.commit(first[0][0], 1, first[0][1].records)
    s.close()  # the process ends with two messages undelivered
    again = Spool(tmp_path, max_bytes=1 << 20, max_age_s=60)
    assert again.dir == s.dir and again.recovered_records == 2 + 3
    assert [m.key for _p, m in again.peek(10)] == [b"k1", b"k2"]


def test_two_live_producers_get_separate_slots(tmp_path: Path) -> None:
    a = Spool(tmp_path, max_bytes=1 << 20, max_age_s=60)
    b = Spool(tmp_path, max_bytes=1 << 20, max_age_s=60)
    assert a.dir != b.dir
    a.append(msg(1))
    assert b.peek(5) == []


def test_a_torn_last_frame_is_skipped(tmp_path: Path) -> None:
    s = Spool(tmp_path, max_bytes=1 << 20, max_age_s=60)
    s.append(msg(1))
    s.append(msg(2))
    s.close()
    seg = next(s.dir.glob("*.seg"))
    seg.write_bytes(seg.read_bytes()[:-3])  # power loss in the middle of the second write
    again = Spool(tmp_path, max_bytes=1 << 20, max_age_s=60)
    assert [m.key for _p, m in again.peek(10)] == [b"k1"]


@pytest.mark.parametrize(("age", "stale"), [(10.0, False), (61.0, True)])
def test_age_bound(tmp_path: Path, age: float, stale: bool) -> None:
    s = Spool(tmp_path, max_bytes=1 << 20, max_age_s=60)
    assert s.is_stale(msg(1, written_s=1000.0), now_s=1000.0 + age) is stale


def test_order_holds_across_segments_partial_commits_and_a_restart(tmp_path: Path) -> None:
    s = Spool(tmp_path, max_bytes=1 << 20, max_age_s=60, segment_bytes=4096)
    for i in range(30):  # ~ 30 x 1 KB over about eight segments
        assert s.append(msg(i, size=1000))
    got: list[bytes] = []
    for chunk in (1, 4, 7):  # what the replay does: peek a group, commit it, peek the next
        group = s.peek(chunk)
        got += [m.key for _p, m in group]
        s.commit(group[-1][0], len(group), sum(m.records for _p, m in group))
    s.close()  # the rest is left to the next process, behind the new messages it spools
    again = Spool(tmp_path, max_bytes=1 << 20, max_age_s=60, segment_bytes=4096)
    for i in range(30, 35):
        assert again.append(msg(i, size=1000))
    got += [m.key for _p, m in again.peek(100)]
    assert got == [f"k{i}".encode() for i in range(35)]


def test_a_full_spool_refuses_exactly_the_newest(tmp_path: Path) -> None:
    frame = len(msg(0, size=1000).encode())
    s = Spool(tmp_path, max_bytes=6 * frame + frame // 2, max_age_s=60)
    results = [s.append(msg(i, size=1000)) for i in range(9)]
    assert results == [True] * 6 + [False] * 3
    assert [m.key for _p, m in s.peek(100)] == [f"k{i}".encode() for i in range(6)]
    # Room comes back a whole segment at a time (here 4,096 bytes: the smallest), once its frames are delivered.
    per_segment = 4096 // frame
    first = s.peek(per_segment)
    s.commit(first[-1][0], per_segment, sum(m.records for _p, m in first))
    assert s.append(msg(9, size=1000))
    assert [m.key for _p, m in s.peek(100)] == [f"k{i}".encode() for i in (*range(per_segment, 6), 9)]
