"""The torch.distributed wrappers on a real one-rank gloo group (in process, no subprocess)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'ccl-d[torch]')")
dist = pytest.importorskip("torch.distributed")

from ccld.identity import comm_hash, p2p_hash  # noqa: E402
from ccld.producers.attach import attach, current, detach  # noqa: E402
from ccld.producers.attach.outlets import ListSink  # noqa: E402
from ccld.records import DType, KernelRecord, OpType, Status  # noqa: E402
from ccld.settings import Settings  # noqa: E402

pytestmark = pytest.mark.torch
c10d = dist.distributed_c10d


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def sink(world: None) -> Iterator[ListSink]:
    sink = ListSink()
    # every op's DONE record (the per-call format): these tests check how each call is identified
    att = attach(Settings.load({}, job="unit"), sink=sink, heartbeat_s=0.05, markers=False, detail="all")
    att.tracker.tick_s = 0.01
    yield sink
    detach()


def done(sink: ListSink) -> list[KernelRecord]:
    att = current()
    assert att is not None
    att.flush()
    return [r for r in sink.records if r.status is Status.DONE]


@pytest.mark.filterwarnings("ignore:`torch.distributed.*` is deprecated:FutureWarning")
def test_collectives_become_records_with_trace_ids(sink: ListSink) -> None:
    t = torch.ones(8)
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.reduce(t, dst=0)
    dist.all_gather([torch.zeros(8)], t)
    dist.all_gather_into_tensor(torch.zeros(8), t)
    dist.reduce_scatter_tensor(torch.zeros(8), torch.ones(8))
    dist.all_to_all_single(torch.zeros(8), t)
    dist.barrier()
    dist.all_reduce(torch.ones(3, dtype=torch.bfloat16))
    recs = done(sink)
    ops = [r.op_type for r in recs]
    assert ops == [
        OpType.ALL_REDUCE, OpType.BROADCAST, OpType.REDUCE, OpType.ALL_GATHER, OpType.ALL_GATHER,
        OpType.REDUCE_SCATTER, OpType.ALL_TO_ALL, OpType.BARRIER, OpType.ALL_REDUCE,
    ]  # fmt: skip
    # one record per user call (all_gather_into_tensor calls all_gather_single inside)
    assert [r.op_seq for r in recs] == list(range(9))
    world_hash = comm_hash([0], dist.group.WORLD.group_name)
    assert {r.comm_hash for r in recs} == {world_hash}
    assert recs[1].peer == 0 and recs[2].peer == 0 and recs[0].peer == -1
    assert recs[-1].dtype is DType.BFLOAT16 and recs[-1].count == 3
    assert all(r.t_exit_ns >= r.t_enter_ns >= 0 and r.rank == 0 and r.comm_size == 1 for r in recs)


def test_async_ops_complete_on_wait_and_on_is_completed(sink: ListSink) -> None:
    t = torch.ones(4)
    w1 = dist.all_reduce(t, async_op=True)
    w1.wait()
    w2 = dist.broadcast(t, src=0, async_op=True)
    while not w2.is_completed():
        pass
    recs = done(sink)
    assert [r.op_type for r in recs] == [OpType.ALL_REDUCE, OpType.BROADCAST]


class _FakeGroup:
    """A stand-in group (held weakly, like a real one)."""


def test_p2p_goes_to_a_directional_channel_and_batches_count_each_op(sink: ListSink) -> None:
    # gloo cannot send to itself, so the identification runs on a fake two-rank group
    from types import SimpleNamespace

    from ccld.producers.attach.torch_hooks import P2P, GroupState

    att = current()
    assert att is not None
    dist.barrier()  # a real call first: it tells the attachment who this process is
    hooks = att.hooks
    pg = _FakeGroup()
    ghash = comm_hash([3, 5], "7")
    hooks._groups[id(pg)] = GroupState(weakref.ref(pg), ghash, (3, 5), 0, 2, {3: 0, 5: 1})
    a = torch.ones(5)
    started = [
        hooks._begin_p2p(P2P["isend"], (a, 5, pg), {}),
        hooks._begin_p2p(P2P["send"], (a,), {"group": pg, "group_dst": 1}),
        hooks._begin_p2p(P2P["irecv"], (a, 5, pg), {}),
        hooks._begin_p2p(P2P["recv"], (a, None, pg), {}),  # any source: not identifiable
        hooks._begin_batch(([SimpleNamespace(op=dist.isend, group=pg, group_peer=1, tensor=a)],), {}),
    ]
    assert started[3] is None and att.tracker.stats.unobserved == 1
    calls = [c for s in started if s for c in s[0]]
    for c in calls:
        att.tracker.exit(c)
    recs = done(sink)
    sends = [r for r in recs if r.op_type is OpType.SEND]
    recvs = [r for r in recs if r.op_type is OpType.RECV]
    assert {r.comm_hash for r in sends} == {p2p_hash(ghash, 3, 5)}
    assert {r.comm_hash for r in recvs} == {p2p_hash(ghash, 5, 3)}
    assert [r.op_seq for r in sends] == [0, 1, 2] and [r.op_seq for r in recvs] == [0]
    assert all(r.comm_rank == 0 and r.peer == 1 for r in sends)
    assert all(r.comm_rank == 1 and r.peer == 0 for r in recvs)
    assert all(r.comm_size == 2 and r.count == 5 for r in sends + recvs)
    assert [s[1] for s in started if s] == [True, False, True, True]  # async flags


def test_subgroups_have_their_own_hash_and_sequence(sink: ListSink) -> None:
    g = dist.new_group([0])
    dist.all_reduce(torch.ones(2), group=g)
    dist.all_reduce(torch.ones(2))
    recs = done(sink)
    assert recs[0].comm_hash == comm_hash([0], g.group_name) != recs[1].comm_hash
    assert recs[0].op_seq == 0


def test_a_destroyed_group_is_not_kept_alive_by_the_attachment(sink: ListSink) -> None:
    # destroy_process_group must really destroy: a group the attachment still holds dies at
    # interpreter exit instead, when gloo's threads can no longer take the GIL to free the
    # tensors of their last work (the job then aborts after it finished: seen in CI)
    att = current()
    assert att is not None and att.poller is not None  # the poller resolves groups by name too
    g = dist.new_group([0])
    dist.all_reduce(torch.ones(2, dtype=torch.int32), group=g)
    att.poller.poll_once()
    assert any(r.comm_hash == comm_hash([0], g.group_name) for r in done(sink))
    alive = weakref.ref(g)
    dist.destroy_process_group(g)
    del g
    gc.collect()
    assert alive() is None


def test_the_callers_exception_passes_unchanged(sink: ListSink) -> None:
    with pytest.raises(Exception) as info:
        dist.broadcast(torch.ones(2), src=7)
    assert "ccld" not in type(info.value).__module__
    assert len(done(sink)) == 1  # the failed call still ends its record


def test_our_failure_never_reaches_the_caller(sink: ListSink, monkeypatch: pytest.MonkeyPatch) -> None:
    att = current()
    assert att is not None

    def broken(group: Any) -> None:
        raise KeyError("internal")

    monkeypatch.setattr(att.hooks, "group_state", broken)
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [1.0, 1.0]
    assert att.tracker.stats.internal_errors == 1


def test_detach_restores_torch(world: None) -> None:
    original = dist.all_reduce
    attach(Settings.load({}), sink=ListSink(), markers=False)
    assert dist.all_reduce is not original and c10d.all_reduce is dist.all_reduce
    assert c10d.P2POp(dist.isend, torch.ones(1), 0).op is dist.isend
    stats = detach()
    assert dist.all_reduce is original and c10d.all_reduce is original
    assert stats["calls"] == 0 and detach() == {}


def test_a_forked_child_stays_silent(sink: ListSink) -> None:
    import os

    att = current()
    assert att is not None
    pid = os.fork()
    if pid == 0:  # a DataLoader-style worker: must not report as the parent's rank
        ok = current() is None and not att.hooks.enabled and att.tracker.inflight() == []
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert current() is att and att.hooks.enabled


def test_the_detail_mode_comes_from_the_argument_or_the_environment(world: None, monkeypatch: Any) -> None:
    from ccld.errors import ConfigError
    from ccld.producers.attach.session import ENV_DETAIL

    monkeypatch.setenv(ENV_DETAIL, "all")
    try:
        assert attach(Settings.load({}, job="unit"), sink=ListSink(), markers=False).tracker.detail == "all"
    finally:
        detach()
    try:
        att = attach(Settings.load({}, job="unit"), sink=ListSink(), markers=False, detail="sampled", interval_s=2.0)
        assert (att.tracker.detail, att.tracker.interval_s) == ("sampled", 2.0)
    finally:
        detach()
    monkeypatch.setenv(ENV_DETAIL, "every")
    with pytest.raises(ConfigError, match="detail"):
        attach(Settings.load({}, job="unit"), sink=ListSink(), markers=False)
    monkeypatch.delenv(ENV_DETAIL)
    try:
        assert attach(Settings.load({}, job="unit"), sink=ListSink(), markers=False).tracker.detail == "sampled"
    finally:
        detach()


def test_the_training_threads_time_in_the_hooks_is_counted_and_torchs_is_not(world: None) -> None:
    """With ``cost`` on, a hook body that sleeps a known time per call (5 ms: the group lookup, inside the
    identification before torch runs the call) is counted within 5 %, once per call; torch's own time
    in the call is not counted. Off (the default), nothing is measured."""
    import time

    att = attach(Settings.load({}, job="unit"), sink=ListSink(), markers=False, cost=True)
    try:
        slept = 0
        lookup = att.hooks.group_state

        def slow_lookup(group: Any) -> Any:
            nonlocal slept
            t0 = time.perf_counter_ns()
            time.sleep(0.005)
            slept += time.perf_counter_ns() - t0
            return lookup(group)

        att.hooks.group_state = slow_lookup  # type: ignore[method-assign]
        t = torch.ones(1 << 20)  # 4 MiB: torch's own time per call is not negligible
        for _ in range(40):
            dist.all_reduce(t)
        stats = att.stats()
    finally:
        detach()
    assert stats["hook_calls"] == 40, stats
    assert slept <= stats["hook_ns"] <= 1.05 * slept, (stats["hook_ns"], slept)
    assert stats["hook_max_ns"] >= 5_000_000 and stats["threads_cpu_ns"] > 0, stats
    att = attach(Settings.load({}, job="unit"), sink=ListSink(), markers=False)
    try:
        dist.all_reduce(torch.ones(8))
        assert "hook_ns" not in att.stats()
    finally:
        detach()


def test_the_attachments_threads_cpu_is_counted_and_the_training_threads_is_not() -> None:
    """A thread named as the attachment's that burns 50 ms of CPU adds them to ``attachment_cpu_ns``
    (within the kernel's accounting); the same work on an unnamed thread adds nothing."""
    import threading
    import time

    from ccld.producers.attach.cost import attachment_cpu_ns

    def burn(go: threading.Event, done: threading.Event) -> None:
        go.wait()
        t0 = time.thread_time_ns()
        while time.thread_time_ns() - t0 < 50_000_000:
            pass
        done.set()
        time.sleep(0.5)  # alive while it is measured

    for name, counted in (("ccld-test-burn", True), ("someone-else", False)):
        go, done = threading.Event(), threading.Event()
        th = threading.Thread(target=burn, args=(go, done), name=name, daemon=True)
        th.start()
        before = attachment_cpu_ns()
        go.set()
        done.wait(10)
        added = attachment_cpu_ns() - before
        assert (45_000_000 <= added <= 80_000_000) if counted else added < 10_000_000, (name, added)
        th.join()


def test_an_unnamed_job_takes_its_schedulers_identity_and_a_named_one_keeps_its_name(
        world: None, monkeypatch: Any) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "rdzv-9")
    for job, want in (("default", "torchelastic-rdzv-9"), ("mine", "mine")):
        sink = ListSink()
        att = attach(Settings.load({}, job=job), sink=sink, markers=False, detail="all")
        try:
            t = torch.ones(2)
            dist.all_reduce(t)
            att.flush()
            assert {r.job for r in sink.records} == {want}
        finally:
            detach()


def test_with_the_nccl_plugin_calls_nccl_runs_are_left_to_it(world: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ccld run --nccl-plugin``: the plugin reports what NCCL runs, so the hooks skip (and count) those calls and
    keep the rest; without the plugin they keep everything. The group here is gloo; NCCL's is told by its backend."""
    monkeypatch.setenv("CCLD_NCCL_PLUGIN", "1")
    sink = ListSink()
    att = attach(Settings.load({}, job="unit"), sink=sink, heartbeat_s=0.05, markers=False, detail="all", source="auto")
    try:
        assert att.source == "wrap" and att.hooks.defer_nccl  # Flight Recorder would see NCCL's ops again
        dist.all_reduce(torch.ones(2))  # gloo: kept
        real = c10d.get_backend
        monkeypatch.setattr(c10d, "get_backend", lambda group=None: "nccl")
        dist.all_reduce(torch.ones(2))  # NCCL's: left to the plugin
        dist.broadcast(torch.ones(2), src=0)
        monkeypatch.setattr(c10d, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")
        dist.all_reduce(torch.ones(2))  # a CPU tensor on a mixed group goes to gloo: kept
        monkeypatch.setattr(c10d, "get_backend", real)
        att.flush()
        kept = [r for r in sink.records if r.status is Status.DONE]
        assert [r.op_seq for r in kept] == [0, 1] and att.tracker.stats.deferred == 2
    finally:
        detach()
