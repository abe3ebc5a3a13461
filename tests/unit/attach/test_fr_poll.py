"""The Flight Recorder poller on hand-made FR JSON: mapping, dedupe, counters; and both sources on a real group."""

from __future__ import annotations

import gc
import json
import pickle
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

from ccld.identity import P2P_RECEIVER, P2P_SENDER, comm_hash, p2p_hash
from ccld.producers.attach.fr_poll import FrPoller, decode_held, parse_tail
from ccld.producers.attach.op_tracker import Identity, Tracker
from ccld.producers.attach.outlets import ListSink
from ccld.records import DType, KernelRecord, OpType, Status

MS = 1_000_000
#: the wall clock minus the tracker clock (FR writes wall-clock times)
OFFSET = 1_700_000_000_000 * MS


class Clock:
    def __init__(self) -> None:
        self.t = 1_000 * MS

    def __call__(self) -> int:
        return self.t

    def wall(self) -> int:
        return self.t + OFFSET


@dataclass
class Group:
    comm_hash: int
    ranks: tuple[int, ...]
    comm_rank: int
    size: int


WORLD = Group(comm_hash(range(4), "0"), (0, 1, 2, 3), 2, 4)
PAIR = Group(comm_hash((1, 2), "1"), (1, 2), 1, 2)
GROUPS = {"0": WORLD, "1": PAIR}


def entry(rid: int, seq: int, name: str = "gloo:all_reduce", *, pg: str = "0", pg_id: int | None = None,
          created_ms: float = 1_000.0, retired: bool = False, state: str = "scheduled", sizes: Any = None,
          dtype: str = "Float", p2p_seq: int = 0, is_p2p: bool = False, **extra: Any) -> dict[str, Any]:  # fmt: skip
    e = {
        "record_id": rid, "collective_seq_id": seq, "p2p_seq_id": p2p_seq, "is_p2p": is_p2p,
        "pg_id": int(pg) if pg_id is None else pg_id, "process_group": [pg, "default_pg" if pg == "0" else "x"],
        "profiling_name": name, "input_sizes": [[1024]] if sizes is None else sizes, "input_dtypes": [dtype],
        "output_sizes": [[1024]] if sizes is None else sizes, "output_dtypes": [dtype], "state": state,
        "retired": retired, "time_created_ns": int(created_ms * MS) + OFFSET,
        "time_discovered_started_ns": 0, "time_discovered_completed_ns": 0, "timeout_ms": 1800000,
    }  # fmt: skip
    e.update(extra)
    return e


def dump(entries: list[dict[str, Any]], status: dict[str, tuple[int, int]] | None = None,
         version: str = "2.10") -> str:  # fmt: skip
    pg_status = {k: {"last_enqueued_collective": str(enq), "last_started_collective": "-1",
                     "last_completed_collective": str(comp)} for k, (enq, comp) in (status or {}).items()}  # fmt: skip
    return json.dumps({"version": version, "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
                       "pg_status": pg_status, "entries": entries})  # fmt: skip


class Source:
    """The dump function: returns what the test set, records what it was asked."""

    def __init__(self) -> None:
        self.text: str | bytes = dump([])
        self.status_text: str = dump([])
        self.asked: list[tuple[bool, bool]] = []
        self.error: Exception | None = None

    def __call__(self, include_collectives: bool, only_active: bool) -> str | bytes:
        self.asked.append((include_collectives, only_active))
        if self.error is not None:
            raise self.error
        return self.text if include_collectives else self.status_text


Made = tuple[FrPoller, Tracker, ListSink, Clock, Source]


def make(*, p2p: bool = False, started_ms: float = 900.0, **kw: Any) -> Made:
    sink, clock, src = ListSink(), Clock(), Source()
    tr = Tracker(sink=sink, heartbeat_s=0.2, clock=clock)
    tr.identity = Identity(job="j", incarnation=0, rank=WORLD.ranks[WORLD.comm_rank], world_size=4, host="h")
    poller = FrPoller(tr, GROUPS.get, dump=src, p2p=p2p, wall_clock=clock.wall, **kw)
    poller._since_wall_ns = int(started_ms * MS) + OFFSET  # what start() sets, without the thread
    return poller, tr, sink, clock, src


def rows(sink: ListSink, status: Status | None = None) -> list[KernelRecord]:
    return [r for r in sink.records if status is None or r.status is status]


def test_a_finished_entry_becomes_one_done_row_with_the_wrappers_trace_id() -> None:
    poller, tr, sink, clock, src = make()
    clock.t = 1_100 * MS
    src.text = dump(
        [
            entry(0, 1, created_ms=1_010, retired=True),
            entry(1, 2, "gloo:broadcast", created_ms=1_020, retired=True, sizes=[[6]], dtype="Long"),
        ]
    )
    poller.poll_once()
    tr.pump()
    a, b = rows(sink)
    assert (a.status, a.comm_hash, a.op_seq, a.op_type, a.dtype, a.count) == (
        Status.DONE, WORLD.comm_hash, 0, OpType.ALL_REDUCE, DType.FLOAT32, 1024)  # fmt: skip
    assert (a.rank, a.comm_rank, a.comm_size, a.peer) == (2, 2, 4, -1)
    assert a.t_enter_ns == 1_010 * MS  # FR's own creation time, on the tracker's clock
    assert a.t_enter_ns < a.t_exit_ns <= 1_100 * MS
    assert (b.op_seq, b.op_type, b.dtype, b.count) == (1, OpType.BROADCAST, DType.INT64, 6)
    assert poller.stats.entered == poller.stats.exited == 2
    assert src.asked == [(True, True)]  # includeCollectives, onlyActive


def test_an_active_entry_is_shipped_in_flight_until_a_later_poll_sees_it_retired() -> None:
    poller, tr, sink, clock, src = make()
    clock.t = 1_100 * MS
    src.text = dump([entry(0, 1, created_ms=1_050)], {"0": (1, 0)})
    poller.poll_once()
    tr.pump()
    assert rows(sink) == []  # in flight for 50 ms: not yet worth a record (heartbeat 200 ms)
    for _ in range(3):
        clock.t += 250 * MS
        poller.poll_once()
        tr.pump()
    # in flight since 1,050 ms: shipped once at the first look past the heartbeat (1,350 ms), not
    # again in that interval; the communicator's state at the 2,000 ms boundary is not due yet
    [look] = rows(sink)
    assert (look.status, look.op_seq, look.t_sample_ns, look.t_exit_ns) == (Status.PROGRESS, 0, 1_350 * MS, -1)
    clock.t += 100 * MS  # 1,950 ms: done, discovered by this poll (the previous one was at 1,850)
    src.text = dump([entry(0, 1, created_ms=1_050, retired=True)], {"0": (1, 1)})
    poller.poll_once()
    tr.pump()
    done = rows(sink, Status.DONE)
    assert len(done) == 1 and done[0].t_enter_ns == 1_050 * MS
    assert done[0].t_exit_ns == 1_900 * MS  # between the last poll that saw it in flight and this one
    assert not tr.inflight()
    clock.t = 2_000 * MS  # the interval boundary: the communicator's newest state, idle after op 0
    tr.pump()
    assert [(r.status, r.op_seq, r.t_exit_ns) for r in rows(sink)[-1:]] == [(Status.IDLE, 0, 1_900 * MS)]


def test_an_entry_that_leaves_the_dump_finishes_only_when_pg_status_says_so() -> None:
    poller, tr, sink, clock, src = make()
    clock.t = 1_100 * MS
    src.text = dump([entry(0, 1, created_ms=1_050), entry(1, 2, created_ms=1_060)], {"0": (2, 0)})
    poller.poll_once()
    clock.t += 100 * MS
    src.text = dump([], {"0": (2, 1)})  # active-only: both gone, but only #1 is completed
    poller.poll_once()
    tr.pump()
    assert [r.op_seq for r in rows(sink, Status.DONE)] == [0]
    assert [c.op_seq for c in tr.inflight()] == [1]


def test_unknown_operation_names_are_counted_and_reported_not_dropped_silently(caplog: Any) -> None:
    poller, tr, sink, clock, src = make()
    clock.t = 1_100 * MS
    src.text = dump([
        entry(0, 1, "gloo:frobnicate", retired=True), entry(1, 2, "gloo:gather", retired=True),
        entry(2, 3, "gloo:frobnicate", retired=True), entry(3, 4, "nccl:_all_gather_base", retired=True),
    ])  # fmt: skip
    with caplog.at_level("WARNING"):
        poller.poll_once()
    tr.pump()
    assert [(r.op_seq, r.op_type) for r in rows(sink)] == [(3, OpType.ALL_GATHER)]
    assert poller.stats.unknown_ops == 3
    assert poller.stats.unknown_names == {"gloo:frobnicate": 2, "gather": 1}
    assert sum("frobnicate" in m for m in caplog.messages) == 1  # warned once per name


@pytest.mark.parametrize(
    "text",
    [b"{not json", "[]", dump([], version="1.0"), json.dumps({"version": "2.10", "entries": [{"record_id": 1}]})],
    ids=["not-json", "not-a-dict", "old-version", "entry-without-fields"],
)
def test_a_bad_dump_is_counted_and_nothing_is_emitted(text: str | bytes) -> None:
    poller, tr, sink, _clock, src = make()
    src.text = text
    poller.poll_once()
    tr.pump()
    assert poller.stats.bad_dumps == 1 and poller.stats.polls == 1
    assert sink.records == []


def test_an_exception_in_the_dump_is_counted_never_raised() -> None:
    poller, _tr, _sink, _clock, src = make()
    src.error = RuntimeError("recorder gone")
    poller.poll_once()
    assert poller.stats.poll_errors == 1


def test_entries_finished_before_the_poller_started_are_history() -> None:
    poller, tr, sink, clock, src = make(started_ms=1_000)
    clock.t = 1_100 * MS
    src.text = dump([entry(0, 1, created_ms=900, retired=True), entry(1, 2, created_ms=950),
                     entry(2, 3, created_ms=1_050, retired=True)], {"0": (3, 1)})  # fmt: skip
    poller.poll_once()
    tr.pump()
    assert poller.stats.preexisting == 1
    assert sorted((r.op_seq, r.status) for r in rows(sink)) == [(2, Status.DONE)]
    clock.t += 100 * MS  # #1 (created at 950 ms) has been in flight for the heartbeat: shipped
    tr.pump()
    assert sorted((r.op_seq, r.status) for r in rows(sink)) == [(1, Status.PROGRESS), (2, Status.DONE)]


def test_each_entry_is_entered_once_and_ring_buffer_gaps_are_counted() -> None:
    poller, tr, sink, clock, src = make()
    clock.t = 1_100 * MS
    src.text = dump([entry(0, 1, retired=True), entry(1, 2, retired=True)])
    poller.poll_once()
    poller.poll_once()  # the same dump again: nothing new
    src.text = dump([entry(1, 2, retired=True), entry(5, 6, retired=True)])  # 2, 3, 4 scrolled away
    poller.poll_once()
    tr.pump()
    assert [r.op_seq for r in rows(sink)] == [0, 1, 5]
    assert poller.stats.missed == 3


def test_p2p_entries_are_left_to_the_wrapper_when_it_runs() -> None:
    poller, tr, sink, clock, src = make(p2p=False)
    clock.t = 1_100 * MS
    src.text = dump([entry(0, 0, "nccl:send 1->0", pg="1", is_p2p=True, p2p_seq=1, retired=True)])
    poller.poll_once()
    tr.pump()
    assert sink.records == [] and poller.stats.p2p_skipped == 1


def test_p2p_entries_get_the_wrappers_channel_trace_ids_when_fr_is_the_only_source() -> None:
    poller, tr, sink, clock, src = make(p2p=True)
    clock.t = 1_100 * MS
    src.text = dump([  # on global rank 2 (local 1 of group "1" = [1, 2])
        entry(0, 0, "nccl:send 1->0", pg="1", is_p2p=True, p2p_seq=1, retired=True),
        entry(1, 0, "nccl:recv 1<-0", pg="1", is_p2p=True, p2p_seq=2, retired=True),
        entry(2, 0, "nccl:send 1->0", pg="1", is_p2p=True, p2p_seq=3, retired=True),
    ])  # fmt: skip
    poller.poll_once()
    tr.pump()
    got = [(r.comm_hash, r.op_seq, r.op_type, r.comm_rank, r.peer, r.comm_size) for r in rows(sink)]
    to1, from1 = p2p_hash(PAIR.comm_hash, 2, 1), p2p_hash(PAIR.comm_hash, 1, 2)
    assert got == [
        (to1, 0, OpType.SEND, P2P_SENDER, P2P_RECEIVER, 2), (from1, 0, OpType.RECV, P2P_RECEIVER, P2P_SENDER, 2),
        (to1, 1, OpType.SEND, P2P_SENDER, P2P_RECEIVER, 2),
    ]  # fmt: skip


def test_an_unknown_group_is_counted() -> None:
    poller, tr, sink, clock, src = make()
    src.text = dump([entry(0, 1, pg="7", retired=True)])
    clock.t = 1_100 * MS
    poller.poll_once()
    assert poller.stats.unresolved_groups == 1 and poller.stats.entered == 0


def test_open_calls_are_bounded() -> None:
    poller, tr, _sink, clock, src = make(open_max=2)
    clock.t = 1_100 * MS
    src.text = dump([entry(i, i + 1, created_ms=1_050) for i in range(5)], {"0": (5, 0)})
    poller.poll_once()
    assert len(poller._open) == 2 and poller.stats.untracked == 3


def test_tracker_enter_keeps_a_given_time() -> None:
    tr = Tracker(sink=ListSink(), clock=lambda: 5)
    assert tr.enter(1, 0, OpType.BARRIER, DType.FLOAT32, 1, -1, 0, 1, t_ns=3).t_enter_ns == 3
    assert tr.enter(1, 1, OpType.BARRIER, DType.FLOAT32, 1, -1, 0, 1).t_enter_ns == 5


def test_the_thread_polls_until_stopped_and_stretches_a_dear_poll() -> None:
    poller, _tr, _sink, _clock, src = make(interval_s=0.01, max_duty=0.05)
    real = src.__call__

    def slow(a: bool, b: bool) -> str | bytes:
        time.sleep(0.005)  # 5 ms a poll > 5 % of 10 ms: the next wait is 100 ms
        return real(a, b)

    poller.dump = slow
    poller.start()
    time.sleep(0.35)
    poller.stop()
    assert not any(t.name == "ccld-fr-poll" for t in threading.enumerate())
    # every polling-thread poll stretched the next wait; stop() polls once more, for the last operations
    assert 2 <= poller.stats.polls <= 7 and poller.stats.backoffs == poller.stats.polls - 1


def test_the_gate_holds_polls_back_and_can_end_the_thread() -> None:
    poller, _tr, _sink, _clock, _src = make(interval_s=0.01)
    answers = iter([None, None, True, False])
    poller.gate = lambda: next(answers)
    poller.start()
    deadline = time.monotonic() + 2
    while poller._thread is not None and poller._thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert poller.stats.polls == 1
    assert not poller._thread.is_alive()


def test_after_fork_the_child_forgets_the_thread_and_the_open_calls() -> None:
    poller, _tr, _sink, clock, src = make()
    clock.t = 1_100 * MS
    src.text = dump([entry(0, 1, created_ms=1_050)], {"0": (1, 0)})
    poller.poll_once()
    assert poller._open
    poller.after_fork_in_child()
    assert not poller._open and poller._stop.is_set() and poller._thread is None


# ---------------------------------------------------------------- a real one-rank gloo group
@pytest.mark.torch
def test_both_sources_on_a_real_group_number_every_collective_once() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'ccl-d[torch]')")
    dist = pytest.importorskip("torch.distributed")
    from ccld.producers.attach import attach, detach
    from ccld.settings import Settings

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sink = ListSink()
        attach(Settings.load({}, job="unit"), sink=sink, markers=False, source="both", fr_poll_s=0.02)
        pg = dist.distributed_c10d._get_default_group()
        t = torch.ones(4)
        dist.all_reduce(t)  # from Python: the wrapper leaves it to Flight Recorder
        pg.allreduce([t]).wait()  # as DDP's reducer calls it: only Flight Recorder sees it
        dist.all_reduce(t)
        dist.monitored_barrier()  # no Flight Recorder entry: counted as unobserved
        dist.broadcast(t, src=0)
        time.sleep(0.1)
        stats = detach()
    finally:
        dist.destroy_process_group()
    done = sorted((r for r in sink.records if r.status is Status.DONE), key=lambda r: r.t_enter_ns)
    # every collective once, numbered by Flight Recorder (monitored_barrier advances its counter
    # without an entry); the wrapper recorded none of them and counted the one FR cannot see
    assert [r.op_type for r in done] == [OpType.ALL_REDUCE] * 3 + [OpType.BROADCAST]
    seqs = [r.op_seq for r in done]
    assert seqs[:3] == [0, 1, 2] and seqs[3] > 2 and len(set(seqs)) == 4, seqs
    assert stats["fr_entered"] == 4 and stats["unobserved"] == 1 and stats["calls"] == 4, stats
    assert stats["fr_poll_errors"] == stats["fr_bad_dumps"] == 0, stats
    assert stats["fr_full_dump_failures"] == 0, stats  # full reads through torch's pickle dump (make_poller)


def test_each_exit_says_how_far_off_it_may_be() -> None:
    """Gloo writes no completion time: an exit is the midpoint of the window the op ended in, off by
    at most half of it (``t_exit_err_ns``); an exit Flight Recorder timed itself is exact."""
    poller, tr, sink, clock, src = make()
    clock.t = 1_100 * MS
    src.text = dump([
        entry(0, 1, created_ms=1_010, retired=True),  # done on first sight: ended in [1,010, 1,100] ms
        entry(1, 2, created_ms=1_020, retired=True, time_discovered_completed_ns=1_070 * MS + OFFSET),
        entry(2, 3, created_ms=1_030),
    ], {"0": (3, 2)})  # fmt: skip
    poller.poll_once()
    clock.t = 1_300 * MS  # the in-flight one retires: it ended in [1,100, 1,300] ms
    src.text = dump([entry(2, 3, created_ms=1_030, retired=True)], {"0": (3, 3)})
    poller.poll_once()
    tr.pump()
    got = {r.op_seq: (r.t_exit_ns, r.t_exit_err_ns) for r in rows(sink, Status.DONE)}
    assert got == {0: (1_055 * MS, 45 * MS), 1: (1_070 * MS, 0), 2: (1_200 * MS, 100 * MS)}


def test_status_reads_between_polls_narrow_an_exit_to_the_reads_that_saw_it_complete() -> None:
    """The status-only dump's completed counter, read every few ms, times a gloo exit that the full
    polls (stretched to hundreds of ms on a busy host) know only to half their interval."""
    poller, tr, sink, clock, src = make()
    clock.t = 1_100 * MS
    src.text = dump([entry(0, 1, created_ms=1_010), entry(1, 2, created_ms=1_020)], {"0": (2, 0)})
    poller.poll_once()  # both in flight
    for t_ms, completed in [(1_140, 0), (1_150, 0), (1_160, 1), (1_170, 1)]:
        clock.t = t_ms * MS
        src.status_text = dump([], {"0": (2, completed)})
        poller.read_status()
    clock.t = 1_300 * MS  # seq 1 completed between the reads at 1,150 and 1,160 ms; nothing read saw seq 2's
    src.text = dump([entry(0, 1, created_ms=1_010, retired=True), entry(1, 2, created_ms=1_020, retired=True)],
                    {"0": (2, 2)})  # fmt: skip
    poller.poll_once()
    tr.pump()
    got = {r.op_seq: (r.t_exit_ns, r.t_exit_err_ns) for r in rows(sink, Status.DONE)}
    assert got == {0: (1_155 * MS, 5 * MS), 1: (1_200 * MS, 100 * MS)}
    assert poller.stats.timed_exits == 1 and poller.stats.status_reads == 4


def test_the_thread_reads_the_status_between_full_polls() -> None:
    poller, _tr, _sink, _clock, src = make(interval_s=0.1, status_s=0.005)
    src.status_text = dump([], {"0": (3, 3)})
    poller.start()
    time.sleep(0.35)
    poller.stop()
    assert poller.stats.status_reads >= 5 * poller.stats.polls, poller.stats


def test_the_thread_leaves_out_full_polls_while_the_status_says_nothing_happened() -> None:
    poller, _tr, _sink, _clock, src = make(interval_s=0.01)
    src.status_text = dump([], {"0": (3, 3)})
    poller.start()
    time.sleep(0.2)
    first = poller.stats.polls
    assert first == 1 and poller.stats.quiet >= 5, poller.stats  # one full dump, then the status alone
    src.status_text = dump([], {"0": (4, 3)})  # a collective was enqueued: the next poll reads the ring
    time.sleep(0.1)
    poller.stop()
    assert poller.stats.polls >= first + 1
    assert src.asked.count((True, True)) == poller.stats.polls


def test_an_fr_only_poller_never_leaves_a_poll_out() -> None:
    # gloo's send/recv do not show in the status: the poller that records them reads the ring each time
    poller, _tr, _sink, _clock, _src = make(interval_s=0.01, p2p=True)
    poller.start()
    time.sleep(0.1)
    poller.stop()
    assert poller.stats.quiet == 0 and poller.stats.polls >= 3


def compact(text: str) -> str:
    """As torch writes the dump: no spaces."""
    return json.dumps(json.loads(text), separators=(",", ":"))


def test_parse_tail_reads_the_entries_from_the_cut_on_and_the_rest_of_the_dump() -> None:
    text = compact(dump([entry(i, i + 1, created_ms=1_000 + i) for i in range(6)], {"0": (6, 5)}))
    obj = parse_tail(text, 3)
    assert obj is not None
    full = json.loads(text)
    assert obj["entries"] == full["entries"][3:]
    assert {k: v for k, v in obj.items() if k != "entries"} == {k: v for k, v in full.items() if k != "entries"}
    assert parse_tail(text, 9) is None  # scrolled out, or not there yet: the caller parses it all
    assert parse_tail(text.replace('"record_id":3,', '"record_id": 3,'), 3) is None
    assert parse_tail(text[:-30], 3) is None  # cut short


def test_later_polls_parse_only_the_tail_and_record_the_same() -> None:
    made = [make(), make()]
    for n, (poller, tr, _sink, clock, src) in enumerate(made):
        clock.t = 1_100 * MS
        done = [entry(i, i + 1, created_ms=1_000 + i, retired=True) for i in range(4)]
        src.text = dump([*done, entry(4, 5, created_ms=1_004)])  # the last one still open
        if n:
            src.text = compact(str(src.text))
        poller.poll_once()
        clock.t = 1_200 * MS
        src.text = dump([entry(i, i + 1, created_ms=1_000 + i, retired=True) for i in range(8)],
                        {"0": (8, 8)})  # fmt: skip
        if n:
            src.text = compact(str(src.text))
        poller.poll_once()
        tr.pump()
    (p0, _, s0, _, _), (p1, _, s1, _, _) = made
    assert p0.stats.tail_reads == 0 and p1.stats.tail_reads == 1  # the first poll has no cut yet
    key = lambda r: (r.status, r.op_seq, r.t_enter_ns, r.t_exit_ns)  # noqa: E731
    assert sorted(map(key, s0.records)) == sorted(map(key, s1.records)) and len(rows(s1, Status.DONE)) == 8


def pickled_form(text: str) -> dict[str, Any]:
    """What torch's pickle dump gives for the JSON dump ``text``: tuples for groups, None for times not
    discovered, integers in the status (the types seen in a real gloo dump, torch 2.13)."""
    obj = json.loads(text)
    for e in obj["entries"]:
        e["process_group"] = tuple(e["process_group"])
        for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            e[k] = e[k] or None
    obj["pg_status"] = {k: {n: int(v) for n, v in st.items()} for k, st in obj["pg_status"].items()}
    return obj


def test_a_decoded_dump_records_what_the_json_dump_records() -> None:
    made = [make(), make()]
    for n, (poller, tr, _sink, clock, src) in enumerate(made):
        if n:
            poller.full_dump = lambda src=src: pickled_form(str(src.text))
        clock.t = 1_100 * MS
        src.text = dump([*(entry(i, i + 1, created_ms=1_000 + i, retired=True) for i in range(4)),
                         entry(4, 5, created_ms=1_004)], {"0": (5, 4)})  # fmt: skip
        poller.poll_once()
        clock.t = 1_200 * MS
        src.text = dump([entry(i, i + 1, created_ms=1_000 + i, retired=True) for i in range(8)], {"0": (8, 8)})
        poller.poll_once()
        tr.pump()
    (p0, _, s0, _, src0), (p1, _, s1, _, src1) = made
    key = lambda r: (r.status, r.op_seq, r.op_type, r.count, r.t_enter_ns, r.t_exit_ns, r.t_exit_err_ns)  # noqa: E731
    assert sorted(map(key, s1.records)) == sorted(map(key, s0.records))
    assert len(rows(s1, Status.DONE)) == 8
    assert (True, True) in src0.asked and (True, True) not in src1.asked  # the decoded one never read the JSON
    assert p1.stats.full_dump_failures == 0 and p1.full_dump is not None


@pytest.mark.parametrize("how", ["raises", "not a dump", "no version"])
def test_a_decoded_dump_that_fails_gives_way_to_the_json_for_good(how: str) -> None:
    poller, tr, sink, clock, src = make()
    calls = []

    def broken() -> Any:
        calls.append(1)
        if how == "raises":
            raise RuntimeError("no such dump in this torch")
        return [] if how == "not a dump" else {"entries": []}

    poller.full_dump = broken
    clock.t = 1_100 * MS
    src.text = dump([entry(0, 1, created_ms=1_010, retired=True)])
    poller.poll_once()
    src.text = dump([entry(i, i + 1, created_ms=1_010 + i, retired=True) for i in range(2)])
    poller.poll_once()
    tr.pump()
    assert [r.op_seq for r in rows(sink, Status.DONE)] == [0, 1]  # nothing lost to the failure
    assert calls == [1] and poller.full_dump is None and poller.stats.full_dump_failures == 1
    assert poller.stats.poll_errors == poller.stats.bad_dumps == 0


# ---------------------------------------------------------------- the ring's cadence (gloo)
def ring_poller(monkeypatch: pytest.MonkeyPatch, *, late: bool = False, **kw: Any) -> Made:
    """A thread over a ring of 8 whose dump keeps finished entries, as gloo's does: after its first
    full poll the status alone decides when the next is due. The fake dump costs microseconds, so a
    read would be "worth its cost" at once: unless ``late``, that trigger waits RING_WAIT_S (5 s)
    whatever the cost, out of the way of the one a test is about."""
    from ccld.producers.attach import fr_poll

    monkeypatch.setattr(fr_poll, "STALL_S", 0.1)
    if not late:
        monkeypatch.setattr(fr_poll, "LATE_DUTY", 1e-12)
    made = make(interval_s=0.01, status_s=0.005, ring=8, **kw)
    src = made[4]
    src.text = dump([entry(i, i + 1, created_ms=1_000 + i, retired=True) for i in range(4)], {"0": (4, 4)})
    src.status_text = dump([], {"0": (4, 4)})
    return made


def wait_for(cond: Any, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.005)
    return bool(cond())


def test_a_ring_that_keeps_finished_entries_is_read_again_once_it_has_refilled(monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:  # fmt: skip
    poller, _tr, _sink, _clock, src = ring_poller(monkeypatch)
    poller.start()
    try:
        assert wait_for(lambda: poller.stats.polls == 1) and poller._keeps_done is True
        for done in range(5, 10):  # 5 enqueued and done since, one at a time: under RING_FILL of the ring
            src.status_text = dump([], {"0": (done, done)})
            time.sleep(0.03)
        time.sleep(0.3)  # the counters stood still after moving, but nothing is in flight: no poll
        assert poller.stats.polls == 1, poller.stats
        src.status_text = dump([], {"0": (11, 11)})  # 7 since: RING_FILL of it, read it before it wraps
        assert wait_for(lambda: poller.stats.polls == 2), poller.stats
        time.sleep(0.1)
        assert poller.stats.polls == 2 and poller.stats.ring_reads == 1
        assert poller.stats.stall_reads == poller.stats.late_reads == 0
    finally:
        poller.stop()


def test_a_collective_in_flight_that_stops_moving_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    poller, _tr, _sink, _clock, src = ring_poller(monkeypatch)
    poller.start()
    try:
        assert wait_for(lambda: poller.stats.polls == 1)
        src.status_text = dump([], {"0": (5, 4)})  # one enqueued, not completed: a rank waits in it
        assert wait_for(lambda: poller.stats.polls == 2), poller.stats
        assert poller.stats.stall_reads == 1
        time.sleep(0.4)  # still stuck, and read already: nothing new to read
        assert poller.stats.polls == 2, poller.stats
    finally:
        poller.stop()


def test_records_never_wait_longer_than_the_ring_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    poller, _tr, _sink, _clock, src = ring_poller(monkeypatch)
    poller.start()
    try:
        assert wait_for(lambda: poller.stats.polls == 1)
        poller._ring_wait = 0.2
        src.status_text = dump([], {"0": (5, 5)})  # one collective since, done: only the clock reads it
        time.sleep(0.1)
        assert poller.stats.polls == 1
        assert wait_for(lambda: poller.stats.polls == 2), poller.stats
        assert poller.stats.late_reads == 1 and poller.stats.ring_reads == 0
    finally:
        poller.stop()


def test_a_cheap_ring_is_read_soon_after_its_first_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # the first read's cost sets the wait of the first ring-driven one: a small ring costs microseconds,
    # so records do not wait RING_WAIT_S (a rank stopped then would never send them)
    poller, _tr, _sink, _clock, src = ring_poller(monkeypatch, late=True)
    poller.start()
    try:
        assert wait_for(lambda: poller.stats.polls == 1)
        src.status_text = dump([], {"0": (5, 5)})  # one collective since, done: far from a refill, none in flight
        assert wait_for(lambda: poller.stats.polls == 2, timeout_s=1.0), poller.stats
        assert poller.stats.late_reads == 1 and poller.stats.ring_reads == poller.stats.stall_reads == 0
    finally:
        poller.stop()


def test_an_active_only_dump_keeps_the_clocks_cadence(monkeypatch: pytest.MonkeyPatch) -> None:
    # NCCL's active-only dump drops finished entries: only a poll every interval sees short ops
    poller, _tr, _sink, _clock, src = ring_poller(monkeypatch)
    src.text = dump([entry(i, i + 1, created_ms=1_000 + i) for i in range(4)], {"0": (4, 0)})
    poller.start()
    try:
        for n in range(5, 10):  # a collective every few ms
            src.status_text = dump([], {"0": (n, 0)})
            time.sleep(0.03)
        assert poller._keeps_done is False and poller.stats.polls >= 3, poller.stats
        assert poller.stats.ring_reads == poller.stats.stall_reads == poller.stats.late_reads == 0
    finally:
        poller.stop()


def test_the_ring_size_comes_from_the_jobs_environment() -> None:
    from ccld.producers.attach.fr_poll import DEFAULT_RING, ring_size

    assert ring_size({"TORCH_FR_BUFFER_SIZE": "500"}) == 500
    assert ring_size({"TORCH_NCCL_TRACE_BUFFER_SIZE": " 64 "}) == 64
    assert ring_size({}) == ring_size({"TORCH_FR_BUFFER_SIZE": "x"}) == ring_size({"TORCH_FR_BUFFER_SIZE": "0"})
    assert ring_size({}) == DEFAULT_RING


def test_a_flush_reads_what_the_ring_holds_now_without_waiting_for_its_cadence(monkeypatch: pytest.MonkeyPatch
                                                                             ) -> None:  # fmt: skip
    poller, tr, sink, clock, src = ring_poller(monkeypatch)
    poller._since_wall_ns = 0  # every entry is new to this poller
    poller.start()
    try:
        assert wait_for(lambda: poller.stats.polls == 1)
        src.text = dump([entry(i, i + 1, created_ms=1_000 + i, retired=True) for i in range(6)], {"0": (6, 6)})
        src.status_text = dump([], {"0": (6, 6)})  # two more: far from a refill, and no clock read due
        time.sleep(0.1)
        assert poller.stats.polls == 1
        poller.poll_now()
        tr.pump()
        assert sorted(r.op_seq for r in rows(sink, Status.DONE)) == list(range(6))
    finally:
        poller.stop()


def test_an_exit_finds_its_window_among_hundreds_of_status_reads() -> None:
    """A ring read seconds apart meets hundreds of completion windows: each exit is timed by its own."""
    poller, tr, sink, clock, src = make()
    tr.detail = "all"  # a DONE record for every op
    n = 600
    clock.t = 1_000 * MS
    src.text = dump([entry(i, i + 1, created_ms=1_000) for i in range(n)], {"0": (n, 0)})
    poller.poll_once()  # all in flight
    for k in range(n):  # a status read every ms; collective k + 1 completes by read k
        clock.t = (1_001 + k) * MS
        src.status_text = dump([], {"0": (n, k + 1)})
        poller.read_status()
    clock.t = 2_000 * MS
    src.text = dump([entry(i, i + 1, created_ms=1_000, retired=True) for i in range(n)], {"0": (n, n)})
    poller.poll_once()
    tr.pump()
    got = {r.op_seq: (r.t_exit_ns, r.t_exit_err_ns) for r in rows(sink, Status.DONE)}
    # collective s ended between the reads at 999 + s and 1,000 + s ms (the first read only starts the count)
    for s in (2, 100, 350, 599, n):
        assert got[s - 1] == ((999 + s) * MS + MS // 2, MS // 2), (s, got[s - 1])
    assert poller.stats.timed_exits == n - 1


def test_status_reads_slow_down_while_nothing_moves_and_tighten_when_a_collective_comes() -> None:
    """Each read wakes the thread and takes the GIL from the training thread twice: while the job
    computes with nothing in flight there is no exit to time, so the reads come IDLE_STATUS_FACTOR
    times further apart; they tighten at the read that sees the counters move."""
    from ccld.producers.attach import fr_poll

    poller, _tr, _sink, _clock, src = make(interval_s=1.0, status_s=0.05)
    src.status_text = dump([], {"0": (3, 3)})
    waits = []
    for _ in range(3):
        status = poller.read_status()
        now = time.monotonic()
        poller._note_moved(status, now)
        waits.append(poller._status_wait(status, now))
    assert waits[0] == 0.05  # it moved (first seen) at this read
    time.sleep(0.03)  # over half a read's wait later: idle, nothing in flight
    status = poller.read_status()
    poller._note_moved(status, time.monotonic())
    assert poller._status_wait(status, time.monotonic()) == 0.05 * fr_poll.IDLE_STATUS_FACTOR
    src.status_text = dump([], {"0": (4, 3)})  # a collective was enqueued
    status = poller.read_status()
    now = time.monotonic()
    poller._note_moved(status, now)
    assert poller._status_wait(status, now) == 0.05
    time.sleep(0.03)  # in flight, not moving for less than STALL_S: its exit is what the reads time
    status = poller.read_status()
    assert poller._status_wait(status, time.monotonic()) == 0.05
    assert poller._status_wait(None, time.monotonic()) == 0.05  # unreadable: as if moving


def test_a_status_read_again_unchanged_moves_the_start_of_the_next_exit_window() -> None:
    """The same status read twice is not parsed again, but the later read still bounds the window of
    the collective that completes after it."""
    poller, tr, sink, clock, src = make()
    clock.t = 1_100 * MS
    src.text = dump([entry(0, 1, created_ms=1_010)], {"0": (1, 0)})
    poller.poll_once()  # in flight
    for t_ms, completed in [(1_140, 0), (1_180, 0), (1_190, 1)]:
        clock.t = t_ms * MS
        src.status_text = dump([], {"0": (1, completed)})
        poller.read_status()
    clock.t = 1_300 * MS
    src.text = dump([entry(0, 1, created_ms=1_010, retired=True)], {"0": (1, 1)})
    poller.poll_once()
    tr.pump()
    got = {r.op_seq: (r.t_exit_ns, r.t_exit_err_ns) for r in rows(sink, Status.DONE)}
    assert got == {0: (1_185 * MS, 5 * MS)}  # between the reads at 1,180 and 1,190 ms, not 1,140


def test_a_poll_reads_only_the_entries_after_the_newest_seen_and_all_when_ids_do_not_count_up() -> None:
    poller, tr, _sink, clock, src = make()
    clock.t = 1_100 * MS
    src.text = dump([entry(i, i + 1, created_ms=1_001 + i, retired=True) for i in range(6)], {"0": (6, 6)})
    poller.poll_once()
    assert poller.stats.entered == 6
    ring = [entry(i, i + 1, created_ms=1_001 + i, retired=True) for i in range(4, 10)]
    assert poller._first_needed(ring) == 1  # record id 5, the newest seen: the one before it is not read
    src.text = dump(ring, {"0": (10, 10)})
    poller.poll_once()
    gapped = [entry(i, i + 1, created_ms=1_001 + i, retired=True) for i in (7, 8, 20, 21)]
    assert poller._first_needed(gapped) == 0  # not one id after another: every entry is looked at
    assert poller.stats.entered == tr.stats.calls == 10 and poller.stats.missed == 0


def test_a_ring_filled_in_bursts_is_read_before_the_next_burst_would_overrun_it(monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:  # fmt: skip
    """A step's collectives can all come between two status reads (500 in 35 ms after 900 ms of compute):
    once a burst that large would not fit in what is left of the ring, the ring is read, not at
    RING_FILL, which the next burst would overrun."""
    poller, _tr, _sink, _clock, src = ring_poller(monkeypatch)
    poller.start()
    try:
        assert wait_for(lambda: poller.stats.polls == 1) and poller._keeps_done is True
        src.status_text = dump([], {"0": (7, 7)})  # 3 at once since the last full read (ring of 8)
        time.sleep(0.2)
        assert poller.stats.polls == 1 and poller._fill_at() == 8 - 1.25 * 3  # another 3 fit
        src.status_text = dump([], {"0": (10, 10)})  # 6 since: under RING_FILL (6.8), but a third burst
        assert wait_for(lambda: poller.stats.polls == 2), poller.stats  # would overrun the ring
        assert poller.stats.ring_reads == 1 and poller.stats.late_reads == 0
    finally:
        poller.stop()


def test_the_first_read_of_a_ring_that_keeps_finished_entries_puts_the_next_on_the_rings_cadence(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The first read of gloo's ring is the dearest (the whole ring is new); the clock's wait stretched by
    its cost (seconds) would let a fast job overrun the ring before the next read."""
    poller, _tr, _sink, _clock, src = ring_poller(monkeypatch)
    real = poller.dump

    def dear(include_collectives: bool, only_active: bool) -> str | bytes:
        if include_collectives:
            time.sleep(0.06)  # stretched by the 2 % duty cap: 3 s
        return real(include_collectives, only_active)

    poller.dump = dear
    poller.start()
    try:
        assert wait_for(lambda: poller.stats.polls == 1) and poller._keeps_done is True
        src.status_text = dump([], {"0": (11, 11)})  # 7 since: RING_FILL of the ring of 8
        assert wait_for(lambda: poller.stats.polls == 2, timeout_s=1.5), poller.stats
        assert poller.stats.ring_reads == 1
    finally:
        poller.stop()


class _Collections:
    """Counts the cyclic collector's runs (any thread) inside the decodes it wraps (``counted``): not
    the young collection that may follow a decode, which finds its objects alive or gone as it may."""

    def __init__(self) -> None:
        self.total = 0
        self.runs: list[int] = []  # per decode

    def _seen(self, phase: str, _info: dict[str, Any]) -> None:
        self.total += phase == "start"

    def counted(self, decode: Any) -> Any:
        def run(raw: Any) -> Any:
            gc.callbacks.append(self._seen)
            before = self.total
            try:
                return decode(raw)
            finally:
                self.runs.append(self.total - before)  # before the callback goes: no list grows uncounted
                gc.callbacks.remove(self._seen)

        return run


def _ring_like(n: int) -> bytes:
    """A pickle shaped like torch's decoded ring: n entry dicts, each holding lists (tracked containers)."""
    return pickle.dumps([{"record_id": i, "process_group": ["0", "default"], "input_sizes": [[4, 4]],
                          "output_sizes": [[4, 4]], "input_dtypes": ["Float"], "profiling_name": "gloo:all_reduce"}
                         for i in range(n)])  # fmt: skip


#: since CPython 3.12 the collector runs only between bytecodes: a C decode never collects, held or not
_COLLECTS_IN_C = pytest.mark.skipif(sys.version_info >= (3, 12), reason="CPython 3.12+ never collects inside a C call")


@_COLLECTS_IN_C
def test_a_decoded_ring_sets_off_no_collection_and_the_collectors_settings_are_put_back() -> None:
    raw = _ring_like(20_000)
    before = gc.get_threshold()
    plain, held = _Collections(), _Collections()
    plain.counted(pickle.loads)(raw)
    entries = decode_held(held.counted(pickle.loads), raw)
    assert plain.runs[0] > 10, plain.runs  # the same decode with the collector on runs it (the test can fail)
    assert held.runs == [0] and len(entries) == 20_000
    assert gc.get_threshold() == before and gc.isenabled()


def test_the_collector_is_put_back_when_the_decode_raises_and_a_jobs_own_choice_is_kept() -> None:
    before = gc.get_threshold()
    with pytest.raises(ValueError):
        decode_held(json.loads, "{not json")
    assert gc.get_threshold() == before and gc.isenabled()
    gc.disable()  # a job's manual GC (Megatron's): the flag is the job's, never turned back on
    try:
        decode_held(pickle.loads, _ring_like(10))
        assert not gc.isenabled() and gc.get_threshold() == before
    finally:
        gc.enable()
    gc.set_threshold(0, *before[1:])  # a job that turned automatic collection off by its threshold
    try:
        decode_held(pickle.loads, _ring_like(10))
        assert gc.get_threshold() == (0, *before[1:])
    finally:
        gc.set_threshold(*before)


@_COLLECTS_IN_C
def test_the_live_pollers_full_read_of_torchs_ring_sets_off_no_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'ccl-d[torch]')")
    dist = pytest.importorskip("torch.distributed")
    from ccld.producers.attach import attach, detach, fr_poll
    from ccld.settings import Settings

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    before = gc.get_threshold()
    held, plain = _Collections(), _Collections()
    loads = pickle.loads
    try:
        att = attach(Settings.load({}, job="unit"), sink=ListSink(), markers=False, source="both", fr_poll_s=5.0)
        t = torch.ones(4)
        for _ in range(300):
            dist.all_reduce(t)
        poller = att.poller
        detach()  # the attachment's threads stopped: no collection of theirs lands in the counts
        assert poller is not None and poller.full_dump is not None
        gc.set_threshold(50, *before[1:])  # a young collection every 50 containers: several in a plain decode
        monkeypatch.setattr(fr_poll.pickle, "loads", held.counted(loads))
        _version, entries, _config, _status = fr_poll._checked(poller.full_dump())
        monkeypatch.setattr(fr_poll, "decode_held", lambda decode, raw: decode(raw))
        monkeypatch.setattr(fr_poll.pickle, "loads", plain.counted(loads))
        fr_poll._checked(poller.full_dump())
    finally:
        gc.set_threshold(*before)
        detach()
        dist.destroy_process_group()
    assert len(entries) >= 300
    assert plain.runs[0] > 5, plain.runs  # without the hold the same read collects (the test can fail)
    assert held.runs == [0], held.runs
