"""The optional ``t_prev_exit_ns`` batch column: filled when absent, kept on the wire, and old
writers' batches (schema history ``KernelBatch-v1``) still decode, reading it as unknown."""

from __future__ import annotations

import io

import fastavro
import numpy as np

from ccld.records import KernelBatch
from ccld.schemas.codec import _writers, decode_metrics, encode_batch, load_schema
from factories import make_kernel_record


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
    rec = {f["name"]: None for f in old.raw["fields"]}
    rec.update(job=b.job, incarnation=b.incarnation, comm_hash=b.comm_hash, world_size=b.world_size, producer="p",
               batch_seq=1, n=b.n, channels=b.channels, hosts=list(b.hosts),
               send=b.send.astype("<i8").tobytes(), recv=b.recv.astype("<i8").tobytes())
    for name, col in b.columns.items():
        if name != "t_prev_exit_ns":
            rec[name] = col.astype("<i8").tobytes()
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, old.parsed, rec)
    got = decode_metrics(old.header + buf.getvalue())
    assert got.records() == b.records() and got.columns["t_prev_exit_ns"].tolist() == [-1, -1, -1]
