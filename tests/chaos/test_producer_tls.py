"""TLS end to end: the producer, a real ``ccld worker`` and a real ``ccld sink`` through a TLS listener only.

The bundled Tansu 0.6.0 takes ``--cert``/``--key`` but its listener never completes a TLS
handshake (measured: the client's handshake times out), so the TLS listener here is a small
TLS-terminating proxy on loopback in front of a real Tansu broker that advertises the proxy's
port: every byte a client exchanges with the broker crosses a real, verified TLS session.
SASL cannot be exercised against Tansu; its translation is unit-tested (tests/unit/core/test_security.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ccld.errors import BrokerError
from ccld.producers.kafka import MetricsProducer
from ccld.producers.simulator.publish import publish
from ccld.security import faust_kwargs, kafka_config
from ccld.settings import Settings
from ccld.stack.broker import free_port, tansu_binary, wait_until_answers
from ccld.stack.up import child_env
from ccld.topics import ensure_topics
from chaoslib import archived, small_scenario, wait_for
from factories import make_kernel_record
from harness import WorkerProcess, collect_verdicts

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def make_cert(d: Path, name: str) -> tuple[Path, Path]:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / f"{name}.key"),
                    "-out", str(d / f"{name}.pem"), "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return d / f"{name}.pem", d / f"{name}.key"


class TlsProxy:
    """Accept TLS on ``port`` and pipe the plaintext to ``upstream`` (a thread with its own loop)."""

    def __init__(self, port: int, upstream: int, cert: Path, key: Path) -> None:
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(cert, key)
        self.port, self.upstream = port, upstream
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self.ctx))
        self.ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.close()
            return

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            with contextlib.suppress(Exception):
                w.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    def __enter__(self) -> TlsProxy:
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    """(bootstrap of the TLS listener, CA that signed it, an unrelated CA)."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = make_cert(d, "broker")
    other, _ = make_cert(d, "other")
    inner, outer = free_port(), free_port()
    broker = subprocess.Popen(
        [tansu_binary(), "broker", "--listener-url", f"tcp://127.0.0.1:{inner}",
         "--advertised-listener-url", f"tcp://127.0.0.1:{outer}", "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"})
    try:
        with TlsProxy(outer, inner, cert, key):
            yield f"127.0.0.1:{outer}", cert, other
    finally:
        broker.terminate()
        broker.wait(10)


def tls_settings(bootstrap: str, ca: Path) -> Settings:
    return Settings.load({}, bootstrap=bootstrap, topic_prefix=f"tls{uuid.uuid4().hex[:6]}.", metrics_partitions=1,
                         security_protocol="SSL", ssl_ca_location=str(ca), producer_linger_ms=20,
                         producer_connect_timeout_s=5)


def test_producer_admin_and_consumer_speak_tls(tls: tuple[str, Path, Path]) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    bootstrap, ca, _other = tls
    s = tls_settings(bootstrap, ca)
    wait_until_answers(bootstrap, timeout_s=15, config=kafka_config(s))
    ensure_topics(s)
    with MetricsProducer(s, producer_id="tls") as p:
        p.check_broker()
        for i in range(200):
            p.submit(make_kernel_record(op_seq=i))
    assert p.stats["delivered_records"] == 200 and p.lost_records == 0, p.stats_line()
    c = Consumer(kafka_config(s, **{"group.id": "tls-read", "enable.auto.commit": False}))
    try:
        c.assign([TopicPartition(s.metrics_topic, 0, OFFSET_BEGINNING)])
        msg = c.poll(15)
        assert msg is not None and msg.error() is None
    finally:
        c.close()


def test_a_broker_certificate_from_another_ca_is_refused(tls: tuple[str, Path, Path]) -> None:
    bootstrap, _ca, other = tls
    p = MetricsProducer(tls_settings(bootstrap, other), background=False)
    try:
        with pytest.raises(BrokerError, match="no Kafka broker answered"):
            p.check_broker(timeout_s=3)
    finally:
        p.close(timeout_s=1)


def test_the_worker_client_speaks_tls_with_faust_kwargs(tls: tuple[str, Path, Path]) -> None:
    from aiokafka import AIOKafkaProducer
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    bootstrap, ca, _other = tls
    s = tls_settings(bootstrap, ca)
    ensure_topics(s)
    auth = credentials_to_aiokafka_auth(faust_kwargs(s)["broker_credentials"])  # what Faust hands aiokafka

    async def send() -> int:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **auth)
        await producer.start()
        try:
            meta = await producer.send_and_wait(s.verdicts_topic, b"over tls")
            return int(meta.offset)
        finally:
            await producer.stop()

    assert auth["security_protocol"] == "SSL"
    assert asyncio.run(asyncio.wait_for(send(), 30)) >= 0


def tls_worker_settings(tls: tuple[str, Path, Path], tmp_path: Path) -> Settings:
    """``tls_settings`` plus what a worker and a sink of this test need: its own app id, group and archive."""
    bootstrap, ca, _other = tls
    tag = uuid.uuid4().hex[:8]
    return tls_settings(bootstrap, ca).replace(
        worker_app_id=f"ccld-tls-{tag}", sink_group=f"ccld-sink-tls-{tag}", archive_dir=str(tmp_path / "archive"),
        worker_tick_s=0.5, worker_commit_interval_s=0.5, worker_shutdown_grace_s=10.0)


def test_a_real_worker_and_sink_over_tls_name_the_hung_rank_and_archive_the_job(
    tls: tuple[str, Path, Path], tmp_path: Path
) -> None:
    s = tls_worker_settings(tls, tmp_path)
    env = child_env(s)
    # The children get the TLS settings and the TLS listener only: the fixture never hands out the broker's
    # own (plaintext) port, and the broker advertises the proxy's, so every connection crosses TLS.
    assert (env["CCLD_SECURITY_PROTOCOL"], env["CCLD_SSL_CA_LOCATION"], env["CCLD_BOOTSTRAP"]) == (
        "SSL", str(tls[1]), tls[0])
    assert Settings.load(env) == s, "the settings did not survive the trip through the environment"
    ensure_topics(s)
    worker = WorkerProcess(s, tmp_path / "worker.log")
    sink_log = tmp_path / "sink.log"
    with sink_log.open("wb") as out:
        sink = subprocess.Popen([sys.executable, "-P", "-m", "ccld.cli", "sink"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path)
    try:
        worker.start(ready_timeout_s=40)
        with MetricsProducer(s, producer_id="tls-job", background=False) as p:
            sent = publish(small_scenario("tls-h1", {"kind": "H1", "rank": 5, "onset_s": 15.0}, 45.0), p)
            assert p.flush(30) == 0
        assert p.stats["delivered_records"] == sent["records"] > 0 and p.lost_records == 0, p.stats_line()

        got = collect_verdicts(s, 30, until=lambda vs: any(5 in v.root_cause_ranks for v in vs))
        hits = [v for v in got if v.kind.value == "H1" and 5 in v.root_cause_ranks]
        assert hits and hits[0].job == "tls-h1", f"{[v.describe() for v in got]}\n{worker.log()}"

        root = Path(s.archive_dir)

        def rows(topic: str) -> int:
            return sum(archived(root, topic).values())

        assert wait_for(lambda: rows(s.metrics_topic) == sent["records"] and rows(s.verdicts_topic) > 0, 20), (
            f"archived {rows(s.metrics_topic)} of {sent['records']} records, {rows(s.verdicts_topic)} verdicts\n"
            f"{sink_log.read_text(errors='replace')[-4000:]}")
    finally:
        worker.stop(signal.SIGKILL)
        if sink.poll() is None:
            os.killpg(sink.pid, signal.SIGKILL)
        sink.wait(10)


def test_a_worker_without_the_tls_settings_fails_fast_at_the_tls_port(
    tls: tuple[str, Path, Path], tmp_path: Path
) -> None:
    s = tls_worker_settings(tls, tmp_path).replace(security_protocol="PLAINTEXT", ssl_ca_location="")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "worker"], env=child_env(s), capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode != 0 and "cannot reach Kafka" in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 40
