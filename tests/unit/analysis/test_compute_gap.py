"""A rank's compute gap before an op (``JobState.gaps``): from where its previous op ended, as the source says
(``t_prev_exit_ns``) or as this analyzer saw it, whichever is later and still before the op's entry."""

from __future__ import annotations

import numpy as np

from ccld.streams.analysis.state import JobState

MS = 1_000_000  # ns


def gaps(js: JobState, rows: list[tuple[int, int, int, int]]) -> list[float]:
    """``rows``: (rank, enter ms, exit ms, previous exit ms or -1 unknown), one call -> the gaps in seconds."""
    a = np.asarray(rows, dtype=np.int64)
    prev = np.where(a[:, 3] >= 0, a[:, 3] * MS, -1)
    return js.gaps(a[:, 0], a[:, 1] * MS, a[:, 2] * MS, prev).round(3).tolist()


def test_without_the_source_s_word_the_previous_op_seen_is_the_one_before() -> None:
    js = JobState("j", 0)
    assert gaps(js, [(0, 10_000, 11_000, -1)]) == [0.0]  # a rank's first op: nothing before it
    assert gaps(js, [(0, 14_000, 15_000, -1), (1, 3_000, 4_000, -1)]) == [3.0, 0.0]


def test_the_source_s_previous_end_counts_when_that_op_has_not_arrived_yet() -> None:
    """Delivered unevenly, a rank's reduce_scatter comes before the recv it waited in (another message): the
    recv ended as the reduce_scatter began (28.303 s), the analyzer has seen only the op that ended at 27.6 s."""
    js = JobState("j", 0)
    gaps(js, [(5, 27_000, 27_600, -1)])
    assert gaps(js, [(5, 28_303, 28_500, 28_303)]) == [0.0]  # not 0.703 s of "compute" that was a wait
    assert gaps(js, [(5, 28_272, 28_303, 27_600)]) == [0.672]  # the recv, arriving after


def test_a_previous_end_older_than_an_op_seen_ending_before_the_entry_gives_way() -> None:
    """A source whose previous end is on another clock (a year before its entries) would make every gap a year
    long: an op the analyzer saw end before the entry, later than that, is the previous one."""
    js = JobState("j", 0)
    gaps(js, [(2, 100_000, 101_000, -1)])
    assert gaps(js, [(2, 103_000, 104_000, 1_000)]) == [2.0]  # told: ended at 1 s; seen: 101 s
    assert gaps(js, [(2, 106_000, 107_000, 105_000)]) == [1.0]  # told 105 s, after the 104 s seen
