"""Ship: kernel records to Kafka (the producer, its batcher and spool), from the GPU probe, the
PyTorch attachment and the fault-injecting simulator."""

from ccld.lazy import exports

# imported on first use: no Kafka, Faust or Arrow at import
__all__, __getattr__ = exports(__name__, {
    "MetricsProducer": "ccld.producers.kafka",
    "simulate": "ccld.producers.simulator",
})
