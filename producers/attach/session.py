"""``attach()`` / ``detach()``: one attachment per process, wired to a sink and torch.distributed."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ccld.bounded import DEFAULT_INTERVAL_S, DETAIL_MODES
from ccld.errors import ConfigError
from ccld.producers.attach.cost import HookTime, attachment_cpu_ns, cost_enabled
from ccld.producers.attach.fr_poll import enqueued_total, fr_buffer_setting
from ccld.producers.attach.job_identity import resolve as resolve_job
from ccld.producers.attach.op_tracker import RecordSink, Tracker
from ccld.producers.attach.outlet_spec import sink_from_spec
from ccld.settings import Settings

if TYPE_CHECKING:
    from ccld.producers.attach.fr_poll import FrPoller

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_S = 0.2
#: "sampled" (default: the bounded record format) or "all" (a DONE record per op, for debugging);
#: read by ``attach()`` when its ``detail`` is not given, so ``ccld run`` ranks inherit it
ENV_DETAIL = "CCLDRUN_DETAIL"

#: where the attachment learns of collectives: function wrapping, Flight Recorder polling, both,
#: or "auto" (per backend, :data:`AUTO_SOURCE`, decided when the default group exists)
SOURCES = ("auto", "wrap", "fr", "both")
#: the source "auto" starts with per backend (measurements and reasons: docs/attach.md)
#: gloo: wrap, watched. Its Flight Recorder dump always holds the whole ring (gloo never marks an
#: entry completed, so onlyActive filters nothing) and torch builds it holding the GIL: 30-110 ms
#: a poll with the default 2,000 entries, about 5 % of step time in stalls of that length. So
#: "auto" polls the full ring only once the job issues collectives the wrapper cannot see (see
#: :meth:`Attachment.watch_check`): then it switches to "both" for good.
#: nccl: both (not measured here): its active-only dump holds only unfinished entries.
AUTO_SOURCE = {"gloo": "wrap", "nccl": "both"}
#: set by ``ccld run --nccl-plugin``: the NCCL profiler plugin reports NCCL's ops, the attachment the rest
ENV_NCCL_PLUGIN = "CCLD_NCCL_PLUGIN"


def fr_enabled(environ: Mapping[str, str]) -> bool:
    """Flight Recorder is on unless its buffer size is set to 0 (TORCH_FR_BUFFER_SIZE, or the older name)."""
    size = fr_buffer_setting(environ)
    return size is None or size.strip() not in ("0", "")


def _to_poller(st: Any, name: str) -> int | None:
    """The wrapper's numbering under "both": collectives are the poller's (see fr_poll), p2p stays."""
    return None


@dataclass
class AutoStats:
    """Counters of "auto" watching a gloo job (``Attachment.stats()`` reports them ``auto_``-prefixed)."""

    checks: int = 0  # status-only dumps read to compare Flight Recorder's count with the wrapper's
    check_errors: int = 0  # a check raised (counted, never raised; the wrapper goes on numbering)
    switched: int = 0  # 1 once collectives the wrapper cannot see turned the poller on
    invisible: int = 0  # at the switch: collectives Flight Recorder counted beyond the wrapper's calls


class Attachment:
    """A live attachment: the tracker, the torch wrappers, the Flight Recorder poller and the sink.

    "auto" on gloo starts as "wrap", *watched*: it compares what torch counted with what the
    wrapper issued. Before each collective called from Python: the group's own sequence number
    (``_get_sequence_number_for_group``, about 0.4 us; it counts every operation, send/recv too,
    as Flight Recorder's ``collective_seq_id`` does) against the wrapper's count of the group's
    operations. Every poll interval, on the poller's otherwise idle thread: Flight Recorder's
    status-only dump (a few hundred bytes, about 3 us whatever the ring holds: every group, those
    Python never called too) against all the wrapper's calls. More on torch's side means
    something the wrapper cannot see issues collectives: DDP's C++ reducer (its constructor's
    broadcasts already count), FSDP, torch.compile's functional collectives, calls on the process
    group object itself. Then it switches to "both" for good and the poller reads the ring: the
    job is never blind to what it issues, and a job whose collectives all come from Python never
    pays for a full dump. (The status dump is not read before each call: in the benchmark it cost
    5-25 us a call, the sequence number about 1.)

    Why not detect DDP by wrapping its constructor, or register a DDP communication hook: the
    first misses FSDP, torch.compile and direct process-group calls, and every new wrapper class;
    a comm hook can be registered only once per model (the job's own ``register_comm_hook`` would
    then raise), runs Python in the reducer for every bucket, and replaces the built-in C++
    all-reduce. Comparing counts sees every source of collectives and changes nothing in the job.

    The switch keeps Trace IDs consistent across ranks. Checking before every Python collective
    means the wrapper's operations on a group are the first ones of its sequence, wherever each
    rank switched; at the switch the poller is told, per group, up to which ``collective_seq_id``
    they go (``FrPoller.wrapper_upto``) and records everything after, in Flight Recorder's
    numbering: nothing lost, nothing twice.
    """

    def __init__(self, tracker: Tracker, hooks: Any, sink: RecordSink, poller: FrPoller | None = None,
                 source: str = "wrap") -> None:  # fmt: skip
        self.tracker = tracker
        self.hooks = hooks
        self.sink = sink
        self.poller = poller
        self.source = source  # as asked ("auto" stays "auto"; resolved_source says what it became)
        self.resolved_source = "" if source == "auto" else source
        self._resolve_lock = threading.Lock()
        #: "auto" on gloo with a poller: compare Flight Recorder's count with the wrapper's (see above)
        self.watching = False
        self.auto = AutoStats()
        self._switch_lock = threading.Lock()
        #: Flight Recorder's count over every group at attach time (collectives before attach)
        self.baseline = 0
        self._seq_ok = True  # the groups answer _get_sequence_number_for_group

    def resolve_source(self) -> str:
        """The source in use; for "auto", picked per backend once the default group exists ("" until then)."""
        if self.resolved_source:
            return self.resolved_source
        with self._resolve_lock:
            if self.resolved_source:
                return self.resolved_source
            c10d = self.hooks.c10d  # the module itself: an import here could wait for torch's import lock
            if not c10d.is_initialized():
                return ""
            backend = str(c10d.get_backend()).lower()
            mode = AUTO_SOURCE["nccl"] if "nccl" in backend else AUTO_SOURCE.get(backend, AUTO_SOURCE["gloo"])
            if self.poller is None:
                mode = "wrap"
            self.watching = mode == "wrap" and self.poller is not None
            if mode == "both" and self.poller is not None:
                self.hooks.seq_source = _to_poller
            else:  # watched: every collective's number passes the check first (_auto_seq)
                self.hooks.seq_source = self._auto_seq if self.watching else None
            self.resolved_source = mode
            log.info("ccld attach: backend %s, source %s%s", backend, mode,
                     " (polling Flight Recorder once collectives come from C++)" if self.watching else "")  # fmt: skip
            return mode

    def _auto_seq(self, st: Any, name: str) -> int | None:
        """The wrapper's op_seq while the source is "auto": resolve it, then number as it says.

        Watched: first compare the group's own sequence number with the wrapper's count of the
        group's operations, under the switch lock (so the poller thread's check and this call's
        number are one order), and leave the call to the poller once switched."""
        mode = self.resolve_source()
        if mode == "both" and self.poller is not None:
            return None
        if self.watching:
            with self._switch_lock:
                if self.resolved_source == "both" or self._unseen_in(st):
                    return None
                seq = int(st.seq)
                st.seq = seq + 1
                return seq
        seq = int(st.seq)
        st.seq = seq + 1
        return seq

    def _unseen_in(self, st: Any) -> bool:
        """Under the switch lock, before a Python collective on ``st``'s group: did the group run
        operations the wrapper never issued? Its sequence number (``_get_sequence_number_for_group``,
        about 0.4 us; it counts every operation, send/recv too, as Flight Recorder's
        ``collective_seq_id`` does) against the wrapper's count of the group's operations."""
        if not self._seq_ok:
            return False
        self.auto.checks += 1
        try:
            pg = st.pg()
            if pg is None:
                return False
            unseen = int(pg._get_sequence_number_for_group()) - int(st.issued)
        except Exception:  # noqa: BLE001 - never our exception in the training code
            self.auto.check_errors += 1
            self._seq_ok = False  # a backend without it: the poller thread's check alone
            log.debug("ccld attach: no sequence number for group %s", st.name, exc_info=True)
            return False
        return unseen > 0 and self._switch(unseen, f"before a Python collective on group {st.name}")

    def watch_check(self) -> bool:
        """Switch "auto" to "both" if Flight Recorder counted collectives the wrapper never issued;
        True once switched. The poller thread asks it every interval (a job whose unseen
        collectives are not followed by a Python one on their group switches here); never raises."""
        if not self.watching:
            return self.resolved_source == "both"
        with self._switch_lock:
            if self.resolved_source == "both":
                return True
            poller = self.poller
            if poller is None:
                return False
            self.auto.checks += 1
            try:
                # every process group together (also those Python never called); the wrapper counts
                # a call before torch runs it, and the status is updated at enqueue (gloo's send/recv
                # only later): with every operation from Python it never counts more
                unseen = enqueued_total(poller.dump(False, True)) - self.baseline - self.hooks.issued
            except Exception:  # noqa: BLE001
                self.auto.check_errors += 1
                return False
            return unseen > 0 and self._switch(unseen, "on the poller's thread")

    def _switch(self, unseen: int, where: str) -> bool:
        """Under the switch lock: collectives from now on are the poller's (for good)."""
        poller = self.poller
        if poller is None:
            return False
        try:
            # the wrapper's operations on each group are the first ``issued`` of its sequence (every
            # check before them passed): the poller takes the entries after them
            upto = {g.name: int(g.issued) for g in list(self.hooks._groups.values())}
        except Exception:  # noqa: BLE001
            self.auto.check_errors += 1
            return False
        poller.wrapper_upto = upto
        self.hooks.seq_source = _to_poller
        self.auto.switched = 1
        self.auto.invisible = unseen
        self.resolved_source = "both"
        log.warning("ccld attach: %d collective(s) the wrapper cannot see (DDP, FSDP, torch.compile or a process "
                    "group called directly), seen %s: polling Flight Recorder from now on (source both)",
                    unseen, where)  # fmt: skip
        return True

    def _poll_gate(self) -> bool | None:
        """Poll once the default group exists (before, there is nothing to read), if the source says so;
        watched, only once switched (until then the thread only checks the counts)."""
        mode = self.resolve_source()
        if not mode:
            return None
        if self.watching:
            return True if self.watch_check() else None
        if mode not in ("fr", "both"):
            return False
        return True if self.hooks.c10d.is_initialized() else None

    def stats(self) -> dict[str, Any]:
        """Counters of the attachment (calls, records, drops, errors), of its poller and of its sink."""
        out: dict[str, Any] = asdict(self.tracker.stats)
        out["source"] = self.resolved_source or self.source
        if self.source == "auto":
            out.update({f"auto_{k}": v for k, v in asdict(self.auto).items()})
        if self.poller is not None:
            out.update({f"fr_{k}": v for k, v in asdict(self.poller.stats).items()})
        sink_stats = getattr(self.sink, "stats", None)
        if isinstance(sink_stats, dict):
            out.update(sink_stats)
        cost = self.hooks.cost
        if cost is not None:  # what it consumed (cost.py): the training thread's time in it, its threads' CPU
            out.update(hook_ns=cost.ns, hook_calls=cost.calls, hook_max_ns=cost.max_ns,
                       threads_cpu_ns=attachment_cpu_ns())  # fmt: skip
        return out

    def flush(self, timeout_s: float = 2.0) -> None:
        """Emit what is recorded now and flush the sink (tests and shutdown): Flight Recorder is read
        first when it is polled (its ring is read by its own cadence, seconds apart; see fr_poll)."""
        if self.poller is not None:
            self.poller.poll_now()
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
    source: str = "auto",
    fr_poll_s: float | None = None,
    fr_status_s: float | None = None,
    detail: str | None = None,
    interval_s: float | None = None,
    aggregate_socket: str | None = None,
    cost: bool | None = None,
) -> Attachment:
    """Observe every torch.distributed collective and p2p call of this process.

    Records go to ``sink`` if given, else to the sink named by ``sink_spec`` ("kafka", the
    default, or "jsonl:DIR"), built from ``settings`` (default: ``Settings.load()``, i.e. the
    ``CCLD_*`` environment). Calling it again returns the running attachment. Functions the
    script imported by name *before* attaching (``from torch.distributed import all_reduce``)
    are not seen; ``ccld run`` attaches before the script runs, so it sees them all.

    ``source`` says how collectives are seen: "wrap" (the Python functions), "fr" (polling
    Flight Recorder every ``fr_poll_s``, default 0.1 s: DDP's and torch.compile's collectives
    too), "both" (collectives from Flight Recorder, send/recv from the wrapper: nothing counted
    twice), or "auto" (per backend: ``AUTO_SOURCE``). Between polls the poller reads the status-only
    dump every ``fr_status_s`` (default 25 ms; 0: only before a poll) to time collectives' exits.

    Records follow the bounded format (docs/wire-format.md, "Record format and its cost"): each
    communicator's state every ``interval_s`` (default 1 s), an op in flight for ``heartbeat_s``
    at once, and the DONE records of a sample of ops (at most about 8 per second and
    communicator). ``detail="all"`` (or ``CCLDRUN_DETAIL=all``) sends every op's DONE record.

    ``aggregate_socket`` (``ccld run --aggregate`` passes it): the Kafka sink hands its batches to
    the host's aggregator listening on that Unix socket (``ccld.producers.attach.aggregate``), and
    sends directly whenever it cannot.

    ``cost`` (default: ``CCLD_ATTACH_COST=1`` in the environment) measures what the attachment consumes:
    the training thread's time inside its hooks and its threads' CPU time, in ``stats()`` as ``hook_ns``,
    ``hook_calls``, ``hook_max_ns`` and ``threads_cpu_ns`` (``ccld.producers.attach.cost``).
    """
    global _current
    with _lock:
        if _current is not None:
            return _current
        settings = settings if settings is not None else Settings.load()
        if source not in SOURCES:
            raise ConfigError(f"unknown attach source {source!r}: use one of {', '.join(SOURCES)}")
        detail = detail or os.environ.get(ENV_DETAIL, "").strip().lower() or "sampled"
        if detail not in DETAIL_MODES:
            raise ConfigError(f"unknown attach detail {detail!r}: use one of {', '.join(DETAIL_MODES)}")
        if sink is None:
            spec = sink_spec or "kafka"
            if spec.partition(":")[0] in ("", "kafka") and not settings.bootstrap:
                raise ConfigError("ccld attach needs a broker: set CCLD_BOOTSTRAP or pass --bootstrap")
            sink = sink_from_spec(spec, settings, aggregate_socket=aggregate_socket)
        try:
            from ccld.producers.attach.probe_hook import load_marker_hook
            from ccld.producers.attach.torch_hooks import TorchHooks
        except ImportError as exc:  # torch missing
            raise ConfigError(f"ccld attach needs torch (pip install 'ccl-d[torch]'): {exc}") from exc
        tracker = Tracker(sink=sink, heartbeat_s=heartbeat_s or DEFAULT_HEARTBEAT_S,
                          interval_s=interval_s or DEFAULT_INTERVAL_S, detail=detail)  # fmt: skip
        if incarnation is None:
            incarnation = _env_int("TORCHELASTIC_RESTART_COUNT", 0)
        job = resolve_job(settings.job, os.environ)  # unnamed: the scheduler's identity (job_identity)
        hooks = TorchHooks(
            tracker, job=job.name, incarnation=incarnation, marker=load_marker_hook() if markers else None
        )
        if cost if cost is not None else cost_enabled(os.environ):
            hooks.cost = HookTime()
        if os.environ.get(ENV_NCCL_PLUGIN) == "1":
            # NCCL's own profiler plugin reports every op NCCL runs, with its channels and the network's
            # steps; this attachment keeps what NCCL does not run (gloo groups, CPU tensors) and Flight
            # Recorder (which would see the NCCL ops again) stays off
            hooks.defer_nccl = True
            source = "wrap"
        poller = None
        if source != "wrap":
            if fr_enabled(os.environ):
                try:
                    from ccld.producers.attach.fr_poll import make_poller

                    poller = make_poller(tracker, hooks, interval_s=fr_poll_s, p2p=source == "fr", status_s=fr_status_s)
                except Exception:  # noqa: BLE001 - no poller: the wrapper alone
                    log.debug("ccld attach: no Flight Recorder poller", exc_info=True)
            if poller is None and source != "auto":
                log.warning("ccld attach: Flight Recorder is not available (off, or an older torch): source wrap")
                source = "wrap"
        att = Attachment(tracker, hooks, sink, poller, source)
        if source == "auto" and poller is not None:
            att.baseline = _fr_baseline(poller, hooks)
            hooks.seq_base = _seq_base(hooks)
        if source != "fr":
            hooks.install()
        if source == "both" and poller is not None:
            hooks.seq_source = _to_poller
        elif source == "auto":
            hooks.seq_source = att._auto_seq
        if poller is not None:
            poller.gate = att._poll_gate
        tracker.start()
        if poller is not None:
            poller.start()
        _current = att
        log.info("ccld attached to torch.distributed (job %s from %s, source %s)", job.name, job.source, source)
        return _current


def detach(timeout_s: float = 2.0) -> dict[str, Any]:
    """Restore torch.distributed, emit what is queued, flush and close the sink; returns the stats."""
    global _current
    with _lock:
        att, _current = _current, None
    if att is None:
        return {}
    if att.poller is not None:
        att.poller.stop(timeout_s)
    att.hooks.uninstall()
    att.tracker.stop(timeout_s)
    stats = att.stats()
    try:
        _close(att.sink, timeout_s)
    except Exception:  # noqa: BLE001
        log.debug("closing the attach sink failed", exc_info=True)
    return stats


def _fr_baseline(poller: FrPoller, hooks: Any) -> int:
    """Collectives Flight Recorder counted before this attachment (attach() after some ran): the
    wrapper never saw them, and they must not read as unseen ones."""
    try:
        if not hooks.c10d.is_initialized():
            return 0
        return enqueued_total(poller.dump(False, True))
    except Exception:  # noqa: BLE001
        log.debug("ccld attach: no Flight Recorder status", exc_info=True)
        return 0


def _seq_base(hooks: Any) -> dict[str, int]:
    """Each existing group's sequence number at attach time (attach() after some collectives ran)."""
    out: dict[str, int] = {}
    try:
        world = getattr(hooks.c10d, "_world", None)
        for pg, name in list((getattr(world, "pg_names", None) or {}).items()):
            out[str(name)] = int(pg._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001
        log.debug("ccld attach: no group sequence numbers", exc_info=True)
    return out


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
            if att.poller is not None:
                att.poller.stop(EXIT_FLUSH_S)
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
        if att.poller is not None:
            att.poller.after_fork_in_child()
        att.tracker.detach_after_fork()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
