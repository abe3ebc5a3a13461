"""Verdicts any consumer can read: with ``verdicts_encoding=json`` a real worker writes JSON objects, and a Kafka
client that shares no code with librdkafka (aiokafka, pure Python) reads them, and the Avro ones too, with only
the schema ``ccld schema verdict`` prints. Our own readers (``ccld verdicts``, the sink, the alert bridge) take
both: ``decode_verdict`` tells them apart by their first byte."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer

from ccld.producers.kafka import MetricsProducer
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.schemas.codec import encode_verdict
from ccld.settings import Settings
from ccld.sinks.archiver import Archiver
from ccld.sinks.catalog import read_verdicts
from factories import make_verdict
from harness import WorkerProcess, collect_verdicts

pytestmark = pytest.mark.integration


def read_with_aiokafka(settings: Settings, want: int, timeout_s: float = 30.0) -> list[tuple[bytes, dict[str, bytes]]]:
    """(value, headers) of the verdicts topic's messages, by a client independent of librdkafka."""
    from aiokafka import AIOKafkaConsumer

    async def run() -> list[tuple[bytes, dict[str, bytes]]]:
        c = AIOKafkaConsumer(settings.verdicts_topic, bootstrap_servers=settings.bootstrap,
                             auto_offset_reset="earliest", enable_auto_commit=False, group_id=None)
        await c.start()
        out: list[tuple[bytes, dict[str, bytes]]] = []
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while len(out) < want and loop.time() < deadline:
                got = await c.getmany(timeout_ms=500)
                for msgs in got.values():
                    out += [(m.value or b"", dict(m.headers or ())) for m in msgs]
        finally:
            await c.stop()
        return out

    return asyncio.run(run())


def test_a_json_worker_is_read_by_an_independent_client_and_so_is_avro_with_the_printed_schema(
    ccld_settings: Settings, worker_factory: Callable[[Settings], WorkerProcess], tmp_path: Path
) -> None:
    s = ccld_settings.replace(verdicts_encoding="json")
    worker_factory(s).start()
    sc = Scenario.from_dict({"id": "json-h1", "seed": 5, "ranks": 16, "layout": {"tp": 8, "pp": 1, "dp": 2},
                             "channels": 2, "step_time_s": 1.0, "duration_s": 60.0,
                             "faults": [{"kind": "H1", "rank": 5, "onset_s": 20.0}]})
    with MetricsProducer(s, background=False) as producer:
        for t_s, batch in simulate(sc):
            assert producer.send_batch(batch, timestamp_ms=int(t_s * 1000))
        assert producer.flush(20) == 0
    got = collect_verdicts(s, 60, until=lambda vs: any(5 in v.root_cause_ranks for v in vs))
    assert any(v.kind.value == "H1" and 5 in v.root_cause_ranks for v in got)
    # one verdict written as Avro beside them (a worker still on the default, or an older one)
    avro = make_verdict(incident_id="avro-1", job="json-h1", root_cause_ranks=(9,), root_cause_hosts=("node-0001",))
    p = Producer({"bootstrap.servers": s.bootstrap})
    p.produce(s.verdicts_topic, key=b"avro-1", value=encode_verdict(avro))
    assert p.flush(10) == 0

    msgs = read_with_aiokafka(s, len(got) + 1)
    as_json = [(json.loads(v), h) for v, h in msgs if v[:1] == b"{"]
    assert as_json and all(h.get("content-type") == b"application/json" for _, h in as_json), msgs
    first = as_json[0][0]
    assert first["kind"] == "H1" and first["root_cause_ranks"] == [5] and first["job"] == "json-h1", first
    assert set(first) >= {"incident_id", "state", "evidence", "detected_time", "root_cause_hosts", "affected_ranks"}
    # the Avro one, with nothing of ours but the schema the CLI prints: 2 marker bytes, 8 fingerprint, the body
    schema = subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "schema", "verdict"], capture_output=True,
                            text=True, check=True, timeout=60).stdout
    (raw,) = [v for v, _ in msgs if v[:2] == b"\xc3\x01"]
    rec: Any = fastavro.schemaless_reader(io.BytesIO(raw[10:]), fastavro.parse_schema(json.loads(schema)))
    assert rec["incident_id"] == "avro-1" and rec["root_cause_ranks"] == [9]

    # our readers take both: the tail, and the sink's archive
    tail = subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "verdicts", "--bootstrap", s.bootstrap,
                           "--topic-prefix", s.topic_prefix, "--from-beginning", "--timeout", "3", "--json"],
                          capture_output=True, text=True, timeout=60)
    ids = {json.loads(line)["incident_id"] for line in tail.stdout.splitlines()}
    assert "avro-1" in ids and first["incident_id"] in ids, tail.stdout + tail.stderr
    arch = Archiver(s)
    stop = threading.Event()
    t = threading.Thread(target=arch.run, args=(stop,), daemon=True)
    t.start()
    try:
        deadline = 60.0
        while deadline > 0 and {"avro-1", first["incident_id"]} - {r["incident_id"] for r in _archived(s)}:
            stop.wait(0.5)
            deadline -= 0.5
    finally:
        stop.set()
        t.join(30)
    assert {"avro-1", first["incident_id"]} <= {r["incident_id"] for r in _archived(s)}
    assert arch.counters["undecodable"] == 0


def _archived(s: Settings) -> list[dict[str, Any]]:
    root = Path(s.archive_dir)
    return read_verdicts(root, s.verdicts_topic) if root.is_dir() else []
