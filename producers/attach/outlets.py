"""Record sinks for the attachment: Kafka (through MetricsProducer), JSON-lines files, a list.

All are called from the attachment's emitter thread, never from the training thread. The
Kafka sink builds its producer lazily on the first record, so attaching costs nothing until a
collective runs, and a producer that cannot be built turns into counted drops.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ccld.records import KernelBatch, KernelRecord
from ccld.settings import Settings

log = logging.getLogger(__name__)


class ListSink:
    """Keeps records in memory (tests, in-process analysis)."""

    def __init__(self) -> None:
        self.records: list[KernelRecord] = []
        self._lock = threading.Lock()

    def submit(self, record: KernelRecord) -> None:
        with self._lock:
            self.records.append(record)

    def flush(self, timeout_s: float = 0.0) -> int:
        return 0

    def close(self, timeout_s: float = 0.0) -> None:
        pass


class JsonlSink:
    """Appends one JSON object per record (``KernelRecord.to_dict``) to a file per process.

    ``target`` is a directory (the file is ``records-<host>-<pid>.jsonl`` inside it) or a path
    ending in ``.jsonl``.
    """

    def __init__(self, target: str | os.PathLike[str]) -> None:
        path = Path(target)
        if path.suffix != ".jsonl":
            path.mkdir(parents=True, exist_ok=True)
            path = path / f"records-{socket.gethostname()}-{os.getpid()}.jsonl"
        self.path = path
        self._fh: Any = None
        self._lock = threading.Lock()

    def submit(self, record: KernelRecord) -> None:
        with self._lock:
            if self._fh is None:
                # line-buffered: every record reaches the file even if the rank is killed or hangs
                self._fh = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - kept open
            self._fh.write(json.dumps(record.to_dict(), separators=(",", ":")) + "\n")

    def flush(self, timeout_s: float = 0.0) -> int:
        with self._lock:
            if self._fh is not None:
                self._fh.flush()
        return 0

    def close(self, timeout_s: float = 0.0) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def read_jsonl(paths: list[Path]) -> list[KernelRecord]:
    """Every record of some JSON-lines files (a torn last line of a killed process is skipped)."""
    out: list[KernelRecord] = []
    for p in paths:
        for line in p.read_text(encoding="utf-8").splitlines():
            try:
                out.append(KernelRecord.from_dict(json.loads(line)))
            except (ValueError, KeyError):
                continue
    return out


class KafkaSink:
    """Sends through ``ccld.producers.kafka.MetricsProducer``, created on the first record or batch.

    Records (``submit``) go through the producer's batcher; whole batches (``submit_batch``, what
    the tracker hands over, one per pump) go out as they are.
    """

    #: the first batch may wait this long for the broker's partition count (see ``submit_batch``)
    FIRST_WAIT_S = 2.0

    def __init__(self, settings: Settings, producer_id: str | None = None, *, keep_ids: bool = False) -> None:
        self.settings = settings
        self.producer_id = producer_id
        # the host aggregator names and numbers its merged batches itself (one producer per host)
        self.keep_ids = keep_ids
        self._producer: Any = None
        self._failed = False
        self._last_stats: dict[str, Any] = {}
        self.dropped = 0
        self.undelivered = 0  # messages a flush could not deliver (the last flush's count)
        self.flush_timeouts = 0
        self._batch_seq = itertools.count()
        self._refused = False  # the last batch was refused: the next ones do not wait

    def _get(self) -> Any:
        if self._producer is None and not self._failed:
            try:
                from ccld.producers.kafka import MetricsProducer

                self._producer = MetricsProducer(self.settings, producer_id=self.producer_id)
            except Exception:  # noqa: BLE001 - no producer: records become counted drops
                self._failed = True
                log.warning("ccld attach: cannot create the metrics producer; records are dropped", exc_info=True)
        return self._producer

    def submit(self, record: KernelRecord) -> None:
        producer = self._get()
        if producer is None:
            self.dropped += 1
            return
        producer.submit(record)

    def submit_batch(self, batch: KernelBatch) -> bool:
        """Send a prebuilt batch (any communicators of one job incarnation) now, from the caller's thread.

        It goes out under the producer id ``<id>-b`` with this sink's own batch numbers (unless
        ``keep_ids``: the host aggregator's batches keep the names it gave them), so it never
        collides with the numbers the producer's batcher gives the ``submit`` path (the worker drops a
        batch whose producer and number it has seen with the same content). The first batch may wait
        ``FIRST_WAIT_S`` for the broker's partition count; after a refusal none waits, so a dead
        broker stalls the calling thread (and the job's exit) at most once. Never raises for the
        broker; returns whether the batch was handed on (a refusal is counted by the producer, a
        batch without a producer in ``dropped``).
        """
        producer = self._get()
        if producer is None:
            self.dropped += batch.n
            return False
        if not self.keep_ids:
            batch = dataclasses.replace(batch, producer=f"{producer.producer_id}-b", batch_seq=next(self._batch_seq))
        ok = bool(producer.send_batch(batch, block_s=0.0 if self._refused else self.FIRST_WAIT_S))
        self._refused = not ok
        return ok

    def flush(self, timeout_s: float = 2.0) -> Any:
        producer = self._producer
        if producer is None:
            return 0
        left = _bounded(lambda: producer.flush(timeout_s), timeout_s)
        if left is None:  # the client did not even answer in time (a dead broker's metadata lookup)
            self.flush_timeouts += 1
        elif left:
            self.undelivered = int(left)
        return left

    def close(self, timeout_s: float = 2.0) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            _bounded(lambda: producer.close(timeout_s), timeout_s)
            self._last_stats = dict(producer.stats)

    @property
    def spool_bytes(self) -> int:
        """Bytes in the producer's on-disk spool (0 without a producer or a spool)."""
        producer = self._producer
        return int(producer.spool_bytes) if producer is not None else 0

    @property
    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sink_dropped": self.dropped,
            "sink_undelivered": self.undelivered,
            "sink_flush_timeouts": self.flush_timeouts,
        }
        live = dict(self._producer.stats) if self._producer is not None else self._last_stats
        out.update({f"producer_{k}": v for k, v in live.items()})
        return out


def _bounded(fn: Callable[[], Any], timeout_s: float) -> Any:
    """Run ``fn`` in a daemon thread for at most ``timeout_s`` (+0.2 s): a dead broker can make a
    client's metadata lookup outlast any flush timeout, and the job's exit must not wait for it."""
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()), name="ccld-attach-flush", daemon=True)
    t.start()
    t.join(timeout_s + 0.2)
    return box[0] if box else None
