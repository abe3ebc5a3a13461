"""The wire contract: Avro schemas (``*.avsc``) and their single-object codec."""

from ccld.schemas.codec import (
    decode,
    decode_dead_letter,
    decode_metrics,
    decode_verdict,
    encode,
    encode_batch,
    encode_dead_letter,
    encode_verdict,
    load_schema,
)

__all__ = [
    "decode",
    "decode_dead_letter",
    "decode_metrics",
    "decode_verdict",
    "encode",
    "encode_batch",
    "encode_dead_letter",
    "encode_verdict",
    "load_schema",
]
