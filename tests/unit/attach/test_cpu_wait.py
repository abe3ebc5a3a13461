"""The attachment's CPU stall sample (``producers/attach/cpu_wait.py``): read from Linux PSI, sent with
the rank's next batch, on the wire, and never an error in the job."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ccld.producers.attach.cpu_wait import CpuWaitSampler, pressure_file, pressure_ns, psi_some_us
from ccld.producers.attach.op_tracker import Identity, Tracker
from ccld.producers.attach.outlets import ListSink
from ccld.records import DType, KernelBatch, OpType, RecordError
from ccld.schemas.codec import SchemaError, _writers, decode_metrics, encode_batch, load_schema
from factories import make_kernel_record, written_by

MS = 1_000_000


PSI = "some avg10=1.50 avg60=0.40 avg300=0.10 total={}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def test_a_psi_file_gives_its_some_total() -> None:
    assert psi_some_us(PSI.format(16392597162)) == 16392597162
    for bad in ("garbage", "full avg10=0.00 total=5\n", "some avg10=1.0\n"):
        with pytest.raises(ValueError):
            psi_some_us(bad)


def test_the_cgroups_own_pressure_comes_first_then_the_hosts(tmp_path: Path) -> None:
    cg, root, host = tmp_path / "cgroup", tmp_path / "fs", tmp_path / "host.pressure"
    (root / "job" / "rank3").mkdir(parents=True)
    cg.write_text("0::/job/rank3\n")
    host.write_text(PSI.format(10))
    assert pressure_file(str(cg), str(root), str(host)) == str(host)  # the cgroup has no cpu.pressure
    (root / "job" / "rank3" / "cpu.pressure").write_text(PSI.format(20))
    assert pressure_file(str(cg), str(root), str(host)) == str(root / "job" / "rank3" / "cpu.pressure")
    cg.write_text("0::/\n")  # the root cgroup: its pressure is the host's
    assert pressure_file(str(cg), str(root), str(host)) == str(host)
    assert pressure_file(str(tmp_path / "none"), str(root), str(tmp_path / "no.pressure")) is None
    # (not stalled, stalled), cumulative, on the sampler's clock
    assert pressure_ns(str(host), clock=lambda: 5_000_000) == (5_000_000 - 10_000, 10_000)
    assert pressure_ns(None) is None and pressure_ns(str(tmp_path / "gone")) is None


@pytest.mark.skipif(not os.path.exists("/proc/pressure/cpu"), reason="a kernel without PSI")
def test_threads_that_wait_for_a_cpu_stall_the_host_in_the_real_counter() -> None:
    """Three busy threads per CPU: two wait on every CPU at any time, so the host's CPU pressure says
    some task was stalled nearly all the time the sampler looked (an idle host: a few percent). Not
    pinned to one CPU: the host's figure averages its CPUs weighted by how busy each was, so three
    threads on one CPU beside any other busy process gave 0.51 stalled."""
    stop, ready = threading.Event(), threading.Barrier(3 * (os.cpu_count() or 1) + 1)
    block = bytes(1 << 20)

    def spin() -> None:  # hashing a large buffer releases the GIL: the threads really run side by side
        ready.wait()
        while not stop.is_set():
            hashlib.sha256(block).digest()

    threads = [threading.Thread(target=spin) for _ in range(ready.parties - 1)]
    try:
        for t in threads:
            t.start()
        ready.wait()
        s = CpuWaitSampler()
        assert s.sample() is None  # the first sample only sets the start
        time.sleep(1.0)
        busy = s.sample()
    finally:
        stop.set()
        for t in threads:
            t.join()
    # (stalled, not stalled): stalled most of the second; the fields swapped would give the reverse
    assert busy is not None and busy[0] >= 2 * busy[1], busy
    assert 0.8e9 <= busy[0] + busy[1] <= 3e9, busy  # the wall time it covers


def test_an_unreadable_counter_gives_no_sample_and_never_raises() -> None:
    def broken() -> int | None:
        raise PermissionError("no /proc here")

    s = CpuWaitSampler(read=broken)
    assert s.sample() is None and s.sample() is None and s.failures == 2
    # (not stalled, stalled): a counter that stepped back reads as nothing, a sample over no time is none
    values = iter([(5000, 1000), (6000, 400), (7000, 900), (7000, 900)])
    s = CpuWaitSampler(read=lambda: next(values))
    assert s.sample() is None  # the start
    assert s.sample() == (0, 1000)
    assert s.sample() == (500, 1000)
    assert s.sample() is None  # no time passed: nothing to say


class BatchSink(ListSink):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[Any] = []

    def submit_batch(self, batch: Any) -> None:
        self.batches.append(batch)


class Clock:
    def __init__(self) -> None:
        self.t = 1_000 * MS

    def __call__(self) -> int:
        return self.t


def test_the_tracker_sends_each_interval_s_wait_once_with_the_ranks_next_batch() -> None:
    times = iter([(0, 0), (100 * MS, 300 * MS), (200 * MS, 300 * MS), (250 * MS, 700 * MS)])  # (not stalled, stalled)
    sink, clock = BatchSink(), Clock()
    sampler = CpuWaitSampler(read=lambda: next(times))
    tr = Tracker(sink=sink, clock=clock, cpu_wait=sampler)
    tr.identity = Identity("j", 0, 5, 8, "h")
    seen = []
    for _ in range(5):  # a state interval (1 s) each, an op in flight so every interval sends a batch;
        # the first pump only sets the interval's phase, the second reads the counter's start
        call = tr.enter(0x77, 0, OpType.ALL_REDUCE, DType.FLOAT32, 1024, -1, 1, 8)
        clock.t += 1000 * MS
        tr.pump()
        tr.exit(call)
        seen.append([b.cpu_wait for b in sink.batches])
        sink.batches.clear()
    flat = [c for per in seen for batch in per for c in batch]
    assert flat == [(5, 300 * MS, 100 * MS), (5, 0, 100 * MS), (5, 400 * MS, 50 * MS)]


def test_the_wire_carries_it_and_older_writers_read_as_not_measured() -> None:
    b = KernelBatch.from_records([make_kernel_record(rank=r, comm_rank=r) for r in range(3)])
    measured = dataclasses.replace(b, cpu_wait=((0, 5 * MS, 1000 * MS), (2, 0, 990 * MS)))
    back = decode_metrics(encode_batch(measured))
    assert back.cpu_wait == measured.cpu_wait and back.records() == b.records()
    merged = KernelBatch.concat([back, dataclasses.replace(b, cpu_wait=((1, 7, 9),))])
    assert merged.cpu_wait == ((0, 5 * MS, 1000 * MS), (2, 0, 990 * MS), (1, 7, 9))
    assert merged.take(merged.columns["rank"][:1] * 0).cpu_wait == merged.cpu_wait  # kept whole, like lost_ranks
    old = load_schema("KernelBatch-v6")
    assert old.fingerprint in _writers() and "cpu_wait" not in {f["name"] for f in old.raw["fields"]}
    got = decode_metrics(written_by(old, measured))
    assert got.cpu_wait == () and got.records() == b.records()


def test_impossible_samples_are_refused() -> None:
    b = KernelBatch.from_records([make_kernel_record(rank=r, comm_rank=r) for r in range(3)])
    for bad in ((0, -1, 10), (0, 1, -1), (0, 0, 0), (-1, 1, 10), (b.world_size, 1, 10)):
        with pytest.raises(RecordError):
            dataclasses.replace(b, cpu_wait=(bad,))
    raw = encode_batch(dataclasses.replace(b, cpu_wait=((0, 1, 10),)))
    with pytest.raises(SchemaError):  # a rank outside the job, on the wire
        decode_metrics(encode_batch(b)[:0] + raw.replace((0).to_bytes(8, "little") + (1).to_bytes(8, "little"),
                                                          (99).to_bytes(8, "little") + (1).to_bytes(8, "little")))
