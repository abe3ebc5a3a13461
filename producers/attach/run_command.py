"""``ccld run [--bootstrap B] [--job J] -- COMMAND ...``: run a command with the attachment active.

Every Python process the command starts (``torchrun`` and each rank it spawns, or a plain
``python train.py``) attaches to torch.distributed at start-up through a generated
``sitecustomize.py``; the script itself is not changed. Settings reach the children as
``CCLD_*`` variables (only those that differ from the defaults are set).

With the Kafka sink, ``--aggregate`` (the default) starts a host aggregator in this process
before the command (``ccld.producers.attach.aggregate``): the ranks hand it their batches over a
Unix socket and it sends one message per job and second for all of them, instead of one per rank.
It is stopped, and flushes what it holds, after the command exits. A rank that cannot reach it
sends directly (counted); an aggregator that cannot start leaves every rank sending directly. It
serves Prometheus metrics on ``aggregator_metrics_port`` (``--metrics-port``; 0: off) while it runs.

Without ``--job`` the ranks take the job's name from their scheduler (Slurm, torchrun, Kubernetes), else
the name of this launch, which every process it starts shares (``job_identity``).

``--nccl-plugin`` builds CCL-D's NCCL profiler plugin (``ccld.probe.nccl_build``) and names it to every rank
(``NCCL_PROFILER_PLUGIN``, ``CCLD_NCCL_DIR``): NCCL then reports each op it runs, from any framework, into
a table the aggregator polls (``ccld.probe.nccl_watch``); the PyTorch hooks leave NCCL's calls to it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from types import FrameType
from typing import Any

from ccld.producers.attach.bootstrap import child_env, write_site_dir
from ccld.producers.attach.job_identity import DEFAULT_JOB, LAUNCH_ENV, from_environment, launch_name
from ccld.producers.attach.session import ENV_NCCL_PLUGIN
from ccld.reachability import broker_reachable
from ccld.settings import Settings

#: how long the aggregator's last flush may take after the job exited (a dead broker costs this, once)
AGGREGATOR_CLOSE_S = 2.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sink", default="kafka", help="where records go: kafka (default) or jsonl:DIR")
    parser.add_argument(
        "--heartbeat-ms", dest="heartbeat_ms", type=int, default=None,
        help="PROGRESS sample interval while a rank is inside a collective (default 200)",
    )  # fmt: skip
    parser.add_argument(
        "--source", choices=("auto", "wrap", "fr", "both"), default=None,
        help="how collectives are seen: wrap (Python calls), fr (polling Flight Recorder: DDP and "
        "torch.compile too), both, or auto (the default: both on NCCL; on gloo wrap, and both as soon as "
        "the job issues collectives Python never called, as DDP, FSDP and torch.compile do)",
    )  # fmt: skip
    parser.add_argument(
        "--fr-poll-ms", dest="fr_poll_ms", type=int, default=None,
        help="Flight Recorder poll interval (default 100)",
    )  # fmt: skip
    parser.add_argument(
        "--aggregate", action=argparse.BooleanOptionalAction, default=True,
        help="with the kafka sink: one message per host and second from a local aggregator instead of one "
        "per rank (default on; a rank that cannot reach it sends directly)",
    )  # fmt: skip
    parser.add_argument(
        "--nccl-plugin", dest="nccl_plugin", action="store_true",
        help="load CCL-D's NCCL profiler plugin in every rank (NCCL_PROFILER_PLUGIN): every op NCCL runs, with "
        "its kernel channels and network steps, whatever the framework; the PyTorch hooks keep the rest",
    )  # fmt: skip
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="the host aggregator serves Prometheus metrics on this port, 0: off "
                        "(default: aggregator_metrics_port, 9466)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="the command to run")


def prepare_env(
    settings: Settings, site_dir: str, *, sink: str = "kafka", heartbeat_ms: int | None = None,
    base: dict[str, str] | None = None, source: str | None = None, fr_poll_ms: int | None = None,
    aggregate_socket: str | None = None,
) -> dict[str, str]:  # fmt: skip
    """Write the sitecustomize into ``site_dir`` and return the environment that activates it."""
    write_site_dir(site_dir)
    return child_env(
        dict(os.environ) if base is None else base, settings.to_env(), site_dir=site_dir, sink=sink,
        heartbeat_ms=heartbeat_ms, source=source, fr_poll_ms=fr_poll_ms, aggregate_socket=aggregate_socket,
    )  # fmt: skip


def start_aggregator(settings: Settings, nccl_dir: str | None = None) -> Any:
    """A running ``HostAggregator`` sending through Kafka (polling the NCCL plugin's tables in ``nccl_dir``),
    or None (said on stderr) when it cannot start."""
    from ccld.producers.attach.aggregate import HostAggregator
    from ccld.producers.attach.outlets import KafkaSink

    agg = HostAggregator(sink=KafkaSink(settings, keep_ids=True), nccl_dir=nccl_dir)
    try:
        return agg.start()
    except OSError as exc:
        print(f"ccld run: no host aggregator ({exc}); every rank sends directly", file=sys.stderr)
        return None


def serve_aggregator_metrics(agg: Any, settings: Settings) -> Any:
    """The aggregator's metrics server on ``aggregator_metrics_port``, or None (off, or the port is taken)."""
    from ccld.metrics_http import start_metrics_server
    from ccld.producers.attach.aggregate_metrics import aggregator_families

    spool_max = int(settings.spool_max_mb * 1024 * 1024) if settings.spool_dir else 0
    return start_metrics_server(lambda: aggregator_families(agg, spool_max_bytes=spool_max), settings.metrics_bind,
                                settings.aggregator_metrics_port, what="ccld run: host aggregator")


def main(args: argparse.Namespace, settings: Settings) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("ccld run: no command given (ccld run [options] -- COMMAND ...)", file=sys.stderr)
        return 2
    sink = str(args.sink)
    if sink.partition(":")[0] in ("", "kafka") and not settings.bootstrap:
        print("ccld run: the kafka sink needs --bootstrap (or CCLD_BOOTSTRAP)", file=sys.stderr)
        return 2
    aggregator = None
    if getattr(args, "metrics_port", None) is not None:
        settings = settings.replace(aggregator_metrics_port=args.metrics_port)
    server = None
    plugin_env: dict[str, str] = {}
    nccl_dir = None
    if getattr(args, "nccl_plugin", False):
        if not (getattr(args, "aggregate", False) and sink.partition(":")[0] in ("", "kafka")):
            print("ccld run: --nccl-plugin sends through the host aggregator: it needs the kafka sink and --aggregate",
                  file=sys.stderr)  # fmt: skip
            return 2
        from ccld.errors import ConfigError
        from ccld.probe.nccl_build import build

        try:
            lib = build()
        except ConfigError as exc:
            print(f"ccld run: {exc}", file=sys.stderr)
            return 2
        # in memory where the host has it: the tables are written at every NCCL event and never need a disk
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        nccl_dir = tempfile.mkdtemp(prefix="ccld-nccl-", dir=shm)
        plugin_env = {"NCCL_PROFILER_PLUGIN": str(lib), "CCLD_NCCL_DIR": nccl_dir, ENV_NCCL_PLUGIN: "1"}
    if getattr(args, "aggregate", False) and sink.partition(":")[0] in ("", "kafka"):
        aggregator = start_aggregator(settings, nccl_dir)
        if aggregator is not None:
            server = serve_aggregator_metrics(aggregator, settings)
        elif nccl_dir is not None:
            print("ccld run: without the host aggregator nothing polls the NCCL plugin: it stays off", file=sys.stderr)
            plugin_env = {}
    try:
        return _run(cmd, args, settings, sink, aggregator, plugin_env)
    finally:
        if aggregator is not None:  # after the job: its ranks' last batches are in the socket by now
            aggregator.close(AGGREGATOR_CLOSE_S)  # logs its stats line
        if server is not None:
            server.close()
        if nccl_dir is not None:
            shutil.rmtree(nccl_dir, ignore_errors=True)


class KafkaWatch:
    """Tells the operator within seconds when nothing of the job reaches Kafka, and at the end how much did.

    The job must never wait for us, so the job runs on either way; but "every record was lost", said
    only when the job ends hours later, leaves an unmonitored job unnoticed. A daemon thread checks
    ``WARN_AFTER_S`` after the start whether a broker answers at all (and, with the aggregator, whether
    batches that came in went out), says so once, and says again when it recovers.
    """

    WARN_AFTER_S = 5.0
    EVERY_S = 5.0

    def __init__(self, bootstrap: str, aggregator: Any = None) -> None:
        self.bootstrap = bootstrap
        self.aggregator = aggregator
        self.ever_reached = False
        self.warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ccld-run-kafka-watch", daemon=True)

    def start(self) -> KafkaWatch:
        self._thread.start()
        return self

    def _problem(self) -> str | None:
        if not broker_reachable(self.bootstrap, 1.0):
            return f"no Kafka broker answers at {self.bootstrap}"
        self.ever_reached = True
        st = getattr(self.aggregator, "stats", None)
        if st is not None and st.received and not st.sent_batches:
            return f"the ranks' records reach the host aggregator but none went out to Kafka at {self.bootstrap}"
        return None

    def _loop(self) -> None:
        if self._stop.wait(self.WARN_AFTER_S):
            return
        while True:
            problem = self._problem()
            if problem and not self.warned:
                print(f"ccld run: WARNING: {problem}: the job runs on, NOT monitored (check --bootstrap and that "
                      f"the broker is up; records wait in the spool if CCLD_SPOOL_DIR is set)",
                      file=sys.stderr, flush=True)
                self.warned = True
            elif not problem and self.warned:
                print(f"ccld run: Kafka at {self.bootstrap} answers again: the job is monitored", file=sys.stderr,
                      flush=True)
                self.warned = False
            if self._stop.wait(self.EVERY_S):
                return

    def stop(self) -> str:
        """Stop watching; the one-line account of how much was monitored."""
        self._stop.set()
        st = getattr(self.aggregator, "stats", None)
        sent = "" if st is None else f"; the host aggregator sent {st.sent_rows} rows in {st.sent_batches} messages"
        if not self.ever_reached and not broker_reachable(self.bootstrap, 1.0):
            return f"ccld run: nothing was monitored: Kafka at {self.bootstrap} never answered{sent}"
        return f"ccld run: Kafka at {self.bootstrap} {'was not reachable at times' if self.warned else 'reached'}{sent}"


def launch_env(settings: Settings, env: dict[str, str]) -> dict[str, str]:
    """``env`` with this launch's job name for the ranks (``CCLD_JOB_LAUNCH``) when no one named the job, and
    the one line that says which name the ranks will use."""
    if settings.job != DEFAULT_JOB:
        return env
    env = dict(env)
    env.setdefault(LAUNCH_ENV, launch_name())
    found = from_environment({k: v for k, v in env.items() if k != LAUNCH_ENV})
    if found is not None:
        print(f"ccld run: no --job: the job is {found.name} (from {found.source})", file=sys.stderr, flush=True)
    else:
        print(f"ccld run: no --job: the job is torchrun's rendezvous id where the ranks have one, else this "
              f"launch's name, {env[LAUNCH_ENV]}", file=sys.stderr, flush=True)
    return env


def _run(cmd: list[str], args: argparse.Namespace, settings: Settings, sink: str, aggregator: Any,
         plugin_env: dict[str, str] | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="ccld-run-") as site_dir:
        env = prepare_env(
            settings, site_dir, sink=sink, heartbeat_ms=args.heartbeat_ms,
            source=getattr(args, "source", None), fr_poll_ms=getattr(args, "fr_poll_ms", None),
            aggregate_socket=aggregator.path if aggregator is not None else None,
            base=launch_env(settings, dict(os.environ)),
        )  # fmt: skip
        env.update(plugin_env or {})
        try:
            proc = subprocess.Popen(cmd, env=env)
        except OSError as exc:
            print(f"ccld run: cannot start {cmd[0]!r}: {exc}", file=sys.stderr)
            return 127
        watch = KafkaWatch(settings.bootstrap, aggregator).start() if sink.partition(":")[0] in ("", "kafka") \
            else None

        def forward(signum: int, _frame: FrameType | None) -> None:
            proc.send_signal(signum)

        old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP)}
        try:
            while True:
                try:
                    rc = proc.wait()
                    return 128 - rc if rc < 0 else rc  # killed by a signal: the shell's convention
                except KeyboardInterrupt:  # the child got the same SIGINT from the terminal
                    continue
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            if watch is not None:
                print(watch.stop(), file=sys.stderr, flush=True)
