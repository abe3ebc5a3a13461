"""The ShardReport message: a shard's report comes back field for field, and bad bytes are a SchemaError."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ccld.errors import SchemaError
from ccld.records import AnomalyKind, Link
from ccld.schemas.codec import HEADER_SIZE, decode, encode, encode_verdict, load_schema
from ccld.streams.analysis.hangs import CommDiag
from ccld.streams.analysis.incidents import Candidate
from ccld.streams.analysis.shard import ShardReport, Stall, decode_report, encode_report
from factories import make_verdict


def _ranks(*r: int) -> np.ndarray:
    return np.array(r, dtype=np.int64)


def _slow(kind: AnomalyKind, **kw: object) -> Candidate:
    base = Candidate(kind=kind, job="job-a", incarnation=3, communicator="00000000000000ff", op_seq=41,
                     op_type="all_reduce", root_cause_ranks=(5,), affected_ranks=(4, 5, 6), confidence=0.875,
                     evidence=f"{kind} evidence", onset_time=12.5, resolve_key=("slow", 7_000_000_000_123))
    return dataclasses.replace(base, **kw)


def make_report() -> ShardReport:
    slow = (
        _slow(AnomalyKind.S1, p=0.93),  # no link, no channel
        _slow(AnomalyKind.S2, root_cause_ranks=(5, 6), link=Link(5, 6), channel=3, p=0.05,
              root_cause_hosts=("node-1",), details={"link": "5->6", "channel": "3"}),
        _slow(AnomalyKind.S3, communicator="1000000000000000", link=Link(2**40, -1), details={"link": "not observed"}),
        _slow(AnomalyKind.S2, root_cause_ranks=(), p=None, resolve_key=("", 0)),  # defaults all the way
    )
    h1 = CommDiag(cid=4, seq=35, op_type=0, kind=AnomalyKind.H1, waiting=_ranks(8, 9, 10), missing=_ranks(13, -1),
                  wait_own_s=21.0, frozen_own_s=20.5, note="rank 13 never entered")
    h2 = CommDiag(cid=1, seq=7, op_type=2, kind=AnomalyKind.H2, waiting=_ranks(0, 1, 2, 3), missing=_ranks(),
                  culprits=_ranks(3), mismatch_field="count")
    h3 = CommDiag(cid=0, seq=2**40, op_type=99, kind=AnomalyKind.H3, waiting=_ranks(0, 1), missing=_ranks(),
                  culprits=_ranks(1, 0), link=(1, 0), channel=0, wait_own_s=1e-9)
    stalls = (Stall("9f3c5a0e1d2b4c6f", h1, 21.5, 20.0, 70.4), Stall("0000000000000001", h2, 3.0, 2.0, 1.0),
              Stall("ffffffffffffffff", h3, 99.0, 30.0, -1.5))
    return ShardReport(
        "job-a", 3, 92.25, slow, stalls, {13: "node-0001", 3: "node-0000", 2**33: "n"},
        {("9f3c5a0e1d2b4c6f", "hang", 34): "progress resumed", ("00000000000000ff", "slow", -7): "healthy again"},
        seen=91.75,
    )


def assert_same_diag(got: CommDiag, want: CommDiag) -> None:
    for f in dataclasses.fields(CommDiag):
        g, w = getattr(got, f.name), getattr(want, f.name)
        if f.name == "cid":
            assert g == -1, "the sender's communicator index is not sent"
        elif isinstance(w, np.ndarray):
            assert g.dtype == np.int64 and g.shape == w.shape and (g == w).all(), f.name
        else:
            assert g == w and type(g) is type(w), f.name


def assert_same_report(got: ShardReport, want: ShardReport) -> None:
    assert (got.job, got.incarnation, got.now, got.hosts, got.over, got.seen) == (
        want.job, want.incarnation, want.now, want.hosts, want.over, want.seen)
    # Candidate's own equality covers every field, job and incarnation included (the report's)
    assert got.slow == want.slow
    assert [type(c.link) for c in got.slow] == [type(c.link) for c in want.slow]
    assert len(got.stalls) == len(want.stalls)
    for g, w in zip(got.stalls, want.stalls, strict=True):
        assert (g.comm, g.stall_s, g.threshold_s, g.onset) == (w.comm, w.stall_s, w.threshold_s, w.onset)
        assert_same_diag(g.diag, w.diag)


def test_every_field_of_a_report_comes_back() -> None:
    report = make_report()
    raw = encode_report(report, 5)
    assert raw[2:10] == load_schema("ShardReport").fingerprint
    shard, back = decode_report(raw)
    assert shard == 5
    assert_same_report(back, report)


def test_an_empty_report_comes_back() -> None:
    assert decode_report(encode_report(ShardReport("j", 0, 0.0), 0)) == (0, ShardReport("j", 0, 0.0))


def _good() -> bytes:
    return encode_report(make_report(), 2)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (lambda g: g[:-3], "corrupt-body"),  # truncated body
        (lambda g: g[:HEADER_SIZE + 4], "corrupt-body"),
        (lambda g: g + b"\x00", "corrupt-body"),  # trailing bytes
        (lambda g: b"\xc3\x02" + g[2:], "bad-marker"),
        (lambda g: g[:5], "bad-marker"),  # shorter than a header
        (lambda g: g[:2] + bytes(8) + g[10:], "unknown-fingerprint"),
    ],
    ids=["truncated", "header-only", "trailing", "wrong-marker", "short", "unknown-fingerprint"],
)
def test_bad_bytes_have_the_codecs_reasons(bad: Callable[[bytes], bytes], reason: str) -> None:
    with pytest.raises(SchemaError) as err:
        decode_report(bad(_good()))
    assert err.value.reason == reason


def test_another_schema_is_wrong_schema() -> None:
    v = make_verdict(op_type="barrier")
    with pytest.raises(SchemaError) as err:
        decode_report(encode_verdict(v))
    assert err.value.reason == "wrong-schema"


@pytest.mark.parametrize(
    "spoil",
    [
        lambda rec: {**rec, "shard": -1},
        lambda rec: {**rec, "stalls": [{**rec["stalls"][0], "kind": "X9"}]},
        lambda rec: {**rec, "slow": [{**rec["slow"][0], "kind": "hang"}]},
    ],
    ids=["negative-shard", "unknown-stall-kind", "unknown-candidate-kind"],
)
def test_well_formed_but_impossible_reports_are_bad_record(spoil: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    _, rec = decode(_good())
    with pytest.raises(SchemaError) as err:
        decode_report(encode("ShardReport", spoil(rec)))
    assert err.value.reason == "bad-record"


def test_damaged_bytes_raise_only_schema_errors() -> None:
    """Every truncation and a few hundred byte flips: decoded or refused with a reason, nothing else."""
    good = _good()
    damaged = [good[:n] for n in range(len(good))]
    rnd = random.Random(7)
    for _ in range(300):
        b = bytearray(good)
        for _ in range(rnd.randint(1, 4)):
            b[rnd.randrange(HEADER_SIZE, len(b))] = rnd.randrange(256)
        damaged.append(bytes(b))
    for raw in damaged:
        try:
            decode_report(raw)
        except SchemaError:
            pass
