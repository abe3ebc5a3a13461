"""Flight Recorder's dump through torch's exported C++ function (fr_native): the binding's bytes, without the GIL."""

from __future__ import annotations

import bisect
import json
import os
import pickle
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ccld.producers.attach import fr_native
from ccld.producers.attach.outlets import ListSink

needs_x86_linux = pytest.mark.skipif(not fr_native.supported_platform(), reason="written for Linux on x86-64 only")


@pytest.fixture
def ring() -> Iterator[Any]:
    """A one-rank gloo group whose Flight Recorder ring (2,000 by default) is full; yields torch."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'ccl-d[torch]')")
    dist = pytest.importorskip("torch.distributed")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        pg = dist.distributed_c10d._get_default_group()
        t = torch.ones(4)
        for _ in range(2_100):
            pg.allreduce([t]).wait()
        # gloo marks the last one completed a moment after wait() returns: read nothing before it has
        deadline = time.monotonic() + 10
        while not _settled(st := json.loads(torch._C._distributed_c10d._dump_fr_trace_json(False, True))):
            assert time.monotonic() < deadline, st
            time.sleep(0.01)
        yield torch
    finally:
        dist.destroy_process_group()


def _settled(status: dict[str, Any]) -> bool:
    """Every group's last enqueued collective marked completed (every group: a later group has its own key)."""
    groups = status["pg_status"].values()
    return all(g["last_completed_collective"] == g["last_enqueued_collective"] for g in groups)


def _native(torch: Any) -> fr_native.NativeDumpFn:
    native = fr_native.native_dump(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")
    if native is None:
        pytest.skip("this torch exports no c10d::dump_fr_trace(bool, bool, bool)")
    return native


@pytest.mark.torch
@needs_x86_linux
def test_the_native_dump_is_the_bindings_dump(ring: Any) -> None:
    bound = ring._C._distributed_c10d._dump_fr_trace
    native = _native(ring)
    mine, theirs = pickle.loads(native(True, False, True)), pickle.loads(bound(True, False, True))
    assert len(mine["entries"]) >= 2_000
    assert mine == theirs  # nothing ran between the two reads: the same dump
    assert fr_native.checked(native, bound)
    # the flags reach the function: without collectives the dump has no entries
    assert "entries" not in pickle.loads(native(False, False, True))


def _pace_while_dumping(dump: Callable[[bool, bool, bool], bytes], dumps: int = 8) -> float:
    """This thread's pace (loop turns a second) in the middle half of each dump another thread makes, as a
    share of its pace alone just before: 0 when the dump holds the GIL (the GIL's hand-overs around a call,
    which take longer on a busy host, fall in the outer quarters), well above when it does not. Counted in
    turns, not in time this thread was off the CPU, so a busy host that slows both alike leaves it where it
    was."""
    clock = time.perf_counter_ns
    windows: list[tuple[int, int]] = []
    go, done = threading.Event(), threading.Event()

    def dumper() -> None:
        go.wait()
        for _ in range(dumps):
            t0 = clock()
            dump(True, False, True)
            windows.append((t0, clock()))
        done.set()

    th = threading.Thread(target=dumper)
    th.start()
    stamps: list[int] = []
    stamp = stamps.append
    solo_until = clock() + 100_000_000
    while (now := clock()) < solo_until:
        stamp(now)
    solo = len(stamps) / 100_000_000
    go.set()
    while not done.is_set():
        stamp(clock())
    th.join()
    middles = [(t0 + (t1 - t0) // 4, t1 - (t1 - t0) // 4) for t0, t1 in windows]
    inside = sum(bisect.bisect_left(stamps, b) - bisect.bisect_right(stamps, a) for a, b in middles)
    return inside / sum(b - a for a, b in middles) / solo


@pytest.mark.torch
@needs_x86_linux
def test_a_python_thread_runs_through_the_native_dump_and_not_through_the_bindings(ring: Any) -> None:
    bound = ring._C._distributed_c10d._dump_fr_trace
    native = _native(ring)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # the GIL changes hands within 0.1 ms of a request: short tails around a dump
    try:
        held = statistics.median(_pace_while_dumping(bound) for _ in range(3))
        free = statistics.median(_pace_while_dumping(native) for _ in range(3))
    finally:
        sys.setswitchinterval(interval)
    # the binding stops this thread in the middle of every dump (the test can fail: 0 on a quiet host, up to
    # 0.09 beside four busy processes); the native call does not (0.5-0.9 quiet, 0.5-0.7 beside them)
    assert free > 0.2 and held < free / 3, (held, free)


@pytest.mark.torch
@needs_x86_linux
@pytest.mark.parametrize("setting", [None, "0"])
def test_the_live_poller_reads_the_ring_natively_unless_switched_off(
    setting: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'ccl-d[torch]')")
    dist = pytest.importorskip("torch.distributed")
    from ccld.producers.attach import attach, detach
    from ccld.settings import Settings

    if setting is not None:
        monkeypatch.setenv(fr_native.ENV_NATIVE, setting)
    _native(torch)  # skips where this torch has no such function (the binding alone is tested elsewhere)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sink = ListSink()
        att = attach(Settings.load({}, job="unit"), sink=sink, markers=False, source="both", fr_poll_s=5.0)
        pg = dist.distributed_c10d._get_default_group()
        t = torch.ones(4)
        for _ in range(50):
            pg.allreduce([t]).wait()  # as DDP's reducer calls it: only Flight Recorder sees it
        att.flush()
        stats = detach()
    finally:
        detach()
        dist.destroy_process_group()
    assert stats["fr_entered"] == 50 and stats["fr_poll_errors"] == stats["fr_full_dump_failures"] == 0, stats
    if setting is None:
        assert stats["fr_native_dumps"] >= 1 and stats["fr_native_dump_ns"] > 0, stats
    else:
        assert stats["fr_native_dumps"] == 0, stats  # the binding read the ring


def test_no_native_dump_where_the_call_is_not_written_for(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert fr_native.native_dump(tmp_path / "libtorch_cpu.so") is None  # no such library loaded
    if fr_native.supported_platform():
        assert fr_native.native_dump(Path("libc.so.6")) is None  # loaded, without the symbol
    torch = sys.modules.get("torch")
    lib = Path(torch.__file__).parent / "lib" / fr_native.LIBRARY if torch is not None else Path(fr_native.LIBRARY)
    monkeypatch.setattr(fr_native.platform, "machine", lambda: "aarch64")  # the result comes back in x8 there
    assert not fr_native.supported_platform()
    assert fr_native.native_dump(lib) is None  # the real library, when this run loaded torch: gated all the same
    monkeypatch.setattr(fr_native.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(fr_native.sys, "platform", "darwin")
    assert not fr_native.supported_platform()


def test_a_fork_waits_for_a_native_dump_in_progress() -> None:
    """A child forked while the dump holds Flight Recorder's mutex would inherit it locked: os.fork waits."""
    forked = threading.Event()

    def fork() -> None:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        forked.set()

    with fr_native._CALLING:  # as a dump in progress holds it
        th = threading.Thread(target=fork)
        th.start()
        assert not forked.wait(0.3)  # the fork waits
    assert forked.wait(10)  # and goes on once the dump is over
    th.join()
    assert not fr_native._CALLING.locked()


def test_a_native_dump_that_fails_at_a_read_gives_way_to_the_binding_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    from ccld.producers.attach import fr_poll

    calls: list[str] = []

    def native(*_flags: bool) -> bytes:
        calls.append("native")
        if len(calls) > 1:
            raise ValueError("no string")
        return pickle.dumps({"version": "2.10", "entries": []})

    def bound(*flags: bool) -> bytes:
        calls.append("binding")
        assert flags == (True, False, True)  # collectives, no stack traces, only active
        return pickle.dumps({"version": "2.10", "entries": [], "pg_config": {}, "pg_status": {}})

    monkeypatch.setattr(fr_poll, "torch_native_dump", lambda _env, _bound: native)
    stats = fr_poll.FrStats()
    read = fr_poll._full_dump(stats, bound)
    assert read()["version"] == "2.10" and stats.native_dumps == 1 and stats.native_failures == 0
    assert read()["pg_config"] == {} and stats.native_failures == 1  # the binding answered the same read
    read()
    assert calls == ["native", "native", "binding", "binding"] and stats.native_dumps == 1
    monkeypatch.setattr(fr_poll, "torch_native_dump", lambda _env, _bound: None)
    calls.clear()
    assert fr_poll._full_dump(stats, bound)()["pg_config"] == {}  # no native dump here: the binding alone
    assert calls == ["binding"] and stats.native_dumps == 1


def test_a_native_dump_that_does_not_read_as_the_bindings_is_not_used() -> None:
    def pickled(obj: Any) -> Callable[[bool, bool, bool], bytes]:
        return lambda *_flags: pickle.dumps(obj)

    def raises(*_flags: bool) -> bytes:
        raise ValueError("no string")

    dump = {"version": "2.10", "pg_config": {"0": {}}, "pg_status": {"0": {"last_completed_collective": 1}}}
    bound = pickled(dump)
    assert fr_native.checked(pickled(dict(dump)), bound)
    assert not fr_native.checked(lambda *_flags: b"not a pickle", bound)
    assert not fr_native.checked(pickled({**dump, "version": "2.9"}), bound)
    assert not fr_native.checked(pickled({**dump, "pg_config": {}}), bound)
    moving = iter([pickle.dumps({**dump, "pg_status": {}}), pickle.dumps(dump)])  # a collective completed between
    assert fr_native.checked(lambda *_flags: next(moving), bound)  # ... the first two reads: the next pair agrees
    assert not fr_native.checked(raises, bound)
    assert fr_native.torch_native_dump({fr_native.ENV_NATIVE: "off"}, bound) is None
    assert fr_native.torch_native_dump(dict(os.environ), None) is None
