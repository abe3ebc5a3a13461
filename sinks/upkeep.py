"""The sink's archive upkeep: compaction (and pruning past the retention) on a timer, beside the consume loop.

Every ``sink_compact_every_s`` the sink starts one background run of ``sinks.compact.compact`` with the offsets
it has committed (a flush that ended below its partition's committed offset is never replayed, so its files
merge even while the ledger names them) and, when ``archive_retention_days`` is set, ``prune``. The consume
loop never waits for it: compaction touches only files below the committed offsets, and the sink writes only
at or above them. A run that fails is logged and counted, and the next one tries again; a compaction the
operator runs at the same time (``ccld archive compact``) holds the archive's lock and this run is skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from ccld.errors import CcldError
from ccld.settings import Settings
from ccld.sinks.compact import CompactBusy, compact, prune

log = logging.getLogger(__name__)

_MB = 1 << 20


class Upkeep:
    """Starts compaction runs on the sink's timer; ``counters`` are the sink's (shared dict)."""

    def __init__(self, settings: Settings, root: Path, counters: dict[str, int]) -> None:
        self.every_s = settings.sink_compact_every_s
        self.max_source_bytes = int(settings.sink_compact_max_file_mb * _MB)
        self.retention_days = settings.archive_retention_days
        self.root = root
        self.counters = counters
        for key in ("compactions", "compacted_files", "compact_errors", "pruned_folders"):
            counters.setdefault(key, 0)
        self._due = time.monotonic() + self.every_s
        self._thread: threading.Thread | None = None

    def maybe_start(self, committed: Mapping[tuple[str, int, str], int], now: float | None = None) -> bool:
        """Start a run when one is due and none is running (``committed`` is copied); whether one started."""
        now = time.monotonic() if now is None else now
        if self.every_s <= 0 or now < self._due or self.running:
            return False
        self._due = now + self.every_s
        self._thread = threading.Thread(target=self.run_once, args=(dict(committed),), name="ccld-sink-upkeep",
                                        daemon=True)
        self._thread.start()
        return True

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run_once(self, committed: Mapping[tuple[str, int, str], int]) -> None:
        """One compaction (and prune) of the archive; never raises (a failure is logged and counted)."""
        began = time.monotonic()
        try:
            r = compact(self.root, committed=committed, max_source_bytes=self.max_source_bytes)
            self.counters["compactions"] += 1
            self.counters["compacted_files"] += r.files_before - r.files_after
            if r.errors:
                self.counters["compact_errors"] += len(r.errors)
                log.warning("archive compaction: %d folders not merged: %s", len(r.errors), "; ".join(r.errors[:3]))
            if r.files_before:
                log.info("archive compaction: %d files in %d folders merged into %d (%d rows) in %.1f s",
                         r.files_before, r.folders, r.files_after, r.rows, time.monotonic() - began)
            if self.retention_days > 0:
                p = prune(self.root, self.retention_days)
                self.counters["pruned_folders"] += p.folders
                if p.folders:
                    log.info("archive retention (%g days): removed %d folders, %d files (%.1f MB) of %s",
                             self.retention_days, p.folders, p.files, p.bytes / _MB, ", ".join(p.days))
        except CompactBusy as exc:
            log.info("archive compaction skipped: %s", exc)
        except (OSError, CcldError) as exc:
            self.counters["compact_errors"] += 1
            log.warning("archive compaction failed: %s: %s", type(exc).__name__, exc)
        except Exception:  # noqa: BLE001 - a bug here must not end the thread unsaid; the next run tries again
            self.counters["compact_errors"] += 1
            log.exception("archive compaction failed")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Wait a while for a running compaction (killed midway it loses nothing: its journal completes it)."""
        if self._thread is not None:
            self._thread.join(timeout_s)
