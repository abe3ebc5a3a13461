"""Keep: the Parquet archive of metrics and verdicts (deterministic files, offsets committed after)."""

from ccld.lazy import exports

# imported on first use: no Kafka, Faust or Arrow at import
__all__, __getattr__ = exports(__name__, {
    "Archiver": "ccld.sinks.archiver",
    "metrics_table": "ccld.sinks.parquet",
    "read_verdicts": "ccld.sinks.parquet",
    "verdicts_table": "ccld.sinks.parquet",
})
