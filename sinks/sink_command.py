"""`ccld sink`: run the Parquet archiver until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from types import FrameType

from ccld.errors import BrokerError
from ccld.settings import Settings
from ccld.sinks.archiver import Archiver


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, help="archive directory (default: archive_dir setting)")


def main(args: argparse.Namespace, settings: Settings) -> int:
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
    print(f"archiving {', '.join(archiver.topics)} to {archiver.root.resolve()}", flush=True)
    archiver.run(stop)
    print(f"sink stopped: {archiver.counters}", flush=True)
    return 0
