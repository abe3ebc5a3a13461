"""Batches of several communicators (one message per producer and flush): column ``comm``, kept on the
wire only when needed, and batches of writers before it (schema history ``KernelBatch-v2``/``-v3``)."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ccld.errors import RecordError
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import COMM_COLUMN, KernelBatch
from ccld.schemas.codec import _writers, decode, decode_metrics, encode_batch, load_schema
from ccld.sinks.parquet import metrics_table
from ccld.streams.analysis.replay import analyze_batches
from factories import make_kernel_record, written_by

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
COMM = make_kernel_record().comm_hash


def mixed() -> KernelBatch:
    return KernelBatch.from_records([make_kernel_record(op_seq=1), make_kernel_record(comm_hash=-5, op_seq=7),
                                     make_kernel_record(op_seq=2, send_counts=(1, 2), recv_counts=(3, 4),
                                                        peak_lag=(0, 1))])


def test_a_batch_of_several_communicators_round_trips_row_for_row() -> None:
    b = mixed()
    assert not b.one_comm and b.comm_hash == COMM
    back = decode_metrics(encode_batch(b))
    assert back.records() == b.records()
    assert [r.comm_hash for r in back.records()] == [COMM, -5, COMM]
    assert back.peaks.tolist() == b.peaks.tolist()


def test_a_batch_of_one_communicator_sends_no_comm_column() -> None:
    one = KernelBatch.from_records([make_kernel_record(op_seq=i) for i in range(5)])
    _, rec = decode(encode_batch(one))
    assert one.one_comm and rec[COMM_COLUMN] == b""
    _, rec = decode(encode_batch(mixed()))
    assert len(rec[COMM_COLUMN]) == 8 * 3


def test_comm_hash_is_the_first_rows_communicator() -> None:
    b = mixed()
    with pytest.raises(RecordError):
        KernelBatch(job=b.job, incarnation=0, comm_hash=-5, world_size=b.world_size, hosts=b.hosts,
                    columns=b.columns, send=b.send, recv=b.recv)


@pytest.mark.parametrize("old", ["KernelBatch-v2", "KernelBatch-v3"])
def test_a_batch_written_before_the_comm_column_reads_as_one_communicator(old: str) -> None:
    schema = load_schema(old)
    assert schema.fingerprint in _writers() and schema.fingerprint != load_schema("KernelBatch").fingerprint
    assert COMM_COLUMN not in {f["name"] for f in schema.raw["fields"]}
    b = KernelBatch.from_records([make_kernel_record(op_seq=i, comm_hash=77, peak_lag=(i, 1)) for i in range(3)])
    got = decode_metrics(written_by(schema, b))
    assert got.one_comm and [r.comm_hash for r in got.records()] == [77, 77, 77]
    peaks_known = old != "KernelBatch-v2"  # v2 predates peak_lag too
    assert got.records() == [dataclasses.replace(r, peak_lag=r.peak_lag if peaks_known else ()) for r in b.records()]


def test_concat_take_and_by_rank_keep_every_row() -> None:
    both = KernelBatch.concat([mixed(), KernelBatch.from_records([make_kernel_record(rank=2, comm_rank=2)])])
    assert both.columns[COMM_COLUMN].tolist() == [COMM, -5, COMM, COMM]
    parts = both.by_rank()
    assert sorted(parts) == [make_kernel_record().rank, 2]
    assert sorted(sum((p.records() for p in parts.values()), []), key=repr) == sorted(both.records(), key=repr)
    assert all(p.comm_hash == int(p.columns[COMM_COLUMN][0]) for p in parts.values())
    second = both.take(np.asarray([1, 2]))
    assert second.comm_hash == -5 and second.records() == both.records()[1:3]
    with pytest.raises(RecordError):
        both.take(np.zeros(0, dtype=np.int64))


def test_take_keeps_only_the_hosts_of_its_rows() -> None:
    rows = [make_kernel_record(rank=r, comm_rank=r, comm_size=6, world_size=6, host=f"node-{r // 2}", op_seq=r)
            for r in range(6)]
    whole = KernelBatch.from_records(rows)
    assert whole.hosts == ("node-0", "node-1", "node-2")
    part = whole.take(np.asarray([5, 4]))
    assert part.hosts == ("node-2",) and part.records() == [rows[5], rows[4]]
    assert decode_metrics(encode_batch(part)).records() == part.records()
    by = whole.by_rank()
    assert [by[r].hosts for r in (0, 3)] == [("node-0",), ("node-1",)]


def test_the_archive_names_each_rows_communicator() -> None:
    table = metrics_table([(0, 0, mixed())])
    assert table.column("communicator").to_pylist() == [f"{COMM:016x}", f"{-5 & (2**64 - 1):016x}", f"{COMM:016x}"]


def per_rank(stream: list[tuple[float, KernelBatch]]) -> list[tuple[float, KernelBatch]]:
    """The simulator's batches (per communicator, all ranks) regrouped the way rank processes send them:
    at each delivery time, one batch per rank holding all of its communicators' rows."""
    at: dict[tuple[float, int], list[KernelBatch]] = defaultdict(list)
    for t, b in stream:
        at[t, b.incarnation].append(b)
    seq: dict[int, int] = defaultdict(int)
    out = []
    for key in sorted(at):
        for rank, b in sorted(KernelBatch.concat(at[key]).by_rank().items()):
            seq[rank] += 1
            out.append((key[0], b.take(np.arange(b.n), producer=f"rank-{rank}", batch_seq=seq[rank])))
    return out


@pytest.mark.parametrize("case", ["m-s3-one-rank-16", "m-h1-p2p-16", "m-s1-s2-one-group-16"])
def test_the_analyzer_decides_the_same_from_per_rank_batches_of_several_communicators(case: str) -> None:
    """The same rows, grouped per communicator or per rank (a batch of several communicators): same verdicts."""
    sc = Scenario.from_dict(json.loads((GOLDEN / case / "scenario.json").read_text()))
    stream = list(simulate(sc))
    merged = per_rank(stream)
    assert any(not b.one_comm for _, b in merged) and len(merged) != len(stream)
    assert sum(b.n for _, b in merged) == sum(b.n for _, b in stream)

    def key(v: Any) -> tuple[tuple[str, str], ...]:
        # Everything decided; not which of a waiting rank's stalled ops stands for the incident (with a
        # rank stuck in a send and a recv on two communicators, that follows the order communicators were
        # first seen in, and so the incident id derived from it).
        d = v.to_dict()
        for k in ("incident_id", "communicator", "op_seq", "op_type", "evidence"):
            d.pop(k)
        return tuple(sorted((k, json.dumps(x, sort_keys=True)) for k, x in d.items()))

    want = analyze_batches(stream)
    got = analyze_batches((t, decode_metrics(encode_batch(b))) for t, b in merged)
    assert want and [key(v) for v in got] == [key(v) for v in want]


def test_a_communicator_without_counters_in_a_batch_with_them_is_not_taken_for_one_with_counters() -> None:
    """Rows are padded to the widest communicator's channels: zeros there are no counters."""
    from ccld.streams.analysis.state import JobState

    js = JobState("job-a", 0)
    js.queue(KernelBatch.from_records([make_kernel_record(comm_hash=1, send_counts=(4, 4), recv_counts=(4, 3)),
                                       make_kernel_record(comm_hash=2, send_counts=(), recv_counts=())]), 1.0)
    rows = js.take_rows()
    assert rows is not None and rows.n == 2
    assert [js.comm_hashes[c] for c in rows.cid.tolist()] == [1, 2]
    assert js.c_counters.tolist() == [True, False]


def test_rows_of_many_communicators_in_any_order_find_their_communicator() -> None:
    """A batch's rows interleaved across communicators (negative hashes too), new communicators appearing
    beside known ones batch after batch: every row lands in its own communicator, each registered once."""
    from ccld.streams.analysis.state import JobState

    rng = np.random.default_rng(7)
    hashes = [int(h) for h in rng.integers(-(2**62), 2**62, size=40)]
    js = JobState("job-a", 0)
    for n_known in (5, 5, 23, 40):  # the first batch all new, then the same again, then more new ones
        picks = rng.integers(0, n_known, size=120)
        batch = KernelBatch.from_records([
            make_kernel_record(comm_hash=hashes[int(p)], comm_size=4, comm_rank=int(p) % 4, op_seq=i,
                               send_counts=(), recv_counts=())
            for i, p in enumerate(picks)])
        js.queue(batch, 1.0)
        rows = js.take_rows()
        assert rows is not None and rows.n == 120
        assert [js.comm_hashes[c] for c in rows.cid.tolist()] == [hashes[int(p)] for p in picks]
    assert sorted(js.comm_hashes) == sorted(set(js.comm_hashes)) and len(js.comm_hashes) <= 40
    assert {js.comm_index[h] for h in js.comm_hashes} == set(range(len(js.comm_hashes)))


def test_a_communicator_known_without_counters_is_marked_once_a_row_shows_them() -> None:
    from ccld.streams.analysis.state import JobState

    js = JobState("job-a", 0)
    js.queue(KernelBatch.from_records([make_kernel_record(comm_hash=1, send_counts=(4, 4), recv_counts=(4, 3)),
                                       make_kernel_record(comm_hash=2, send_counts=(0, 0), recv_counts=(0, 0))]), 1.0)
    js.take_rows()
    assert js.c_counters.tolist() == [True, False]
    js.queue(KernelBatch.from_records([make_kernel_record(comm_hash=2, send_counts=(0, 9), recv_counts=(1, 9)),
                                       make_kernel_record(comm_hash=1, send_counts=(), recv_counts=())]), 2.0)
    js.take_rows()
    assert js.c_counters.tolist() == [True, True]
