"""The one ``ccld`` command: each subcommand lives in the module that does the work.

A subcommand module exposes ``configure(parser)`` (adds its arguments) and
``main(args, settings) -> int``. Modules are imported only when their command runs, so
``ccld verdicts`` never imports Faust, torch or CuPy.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any, Protocol

from ccld.errors import CcldError
from ccld.lifeline import watch_supervisor
from ccld.settings import Settings

log = logging.getLogger(__name__)


def count_arg(text: str) -> int:
    """An argparse type for a count of at least 1 (``--workers``): refused at parse time, with the flag named."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def port_arg(text: str) -> int:
    """An argparse type for a TCP port (0: pick a free one): one clear line for ``--port 99999``, not a traceback."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {n}")
    return n


def stop_on_signals() -> threading.Event:
    """An event that SIGTERM and SIGINT set: a long-running command's loop stops cleanly on either."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


class Command(Protocol):
    def configure(self, parser: argparse.ArgumentParser) -> None: ...

    def main(self, args: argparse.Namespace, settings: Settings) -> int: ...


#: name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("ccld.stack.demo", "run the embedded pipeline on a simulated job with injected faults"),
    "up": ("ccld.stack.up", "broker (unless --bootstrap) + worker + sink on this machine"),
    "broker": ("ccld.stack.broker", "run the embedded Kafka-compatible broker (Tansu)"),
    "topics": ("ccld.topics", "create the CCL-D topics on a broker"),
    "worker": ("ccld.streams.worker", "run the Faust stream processor that emits verdicts"),
    "sink": ("ccld.sinks.sink_command", "archive metrics and verdicts to Parquet"),
    "archive": ("ccld.sinks.archive_command", "inspect a Parquet archive (archive summary DIR)"),
    "report": ("ccld.sinks.report_command", "one self-contained HTML page about an incident, from the archive"),
    "verdicts": ("ccld.streams.tail", "tail the verdicts topic"),
    "status": ("ccld.streams.status_command", "a job's live status: ranks by what they do, who waits for whom"),
    "alert": ("ccld.sinks.alert_command", "deliver verdicts to Alertmanager and/or a webhook"),
    "nodes": ("ccld.stack.nodes_command", "which machines keep breaking jobs: incidents per host, drain candidates"),
    "simulate": ("ccld.producers.simulator.simulate_command", "run a simulated training job with injected faults"),
    "bench": ("ccld.stack.bench", "benchmarks (bench accuracy --scenarios FILE)"),
    "run": ("ccld.producers.attach.run_command", "run a command with the PyTorch attachment active"),
    "import-fr": ("ccld.streams.flight_recorder.import_fr_command",
                  "name the broken ranks from PyTorch Flight Recorder dumps"),
    "probe": ("ccld.probe.probe_command", "GPU probe tools (layout, compile check)"),
    "nccl": ("ccld.producers.attach.nccl_command", "NCCL profiler plugin: build it, check its interface, aggregate"),
    "schema": ("ccld.schemas.schema_command", "print the Avro schema of a topic's records (schema verdict)"),
}

#: flags every subcommand takes; they become Settings fields of the same name
COMMON_FLAGS = ("bootstrap", "topic_prefix", "job", "log_level")


def _add_common(p: argparse.ArgumentParser, *, nested: bool = False) -> None:
    # A nested parser (``bench accuracy``) takes the flags too; its defaults are suppressed so
    # that it never overwrites a value given before the sub-subcommand.
    none: object = argparse.SUPPRESS if nested else None
    g = p.add_argument_group("common")
    g.add_argument("--bootstrap", default=none,
                   help="Kafka bootstrap servers (default: CCLD_BOOTSTRAP or the embedded broker)")
    g.add_argument("--topic-prefix", dest="topic_prefix", default=none, help="topic name prefix (default ccl-d.)")
    g.add_argument("--job", default=none, help="job id")
    g.add_argument("--log-level", dest="log_level", default=none, help="DEBUG, INFO, WARNING, ...")
    g.add_argument(
        "--set",
        action="append",
        default=argparse.SUPPRESS if nested else [],
        metavar="KEY=VALUE",
        help="any setting by name, e.g. --set metrics_partitions=8 --set analyzer_hang_min_s=30",
    )


def _nested_parsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out: list[argparse.ArgumentParser] = []
    for action in p._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                out += [child, *_nested_parsers(child)]
    return out


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    parser = argparse.ArgumentParser(
        prog="ccld", description="CCL-D: detect and localize slow and hung collective communication in training."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    loaded: dict[str, Command] = {}
    wanted = _wanted_command()
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        _add_common(p)
        if name == wanted:
            mod: Any = importlib.import_module(module)
            mod.configure(p)
            for child in _nested_parsers(p):
                _add_common(child, nested=True)
            loaded[name] = mod
    return parser, loaded


_argv: Sequence[str] = ()


def _wanted_command() -> str | None:
    return next((a for a in _argv if a in COMMANDS), None)


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {k: getattr(args, k, None) for k in COMMON_FLAGS}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise CcldError(f"--set wants KEY=VALUE, got {item!r}")
        overrides[key.strip().replace("-", "_")] = value
    return Settings.load(**overrides)


def main(argv: Sequence[str] | None = None) -> int:
    global _argv
    _argv = list(sys.argv[1:] if argv is None else argv)
    # A child of `ccld up` stops when `ccld up` is gone, however it went (kill -9 included).
    watch_supervisor()
    try:
        parser, loaded = build_parser()
        args = parser.parse_args(_argv)
        settings = settings_from_args(args)
    except ModuleNotFoundError as exc:
        print(f"ccld: this command needs a missing module: {exc} (is the extra installed?)", file=sys.stderr)
        return 2
    except CcldError as exc:
        print(f"ccld: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, settings.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(loaded[args.command].main(args, settings))
    except CcldError as exc:
        print(f"ccld {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ccld {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ccld ... | head`: the reader left; not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
