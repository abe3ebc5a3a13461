"""One metrics message per host and interval: a node-local aggregator and the ranks' sink for it.

The worker's cost is per message far more than per record, and each rank of a job sending its own
batch every interval makes one message per rank and second (one worker keeps pace with about
2,000 ranks). The ranks of a host are separate processes, so they hand their batches to a
:class:`HostAggregator` over a Unix datagram socket (``AggregatorSink``), and the aggregator
sends one ``KernelBatch`` per (job, incarnation) every ``flush_interval_s``: 8x fewer messages
with 8 ranks per host.

Nothing is lost when the aggregator is missing, full or gone: a batch the socket does not take
goes straight to Kafka from the rank (a lazily created ``KafkaSink``), and is counted. Neither
side ever blocks or raises into the training job.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from ccld.producers.attach.outlets import KafkaSink
from ccld.producers.batcher import LostRecords
from ccld.records import KernelBatch, KernelRecord
from ccld.schemas.codec import decode_metrics, encode_batch
from ccld.settings import Settings

log = logging.getLogger(__name__)

#: The ranks' environment variable naming the aggregator's socket (set by ``ccld run --aggregate``).
ENV_AGGREGATE_SOCKET = "CCLDRUN_AGGREGATE_SOCKET"
#: Largest datagram either side handles. A rank's batch for one interval is a few KB to a few
#: hundred KB; anything bigger (or what the kernel refuses, EMSGSIZE) goes to Kafka directly.
MAX_DATAGRAM = 4 * 1024 * 1024
#: Socket buffer asked for on the rank's side (the kernel caps it at net.core.wmem_max): the
#: largest datagram Linux takes is about this size, and the default (212 KB) is small for big batches.
SEND_BUFFER = MAX_DATAGRAM


class BatchSink(Protocol):
    """Where the aggregator's merged batches go (``KafkaSink(keep_ids=True)`` in production)."""

    def submit_batch(self, batch: KernelBatch) -> bool: ...

    def flush(self, timeout_s: float = ...) -> Any: ...

    def close(self, timeout_s: float = ...) -> None: ...


@dataclass
class AggregatorStats:
    """Counters of one aggregator (``HostAggregator.stats``)."""

    received: int = 0  # datagrams decoded and buffered
    received_rows: int = 0
    merged_messages: int = 0  # rank batches that went out inside a merged batch
    sent_batches: int = 0  # merged batches the sink took
    sent_rows: int = 0
    send_failures: int = 0  # merged batches the sink refused or raised on (its own counters say why)
    dropped: int = 0  # rows dropped because the buffer was full
    dropped_messages: int = 0
    decode_errors: int = 0  # datagrams that were not a valid KernelBatch (or were truncated)
    internal_errors: int = 0


def private_socket_path() -> tuple[str, str]:
    """A fresh private directory (mode 0700) and the socket path inside it (short: sun_path is 108 bytes)."""
    base = tempfile.gettempdir()
    if len(base) > 60:  # a long TMPDIR would not leave room for the socket's name
        base = "/tmp"
    d = tempfile.mkdtemp(prefix="ccld-agg-", dir=base)
    return d, os.path.join(d, "agg.sock")


@dataclass
class HostAggregator:
    """Merges the ranks' batches of one host into one batch per (job, incarnation) and interval.

    ``start()`` binds the socket (``path``, or a fresh one in a private temp dir) and starts two
    daemon threads: a receiver that only decodes and buffers (a slow broker must not fill the
    socket's short queue: the ranks would fall back to direct sends), and a flusher that sends.
    Flushes happen at ``flush_phase`` of each ``flush_interval_s`` of the monotonic clock: the ranks
    send their states just after each interval boundary of the same clock, so mid-interval every
    rank's state of the interval is in, and one flush holds one round of them.
    ``close()`` stops receiving, drains the socket, flushes what it holds and closes the sink.
    """

    sink: BatchSink
    path: str | None = None
    flush_interval_s: float = 1.0
    flush_phase: float = 0.5
    max_rows: int = 200_000
    producer_id: str = ""
    stats: AggregatorStats = field(default_factory=AggregatorStats)
    #: the NCCL profiler plugin's directory (``CCLD_NCCL_DIR``): its processes' tables are polled there
    nccl_dir: str | None = None
    nccl_poll_s: float = 0.1

    def __post_init__(self) -> None:
        if not self.producer_id:
            self.producer_id = f"{socket.gethostname()}-agg-{uuid.uuid4().hex[:8]}"
        self._own_dir: str | None = None
        self._sock: socket.socket | None = None
        self._buf: dict[tuple[str, int], list[KernelBatch]] = {}
        self._lost = LostRecords()  # rank batches dropped here, said with the job's next flush
        self._rows = 0
        self._lock = threading.Lock()  # guards the buffer (receiver appends, flusher swaps)
        self._send_lock = threading.Lock()  # one flush at a time: batch numbers go out in order
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.nccl: Any = None  # the TableWatcher over nccl_dir, once started

    # ---- lifecycle ----
    def start(self) -> HostAggregator:
        """Bind the socket (mode 0600) and start the threads; raises OSError when it cannot bind."""
        if self.path is None:
            self._own_dir, self.path = private_socket_path()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            old = os.umask(0o177)  # the socket exists with mode 0600 from the start, not after a chmod
            try:
                sock.bind(self.path)
            finally:
                os.umask(old)
            sock.settimeout(0.1)  # the receiver checks for stop this often
        except OSError:
            sock.close()
            self._remove_dir()
            raise
        self._sock = sock
        loops = [(self._receive_loop, "ccld-agg-recv"), (self._flush_loop, "ccld-agg-flush")]
        if self.nccl_dir is not None:
            from ccld.probe.nccl_watch import TableWatcher, announce

            self.nccl = TableWatcher(self.nccl_dir, self.take_batch, name_job=nccl_job)
            announce(self.nccl_dir)  # last: the plugin starts only once something polls its tables
            loops.append((self._nccl_loop, "ccld-agg-nccl"))
        for target, name in loops:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info("ccld aggregator %s listening on %s", self.producer_id, self.path)
        return self

    def close(self, timeout_s: float = 5.0) -> AggregatorStats:
        """Stop, drain the socket, send what is held, close the sink; logs and returns the stats."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout_s)
        self._threads = []
        if self.nccl is not None:  # the frames' last states (a job that just ended), then no more tables
            from ccld.probe.nccl_watch import PID_FILE

            with contextlib.suppress(OSError):
                os.unlink(os.path.join(str(self.nccl_dir), PID_FILE))
            with contextlib.suppress(Exception):
                self.nccl.poll(final=True)
            self.nccl.close()
        sock, self._sock = self._sock, None
        if sock is not None:
            self._drain(sock)
            sock.close()
            if self.path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
        self._remove_dir()
        self.flush()
        try:
            self.sink.close(timeout_s)
        except Exception:  # noqa: BLE001 - a dying sink must not fail the close
            self.stats.internal_errors += 1
            log.debug("closing the aggregator's sink failed", exc_info=True)
        lost = self.stats.dropped + self.stats.decode_errors + self.stats.send_failures
        (log.warning if lost else log.info)("%s", self.stats_line())
        return self.stats

    def __enter__(self) -> HostAggregator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def buffered_rows(self) -> int:
        """Rows received and not yet flushed (at most ``max_rows``; beyond it rank batches are dropped)."""
        return self._rows

    def stats_line(self) -> str:
        s = self.stats
        return (
            f"ccld aggregator {self.producer_id}: {s.received} rank batches ({s.received_rows} rows) merged "
            f"into {s.sent_batches} messages; dropped {s.dropped} rows ({s.dropped_messages} batches, buffer "
            f"full), {s.decode_errors} undecodable datagrams, {s.send_failures} messages not sent"
        )

    def _remove_dir(self) -> None:
        d, self._own_dir = self._own_dir, None
        if d is not None:
            with contextlib.suppress(OSError):
                os.rmdir(d)

    # ---- the NCCL plugin's tables ----
    def _nccl_loop(self) -> None:
        next_scan = 0.0
        while not self._stop.wait(self.nccl_poll_s):
            try:
                now = time.monotonic()
                if now >= next_scan:  # new processes and communicators: once a second is soon enough
                    self.nccl.scan()
                    next_scan = now + 1.0
                self.nccl.poll()
            except Exception:  # noqa: BLE001 - the poller must survive anything
                self.stats.internal_errors += 1
                log.debug("aggregator: polling the NCCL tables failed", exc_info=True)

    # ---- receiving ----
    def _receive_loop(self) -> None:
        buf = bytearray(MAX_DATAGRAM)
        sock = self._sock
        while sock is not None and not self._stop.is_set():
            try:
                n = sock.recv_into(buf, 0, socket.MSG_TRUNC)  # the real length, even when cut
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                self.stats.internal_errors += 1
                time.sleep(0.05)
                continue
            try:
                self._take(bytes(memoryview(buf)[:n]) if n <= len(buf) else None)
            except Exception:  # noqa: BLE001 - the receiver must survive anything
                self.stats.internal_errors += 1
                log.debug("aggregator: a datagram broke the receiver", exc_info=True)

    def _drain(self, sock: socket.socket) -> None:
        """Take every datagram still queued (the ranks' last batches at their exit)."""
        while True:
            try:
                data = sock.recv(MAX_DATAGRAM, socket.MSG_DONTWAIT)
            except OSError:
                return
            try:
                self._take(data)
            except Exception:  # noqa: BLE001
                self.stats.internal_errors += 1

    def _take(self, data: bytes | None) -> None:
        """Decode one datagram and buffer it (None: a datagram cut because it was too big)."""
        try:
            if data is None:
                raise ValueError("datagram larger than MAX_DATAGRAM")
            batch = decode_metrics(data, check_values=True)
        except Exception:  # noqa: BLE001 - SchemaError, or a decoder bug on odd bytes: counted, dropped
            self.stats.decode_errors += 1
            return
        self.take_batch(batch)

    def take_batch(self, batch: KernelBatch) -> None:
        """Buffer one batch for the next flush (a rank's datagram, or the NCCL plugin's frames of a poll)."""
        if batch.n == 0:
            return
        with self._lock:
            if self._rows + batch.n > self.max_rows:
                self.stats.dropped += batch.n
                self.stats.dropped_messages += 1
                self._lost.note_batch(batch)  # the job's next merged batch says whose records went
                return
            self._buf.setdefault((batch.job, batch.incarnation), []).append(batch)
            self._rows += batch.n
            self.stats.received += 1
            self.stats.received_rows += batch.n

    # ---- sending ----
    def _next_flush(self, now: float) -> float:
        iv = max(self.flush_interval_s, 0.01)
        at = (now // iv) * iv + self.flush_phase * iv
        return at if at > now else at + iv

    def _flush_loop(self) -> None:
        due = self._next_flush(time.monotonic())
        while not self._stop.wait(max(due - time.monotonic(), 0.0)):
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - the flusher must survive anything
                self.stats.internal_errors += 1
                log.debug("aggregator: a flush failed", exc_info=True)
            due = self._next_flush(time.monotonic())

    def flush(self) -> int:
        """Send one merged batch per (job, incarnation) held now; returns how many the sink took."""
        with self._send_lock:
            with self._lock:
                held, self._buf, self._rows = self._buf, {}, 0
            sent = 0
            for key, batches in held.items():
                try:
                    merged = KernelBatch.concat(batches, producer=self.producer_id, batch_seq=next(self._seq))
                    with self._lock:  # losses of jobs with nothing held now wait for their next flush
                        merged = self._lost.stamp(key, merged)
                    ok = self.sink.submit_batch(merged)
                except Exception:  # noqa: BLE001 - never out of the flusher thread
                    ok = False
                    self.stats.internal_errors += 1
                    log.debug("aggregator: sending a merged batch failed", exc_info=True)
                    merged = None
                if ok and merged is not None:
                    sent += 1
                    self.stats.sent_batches += 1
                    self.stats.sent_rows += merged.n
                    self.stats.merged_messages += len(batches)
                else:
                    self.stats.send_failures += 1
            return sent


def nccl_job(env: dict[str, str] | Any) -> tuple[str, int]:
    """(job, incarnation) of a plugin table's writer from its environment, by the attachment's rules."""
    from ccld.producers.attach.job_identity import DEFAULT_JOB, resolve

    named = str(env.get("CCLD_JOB", "")).strip() or DEFAULT_JOB
    inc = str(env.get("TORCHELASTIC_RESTART_COUNT") or "0")  # as the attachment counts incarnations
    return resolve(named, env).name, int(inc) if inc.isdigit() else 0


@dataclass
class AggregatorSinkStats:
    """Counters of a rank's ``AggregatorSink``."""

    sent: int = 0  # batches the aggregator's socket took
    sent_rows: int = 0
    fallback: int = 0  # batches sent to Kafka directly instead
    fallback_rows: int = 0
    no_aggregator: int = 0  # of those: no socket, or nobody listening (ENOENT, ECONNREFUSED)
    full: int = 0  # the socket's queue was full (EAGAIN)
    too_big: int = 0  # larger than a datagram may be (EMSGSIZE, or over MAX_DATAGRAM)
    other_errors: int = 0  # any other OSError, or encoding failed
    fallback_failed: int = 0  # batches the fallback sink did not take either (its own counters say why)


class AggregatorSink:
    """A rank's sink that hands each batch to the host's aggregator, or to Kafka when it cannot.

    ``submit_batch`` encodes the batch and sends it as one datagram without waiting
    (``MSG_DONTWAIT``); on any ``OSError`` the batch goes to a ``KafkaSink`` created on first need
    (``fallback``, for tests: any object with ``submit_batch``), and the reason is counted. It
    never raises and never blocks on the aggregator (the fallback's own first send may wait up to
    ``KafkaSink.FIRST_WAIT_S``, as a rank without aggregator would; it runs on the tracker's
    thread, never the training thread).
    """

    def __init__(self, path: str, settings: Settings | None = None, *, fallback: Any = None) -> None:
        self.path = path
        self.settings = settings
        self._fallback = fallback
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self.counters = AggregatorSinkStats()

    def _socket(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            self._sock = sock
        return self._sock

    def _get_fallback(self) -> Any:
        if self._fallback is None:
            self._fallback = KafkaSink(self.settings if self.settings is not None else Settings.load())
        return self._fallback

    def submit(self, record: KernelRecord) -> None:
        """One record: a batch of one, on the same path."""
        try:
            batch = KernelBatch.from_records([record])
        except Exception:  # noqa: BLE001
            self.counters.other_errors += 1
            return
        self.submit_batch(batch)

    def submit_batch(self, batch: KernelBatch) -> bool:
        """Send ``batch`` to the aggregator, else to Kafka directly; True when one of them took it."""
        with self._lock:
            c = self.counters
            try:
                data = encode_batch(batch)
                if len(data) > MAX_DATAGRAM:
                    raise OSError(errno.EMSGSIZE, "batch larger than MAX_DATAGRAM")
                self._socket().sendto(data, socket.MSG_DONTWAIT, self.path)
            except OSError as exc:
                code = exc.errno
                if code in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR):
                    c.no_aggregator += 1
                elif code in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS):
                    c.full += 1
                elif code == errno.EMSGSIZE:
                    c.too_big += 1
                else:
                    c.other_errors += 1
            except Exception:  # noqa: BLE001 - an encoding bug: Kafka may still take the batch
                c.other_errors += 1
            else:
                c.sent += 1
                c.sent_rows += batch.n
                return True
            c.fallback += 1
            c.fallback_rows += batch.n
        try:
            ok = bool(self._get_fallback().submit_batch(batch))
        except Exception:  # noqa: BLE001 - never into the job
            ok = False
        if not ok:
            self.counters.fallback_failed += 1
        return ok

    def flush(self, timeout_s: float = 2.0) -> Any:
        fb = self._fallback
        return fb.flush(timeout_s) if fb is not None else 0

    def close(self, timeout_s: float = 2.0) -> None:
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        fb = self._fallback
        if fb is not None:
            fb.close(timeout_s)

    @property
    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {f"agg_{k}": v for k, v in vars(self.counters).items()}
        fb_stats = getattr(self._fallback, "stats", None)
        if isinstance(fb_stats, dict):
            out.update(fb_stats)
        return out
