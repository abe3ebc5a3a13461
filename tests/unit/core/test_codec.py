"""The wire format: golden bytes, fingerprints, evolution, and every way a message can be bad."""

from __future__ import annotations

import json
from pathlib import Path

import fastavro.schema
import numpy as np
import pytest

from ccld.errors import SchemaError
from ccld.records import AnomalyKind, KernelBatch, Link, Verdict, VerdictState, batch_value_problems
from ccld.schemas import codec
from ccld.schemas.codec import decode, decode_metrics, decode_verdict, encode, encode_batch, encode_verdict, load_schema
from factories import make_kernel_record, make_verdict
from harness import impossible_batches

SCHEMAS = Path(codec.__file__).parent

# The exact bytes of make_kernel_record() as a single-object message: marker C3 01, the
# fingerprint 6f2d6d72c47d0011, then the Avro body. A change here changes the wire format.
GOLDEN_KERNEL_RECORD = (
    "c3016f2d6d72c47d00110a6a6f622d6100e0fbe6ab939eabb4240e0004808080010102020808126e6f64652d30303030"
    "0480897ac09fab03c09fab030408080004080600"
)


def crc64_avro(data: bytes) -> int:
    """The Avro spec's reference fingerprint algorithm, written out independently of fastavro."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for b in data:
        fp = (fp >> 8) ^ table[(fp ^ b) & 0xFF]
    return fp


def test_kernel_record_golden_bytes() -> None:
    assert encode("KernelRecord", make_kernel_record().to_dict()).hex() == GOLDEN_KERNEL_RECORD


@pytest.mark.parametrize("name", codec.CURRENT)
def test_fingerprint_is_crc64_avro_little_endian(name: str) -> None:
    raw = json.loads((SCHEMAS / f"{name}.avsc").read_text())
    canonical = fastavro.schema.to_parsing_canonical_form(raw).encode()
    assert load_schema(name).fingerprint == crc64_avro(canonical).to_bytes(8, "little")


def test_record_and_batch_round_trip() -> None:
    recs = [make_kernel_record(rank=r, comm_rank=r, host=f"node-{r // 2}") for r in range(4)]
    batch = KernelBatch.from_records(recs, producer="p1", batch_seq=9)
    back = decode_metrics(encode_batch(batch))
    assert back.records() == recs
    assert (back.producer, back.batch_seq, back.hosts) == ("p1", 9, ("node-0", "node-1"))
    # A single row record on the metrics topic is accepted as a batch of one.
    assert decode_metrics(encode("KernelRecord", recs[2].to_dict())).records() == [recs[2]]


def test_verdict_round_trip_and_json() -> None:
    v = Verdict(incident_id="abc", state=VerdictState.OPEN, kind=AnomalyKind.H3, job="j", communicator="00ff",
                op_seq=3, op_type="ALL_REDUCE", root_cause_ranks=(5,), affected_ranks=(4, 5, 6), confidence=0.9,
                evidence="counters frozen", onset_time=1.5, detected_time=9.0, link=Link(5, 6), channel=2)
    assert decode_verdict(encode_verdict(v)) == v
    assert json.loads(json.dumps(v.to_dict()))["link"] == {"src": 5, "dst": 6}


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "bad-marker"),
        (b"{\"json\": 1}", "bad-marker"),
        (b"\xc3\x01" + b"\x00" * 8 + b"\x02", "unknown-fingerprint"),
    ],
)
def test_bad_messages_have_reasons(data: bytes, reason: str) -> None:
    with pytest.raises(SchemaError) as err:
        decode(data)
    assert err.value.reason == reason


def test_corrupt_and_truncated_bodies() -> None:
    good = encode_batch(KernelBatch.from_records([make_kernel_record()]))
    for bad in (good[:-7], good[:12], good + b"\x00\x01", good[:10] + b"\xff" * 40):
        with pytest.raises(SchemaError) as err:
            decode_metrics(bad)
        assert err.value.reason in {"corrupt-body", "bad-record"}


def test_batch_with_inconsistent_columns_is_bad_record() -> None:
    name, rec = decode(encode_batch(KernelBatch.from_records([make_kernel_record()])))
    rec["n"] = 2  # columns hold one row
    with pytest.raises(SchemaError) as err:
        codec.batch_from_dict(rec)
    assert err.value.reason == "bad-record"
    rec["n"], rec["host_idx"] = 1, np.array([5], "<i8").tobytes()  # points outside the hosts table
    with pytest.raises(SchemaError):
        codec.batch_from_dict(rec)


def test_verdict_on_metrics_topic_is_wrong_schema() -> None:
    v = make_verdict(op_type="BARRIER")
    with pytest.raises(SchemaError) as err:
        decode_metrics(encode_verdict(v))
    assert err.value.reason == "wrong-schema"


def test_reader_with_new_optional_field_reads_old_bytes(tmp_path: Path) -> None:
    """Schema evolution: bytes written with the shipped schema, read by a schema with one more field."""
    old = load_schema("Verdict")
    newer = json.loads((SCHEMAS / "Verdict.avsc").read_text())
    newer["fields"].append({"name": "runbook_url", "type": ["null", "string"], "default": None})
    v = Verdict(incident_id="x", state=VerdictState.RESOLVED, kind=AnomalyKind.S2, job="j", communicator="1",
                op_seq=1, op_type="ALL_GATHER", root_cause_ranks=(2,), affected_ranks=(1, 2), confidence=0.5,
                evidence="e", onset_time=0.0, detected_time=1.0, p=0.1)
    data = encode_verdict(v)
    assert data[2:10] == old.fingerprint
    reader = fastavro.parse_schema(newer)
    import io

    rec = fastavro.schemaless_reader(io.BytesIO(data[10:]), old.parsed, reader)
    assert rec["runbook_url"] is None and rec["p"] == 0.1 and Verdict.from_dict(rec) == v


def test_historical_schema_is_resolved_to_current(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Bytes of an older Verdict version (one field fewer) decode with the current reader."""
    raw = json.loads((SCHEMAS / "Verdict.avsc").read_text())
    raw["fields"] = [f for f in raw["fields"] if f["name"] != "mismatch_field"]
    old = codec._parse(raw)
    monkeypatch.setitem(codec._writers(), old.fingerprint, old)
    import io

    buf = io.BytesIO()
    body = {f["name"]: None for f in raw["fields"]}
    body.update(incident_id="i", state="open", kind="H2", job="j", communicator="c", op_seq=2, op_type="SEND",
                root_cause_ranks=[3], root_cause_hosts=[], affected_ranks=[3], link=None, channel=None, p=None,
                confidence=1.0, evidence="e", onset_time=0.0, detected_time=2.0, details={})
    fastavro.schemaless_writer(buf, old.parsed, body)
    v = decode_verdict(old.header + buf.getvalue())
    assert v.mismatch_field is None and v.kind is AnomalyKind.H2


def test_concat_keeps_rows_and_remaps_hosts() -> None:
    a = KernelBatch.from_records([make_kernel_record(host="h1", send_counts=(1,), recv_counts=(2,))])
    b = KernelBatch.from_records([make_kernel_record(host="h2", rank=2, comm_rank=2),
                                  make_kernel_record(host="h1", rank=3, comm_rank=3)])
    both = KernelBatch.concat([a, b], producer="x", batch_seq=4)
    assert both.hosts == ("h1", "h2") and both.channels == 2
    assert [r.host for r in both.records()] == ["h1", "h2", "h1"]
    assert both.records()[0].send_counts == (1, 0) and both.records()[1:] == b.records()
    assert decode_metrics(encode_batch(both)).records() == both.records()


# --- impossible values (issue 11): one pure check, applied by decode_metrics for the worker and the sink ---------


@pytest.mark.parametrize("name", sorted(impossible_batches()))
def test_each_impossible_value_is_named_and_refused_as_bad_value(name: str) -> None:
    batch = impossible_batches()[name]
    assert batch_value_problems(batch), f"{name} passed the value checks"
    data = encode_batch(batch)
    with pytest.raises(SchemaError) as err:
        decode_metrics(data)
    assert err.value.reason == "bad-value" and "bad-p#0" in err.value.detail
    assert decode_metrics(data, check_values=False).n == batch.n  # still readable for forensics


def test_simulated_and_factory_records_have_no_impossible_values() -> None:
    from ccld.producers.simulator.scenario import Scenario
    from ccld.producers.simulator.sim import simulate

    sc = Scenario.from_dict({"id": "v", "seed": 1, "ranks": 16, "layout": {"tp": 8, "pp": 1, "dp": 2},
                             "channels": 2, "step_time_s": 1.0, "duration_s": 40.0, "clock_skew_s": 2.0,
                             "faults": [{"kind": "H3", "rank": 3, "peer": 4, "onset_s": 20.0}],
                             "expect": [{"kind": "H3", "rank": 3}]})
    assert [p for _, b in simulate(sc) for p in batch_value_problems(b)] == []
    assert batch_value_problems(KernelBatch.from_records([make_kernel_record(t_enter_ns=-1, t_exit_ns=-1)])) == []


def test_a_single_record_beyond_the_world_is_bad_value() -> None:
    with pytest.raises(SchemaError) as err:
        decode_metrics(encode("KernelRecord", make_kernel_record(rank=9, world_size=4).to_dict()))
    assert err.value.reason == "bad-value" and "rank outside [0, world_size=4)" in err.value.detail


def test_dead_letters_keep_at_most_raw_max_bytes_and_say_the_size() -> None:
    small = codec.make_dead_letter(b"abc", "bad-marker", "d", source_topic="t", source_partition=1, source_offset=2,
                                   time_ms=3)
    assert (small.raw, small.detail) == (b"abc", "d")
    big = codec.make_dead_letter(bytes(100_000), "corrupt-body", "d", source_topic="t", source_partition=1,
                                 source_offset=2, time_ms=3, raw_max=10)
    assert big.raw == bytes(10) and big.detail == "raw truncated to 10 of 100000 bytes; d"
    assert len(codec.encode_dead_letter(codec.make_dead_letter(bytes(5 << 20), "x", "d", source_topic="t",
                                                                source_partition=0, source_offset=0, time_ms=0))) \
        < codec.DEAD_LETTER_RAW_MAX + 512


def test_a_verdict_in_json_decodes_like_avro_and_bad_json_is_a_clear_error() -> None:
    import json as _json

    from ccld.errors import SchemaError
    from ccld.schemas.codec import decode_verdict, encode_verdict, encode_verdict_json
    from factories import make_verdict

    v = make_verdict(root_cause_hosts=("node-0003",), details={"nic": "node-0003"})
    raw = encode_verdict_json(v)
    assert raw[:1] == b"{" and _json.loads(raw) == v.to_dict()
    assert decode_verdict(raw) == v == decode_verdict(encode_verdict(v))
    for bad, reason in ((b"{not json", "corrupt-body"), (b'{"kind": "H1"}', "bad-record"),
                        (b'{"incident_id": 1}', "bad-record")):
        with pytest.raises(SchemaError) as info:
            decode_verdict(bad)
        assert info.value.reason == reason, (bad, info.value)


def test_ccld_schema_prints_the_verdict_schema(capsys: pytest.CaptureFixture[str]) -> None:
    import json as _json

    from ccld.cli import main

    assert main(["schema", "verdict"]) == 0
    schema = _json.loads(capsys.readouterr().out)
    assert schema["name"] == "Verdict" and any(f["name"] == "root_cause_hosts" for f in schema["fields"])
