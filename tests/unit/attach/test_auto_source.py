"""The default source ("auto") on gloo: the wrapper alone until the job issues collectives it cannot see.

A real one-rank gloo group in process. A collective issued on the process group object itself
(``pg.allreduce``) is what DDP's C++ reducer does: the wrapper never sees it, Flight Recorder does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'ccl-d[torch]')")
dist = pytest.importorskip("torch.distributed")

from ccld.producers.attach import attach, detach  # noqa: E402
from ccld.producers.attach.fr_poll import enqueued_total  # noqa: E402
from ccld.producers.attach.outlets import ListSink  # noqa: E402
from ccld.producers.attach.session import Attachment  # noqa: E402
from ccld.records import KernelRecord, OpType, Status  # noqa: E402
from ccld.settings import Settings  # noqa: E402

pytestmark = pytest.mark.torch

PY = 4  # elements of the script's own all_reduce
CPP = 7  # elements of the all-reduce issued on the process group directly (as DDP's reducer does)


@pytest.fixture
def world() -> Iterator[None]:  # a fresh group per test: Flight Recorder numbers its collectives from 1
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def auto(world: None) -> Iterator[tuple[Attachment, ListSink]]:
    sink = ListSink()
    att = attach(Settings.load({}, job="unit"), sink=sink, heartbeat_s=0.05, markers=False, detail="all",
                 source="auto", fr_poll_s=0.02)  # fmt: skip
    if att.poller is None:
        detach()
        pytest.skip("this torch has no live Flight Recorder dump")
    att.tracker.tick_s = 0.01
    yield att, sink
    detach()


def done(sink: ListSink) -> list[KernelRecord]:
    return [r for r in sink.records if r.status is Status.DONE]


def wait_for(cond: Any, timeout_s: float = 3.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return bool(cond())


def test_enqueued_total_sums_every_group_and_ignores_groups_without_collectives() -> None:
    status = (b'{"pg_status": {"0": {"last_completed_collective": "7", "last_enqueued_collective": "9"}, '
              b'"1": {"last_enqueued_collective": "-1"}, "2": {"last_enqueued_collective": 3}}}')  # fmt: skip
    assert enqueued_total(status) == 12
    assert enqueued_total("{}") == 0


def test_python_collectives_alone_never_turn_the_poller_on(auto: tuple[Attachment, ListSink]) -> None:
    att, sink = auto
    t = torch.ones(PY)
    for _ in range(5):
        dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.barrier()
    # counted, not recorded: gather/scatter (no op type), monitored_barrier (send/recv inside gloo)
    dist.gather(t, [torch.ones(PY)], dst=0)
    dist.scatter(t, [torch.ones(PY)], src=0)
    dist.monitored_barrier()
    time.sleep(0.15)  # several poll intervals: the poller thread only compares the counts
    st = att.stats()
    assert st["source"] == "wrap" and st["auto_switched"] == 0, st
    assert st["auto_checks"] >= 8 and st["auto_check_errors"] == 0, st
    assert st["fr_polls"] == 0, "a full Flight Recorder dump was read although the wrapper saw everything"
    stats = detach()
    assert stats["fr_polls"] == 0
    assert sorted(r.op_seq for r in done(sink)) == list(range(7))


def test_a_collective_issued_from_cpp_hands_collectives_to_the_poller_before_the_next_python_one(
    auto: tuple[Attachment, ListSink],
) -> None:
    att, sink = auto
    t, u = torch.ones(PY), torch.ones(CPP)
    pg = dist.distributed_c10d._get_default_group()
    for _ in range(3):
        dist.all_reduce(t)  # the wrapper's: op_seq 0, 1, 2
    assert att.stats()["source"] == "wrap"
    pg.allreduce([u]).wait()  # unseen by the wrapper: Flight Recorder's collective 4
    dist.all_reduce(t)  # the check before it switches: this one is the poller's (collective 5)
    st = att.stats()
    assert st["source"] == "both" and st["auto_switched"] == 1 and st["auto_invisible"] == 1, st
    stats = detach()  # the poller's last poll
    rows = done(sink)
    keys = sorted((r.op_seq, r.count) for r in rows)
    # one numbering, no hole, nothing twice: the wrapper's three, then Flight Recorder's two
    assert keys == [(0, PY), (1, PY), (2, PY), (3, CPP), (4, PY)], keys
    assert len({r.comm_hash for r in rows}) == 1
    assert stats["fr_wrapper_seen"] == 3 and stats["fr_poll_errors"] == stats["fr_bad_dumps"] == 0, stats


def test_ddp_with_no_python_collective_is_found_by_the_poller_thread(auto: tuple[Attachment, ListSink]) -> None:
    att, sink = auto
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))  # its constructor broadcasts (C++)
    for _ in range(3):
        model(torch.randn(2, 8)).pow(2).mean().backward()  # the reducer all-reduces the gradient bucket
    assert wait_for(lambda: att.stats()["source"] == "both"), att.stats()
    assert wait_for(lambda: att.stats()["fr_polls"] > 0)
    stats = detach()
    assert stats["auto_switched"] == 1 and stats["auto_invisible"] >= 1, stats  # as many as ran before the check
    buckets = [r for r in done(sink) if r.op_type is OpType.ALL_REDUCE and r.count == 36]  # 32 weights + 4 biases
    assert len(buckets) == 3, [(r.op_type, r.count, r.op_seq) for r in done(sink)]
    seqs = sorted(r.op_seq for r in done(sink))
    assert seqs == list(range(len(seqs))), seqs


def test_a_failing_check_is_counted_and_the_job_goes_on(
    auto: tuple[Attachment, ListSink], monkeypatch: pytest.MonkeyPatch
) -> None:
    att, sink = auto
    assert att.poller is not None

    def broken(*args: Any) -> Any:
        raise RuntimeError("not here")

    monkeypatch.setattr(att.poller, "dump", broken)  # the poller thread's check
    monkeypatch.setattr(dist.ProcessGroup, "_get_sequence_number_for_group", broken)  # the check before a call
    t = torch.ones(PY)
    for _ in range(4):
        dist.all_reduce(t)
    time.sleep(0.1)
    assert t.tolist() == [1.0] * PY
    st = att.stats()
    # the first failure before a call turns that check off (a backend without sequence numbers)
    assert st["source"] == "wrap" and st["auto_check_errors"] >= 2 and st["auto_switched"] == 0, st
    detach()
    assert sorted(r.op_seq for r in done(sink)) == list(range(4))


def test_explicit_wrap_never_watches(world: None) -> None:
    att = attach(Settings.load({}, job="unit"), sink=ListSink(), markers=False, source="wrap")
    try:
        dist.distributed_c10d._get_default_group().allreduce([torch.ones(CPP)]).wait()
        dist.all_reduce(torch.ones(PY))
        st = att.stats()
        assert att.poller is None and st["source"] == "wrap" and "auto_checks" not in st, st
    finally:
        detach()


def test_a_functional_collective_as_torch_compile_issues_it_is_seen(auto: tuple[Attachment, ListSink]) -> None:
    funcol = pytest.importorskip("torch.distributed._functional_collectives")
    att, sink = auto
    dist.all_reduce(torch.ones(PY))  # the wrapper's op_seq 0
    # compiled code calls the same C++ op (torch.ops._c10d_functional.all_reduce): no Python wrapper sees it
    out = funcol.all_reduce(torch.ones(CPP), "sum", dist.group.WORLD)
    assert out.tolist() == [1.0] * CPP
    assert wait_for(lambda: att.stats()["source"] == "both"), att.stats()
    detach()
    assert sorted((r.op_seq, r.count) for r in done(sink)) == [(0, PY), (1, CPP)]


def test_collectives_before_an_in_process_attach_are_history(world: None) -> None:
    pg = dist.distributed_c10d._get_default_group()
    for _ in range(3):
        dist.all_reduce(torch.ones(PY))
    pg.allreduce([torch.ones(CPP)]).wait()  # before the attachment: not an unseen collective of the job's
    att = attach(Settings.load({}, job="unit"), sink=ListSink(), markers=False, source="auto", fr_poll_s=0.02)
    try:
        for _ in range(2):
            dist.all_reduce(torch.ones(PY))
        time.sleep(0.1)
        st = att.stats()
        assert st["source"] == "wrap" and st.get("auto_switched") == 0, st
    finally:
        detach()
