"""Decide: the analyzer (pure), the Faust worker that runs it per partition, the verdict tail and
the Flight Recorder post-mortem."""

from ccld.lazy import exports

# imported on first use: no Kafka, Faust or Arrow at import
__all__, __getattr__ = exports(__name__, {
    "Analyzer": "ccld.streams.analysis",
    "analyze_batches": "ccld.streams.analysis",
    "PartitionProcessor": "ccld.streams.processor",
    "create_app": "ccld.streams.app",
})
