"""The NCCL profiler plugin, built from source and driven through ctypes exactly as NCCL calls it.

Each test loads its own copy of the library (``dlopen`` of one path twice is one instance), so each
starts with fresh state; what a refused start prints is checked in a child process.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ccld.probe import frame, layout, nccl_build, nccl_table
from ccld.probe.nccl_driver import NcclDriver, structure_offsets
from ccld.probe.nccl_replay import plugin_copies
from ccld.probe.nccl_watch import announce
from ccld.records import OpType, TraceId

pytestmark = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="no C compiler")


@pytest.fixture(scope="module")
def plugin() -> Path:
    return nccl_build.build()


@pytest.fixture
def table_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "nccl"
    announce(d)
    monkeypatch.setenv("CCLD_NCCL_DIR", str(d))
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("CCLD_JOB", "job-a")
    return d


def fresh(plugin: Path, folder: Path, version: int = 6) -> NcclDriver:
    (lib,) = plugin_copies(plugin, folder / f"lib{len(list(folder.glob('lib*')))}", 1)
    drv = NcclDriver.load(lib, version)
    assert drv is not None
    return drv


def only_table(d: Path) -> nccl_table.NcclTable:
    (path,) = d.glob("nccl-*.table")
    return nccl_table.NcclTable(path)


def test_it_exports_the_interfaces_nccl_loads_and_no_other(plugin: Path, tmp_path: Path) -> None:
    """v6, v5 and v4 (NCCL 2.26 on); an NCCL that asks only for v1-v3, or a future v7, finds nothing and runs on."""
    lib = ctypes.CDLL(str(plugin_copies(plugin, tmp_path, 1)[0]))
    for v in (4, 5, 6):
        assert getattr(lib, f"ncclProfiler_v{v}") is not None
    for v in (1, 2, 3, 7):
        with pytest.raises(AttributeError):
            getattr(lib, f"ncclProfiler_v{v}")
    assert NcclDriver.load(plugin, 7) is None
    assert NcclDriver.load(plugin, 6).name == "CCL-D"  # type: ignore[union-attr]


def test_its_interface_offsets_are_nccls() -> None:
    """The plugin's header and this test driver lay the descriptors out as NCCL's headers do (measured from them)."""
    recorded = nccl_build.recorded_offsets()
    assert nccl_build.abi_offsets() == recorded
    assert structure_offsets() == recorded
    nccl_src = os.environ.get("CCLD_NCCL_INCLUDE")  # NCCL's own headers, where a machine has them
    if nccl_src:
        assert nccl_build.abi_offsets(nccl_include=nccl_src) == recorded


def test_the_c_source_carries_the_frame_and_table_layouts() -> None:
    text = (nccl_build.source_dir() / "ccld_nccl_profiler.c").read_text()
    assert layout.c_block() in text, "the plugin's frame layout drifted: paste `ccld probe layout --c`"
    assert nccl_table.c_block() in text, "the plugin's table layout drifted: paste `ccld nccl layout --c`"


def test_a_collective_becomes_a_frame_kernel_with_its_trace_counts_and_gpu_times(
        plugin: Path, table_dir: Path, tmp_path: Path) -> None:  # fmt: skip
    drv = fresh(plugin, tmp_path)
    comm = drv.init(0xABCDEF, 8, 5, n_nodes=2)
    assert comm is not None
    t = 1_000_000_000
    op = drv.coll(comm, "AllGather", 4096, "ncclBfloat16", n_channels=2)
    drv.stop(op)  # enqueued: NCCL stops the op's own event before its kernel runs
    tab = only_table(table_dir)
    assert tab.env["RANK"] == "5" and tab.env["CCLD_JOB"] == "job-a"
    assert nccl_table.rank_of(tab.env, list(tab.slots())) == (5, 8)
    snap = frame.read_consistent(tab.frame(0))
    assert snap is not None and snap.kernel_index == 0  # nothing on the GPU yet
    k0 = drv.kernel_ch_start(comm, op, 0, t)
    k1 = drv.kernel_ch_start(comm, op, 1, t + 50)
    send = drv.proxy_op_start(comm, op, 1, 6, 4, True)
    recv = drv.proxy_op_start(comm, op, 1, 4, 4, False)
    for i in range(3):
        drv.proxy_step(comm, recv, i, False)
    for i in range(2):
        drv.proxy_step(comm, send, i, True)
    snap = frame.read_consistent(tab.frame(0))
    assert snap is not None and snap.inside and snap.t_begin_ns == t
    sub = snap.sub_for(snap.kernel_index)
    assert TraceId.unpack(sub.trace_raw) == TraceId(0xABCDEF, 0, OpType.ALL_GATHER, layout_dtype("ncclBfloat16"))
    assert (sub.send[1], sub.recv[1], sub.peak[1]) == (2, 3, 3)  # channel 1: received 3 ahead of sending
    drv.kernel_ch_stop(k0, t + 900)
    assert frame.read_consistent(tab.frame(0)).inside  # type: ignore[union-attr]  # one channel still runs
    drv.kernel_ch_stop(k1, t + 1000)
    snap = frame.read_consistent(tab.frame(0))
    assert snap is not None and not snap.inside and snap.t_end_ns == t + 1000
    assert tab.count_of(0, 0) == 4096
    stats = tab.stats()
    assert stats["abi"] == 6 and stats["dropped_events"] == 0 and stats["slots_used"] == 1


def layout_dtype(name: str) -> int:
    from ccld.identity import dtype_code

    return int(dtype_code(name.removeprefix("nccl").lower()))


def test_both_ends_of_a_point_to_point_channel_agree_on_it(plugin: Path, table_dir: Path, tmp_path: Path) -> None:
    """Rank 0's k-th send to rank 3 and rank 3's k-th receive from 0 are one op of one two-rank channel."""
    sender, receiver = fresh(plugin, tmp_path), fresh(plugin, tmp_path)
    a, b = sender.init(0x77, 4, 0), receiver.init(0x77, 4, 3)
    assert a is not None and b is not None
    for k in range(3):
        for drv, comm, func, peer in ((sender, a, "Send", 3), (receiver, b, "Recv", 0)):
            op = drv.p2p(comm, func, peer, 100 + k)
            drv.stop(op)
            h = drv.kernel_ch_start(comm, op, 0, 10 + k)
            drv.kernel_ch_stop(h, 20 + k)
    tables = [nccl_table.NcclTable(p) for p in sorted(table_dir.glob("nccl-*.table"))]
    assert len(tables) == 2
    ends = [s for t in tables for s in t.slots() if s.kind != nccl_table.KIND_COLLECTIVE]
    send_end = next(s for s in ends if s.kind == nccl_table.KIND_P2P_SEND)
    recv_end = next(s for s in ends if s.kind == nccl_table.KIND_P2P_RECV)
    assert send_end.trace_hash == recv_end.trace_hash
    assert (send_end.comm_rank, recv_end.comm_rank, send_end.comm_size) == (0, 1, 2)
    for t in tables:
        for s in t.slots():
            if s.kind != nccl_table.KIND_COLLECTIVE:
                snap = frame.read_consistent(t.frame(s.index))
                assert snap is not None and snap.kernels_done == 3
                assert t.count_of(s.index, 2) == 102


def test_unknown_foreign_and_stale_events_are_ignored_and_counted(
        plugin: Path, table_dir: Path, tmp_path: Path) -> None:  # fmt: skip
    drv = fresh(plugin, tmp_path)
    comm = drv.init(0x5, 2, 0)
    assert comm is not None
    assert drv.raw_event(comm, 1 << 40) == 0  # a type this plugin never heard of
    assert drv.raw_event(comm, 1 << 11) == 0  # one it does not track (a kernel launch)
    op = drv.coll(comm, "Gather", 10)  # a collective it has no op type for
    assert op == 0
    real = drv.coll(comm, "AllReduce", 10)
    assert drv.proxy_op_start(comm, real, 0, 1, 2, True, pid=os.getpid() + 1) == 0  # another process's op
    drv.stop(0)
    drv.record(0, 22)
    tab = only_table(table_dir)
    assert tab.stats()["unknown_events"] == 2
    assert frame.read_consistent(tab.frame(0)).kernel_index == 0  # type: ignore[union-attr]


def test_a_full_table_refuses_new_communicators_and_counts_them(
        plugin: Path, table_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("CCLD_NCCL_SLOTS", "8")
    drv = fresh(plugin, tmp_path)
    comms = [drv.init(0x100 + i, 2, 0) for i in range(10)]
    assert all(c is not None for c in comms)  # NCCL's calls go on; the extra ones are not watched
    for c in comms:
        op = drv.coll(c, "AllReduce", 1)  # type: ignore[arg-type]
        drv.kernel_ch_stop(drv.kernel_ch_start(c, op, 0, 1), 2)  # type: ignore[arg-type]
    stats = only_table(table_dir).stats()
    assert (stats["n_slots"], stats["slots_refused"], stats["dropped_events"]) == (8, 2, 2)


def test_ops_beyond_the_pools_keep_every_frame_consistent(plugin: Path, table_dir: Path, tmp_path: Path) -> None:
    """Pool entries are reused after 4,096 ops: ten thousand ops of two communicators, every one begun and ended."""
    drv = fresh(plugin, tmp_path)
    a, b = drv.init(0xA, 2, 0), drv.init(0xB, 2, 0)
    assert a is not None and b is not None
    for i in range(5000):
        for comm in (a, b):
            op = drv.coll(comm, "AllReduce", i)
            drv.stop(op)
            pop = drv.proxy_op_start(comm, op, 0, 1, 1, True)
            k = drv.kernel_ch_start(comm, op, 0, 2 * i + 1)
            drv.proxy_step(comm, pop, 0, True)
            drv.kernel_ch_stop(k, 2 * i + 2)
            drv.stop(pop)
    tab = only_table(table_dir)
    for slot in (0, 1):
        snap = frame.read_consistent(tab.frame(slot))
        assert snap is not None and (snap.kernel_index, snap.kernels_done) == (5000, 5000)
        assert snap.sub_for(5000).send[0] == 1 and TraceId.unpack(snap.sub_for(5000).trace_raw).op_seq == 4999
    assert tab.stats()["dropped_events"] == 0


REFUSE = textwrap.dedent("""
    import sys
    from ccld.probe.nccl_driver import NcclDriver
    drv = NcclDriver.load(sys.argv[1], 6)
    comms = [drv.init(0x1, 2, 0), drv.init(0x2, 2, 1)]
    # init succeeds (a failed init would make NCCL unload the library) with no context and no event asked for
    ok = all(c is None for c in comms) and drv.mask == 0
    # calls that come with no context change nothing
    from ccld.probe.nccl_driver import Comm
    ghost = Comm(0, 0x1, 0, 2)
    op = drv.coll(ghost, "AllReduce", 1)
    drv.stop(op)
    print("refused" if ok and op == 0 else "accepted")
""")


@pytest.mark.parametrize("case", ["no-dir-setting", "no-aggregator", "dead-aggregator", "bad-slots"])
def test_without_a_live_aggregator_or_with_a_bad_setting_nccl_runs_on_with_one_line(
        plugin: Path, tmp_path: Path, case: str) -> None:  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_NCCL")}
    d = tmp_path / "nccl"
    d.mkdir()
    if case != "no-dir-setting":
        env["CCLD_NCCL_DIR"] = str(d)
    if case == "dead-aggregator":
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        (d / "aggregator.pid").write_text(dead.stdout)
    if case == "bad-slots":
        announce(d)
        env["CCLD_NCCL_SLOTS"] = "lots"
    done = subprocess.run([sys.executable, "-c", REFUSE, str(plugin)], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "refused"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccld-nccl: ") and "without the CCL-D profiler" in lines[0], lines
    assert list(d.glob("nccl-*.table")) == []
    quiet = subprocess.run([sys.executable, "-c", REFUSE, str(plugin)], env=dict(env, CCLD_NCCL_QUIET="1"),
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert quiet.stdout.strip() == "refused" and quiet.stderr == ""


def test_the_ccld_nccl_command(plugin: Path, table_dir: Path, tmp_path: Path) -> None:
    def ccld(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ccld.cli", "nccl", *args], capture_output=True, text=True,
                              timeout=120)  # fmt: skip

    abi = ccld("abi")
    assert abi.returncode == 0 and f"{len(nccl_build.recorded_offsets())}/" in abi.stdout, abi.stdout + abi.stderr
    assert ccld("build").stdout.strip() == str(plugin)
    assert ccld("layout", "--c").stdout.strip() == nccl_table.c_block()
    drv = fresh(plugin, tmp_path)
    drv.init(0xAB, 4, 1)
    shown = ccld("tables", str(table_dir))
    assert "rank 5 of 8, profiler v6" in shown.stdout and "communicator 00000000000000ab rank 1/4" in shown.stdout
    no_gcc = subprocess.run([sys.executable, "-m", "ccld.cli", "nccl", "build", "--force"], capture_output=True,
                            text=True, env=dict(os.environ, PATH="/nonexistent", CC=""), timeout=60)  # fmt: skip
    assert no_gcc.returncode == 2 and "no C compiler" in no_gcc.stderr


def test_it_builds_from_source_into_a_given_folder_and_reuses_an_identical_build(tmp_path: Path) -> None:
    lib = nccl_build.build(tmp_path / "out")
    assert lib.name == "libnccl-profiler-ccld.so" and lib.stat().st_size > 0
    first = lib.stat().st_mtime_ns
    assert nccl_build.build(tmp_path / "out") == lib and lib.stat().st_mtime_ns == first  # not rebuilt
    assert nccl_build.build(tmp_path / "out", force=True) == lib
    assert NcclDriver.load(lib, 6) is not None
    assert not list((tmp_path / "out").glob(".build-*"))  # no half-written library left behind


def test_an_op_enqueued_ahead_begins_with_its_kernel_not_with_its_proxy_ops(
        plugin: Path, table_dir: Path, tmp_path: Path) -> None:  # fmt: skip
    """NCCL appends an op's proxy ops when the host enqueues it: op 2's, while op 1's kernel still runs, must not
    end op 1 on the frame; op 2's early receive waits in it until its kernel's first channel begins it."""
    drv = fresh(plugin, tmp_path)
    comm = drv.init(0xE, 2, 0)
    assert comm is not None
    op1 = drv.coll(comm, "AllReduce", 8)
    drv.stop(op1)
    k1 = drv.kernel_ch_start(comm, op1, 0, 100)
    op2 = drv.coll(comm, "AllReduce", 8)
    drv.stop(op2)
    recv2 = drv.proxy_op_start(comm, op2, 0, 1, 2, False)
    drv.proxy_step(comm, recv2, 0, False)  # op 2's data arrives before its kernel runs
    tab = only_table(table_dir)
    snap = frame.read_consistent(tab.frame(0))
    assert snap is not None and (snap.kernel_index, snap.kernels_done) == (1, 0)  # op 1 still inside
    drv.kernel_ch_stop(k1, 200)
    k2 = drv.kernel_ch_start(comm, op2, 0, 300)
    snap = frame.read_consistent(tab.frame(0))
    assert snap is not None and (snap.kernel_index, snap.kernels_done, snap.t_begin_ns) == (2, 1, 300)
    assert snap.sub_for(2).recv[0] == 1  # the early receive, counted with its op
    drv.kernel_ch_stop(k2, 400)
    assert tab.stats()["late_counts"] == 0


def test_a_p2p_op_on_a_high_channel_counts_on_its_own_frame_channel_with_its_own_peak(
        plugin: Path, table_dir: Path, tmp_path: Path) -> None:  # fmt: skip
    """A send of one channel that NCCL runs on channel 37: its counters are the frame's channel 0 (the frame
    says one channel), and each op's peak backlog is its own, not the sum of the ops before."""
    drv = fresh(plugin, tmp_path)
    comm = drv.init(0xF, 4, 1)
    assert comm is not None
    for k in range(3):
        op = drv.p2p(comm, "Recv", 2, 10, n_channels=1)
        drv.stop(op)
        kch = drv.kernel_ch_start(comm, op, 37, 10 * k + 1)
        pop = drv.proxy_op_start(comm, op, 37, 2, 3, False)
        for i in range(3):
            drv.proxy_step(comm, pop, i, False)
        drv.kernel_ch_stop(kch, 10 * k + 2)
        drv.stop(pop)
        tab = only_table(table_dir)
        (chan,) = [s for s in tab.slots() if s.kind == nccl_table.KIND_P2P_RECV]
        snap = frame.read_consistent(tab.frame(chan.index))
        assert snap is not None and snap.n_channels == 1
        sub = snap.sub_for(snap.kernel_index)
        assert (sub.recv[0], sub.peak[0], sum(sub.recv[1:])) == (3, 3, 0), (k, sub)


def test_a_full_pool_drops_new_events_and_never_reuses_an_entry_still_named(
        plugin: Path, table_dir: Path, tmp_path: Path) -> None:  # fmt: skip
    """Far more proxy ops open at once than the pool holds (NCCL enqueued far ahead): the extra ones are
    dropped and counted; once they stop, another communicator's steps land on its own frame, nowhere else."""
    drv = fresh(plugin, tmp_path)
    a, b = drv.init(0xA1, 2, 0), drv.init(0xB1, 2, 0)
    assert a is not None and b is not None
    op_a = drv.coll(a, "AllReduce", 1, n_channels=1)
    drv.stop(op_a)
    ka = drv.kernel_ch_start(a, op_a, 0, 1)
    held = [drv.proxy_op_start(a, op_a, 0, 1, 1, True) for _ in range(16_384 + 50)]
    assert held.count(0) >= 50  # dropped, not taken from a proxy op that is still open
    for h in held:  # they end: their entries go back
        drv.stop(h)
    op_b = drv.coll(b, "AllReduce", 1, n_channels=1)
    drv.stop(op_b)
    kb = drv.kernel_ch_start(b, op_b, 0, 2)
    pop_b = drv.proxy_op_start(b, op_b, 0, 1, 2, False)
    for i in range(2):
        drv.proxy_step(b, pop_b, i, False)
    tab = only_table(table_dir)
    sa, sb = frame.read_consistent(tab.frame(0)), frame.read_consistent(tab.frame(1))
    assert sa is not None and sb is not None
    assert sb.sub_for(1).recv[0] == 2 and sa.sub_for(1).recv[0] == 0 and sa.sub_for(1).send[0] == 0
    assert tab.stats()["dropped_events"] >= 50
    drv.kernel_ch_stop(ka, 3)
    drv.kernel_ch_stop(kb, 4)
