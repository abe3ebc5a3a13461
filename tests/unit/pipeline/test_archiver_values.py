"""The Parquet sink applies the worker's value checks: an impossible record is counted, never archived."""

from __future__ import annotations

from pathlib import Path

from ccld.records import KernelBatch
from ccld.schemas.codec import encode_batch
from ccld.settings import Settings
from ccld.sinks.archiver import Archiver
from factories import make_kernel_record
from harness import impossible_batches


def test_impossible_batches_are_counted_and_not_archived(tmp_path: Path) -> None:
    s = Settings.load({}, bootstrap="127.0.0.1:1", archive_dir=str(tmp_path))
    arch = Archiver(s)  # no client is created until run()
    for i, b in enumerate(impossible_batches().values()):
        arch._add(s.metrics_topic, 0, i, 1_000, encode_batch(b))
    arch._add(s.metrics_topic, 0, 99, 1_000, encode_batch(KernelBatch.from_records([make_kernel_record()])))
    arch._add(s.metrics_topic, 0, 100, 1_000, b"garbage")
    assert (arch.counters["bad_value"], arch.counters["undecodable"]) == (len(impossible_batches()), 1)
    (buf,) = arch._buffers.values()
    assert buf.rows == 1, "only the good record is kept for the archive"
