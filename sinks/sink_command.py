"""`ccld sink`: run the Parquet archiver until Ctrl-C."""

from __future__ import annotations

import argparse
from pathlib import Path

from ccld.cli import stop_on_signals
from ccld.errors import BrokerError
from ccld.metrics_http import serving_metrics
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
    stop = stop_on_signals()
    with serving_metrics(lambda: archiver_families(archiver), settings.metrics_bind, settings.sink_metrics_port,
                         what="sink") as server:
        print(f"archiving {', '.join(archiver.topics)} to {archiver.root.resolve()}", flush=True)
        if server is not None:
            print(f"metrics: {server.url}", flush=True)
        archiver.run(stop)
    print(f"sink stopped: {archiver.counters}", flush=True)
    return 0
