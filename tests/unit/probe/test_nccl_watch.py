"""The aggregator's side of the NCCL plugin: tables found, frames polled into batches, an ended writer's table gone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ccld.metrics import render
from ccld.probe import nccl_build
from ccld.probe.nccl_watch import PID_FILE, TableWatcher, announce
from ccld.producers.attach.aggregate import HostAggregator, nccl_job
from ccld.producers.attach.aggregate_metrics import aggregator_families
from ccld.records import KernelBatch, Status
from factories import FakeBatchSink
from harness import parse_exposition

pytestmark = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="no C compiler")

WRITER = textwrap.dedent("""
    import sys, time
    from ccld.probe.nccl_driver import NcclDriver
    drv = NcclDriver.load(sys.argv[1], 6)
    comm = drv.init(0xC0FFEE, 2, 1)
    op = drv.coll(comm, "AllReduce", 64)
    drv.stop(op)
    drv.kernel_ch_start(comm, op, 0, time.time_ns())  # inside, never ends: the process exits mid-op
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin
""")


def writer(d: Path, **env: str) -> subprocess.Popen[str]:
    e = dict(os.environ, CCLD_NCCL_DIR=str(d), RANK="1", WORLD_SIZE="2", **env)
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(nccl_build.build())], env=e, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def test_a_live_writers_frames_become_records_and_its_table_goes_when_it_ends(tmp_path: Path) -> None:
    announce(tmp_path)
    proc = writer(tmp_path, CCLD_JOB="watched")
    got: list[KernelBatch] = []
    w = TableWatcher(tmp_path, got.append, name_job=nccl_job)
    assert w.scan() == 1
    w.poll()
    recs = [r for b in got for r in b.records()]
    assert {(r.job, r.rank, r.comm_rank, r.comm_size, r.world_size) for r in recs} == {("watched", 1, 1, 2, 2)}
    assert any(r.status is Status.PROGRESS for r in recs)
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(10)
    w.poll()  # the writer is gone: a last poll, then its table is dropped and removed
    assert w.stats.tables_done == 1 and w.stats.tables == 0
    assert list(tmp_path.glob("nccl-*.table")) == []


def test_a_file_that_is_no_table_is_skipped_and_counted(tmp_path: Path) -> None:
    (tmp_path / "nccl-host-123-abcdef.table").write_bytes(b"\0" * 5000)
    (tmp_path / "nccl-host-124-abcdef.table").write_bytes(b"short")
    w = TableWatcher(tmp_path, lambda b: None)
    assert w.scan() == 0 and w.poll() == 0
    assert w.stats.bad_tables == 2
    assert w.scan() == 0 and w.stats.bad_tables == 2  # said once, not at every scan


def test_the_job_is_named_by_the_attachments_rules() -> None:
    assert nccl_job({"CCLD_JOB": "given", "SLURM_JOB_ID": "7"}) == ("given", 0)
    assert nccl_job({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "2"}) == ("slurm-7.2", 0)
    assert nccl_job({"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "3"}) == ("torchelastic-abc", 3)
    assert nccl_job({}) == ("default", 0)


def test_the_host_aggregator_announces_itself_polls_the_tables_and_sends_their_records(tmp_path: Path) -> None:
    d = tmp_path / "nccl"
    sink = FakeBatchSink()
    agg = HostAggregator(sink=sink, nccl_dir=str(d), flush_interval_s=0.2, nccl_poll_s=0.05).start()
    try:
        assert (d / PID_FILE).read_text().strip() == str(os.getpid())  # the plugin starts only beside a live one
        proc = writer(d, CCLD_JOB="agg-job")
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and not any(b.job == "agg-job" for b in sink.batches):
            time.sleep(0.1)
        got = parse_exposition(render(aggregator_families(agg)))
        assert got["ccld_aggregator_nccl_tables"] == 1 and got["ccld_aggregator_nccl_records_total"] > 0
        assert got['ccld_aggregator_nccl_plugin_events{outcome="seen"}'] == 2  # two starts: op, channel
        assert got['ccld_aggregator_nccl_plugin_events{outcome="dropped"}'] == 0
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
    finally:
        agg.close()
    assert not (d / PID_FILE).exists()
    rows = [r for b in sink.batches for r in b.records() if r.job == "agg-job"]
    assert rows and {r.rank for r in rows} == {1}
    assert all(b.producer == agg.producer_id for b in sink.batches)
