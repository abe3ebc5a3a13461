"""`ccld worker`: run the Faust stream processor until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from typing import Any

from ccld.errors import BrokerError
from ccld.reachability import broker_reachable
from ccld.settings import Settings

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--app-id", help="consumer group / app id (default: worker_app_id setting)")
    parser.add_argument("--web-port", type=int, help="serve Faust's web UI on 127.0.0.1:PORT (default: off)")


#: How long a stop may take when no broker answers: there is nothing left to commit or send to.
DEAD_BROKER_GRACE_S = 1.0


def _exit_if_still_running(grace_s: float) -> None:
    def watchdog() -> None:
        time.sleep(grace_s)
        log.error("worker did not stop within %.0f s of the signal (broker unreachable?); exiting", grace_s)
        logging.shutdown()
        os._exit(1)

    threading.Thread(target=watchdog, name="ccld-shutdown-watchdog", daemon=True).start()


def run_worker(settings: Settings, app_id: str | None = None) -> int:
    """Create the topics, then run the worker in this process until a signal stops it."""
    import faust

    from ccld.streams.app import create_app
    from ccld.topics import ensure_topics

    if not settings.bootstrap:
        raise BrokerError("ccld worker needs --bootstrap (or CCLD_BOOTSTRAP); `ccld up` starts everything")
    ensure_topics(settings)
    app = create_app(settings, app_id=app_id)
    class Worker(faust.Worker):
        def _schedule_shutdown(self, signal: Any) -> None:
            # With its broker gone, Faust's shutdown can wait forever: end the process anyway, and soon when
            # nothing listens there (its commits and sends would only time out; the input is read again).
            grace = settings.worker_shutdown_grace_s
            if not broker_reachable(settings.bootstrap):
                grace = min(grace, DEAD_BROKER_GRACE_S)
                log.warning("stopping with no broker at %s: exiting within %.0f s", settings.bootstrap, grace)
            _exit_if_still_running(grace)
            super()._schedule_shutdown(signal)

    worker = Worker(app, loglevel=settings.log_level.lower(), quiet=True, redirect_stdouts=False,
                    override_logging=False)
    print(f"worker {app.conf.id} consuming {settings.metrics_topic} at {settings.bootstrap}", flush=True)
    worker.execute_from_commandline()  # returns via SystemExit when stopped
    return 0


def main(args: argparse.Namespace, settings: Settings) -> int:
    if args.web_port is not None:
        settings = settings.replace(worker_web_port=args.web_port)
    try:
        return run_worker(settings, app_id=args.app_id)
    except SystemExit as exc:
        return int(exc.code or 0)
