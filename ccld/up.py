"""`ccld up`: the whole pipeline on one machine: broker (unless --bootstrap), worker and sink.

The worker and the sink run as child processes (Faust wants its own event loop and signal
handlers); Ctrl-C or SIGTERM stops the children first, then the broker.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from ccld.broker import EmbeddedBroker, wait_until_answers
from ccld.settings import Settings
from ccld.topics import ensure_topics

log = logging.getLogger(__name__)


def child_env(settings: Settings) -> dict[str, str]:
    """The environment that hands every one of our settings to a child (it reads CCLD_* like we do)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_") or k == "CCLD_TEST_BOOTSTRAP"}
    env.update(settings.to_env())
    return env


class Pipeline:
    """Broker + worker + sink, started together and stopped together."""

    def __init__(self, settings: Settings, *, port: int = 0, log_dir: Path | None = None) -> None:
        self.settings = settings
        self.port = port
        self.log_dir = log_dir
        self.broker: EmbeddedBroker | None = None
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.started = False

    def start(self, *, worker: bool = True, sink: bool = True) -> Pipeline:
        try:
            if not self.settings.bootstrap:
                self.broker = EmbeddedBroker(self.port).start()
                self.settings = self.settings.replace(bootstrap=self.broker.bootstrap)
            else:
                wait_until_answers(self.settings.bootstrap)
            ensure_topics(self.settings)
            if worker:
                self._spawn("worker")
            if sink:
                self._spawn("sink")
        except BaseException:
            self.stop()  # never leave a broker or a child behind a failed start
            raise
        self.started = True
        return self

    def _spawn(self, command: str) -> None:
        old = self.children.get(command)
        if old is not None and old.poll() is None:
            raise RuntimeError(f"{command} is already running (pid {old.pid})")
        out: int | object = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{command}.log", "ab")  # noqa: SIM115 - lives as long as the child
        self.children[command] = subprocess.Popen(
            [sys.executable, "-P", "-m", "ccld.cli", command], env=child_env(self.settings),
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,  # type: ignore[arg-type]
        )

    def dead_children(self) -> list[str]:
        return [name for name, p in self.children.items() if p.poll() is not None]

    def stop(self, timeout_s: float = 15.0) -> None:
        for p in self.children.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for name, p in self.children.items():
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time; killing it", name)
                p.kill()
                p.wait()
        self.children.clear()
        if self.broker is not None:
            self.broker.stop()
            self.broker = None
        self.started = False

    def __enter__(self) -> Pipeline:
        # `with Pipeline(...).start(sink=False)` is started already: entering must not start twice.
        return self if self.started else self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=9092, help="embedded broker port (0 picks a free one)")
    parser.add_argument("--logs", type=Path, default=Path("ccld-logs"), help="where worker.log and sink.log go")


def stop_on_sigterm() -> None:
    """Make SIGTERM (and SIGINT, even where a shell started us with it ignored) unwind like Ctrl-C,
    so ``with``/``finally`` blocks stop brokers and children."""

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)


def main(args: argparse.Namespace, settings: Settings) -> int:
    pipeline = Pipeline(settings, port=args.port, log_dir=args.logs)
    stop_on_sigterm()
    try:
        pipeline.start()
        print(f"bootstrap: {pipeline.settings.bootstrap}", flush=True)
        print(f"worker and sink running (logs in {args.logs}/); archive in {settings.archive_dir}/; "
              f"Ctrl-C stops everything", flush=True)
        while True:
            dead = pipeline.dead_children()
            if dead:
                print(f"ccld up: {', '.join(dead)} exited; see {args.logs}/", file=sys.stderr)
                return 1
            if pipeline.broker is not None and not pipeline.broker.running:
                print("ccld up: the broker exited", file=sys.stderr)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("stopping...", flush=True)
        return 0
    finally:
        pipeline.stop()
