"""The optional ``peak_lag`` batch column (n x channels, the kernels' own peak send backlog on DONE
rows): unknown (-1) when absent, kept on the wire, padded as unknown, checked for impossible values,
and older writers' batches (schema history ``KernelBatch-v2``, before the column) still decode."""

from __future__ import annotations

import dataclasses

import numpy as np

from ccld.records import KernelBatch, batch_value_problems
from ccld.schemas.codec import _writers, decode_metrics, encode_batch, load_schema
from factories import make_kernel_record, written_by


def _batch() -> KernelBatch:
    return KernelBatch.from_records([make_kernel_record(rank=r, comm_rank=r) for r in range(3)])


def test_missing_peaks_are_unknown_and_known_ones_travel() -> None:
    b = _batch()
    assert b.peaks.shape == (3, 2) and (b.peaks == -1).all()
    assert all(r.peak_lag == () for r in b.records())
    assert (decode_metrics(encode_batch(b)).peaks == -1).all()  # all unknown travels as the empty default
    recs = [make_kernel_record(rank=r, comm_rank=r, peak_lag=(r, 8 - r)) for r in range(3)]
    kb = KernelBatch.from_records(recs)
    got = decode_metrics(encode_batch(kb))
    assert got.peaks.tolist() == [[0, 8], [1, 7], [2, 6]] and got.records() == recs
    # concat: a narrower batch's missing channels and an unknown batch's rows are unknown
    narrow = KernelBatch.from_records([make_kernel_record(rank=0, comm_rank=0, send_counts=(1,), recv_counts=(1,),
                                                          peak_lag=(4,))])
    both = KernelBatch.concat([kb, narrow, b])
    assert both.peaks.tolist() == [[0, 8], [1, 7], [2, 6], [4, -1], [-1, -1], [-1, -1], [-1, -1]]
    # a copy without counters has no peaks either
    empty = np.zeros((3, 0), dtype=np.int64)
    assert dataclasses.replace(kb, send=empty, recv=empty).peaks.shape == (3, 0)


def test_impossible_peaks_are_refused() -> None:
    kb = KernelBatch.from_records([make_kernel_record(peak_lag=(1, 2))])
    assert batch_value_problems(kb) == []
    for bad in (-2, 0x10000):
        b = dataclasses.replace(kb, peak_lag=np.array([[1, bad]], dtype=np.int64))
        assert any("peak_lag" in p for p in batch_value_problems(b))


def test_batch_of_a_writer_before_peak_lag_decodes() -> None:
    old = load_schema("KernelBatch-v2")
    assert old.name == "KernelBatch" and old.fingerprint in _writers()
    assert old.fingerprint != load_schema("KernelBatch").fingerprint
    assert "peak_lag" not in {f["name"] for f in old.raw["fields"]}
    b = _batch()
    got = decode_metrics(written_by(old, b))
    assert got.records() == b.records() and (got.peaks == -1).all() and got.peaks.shape == (3, 2)
