"""The outbox hands out each distinct verdict once: repeats are dropped, refinements are not."""

from __future__ import annotations

from collections import Counter

from ccld.records import AnomalyKind, Link, VerdictState
from ccld.streams.outbox import Outbox
from tests.factories import make_verdict


class _Box(Outbox):
    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self._init_outbox(None)


def test_a_refined_update_is_sent_and_a_repeat_is_not() -> None:
    box = _Box()
    s2 = make_verdict(state=VerdictState.UPDATE, kind=AnomalyKind.S2, op_seq=40, root_cause_ranks=(21,))
    linked = make_verdict(state=VerdictState.UPDATE, kind=AnomalyKind.S2, op_seq=40, root_cause_ranks=(21,),
                          link=Link(21, 22))
    s3 = make_verdict(state=VerdictState.UPDATE, kind=AnomalyKind.S3, op_seq=40, root_cause_ranks=(21,),
                      link=Link(21, 22))
    grown = make_verdict(state=VerdictState.UPDATE, kind=AnomalyKind.S3, op_seq=40, root_cause_ranks=(21,),
                         link=Link(21, 22), affected_ranks=(0, 1, 2))
    box.found([s2, linked, s3, s3, grown])
    # the same incident, op and culprit: naming the link and refining the class are news to a reader
    assert [v for v, _ in box.pending()] == [s2, linked, s3]
    assert box.counters["duplicate_verdicts"] == 2  # the repeat, and growth alone
    for v, _ in box.pending():
        box.mark_sent(v)
    box.found([s3])  # delivered twice (a restart): still once
    assert box.pending() == [] and box.counters["verdicts"] == 3


def test_the_verdicts_remembered_for_a_job_go_with_it_and_old_snapshots_still_restore() -> None:
    """A partition remembered the last 50,000 verdicts it sent whatever became of their jobs (735 KB of every
    snapshot once full); a forgotten job's go with it, the others' stay, through a snapshot too."""
    box = _Box()
    a = make_verdict(job="job-a", state=VerdictState.OPEN)
    b = make_verdict(job="job-b", incident_id="other", state=VerdictState.OPEN)
    box.found([a, b])
    for v, _ in box.pending():
        box.mark_sent(v)
    box.forget_job("job-a")
    box.found([a, b])  # job a's verdict is news again (its job was forgotten); job b's is still a repeat
    assert [v for v, _ in box.pending()] == [a] and box.counters["duplicate_verdicts"] == 1
    state = box.outbox_state()
    assert state["sent"] == [[b.dedupe_key, "job-b"]]
    restored = _Box()
    restored._init_outbox(state)
    restored.found([b])
    assert [v for v, _ in restored.pending()] == [a]  # b a repeat; a pending since before the snapshot
    old = _Box()
    old._init_outbox({"sent": [b.dedupe_key], "pending": []})  # a snapshot of keys alone: still a repeat
    old.found([b])
    assert old.pending() == []
