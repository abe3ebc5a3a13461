"""A /metrics endpoint on a stdlib HTTP server thread, for the processes without a web server of their own.

The sink, the alert bridge and the host aggregator each run one (``start_metrics_server``); the
worker serves the same text from Faust's web server instead. A scrape calls the service's
``collect`` function on the server's thread, so ``collect`` only reads (copies) what the service's
own thread counts. Metrics are never worth a service: a port that cannot be bound is said once and
the service runs without them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ccld.metrics import CONTENT_TYPE, Family, render

log = logging.getLogger(__name__)

Collect = Callable[[], Iterable[Family]]


def shown_host(host: str) -> str:
    """The host a URL should name for a server bound to ``host`` (all interfaces: this machine's loopback)."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def metrics_url(host: str, port: int) -> str:
    h = shown_host(host)
    return f"http://[{h}]:{port}/metrics" if ":" in h else f"http://{h}:{port}/metrics"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # the name http.server calls
        path = self.path.split("?", 1)[0]
        if path not in ("/metrics", "/metrics/"):
            self._send(404, b"not found: try /metrics\n", "text/plain; charset=utf-8")
            return
        try:
            body = render(self.server.collect()).encode()
        except Exception as exc:  # noqa: BLE001 - a bug in a collector answers 500, it must not kill the server
            log.exception("collecting metrics failed")
            self._send(500, f"collecting metrics failed: {type(exc).__name__}: {exc}\n".encode(),
                       "text/plain; charset=utf-8")
            return
        self._send(200, body, CONTENT_TYPE)

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics %s: " + format, self.address_string(), *args)  # every scrape would be a line otherwise


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a hung scraper must not keep the process alive

    def __init__(self, address: tuple[str, int], collect: Collect) -> None:
        self.collect = collect
        super().__init__(address, _Handler)


class MetricsServer:
    """``collect``'s families at ``http://host:port/metrics``, served from a daemon thread until ``close``."""

    def __init__(self, collect: Collect, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.collect = collect
        self.host = host
        self.port = port  # the bound port after start (0 picks a free one)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> MetricsServer:
        """Bind and serve; raises OSError when the address cannot be bound."""
        self._server = _Server((self.host, self.port), self.collect)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="ccld-metrics", daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        return metrics_url(self.host, self.port)

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> MetricsServer:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_metrics_server(collect: Collect, host: str, port: int, *, what: str) -> MetricsServer | None:
    """A started server for ``what`` (a service's name, for the log), or None: ``port`` 0 (off), or one that
    cannot be bound (said once; the service runs on without metrics)."""
    if port <= 0:
        return None
    try:
        server = MetricsServer(collect, host=host, port=port).start()
    except OSError as exc:
        log.warning("%s: no metrics endpoint: cannot listen on %s:%d (%s); set another port or 0 to turn it off",
                    what, host, port, exc.strerror or exc)
        return None
    log.info("%s metrics at %s", what, server.url)
    return server


@contextmanager
def serving_metrics(collect: Collect, host: str, port: int, *, what: str) -> Iterator[MetricsServer | None]:
    """``start_metrics_server`` for the life of a ``with`` block: closed however the service ends."""
    server = start_metrics_server(collect, host, port, what=what)
    try:
        yield server
    finally:
        if server is not None:
            server.close()
