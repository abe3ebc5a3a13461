"""The optional ``t_exit_err_ns`` column (an exit known only to +/-): carried row to batch to wire and
back, empty on the wire when every exit was timed exactly, 0 in batches of writers before it (schema
history ``KernelBatch-v4``), and checked like every other value."""

from __future__ import annotations

import numpy as np
import pytest

from ccld.errors import RecordError, SchemaError
from ccld.records import MAX_TIME_NS, KernelBatch, KernelRecord, batch_value_problems
from ccld.schemas.codec import _writers, decode, decode_metrics, encode, encode_batch, load_schema
from factories import make_kernel_record, written_by


def recs(*errs: int) -> list[KernelRecord]:
    return [make_kernel_record(rank=r, comm_rank=r, t_exit_err_ns=e) for r, e in enumerate(errs)]


def test_records_carry_it_to_the_batch_over_the_wire_and_back() -> None:
    rows = recs(0, 40_000_000, 7)
    b = KernelBatch.from_records(rows)
    assert b.columns["t_exit_err_ns"].tolist() == [0, 40_000_000, 7]
    back = decode_metrics(encode_batch(b))
    assert back.records() == rows and back.columns["t_exit_err_ns"].tolist() == [0, 40_000_000, 7]
    both = KernelBatch.concat([b, KernelBatch.from_records(recs(0))])
    assert both.columns["t_exit_err_ns"].tolist() == [0, 40_000_000, 7, 0]
    assert both.take(np.asarray([1])).records() == [rows[1]]


def test_exact_exits_cost_nothing_on_the_wire() -> None:
    b = KernelBatch.from_records(recs(0, 0))
    _, rec = decode(encode_batch(b))
    assert rec["t_exit_err_ns"] == b""
    assert decode_metrics(encode_batch(b)).columns["t_exit_err_ns"].tolist() == [0, 0]
    _, rec = decode(encode_batch(KernelBatch.from_records(recs(0, 5))))
    assert len(rec["t_exit_err_ns"]) == 2 * 8


def test_a_batch_without_the_column_reads_as_timed_exactly() -> None:
    b = KernelBatch.from_records(recs(0, 0, 0))
    cols = {k: v for k, v in b.columns.items() if k != "t_exit_err_ns"}
    again = KernelBatch(b.job, b.incarnation, b.comm_hash, b.world_size, b.hosts, cols, b.send, b.recv)
    assert again.columns["t_exit_err_ns"].tolist() == [0, 0, 0]


def test_batch_of_a_writer_before_it_decodes_with_exact_exits() -> None:
    old = load_schema("KernelBatch-v4")
    assert old.name == "KernelBatch" and old.fingerprint in _writers()
    assert old.fingerprint != load_schema("KernelBatch").fingerprint
    assert "t_exit_err_ns" not in {f["name"] for f in old.raw["fields"]}
    b = KernelBatch.from_records([make_kernel_record(rank=r, comm_rank=r, t_prev_exit_ns=10 * r, peak_lag=(r, 1))
                                  for r in range(3)])
    got = decode_metrics(written_by(old, b))
    assert got.records() == b.records() and got.columns["t_exit_err_ns"].tolist() == [0, 0, 0]


def test_json_lines_carry_it_and_the_single_record_schema_reads_it_as_zero() -> None:
    r = recs(0, 25)[1]
    assert KernelRecord.from_dict(r.to_dict()) == r
    d = r.to_dict()
    del d["t_exit_err_ns"]  # a line of a writer before it
    assert KernelRecord.from_dict(d).t_exit_err_ns == 0
    assert decode_metrics(encode("KernelRecord", r.to_dict())).records()[0].t_exit_err_ns == 0


@pytest.mark.parametrize("bad", [-1, MAX_TIME_NS + 1])
def test_an_impossible_uncertainty_is_a_bad_value(bad: int) -> None:
    with pytest.raises(RecordError):
        make_kernel_record(t_exit_err_ns=bad)
    b = KernelBatch.from_records(recs(0, 0))
    cols = {**b.columns, "t_exit_err_ns": np.asarray([0, bad], dtype=np.int64)}
    b = KernelBatch(b.job, b.incarnation, b.comm_hash, b.world_size, b.hosts, cols, b.send, b.recv)
    assert any("t_exit_err_ns" in p for p in batch_value_problems(b)), batch_value_problems(b)
    with pytest.raises(SchemaError, match="bad-value|t_exit_err_ns"):
        decode_metrics(encode_batch(b))
