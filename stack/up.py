"""`ccld up`: the whole pipeline on one machine: broker (unless --bootstrap), worker and sink, supervised.

The worker and the sink run as child processes (Faust wants its own event loop and signal
handlers). A child that dies is restarted with backoff (``stack.supervise.Backoff``) and the
restart is logged; a dead embedded broker is restarted on the same port, its topics are
recreated and the children restarted against it (the memory broker lost every message, offset
and group). Ctrl-C or SIGTERM stops the children first, then the broker.

``ccld up`` gives each child a Prometheus metrics port (``--metrics-port``: free ones by default,
or consecutive ones from a base) and prints each URL; a restarted child keeps its port.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from ccld import up_state
from ccld.cli import count_arg, port_arg
from ccld.errors import BrokerError
from ccld.lifeline import Lifeline
from ccld.metrics_http import metrics_url
from ccld.security import kafka_config
from ccld.settings import Settings
from ccld.stack import renew
from ccld.stack.broker import EmbeddedBroker, free_port, wait_until_answers
from ccld.stack.renew import RenewalWatch
from ccld.stack.signals import stop_on_sigterm
from ccld.stack.supervise import Backoff
from ccld.topics import ensure_topics

log = logging.getLogger(__name__)

__all__ = ["Pipeline", "child_env", "configure", "main", "stop_on_sigterm"]

#: the setting that carries each kind of child's metrics port (the worker serves /metrics from Faust's web server)
METRICS_PORT_SETTING = {"worker": "worker_web_port", "sink": "sink_metrics_port", "alert": "alert_metrics_port"}


def child_env(settings: Settings) -> dict[str, str]:
    """The environment that hands every one of our settings to a child (it reads CCLD_* like we do)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_") or k == "CCLD_TEST_BOOTSTRAP"}
    env.update(settings.to_env())
    return env


class Pipeline:
    """Broker + worker + sink, started together and stopped together; ``supervise()`` restarts the dead."""

    def __init__(self, settings: Settings, *, port: int = 0, log_dir: Path | None = None,
                 backoff: Callable[[], Backoff] = Backoff, metrics_port: int | None = None) -> None:
        self.settings = settings
        self.port = port
        self.log_dir = log_dir
        self.broker: EmbeddedBroker | None = None
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.started = False
        self._backoff_factory = backoff
        self.backoff: dict[str, Backoff] = {}  # "broker", "worker", "sink"
        self._lifeline: Lifeline | None = None  # children watch it: they stop when this process is gone
        # None: the children's metrics ports are the settings' as they are; 0: a free port each; N: N, N+1, ...
        # in start order. A child keeps its port across restarts, so a printed URL stays right.
        self.metrics_port = metrics_port
        self.metrics_ports: dict[str, int] = {}
        # the bound on the embedded broker's memory (stack/renew.py)
        self._renewal = RenewalWatch(settings.up_broker_renew_mb, settings.up_renew_quiet_s)
        self._renew_checked = -math.inf
        self.renewals = 0

    def start(self, *, worker: bool = True, sink: bool = True, workers: int = 1) -> Pipeline:
        """Start the broker (unless the settings name one), ``workers`` workers and the sink."""
        try:
            if not self.settings.bootstrap:
                self.broker = EmbeddedBroker(self.port).start()
                self.settings = self.settings.replace(bootstrap=self.broker.bootstrap)
                self._backoff("broker").started(time.monotonic())
            else:
                wait_until_answers(self.settings.bootstrap, config=kafka_config(self.settings))
            ensure_topics(self.settings)
            if worker:
                for i in range(max(workers, 1)):
                    # several workers share the load (the metrics partitions); each has its own log
                    self._spawn("worker" if i == 0 else f"worker-{i + 1}")
            if sink:
                self._spawn("sink")
            if self.settings.alert_alertmanager_url or self.settings.alert_webhook_url:
                self._spawn("alert")  # the alert bridge, only when it has somewhere to deliver
        except BaseException:
            self.stop()  # never leave a broker or a child behind a failed start
            raise
        self.started = True
        return self

    def _backoff(self, name: str) -> Backoff:
        return self.backoff.setdefault(name, self._backoff_factory())

    def _spawn(self, name: str) -> None:
        """Start child ``name``: ``worker``, ``worker-<n>`` (another worker) or ``sink``."""
        old = self.children.get(name)
        if old is not None and old.poll() is None:
            raise RuntimeError(f"{name} is already running (pid {old.pid})")
        out: int = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = os.open(self.log_dir / f"{name}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if self._lifeline is None:
            self._lifeline = Lifeline()
        try:
            # A session of its own: a Ctrl-C in the terminal reaches us alone, and we stop the children in
            # order. So nothing tells them if we are killed: they watch the lifeline (ccld.lifeline).
            self.children[name] = subprocess.Popen(
                [sys.executable, "-P", "-m", "ccld.cli", name.partition("-")[0]],
                env={**child_env(self._child_settings(name)), **self._lifeline.env()},
                pass_fds=self._lifeline.pass_fds,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        finally:
            if out != subprocess.DEVNULL:
                os.close(out)  # the child has its own copy; a restarted child must not leak ours
        self._backoff(name).started(time.monotonic())

    def _child_settings(self, name: str) -> Settings:
        """The settings child ``name`` gets: ours, with its own metrics port when we hand them out."""
        setting = METRICS_PORT_SETTING.get(name.partition("-")[0])
        if self.metrics_port is None or setting is None:
            return self.settings
        port = self.metrics_ports.get(name)
        if port is None:
            base = self.metrics_port
            port = free_port(self.settings.metrics_bind) if base == 0 else base + len(self.metrics_ports)
            self.metrics_ports[name] = port
        return self.settings.replace(**{setting: port})

    def metrics_urls(self) -> dict[str, str]:
        """Child name -> the URL of its /metrics, for the children given a port (``metrics_port``)."""
        return {name: metrics_url(self.settings.metrics_bind, port) for name, port in self.metrics_ports.items()
                if name in self.children}

    def dead_children(self) -> list[str]:
        return [name for name, p in self.children.items() if p.poll() is not None]

    # --- supervision ---------------------------------------------------------------------------

    def supervise(self, now: float | None = None) -> list[str]:
        """One round: restart a dead broker (then the children) or dead children whose backoff is over.

        Returns one line per thing it saw or did, for the person watching; each is logged too.
        """
        now = time.monotonic() if now is None else now
        events: list[str] = []
        if self.broker is not None and not self.broker.running:
            events += self._restart_broker(now)
            if self.broker is not None and not self.broker.running:
                return events  # children wait for their broker
        for name in sorted(self.children):
            proc = self.children[name]
            code = proc.poll()
            if code is None:
                continue
            b = self._backoff(name)
            if b.started_at is not None:  # first time we see this death
                delay = b.crashed(now)
                events.append(f"{name} exited with code {code}; restarting in {delay:.0f} s "
                              f"(restart {b.restarts + 1}; log: {self._log_hint(name)})")
            if b.due(now):
                self._spawn(name)
                b.restarted(now)
                events.append(f"{name} restarted (pid {self.children[name].pid}, restart {b.restarts})")
        events += self._maybe_renew(now)
        for line in events:
            log.warning("%s", line)
        return events

    def _maybe_renew(self, now: float) -> list[str]:
        """Renew the embedded broker when ``RenewalWatch`` says it is over its memory cap and nothing would be lost."""
        broker, cap = self.broker, self.settings.up_broker_renew_mb
        if broker is None or broker.pid is None or cap <= 0 or now - self._renew_checked < renew.CHECK_EVERY_S:
            return []
        self._renew_checked = now
        mb = renew.rss_mb(broker.pid)
        urls = self.metrics_urls()
        seen = None if mb <= cap else renew.activity(
            [u for name, u in urls.items() if name.startswith("worker")],
            [u for name, u in urls.items() if name == "sink"], self.settings, alert="alert" in self.children)
        if not self._renewal.observe(now, mb, seen):
            return []
        events = [f"the embedded broker holds {mb:.0f} MB, over up_broker_renew_mb ({cap:.0f}); no record for "
                  f"{self.settings.up_renew_quiet_s:.0f} s and nothing open, pending, unread or unarchived: restarting "
                  f"it empty (the archive keeps every row)"]
        self._stop_children(timeout_s=15.0)  # a clean stop: the sink commits, the worker snapshots
        broker.stop()
        try:
            self._broker_back(broker)
        except BrokerError as exc:  # the next round restarts it as a dead broker, with its backoff
            broker.stop()
            events.append(f"the embedded broker did not come back after its renewal: {exc}")
            return events
        self.renewals += 1
        self._renewal.renewed(now)
        events.append(f"the embedded broker is renewed on {broker.bootstrap} ({renew.rss_mb(broker.pid or 0):.0f} MB; "
                      f"renewal {self.renewals}); topics recreated; worker and sink restarted")
        return events

    def _restart_broker(self, now: float) -> list[str]:
        broker = self.broker
        if broker is None:
            return []
        b = self._backoff("broker")
        events: list[str] = []
        if b.started_at is not None:
            delay = b.crashed(now)
            events.append(f"the embedded broker on {broker.bootstrap} exited; restarting it in {delay:.0f} s "
                          f"(the memory broker lost every topic, message, offset and group)")
            # Stop the children now, not once the broker is back: a client of the old broker that
            # reconnects to the new one joins its group there and, stopped mid-join, leaves a member
            # Tansu never expires, so the restarted sink waited forever in "rebalance in progress".
            self._stop_children(timeout_s=5.0)
        if not b.due(now):
            return events
        try:
            self._broker_back(broker)
        except BrokerError as exc:
            broker.stop()
            b.started(now)
            b.crashed(now)
            events.append(f"the embedded broker did not restart: {exc}; next try in {b.delay_s:.0f} s")
            return events
        b.restarted(now)
        events.append(f"the embedded broker is back on {broker.bootstrap} (restart {b.restarts}); "
                      f"topics recreated; restarting worker and sink against the empty broker")
        return events

    def _broker_back(self, broker: EmbeddedBroker) -> None:
        """Start the embedded broker on its port, create its topics, and restart every child against it (raises
        ``BrokerError`` before any child starts). Their consumer groups, offsets and changelogs were in the broker
        that is gone: they start clean."""
        broker.start()
        ensure_topics(self.settings)
        self._stop_children(timeout_s=5.0)  # stopped already; a no-op unless one was started since
        for name in sorted(self.children):
            self._spawn(name)

    def _log_hint(self, name: str) -> str:
        return str(self.log_dir / f"{name}.log") if self.log_dir is not None else "not kept"

    # --- stopping ----------------------------------------------------------------------------

    def _stop_children(self, timeout_s: float) -> None:
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

    def stop(self, timeout_s: float = 15.0) -> None:
        self._stop_children(timeout_s)
        self.children.clear()
        if self._lifeline is not None:
            self._lifeline.close()
            self._lifeline = None
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
    parser.add_argument("--port", type=port_arg, default=9092, help="embedded broker port (0 picks a free one)")
    parser.add_argument("--logs", type=Path, default=Path("ccld-logs"), help="where worker.log and sink.log go")
    parser.add_argument("--workers", type=count_arg, default=1,
                        help="worker processes (they share the metrics partitions; default 1)")
    parser.add_argument("--metrics-port", type=port_arg, default=0, metavar="PORT",
                        help="Prometheus metrics of the worker(s), sink and alert bridge on PORT, PORT+1, ... in "
                        "that order (default 0: free ports); each URL is printed")
    g = parser.add_argument_group("alerts (also a service of ccld up: `ccld alert` with the same flags)")
    g.add_argument("--alertmanager", metavar="URL", help="deliver incidents to this Alertmanager (v2 API)")
    g.add_argument("--webhook", metavar="URL", help="deliver incidents to this JSON webhook")
    g.add_argument("--slack", action="store_true", help="send the webhook a Slack-compatible text body")


def main(args: argparse.Namespace, settings: Settings) -> int:
    alerts: dict[str, object] = {}
    if args.alertmanager:
        alerts["alert_alertmanager_url"] = args.alertmanager
    if args.webhook:
        alerts["alert_webhook_url"] = args.webhook
    if args.slack:
        alerts["alert_slack"] = True
    if alerts:
        settings = settings.replace(**alerts)  # the children read them from the environment (child_env)
    pipeline = Pipeline(settings, port=args.port, log_dir=args.logs, metrics_port=args.metrics_port)
    state: Path | None = None
    stop_on_sigterm()
    try:
        pipeline.start(workers=args.workers)
        print(f"bootstrap: {pipeline.settings.bootstrap}", flush=True)
        services = "worker, sink and alert bridge" if alerts or settings.alert_alertmanager_url \
            or settings.alert_webhook_url else "worker and sink"
        print(f"{services} running (logs in {args.logs}/); archive in {settings.archive_dir}/; "
              f"a dead worker, sink or broker is restarted; Ctrl-C stops everything", flush=True)
        urls = pipeline.metrics_urls()
        for name, url in urls.items():
            print(f"metrics: {url} ({name})", flush=True)
        # the workers' web servers also answer `ccld status` (its /status/ page beside /metrics)
        workers = [url.removesuffix("/metrics") for name, url in urls.items() if name.startswith("worker")]
        if workers:
            print("status: ccld status --job JOB " + " ".join(f"--worker {w}" for w in workers), flush=True)
            # `ccld status` on this machine finds them without --worker
            state = up_state.write(up_state.UpState(os.getpid(), pipeline.settings.bootstrap,
                                                    settings.topic_prefix, tuple(workers)))
        while True:
            for line in pipeline.supervise():
                print(f"ccld up: {line}", file=sys.stderr, flush=True)
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("stopping...", flush=True)
        return 0
    finally:
        if state is not None:
            up_state.remove(state)
        pipeline.stop()
