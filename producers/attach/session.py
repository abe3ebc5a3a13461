"""``attach()`` / ``detach()``: one attachment per process, wired to a sink and torch.distributed."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from dataclasses import asdict
from typing import Any

from ccld.errors import ConfigError
from ccld.producers.attach.sinks import sink_from_spec
from ccld.producers.attach.tracker import RecordSink, Tracker
from ccld.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_S = 0.2


class Attachment:
    """A live attachment: the tracker, the torch wrappers and the sink behind them."""

    def __init__(self, tracker: Tracker, hooks: Any, sink: RecordSink) -> None:
        self.tracker = tracker
        self.hooks = hooks
        self.sink = sink

    def stats(self) -> dict[str, Any]:
        """Counters of the attachment (calls, records, drops, errors) and of its sink."""
        out: dict[str, Any] = asdict(self.tracker.stats)
        sink_stats = getattr(self.sink, "stats", None)
        if isinstance(sink_stats, dict):
            out.update(sink_stats)
        return out

    def flush(self, timeout_s: float = 2.0) -> None:
        """Emit what is queued now and flush the sink (tests and shutdown)."""
        self.tracker.pump()
        try:
            self.sink.flush(timeout_s)
        except Exception:  # noqa: BLE001
            self.tracker.stats.sink_errors += 1


_lock = threading.Lock()
_current: Attachment | None = None


def current() -> Attachment | None:
    """The active attachment of this process, if any."""
    return _current


def attach(
    settings: Settings | None = None,
    *,
    sink: RecordSink | None = None,
    sink_spec: str | None = None,
    heartbeat_s: float | None = None,
    incarnation: int | None = None,
    markers: bool = True,
) -> Attachment:
    """Observe every torch.distributed collective and p2p call of this process.

    Records go to ``sink`` if given, else to the sink named by ``sink_spec`` ("kafka", the
    default, or "jsonl:DIR"), built from ``settings`` (default: ``Settings.load()``, i.e. the
    ``CCLD_*`` environment). Calling it again returns the running attachment. Functions the
    script imported by name *before* attaching (``from torch.distributed import all_reduce``)
    are not seen; ``ccld run`` attaches before the script runs, so it sees them all.
    """
    global _current
    with _lock:
        if _current is not None:
            return _current
        settings = settings if settings is not None else Settings.load()
        if sink is None:
            spec = sink_spec or "kafka"
            if spec.partition(":")[0] in ("", "kafka") and not settings.bootstrap:
                raise ConfigError("ccld attach needs a broker: set CCLD_BOOTSTRAP or pass --bootstrap")
            sink = sink_from_spec(spec, settings)
        try:
            from ccld.producers.attach.probe_hook import load_marker_hook
            from ccld.producers.attach.torch_hooks import TorchHooks
        except ImportError as exc:  # torch missing
            raise ConfigError(f"ccld attach needs torch (pip install 'ccl-d[torch]'): {exc}") from exc
        tracker = Tracker(sink=sink, heartbeat_s=heartbeat_s or DEFAULT_HEARTBEAT_S)
        if incarnation is None:
            incarnation = _env_int("TORCHELASTIC_RESTART_COUNT", 0)
        hooks = TorchHooks(
            tracker, job=settings.job, incarnation=incarnation, marker=load_marker_hook() if markers else None
        )
        hooks.install()
        tracker.start()
        _current = Attachment(tracker, hooks, sink)
        log.info("ccld attached to torch.distributed (job %s)", settings.job)
        return _current


def detach(timeout_s: float = 2.0) -> dict[str, Any]:
    """Restore torch.distributed, emit what is queued, flush and close the sink; returns the stats."""
    global _current
    with _lock:
        att, _current = _current, None
    if att is None:
        return {}
    att.hooks.uninstall()
    att.tracker.stop(timeout_s)
    stats = att.stats()
    try:
        _close(att.sink, timeout_s)
    except Exception:  # noqa: BLE001
        log.debug("closing the attach sink failed", exc_info=True)
    return stats


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _close(sink: RecordSink, timeout_s: float) -> None:
    sink.close(timeout_s)


#: seconds the interpreter's exit may wait for the last records (a dead broker costs this, once)
EXIT_FLUSH_S = 0.5


def _at_exit() -> None:
    att = _current
    if att is not None:
        try:
            att.tracker.stop(EXIT_FLUSH_S)
            _close(att.sink, EXIT_FLUSH_S)
            stats = att.stats()
            lost = {k: v for k, v in stats.items() if k in LOSS_COUNTERS and v}
            if lost:  # one line, only when something was lost: the job's log is not ours
                sys.stderr.write(f"ccld attach (pid {os.getpid()}): {stats.get('records', 0)} records, lost: {lost}\n")
        except Exception:  # noqa: BLE001 - never disturb interpreter shutdown
            pass


#: counters that mean records did not reach the sink (reported once at exit when non-zero)
LOSS_COUNTERS = frozenset(
    {
        "dropped", "sink_errors", "internal_errors", "sink_dropped", "sink_undelivered", "sink_flush_timeouts",
        "producer_dropped_progress", "producer_dropped_critical", "producer_delivery_failures",
        "producer_produce_errors", "producer_queued", "producer_lost_records", "producer_spooled_records",
    }
)  # fmt: skip


def _after_fork_in_child() -> None:
    # A forked child (a DataLoader worker) has no emitter thread and runs no collectives of the
    # parent's groups: it must stay silent, not report as the parent's rank.
    global _current, _lock
    _lock = threading.Lock()  # another thread may have held it at fork time
    att, _current = _current, None  # nothing to flush at the child's exit
    if att is not None:
        att.hooks.enabled = False  # the wrappers stay in place, as plain pass-throughs
        att.tracker.detach_after_fork()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
