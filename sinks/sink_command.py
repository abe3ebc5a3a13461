"""`ccld sink`: run the Parquet archiver until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from types import FrameType

from ccld.errors import BrokerError
from ccld.metrics_http import start_metrics_server
from ccld.settings import Settings
from ccld.sinks.archiver import Archiver
from ccld.sinks.sink_metrics import archiver_families


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, help="archive directory (default: archive_dir setting)")
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics on this port, 0: off (default: sink_metrics_port, 9464)")


def main(args: argparse.Namespace, settings: Settings) -> int:
    if args.metrics_port is not None:
        settings = settings.replace(sink_metrics_port=args.metrics_port)
    if not settings.bootstrap:
        raise BrokerError("ccld sink needs --bootstrap (or CCLD_BOOTSTRAP)")
    from ccld.topics import ensure_topics

    ensure_topics(settings)
    archiver = Archiver(settings, args.dir)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = start_metrics_server(lambda: archiver_families(archiver), settings.metrics_bind,
                                  settings.sink_metrics_port, what="sink")
    print(f"archiving {', '.join(archiver.topics)} to {archiver.root.resolve()}", flush=True)
    if server is not None:
        print(f"metrics: {server.url}", flush=True)
    try:
        archiver.run(stop)
    finally:
        if server is not None:
            server.close()
    print(f"sink stopped: {archiver.counters}", flush=True)
    return 0
