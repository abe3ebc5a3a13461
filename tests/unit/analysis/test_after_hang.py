"""A slowdown of ranks that only waited in a hang is the hang's aftermath, not a page of its own.

A real 4-stage gloo pipeline whose third stage paused 20 s got its H1, and in about one run of ten also an S2
on the pair link 0->1 upstream of it or an S1 on the first stage at the next world all-reduce: both sides of
them waited out the stall, and it stays in their timings for a while (the pipeline refills, a window's ops
still hold the stalled ones). The incident book holds such a finding while the hang's incident is kept, and
opens it only if it outlasts that.
"""

from __future__ import annotations

from dataclasses import replace

from ccld.records import AnomalyKind, Link, VerdictState
from ccld.streams.analysis.incidents import HANG_SHADOW_S, Candidate, IncidentBook

HANG_AT = 100.0
REOPEN_S = 60.0


def hang() -> Candidate:
    return Candidate(kind=AnomalyKind.H1, job="j", incarnation=0, communicator="pp23", op_seq=120, op_type="recv",
                     root_cause_ranks=(2,), affected_ranks=(0, 1, 3), confidence=0.95, evidence="rank 2 stopped",
                     onset_time=HANG_AT, resolve_key=("hang", 120))


def slow(kind: AnomalyKind, ranks: tuple[int, ...], onset: float, job: str = "j") -> Candidate:
    return Candidate(kind=kind, job=job, incarnation=0, communicator=f"c{ranks}", op_seq=9, op_type="send",
                     root_cause_ranks=ranks, affected_ranks=(), confidence=1.0, evidence="slow", onset_time=onset,
                     link=Link(*ranks) if len(ranks) == 2 else None, resolve_key=("slow", 1))


def opened(book: IncidentBook, c: Candidate, now: float) -> bool:
    return [v.state for v in book.report(c, now)] == [VerdictState.OPEN]


def test_a_slowdown_of_the_ranks_that_waited_in_a_hang_is_held_while_it_stands_and_just_after() -> None:
    book = IncidentBook(100, 10.0, REOPEN_S)
    assert opened(book, hang(), HANG_AT + 5)
    assert not opened(book, slow(AnomalyKind.S2, (0, 1), HANG_AT + 4), HANG_AT + 12)  # the pair upstream of it
    book.resolve(hang().match_key, HANG_AT + 25, "rank 2 goes on")  # held for REOPEN_S, then resolved
    ended = HANG_AT + 25
    assert not opened(book, slow(AnomalyKind.S1, (0,), ended + 8), ended + 20)  # the first stage, just after
    # ... but not a slowdown that began long after it ended, of ranks it never held, of the hung rank, of
    # another job, or one that was on before it
    assert opened(book, slow(AnomalyKind.S1, (3,), ended + HANG_SHADOW_S + 5), ended + 40)
    assert opened(book, slow(AnomalyKind.S2, (4, 5), HANG_AT + 4), ended + 20)
    assert opened(book, slow(AnomalyKind.S2, (1, 2), HANG_AT + 4), ended + 20)
    assert opened(book, slow(AnomalyKind.S1, (0,), HANG_AT + 4, job="other"), ended + 20)
    assert opened(book, slow(AnomalyKind.S1, (0,), HANG_AT - 30), ended + 20)


def test_a_slowdown_that_outlasts_the_hangs_incident_opens_then() -> None:
    book = IncidentBook(100, 10.0, REOPEN_S)
    book.report(hang(), HANG_AT + 5)
    s2 = slow(AnomalyKind.S2, (0, 1), HANG_AT + 4)
    assert not opened(book, s2, HANG_AT + 12)
    book.resolve(hang().match_key, HANG_AT + 25, "rank 2 goes on")
    (res,) = book.expire(HANG_AT + 25 + REOPEN_S, "j", 0)
    assert res.state == VerdictState.RESOLVED and res.kind == AnomalyKind.H1
    assert opened(book, replace(s2, evidence="still slow"), HANG_AT + 26 + REOPEN_S)  # delayed, not lost
