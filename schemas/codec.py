"""Avro single-object encoding of every CCL-D message, with no schema registry.

A message is the Avro spec's 2-byte marker ``C3 01``, the 8-byte little-endian CRC-64-AVRO
fingerprint of the writer schema's canonical form, then the Avro binary body. The decoder
finds the writer schema by fingerprint among the ``.avsc`` files shipped in this package
(current and historical), and resolves it against the reader's schema, so old bytes stay
readable after a schema gains an optional field.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import fastavro
import fastavro.schema
import numpy as np

from ccld.errors import RecordError, SchemaError
from ccld.records import (
    BATCH_COLUMNS,
    COMM_COLUMN,
    OPTIONAL_BATCH_COLUMNS,
    DeadLetter,
    KernelBatch,
    KernelRecord,
    Verdict,
    batch_value_problems,
)

MAGIC = b"\xc3\x01"
HEADER_SIZE = 10

#: The schemas this build writes, by record name.
CURRENT = ("KernelRecord", "KernelBatch", "Verdict", "DeadLetter", "ShardReport")


@dataclass(frozen=True)
class Schema:
    """A parsed schema with its canonical form and fingerprint."""

    name: str
    raw: Mapping[str, Any]
    parsed: Any
    fingerprint: bytes  # 8 bytes, little-endian as written on the wire

    @property
    def header(self) -> bytes:
        return MAGIC + self.fingerprint


def _parse(raw: Mapping[str, Any]) -> Schema:
    # parsed with fastavro's hint (its marker keys): a schema without them is parsed again on every
    # read and write, a third of decoding a batch
    parsed = fastavro.parse_schema(dict(raw))
    canonical = fastavro.schema.to_parsing_canonical_form(dict(raw))
    # fastavro's hex string is already the little-endian byte order the single-object header wants
    # (tests/unit/core/test_codec.py checks it against an independent CRC-64-AVRO).
    fp = bytes.fromhex(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO"))
    return Schema(name=str(raw["name"]), raw=raw, parsed=parsed, fingerprint=fp)


@cache
def load_schema(name: str) -> Schema:
    """Load ``<name>.avsc`` (or ``history/<name>.avsc``) from the package data."""
    base = resources.files("ccld.schemas")
    path = base / f"{name}.avsc"
    if not path.is_file():
        path = base / "history" / f"{name}.avsc"
    if not path.is_file():
        raise SchemaError("unknown-schema", f"no schema file named {name}.avsc")
    return _parse(json.loads(path.read_text(encoding="utf-8")))


@cache
def _writers() -> dict[bytes, Schema]:
    """Every schema this build can read bytes of, keyed by fingerprint."""
    out: dict[bytes, Schema] = {}
    base = resources.files("ccld.schemas")
    names = [n for n in CURRENT]
    hist = base / "history"
    if hist.is_dir():
        names += [p.name[: -len(".avsc")] for p in hist.iterdir() if p.name.endswith(".avsc")]
    for n in names:
        s = load_schema(n)
        out[s.fingerprint] = s
    return out


def encode(name: str, record: Mapping[str, Any]) -> bytes:
    """Encode a dict with the current schema ``name`` as one single-object message."""
    schema = load_schema(name)
    buf = io.BytesIO()
    buf.write(schema.header)
    try:
        fastavro.schemaless_writer(buf, schema.parsed, dict(record))
    except (ValueError, TypeError, KeyError) as exc:
        raise SchemaError("unencodable", f"{name}: {exc}") from exc
    return buf.getvalue()


def read_header(data: bytes) -> Schema:
    """Check the marker and look the writer schema up by fingerprint."""
    if len(data) < HEADER_SIZE or data[:2] != MAGIC:
        raise SchemaError("bad-marker", f"not an Avro single-object message (starts {data[:2].hex() or 'empty'})")
    writer = _writers().get(bytes(data[2:HEADER_SIZE]))
    if writer is None:
        raise SchemaError("unknown-fingerprint", f"no known schema has fingerprint {data[2:HEADER_SIZE].hex()}")
    return writer


def decode(data: bytes, reader: str | None = None) -> tuple[str, dict[str, Any]]:
    """Decode one message; returns (record name, dict). ``reader`` resolves to that schema."""
    writer = read_header(data)
    target = load_schema(reader or writer.name)
    if target.name != writer.name:
        raise SchemaError("wrong-schema", f"expected {target.name}, message was written as {writer.name}")
    try:
        body = io.BytesIO(data)  # shares the bytes (a slice past the header copied the whole message)
        body.seek(HEADER_SIZE)
        rec = fastavro.schemaless_reader(
            body, writer.parsed, target.parsed if target is not writer else None
        )
        if body.tell() != len(data):
            raise SchemaError("corrupt-body", f"{len(data) - body.tell()} trailing bytes")
    except SchemaError:
        raise
    except Exception as exc:  # fastavro raises EOFError, ValueError, IndexError, UnicodeDecodeError...
        raise SchemaError("corrupt-body", f"{writer.name}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(rec, dict):
        raise SchemaError("corrupt-body", f"{writer.name} did not decode to a record")
    return writer.name, rec


# --- typed helpers -----------------------------------------------------------------------------


def encode_batch(batch: KernelBatch) -> bytes:
    rec: dict[str, Any] = {
        "job": batch.job,
        "incarnation": batch.incarnation,
        "comm_hash": batch.comm_hash,
        "world_size": batch.world_size,
        "producer": batch.producer,
        "batch_seq": batch.batch_seq,
        "n": batch.n,
        "channels": batch.channels,
        "hosts": list(batch.hosts),
        "send": np.ascontiguousarray(batch.send, dtype="<i8").tobytes(),
        "recv": np.ascontiguousarray(batch.recv, dtype="<i8").tobytes(),
        # all unknown (every row of an older source, every non-DONE row) travels as the empty default
        "peak_lag": b"" if not (batch.peaks >= 0).any() else np.ascontiguousarray(batch.peaks, dtype="<i8").tobytes(),
    }
    for name in BATCH_COLUMNS:
        rec[name] = np.ascontiguousarray(batch.columns[name], dtype="<i8").tobytes()
    for name, unknown in OPTIONAL_BATCH_COLUMNS.items():
        # a column that says nothing (every row its "unknown" value) travels as the empty default
        col = batch.columns[name]
        rec[name] = b"" if not (col != unknown).any() else np.ascontiguousarray(col, dtype="<i8").tobytes()
    rec["lost_records"] = int(batch.lost_records)
    rec["lost_ranks"] = np.asarray(batch.lost_ranks, dtype="<i8").tobytes()
    rec["cpu_wait"] = np.asarray(batch.cpu_wait, dtype="<i8").reshape(-1).tobytes()
    # one communicator (every batch of a source that sends per communicator): no column, 8 bytes a row saved
    comm = batch.columns[COMM_COLUMN]
    rec[COMM_COLUMN] = b"" if batch.one_comm else np.ascontiguousarray(comm, dtype="<i8").tobytes()
    return encode("KernelBatch", rec)


def batch_from_dict(rec: Mapping[str, Any]) -> KernelBatch:
    """Turn a decoded KernelBatch dict into arrays, checking every column's length."""
    n, ch = int(rec["n"]), int(rec["channels"])
    if n < 0 or not 0 <= ch <= 8:
        raise SchemaError("bad-record", f"KernelBatch n={n} channels={ch}")

    # An optional column absent from the message (an older writer, or nothing to say: empty bytes)
    # is left out here and filled by KernelBatch ("unknown", or comm_hash for column comm).
    # Every column in one frombuffer, the columns views of one array: a call per column was a
    # fifth of the worker's decoding time on small batches.
    wide = ("send", "recv", "peak_lag")  # n x channels
    names = [*BATCH_COLUMNS, *(k for k in (*OPTIONAL_BATCH_COLUMNS, COMM_COLUMN) if rec.get(k)),
             *(k for k in wide if k != "peak_lag" or rec.get(k))]
    raws = [rec[name] for name in names]
    for name, raw in zip(names, raws, strict=True):
        want = 8 * n * (ch if name in wide else 1)
        if len(raw) != want:
            raise SchemaError("bad-record", f"KernelBatch column {name} has {len(raw)} bytes, want {want}")
    flat = np.frombuffer(b"".join(raws), dtype="<i8").astype(np.int64, copy=False)
    arrays: dict[str, np.ndarray] = {}
    at = 0
    for name in names:
        width = ch if name in wide else 1
        arrays[name] = flat[at : at + n * width].reshape(n, width) if name in wide else flat[at : at + n]
        at += n * width
    send, recv, peak = arrays.pop("send"), arrays.pop("recv"), arrays.pop("peak_lag", None)
    lost_raw = rec.get("lost_ranks") or b""
    lost_n = int(rec.get("lost_records", 0))
    if len(lost_raw) % 8 or lost_n < 0:
        raise SchemaError("bad-record", f"KernelBatch lost_ranks has {len(lost_raw)} bytes, lost_records {lost_n}")
    cpu_raw = rec.get("cpu_wait") or b""
    if len(cpu_raw) % 24:
        raise SchemaError("bad-record",
                          f"KernelBatch cpu_wait has {len(cpu_raw)} bytes, not whole (rank, wait, run) triples")
    cpu = np.frombuffer(cpu_raw, dtype="<i8").reshape(-1, 3).tolist()

    try:
        return KernelBatch(
            job=str(rec["job"]),
            incarnation=int(rec["incarnation"]),
            comm_hash=int(rec["comm_hash"]),
            world_size=int(rec["world_size"]),
            hosts=tuple(rec["hosts"]),
            columns=arrays,
            send=send,
            recv=recv,
            producer=str(rec["producer"]),
            batch_seq=int(rec["batch_seq"]),
            peak_lag=peak,
            lost_records=lost_n,
            lost_ranks=tuple(np.frombuffer(lost_raw, dtype="<i8").tolist()),
            cpu_wait=tuple((int(r), int(w), int(sp)) for r, w, sp in cpu),
        )
    except RecordError as exc:
        raise SchemaError("bad-record", str(exc)) from exc


def decode_metrics(data: bytes, *, check_values: bool = True) -> KernelBatch:
    """Decode a metrics-topic message (a KernelBatch, or a single KernelRecord) into a batch.

    With ``check_values`` (the default, what the worker and the sink use) a batch holding an
    impossible value (rank >= world size, unknown status, int64-extreme time, ...) raises
    ``SchemaError("bad-value", ...)``: it is well-formed on the wire but must not be analysed or archived.
    """
    name, rec = decode(data)
    if name == "KernelBatch":
        batch = batch_from_dict(rec)
    elif name == "KernelRecord":
        try:
            batch = KernelBatch.from_records([KernelRecord.from_dict(rec)])
        except RecordError as exc:
            raise SchemaError("bad-record", str(exc)) from exc
    else:
        raise SchemaError("wrong-schema", f"a {name} does not belong on the metrics topic")
    if check_values:
        problems = batch_value_problems(batch)
        if problems:
            raise SchemaError("bad-value", f"{batch.job}/{batch.producer}#{batch.batch_seq}: " + "; ".join(problems))
    return batch


#: Raw bytes of a message kept in its dead letter, at most (the broker refuses messages over about 1 MB,
#: and the reason, size and origin say enough to find the original in the source topic).
DEAD_LETTER_RAW_MAX = 64 * 1024


def make_dead_letter(raw: bytes | None, reason: str, detail: str, *, source_topic: str, source_partition: int,
                     source_offset: int, time_ms: int, raw_max: int = DEAD_LETTER_RAW_MAX) -> DeadLetter:
    """A dead letter whose ``raw`` is cut to ``raw_max`` bytes; the detail then says the original size."""
    data = bytes(raw or b"")
    if len(data) > raw_max:
        detail = f"raw truncated to {raw_max} of {len(data)} bytes; {detail}"
        data = data[:raw_max]
    return DeadLetter(raw=data, reason=reason, detail=detail[:2000], source_topic=source_topic,
                      source_partition=source_partition, source_offset=source_offset, time_ms=time_ms)


def encode_verdict(v: Verdict) -> bytes:
    return encode("Verdict", v.to_dict())


#: the header that names a JSON verdict's encoding (``verdicts_encoding=json``)
ENCODING_HEADER = "content-type"
JSON_CONTENT_TYPE = b"application/json"


def encode_verdict_json(v: Verdict) -> bytes:
    """A verdict as one JSON object: the fields ``ccld verdicts --json`` prints, for consumers without Avro."""
    return json.dumps(v.to_dict(), sort_keys=True, separators=(",", ":")).encode()


def decode_verdict(data: bytes) -> Verdict:
    """A verdict in either encoding: JSON starts with ``{``, Avro's single-object encoding with its marker."""
    if data[:1] == b"{":
        try:
            rec = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SchemaError("corrupt-body", f"Verdict (JSON): {exc}") from exc
        if not isinstance(rec, dict):
            raise SchemaError("corrupt-body", "Verdict (JSON) is not an object")
    else:
        _, rec = decode(data, reader="Verdict")
    try:
        return Verdict.from_dict(rec)
    except (RecordError, KeyError, TypeError, ValueError) as exc:
        raise SchemaError("bad-record", f"{type(exc).__name__}: {exc}") from exc


def encode_dead_letter(d: DeadLetter) -> bytes:
    return encode("DeadLetter", d.to_dict())


def decode_dead_letter(data: bytes) -> DeadLetter:
    _, rec = decode(data, reader="DeadLetter")
    return DeadLetter.from_dict(rec)
