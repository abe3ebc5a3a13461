"""Rank lists as people read them: ``0-3,8,10-11`` (one helper for the status, the reports and the verdicts)."""

from __future__ import annotations

from collections.abc import Iterable


def rank_ranges(ranks: Iterable[int], *, min_run: int = 2) -> str:
    """Sorted, each run of at least ``min_run`` consecutive ranks as ``a-b``: ``[0, 1, 2, 5]`` -> ``0-2,5``.

    ``min_run=3`` keeps pairs apart (``7,8``), as a page that names single ranks often reads better."""
    rs = sorted(set(ranks))
    out: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(f"{rs[i]}-{rs[j]}" if j - i + 1 >= max(min_run, 2) else ",".join(map(str, rs[i : j + 1])))
        i = j + 1
    return ",".join(out)
