"""The optional ``t_prev_exit_ns`` batch column: filled when absent, kept on the wire, and old
writers' batches (schema history ``KernelBatch-v1``) still decode, reading it as unknown."""

from __future__ import annotations

import numpy as np

from ccld.records import KernelBatch
from ccld.schemas.codec import _writers, decode_metrics, encode_batch, load_schema
from factories import make_kernel_record, written_by


def _batch() -> KernelBatch:
    return KernelBatch.from_records([make_kernel_record(rank=r, comm_rank=r) for r in range(3)])


def test_missing_column_is_unknown_and_set_values_travel() -> None:
    b = _batch()
    assert b.columns["t_prev_exit_ns"].tolist() == [-1, -1, -1]
    cols = dict(b.columns)
    cols["t_prev_exit_ns"] = np.array([5, 6, 7], dtype=np.int64)
    b2 = KernelBatch(b.job, b.incarnation, b.comm_hash, b.world_size, b.hosts, cols, b.send, b.recv)
    assert decode_metrics(encode_batch(b2)).columns["t_prev_exit_ns"].tolist() == [5, 6, 7]
    both = KernelBatch.concat([b2, b])
    assert both.columns["t_prev_exit_ns"].tolist() == [5, 6, 7, -1, -1, -1]


def test_batch_of_an_older_writer_decodes() -> None:
    old = load_schema("KernelBatch-v1")
    assert old.name == "KernelBatch" and old.fingerprint in _writers()
    assert old.fingerprint != load_schema("KernelBatch").fingerprint
    b = _batch()
    got = decode_metrics(written_by(old, b))
    assert got.records() == b.records() and got.columns["t_prev_exit_ns"].tolist() == [-1, -1, -1]


def test_records_carry_it_to_the_batch_and_back() -> None:
    """``KernelRecord.t_prev_exit_ns`` is the column's row form; the single-record schema has no such field."""
    from ccld.schemas.codec import encode

    recs = [make_kernel_record(rank=r, comm_rank=r, t_prev_exit_ns=100 * r - 1) for r in range(3)]
    b = KernelBatch.from_records(recs)
    assert b.columns["t_prev_exit_ns"].tolist() == [-1, 99, 199]
    assert decode_metrics(encode_batch(b)).records() == recs
    one = decode_metrics(encode("KernelRecord", recs[1].to_dict()))  # the field is left out on the wire
    assert one.records()[0].t_prev_exit_ns == -1
