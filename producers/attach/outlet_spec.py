"""Which outlet an attach sink spec names: Kafka (direct, or through the host aggregator) or JSON lines."""

from __future__ import annotations

from typing import Any

from ccld.errors import ConfigError
from ccld.producers.attach.aggregate import AggregatorSink
from ccld.producers.attach.outlets import JsonlSink, KafkaSink
from ccld.settings import Settings


def sink_from_spec(
    spec: str, settings: Settings, producer_id: str | None = None, aggregate_socket: str | None = None
) -> Any:
    """``kafka`` (default) or ``jsonl:<dir or file>``. With ``aggregate_socket``, Kafka batches go
    through the host's aggregator listening there (``AggregatorSink``; direct when it cannot take them)."""
    kind, _, arg = spec.partition(":")
    if kind in ("", "kafka"):
        if aggregate_socket:
            return AggregatorSink(aggregate_socket, settings)
        return KafkaSink(settings, producer_id)
    if kind == "jsonl" and arg:
        return JsonlSink(arg)
    raise ConfigError(f"unknown attach sink {spec!r}: use 'kafka' or 'jsonl:DIR'")
