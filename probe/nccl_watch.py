"""The aggregator's side of the NCCL plugin: find the processes' tables, poll their frames, hand on batches.

``TableWatcher.scan()`` maps every new ``nccl-*.table`` in the directory and starts watching each
communicator or channel the plugin publishes (the frame of a slot becomes a ``FrameSource`` whose
binding names the job, the global rank and the host from the writer's environment); ``poll()`` reads
every frame with one ``ProbePoller`` per table (the GPU probe's poller: the bounded record format,
the same detail sampling) and hands each poll's batches to ``batch_sink``. A table whose writer is
gone is polled one last time, unmapped and removed, so a job's end is an end, not a silence with
stale states. Nothing here raises into the caller's loop: bad tables are counted and skipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ccld.probe import nccl_table
from ccld.probe.errors import FrameError
from ccld.probe.frame_tracker import RankBinding
from ccld.probe.nccl_table import NcclTable, Slot
from ccld.probe.poller import BatchSink, FrameSource, ProbePoller
from ccld.records import TraceId

log = logging.getLogger(__name__)

#: (job, incarnation) of a writer from its environment (the aggregator applies its job-naming rules)
NameJob = Callable[[Mapping[str, str]], tuple[str, int]]
PID_FILE = "aggregator.pid"


def default_name_job(env: Mapping[str, str]) -> tuple[str, int]:
    inc = env.get("TORCHELASTIC_RESTART_COUNT") or "0"
    return env.get("CCLD_JOB") or "default", int(inc) if inc.isdigit() else 0


def announce(directory: str | os.PathLike[str], pid: int | None = None) -> Path:
    """Say in ``directory`` that an aggregator lives (the plugin refuses to start without one)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / PID_FILE
    tmp = d / f".{PID_FILE}.{os.getpid()}"
    tmp.write_text(f"{os.getpid() if pid is None else pid}\n")
    os.replace(tmp, path)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class _Watched:
    table: NcclTable
    poller: ProbePoller
    job: str
    incarnation: int
    rank: int
    world: int
    slots: dict[int, int] = field(default_factory=dict)  # slot index -> source index
    by_hash: dict[int, int] = field(default_factory=dict)  # unsigned trace hash -> slot index


@dataclass
class WatchStats:
    tables: int = 0  # tables watched now
    tables_seen: int = 0
    tables_done: int = 0  # writers gone: polled a last time and removed
    bad_tables: int = 0
    sources: int = 0  # communicators and channels watched
    polls: int = 0
    records: int = 0
    errors: int = 0


class TableWatcher:
    """Watches the plugin tables in ``directory`` (see the module's doc)."""

    def __init__(self, directory: str | os.PathLike[str], batch_sink: BatchSink, *,
                 name_job: NameJob = default_name_job, clock_ns: Callable[[], int] = time.time_ns,
                 state_interval_s: float = 1.0, remove_done: bool = True) -> None:  # fmt: skip
        self.directory = Path(directory)
        self._sink = batch_sink
        self._name_job = name_job
        self._clock = clock_ns
        self._state_interval_s = state_interval_s
        self._remove_done = remove_done
        self._watched: dict[Path, _Watched] = {}
        self._bad: set[Path] = set()
        self.stats = WatchStats()

    @staticmethod
    def _count_of(table: NcclTable, by_hash: dict[int, int]) -> Callable[[TraceId], int]:
        def count_of(trace: TraceId) -> int:
            i = by_hash.get(nccl_table.unsigned64(trace.comm_hash))
            return -1 if i is None else table.count_of(i, trace.op_seq)

        return count_of

    def scan(self) -> int:
        """Map new tables and watch new slots; returns how many sources were added."""
        added = 0
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return 0
        for name in names:
            if not nccl_table.FILE_PATTERN.fullmatch(name):
                continue
            path = self.directory / name
            if path in self._watched or path in self._bad:
                continue
            try:
                table = NcclTable(path)
            except (FrameError, OSError, ValueError) as exc:
                self._bad.add(path)
                self.stats.bad_tables += 1
                log.warning("ccld aggregator: skipping %s: %s", path, exc)
                continue
            job, inc = self._name_job(table.env)
            by_hash: dict[int, int] = {}
            poller = ProbePoller([], lambda r: None, batch_sink=self._sink, clock_ns=self._clock,
                                 count_of=self._count_of(table, by_hash), state_interval_s=self._state_interval_s)
            self._watched[path] = _Watched(table, poller, job, inc, -1, -1, by_hash=by_hash)
            self.stats.tables_seen += 1
        for w in self._watched.values():
            added += self._watch_slots(w)
        self.stats.tables = len(self._watched)
        self.stats.sources += added
        return added

    def _watch_slots(self, w: _Watched) -> int:
        slots = list(w.table.slots())
        new = [s for s in slots if s.index not in w.slots]
        if not new:
            return 0
        rank, world = nccl_table.rank_of(w.table.env, slots)
        w.rank, w.world = rank, world
        for s in new:
            binding = self._binding(w, s)
            if binding is None:
                continue
            w.by_hash[s.trace_hash] = s.index
            w.slots[s.index] = w.poller.add_source(FrameSource(w.table.frame(s.index), binding))
        return len(new)

    def _binding(self, w: _Watched, s: Slot) -> RankBinding | None:
        if w.rank < 0 or s.comm_size < 1 or not 0 <= s.comm_rank < s.comm_size:
            return None
        return RankBinding(job=w.job, rank=w.rank, comm_rank=s.comm_rank, comm_size=s.comm_size,
                           world_size=max(w.world, 1), host=w.table.host or "?", incarnation=w.incarnation)  # fmt: skip

    def poll(self, *, final: bool = False) -> int:
        """Poll every watched frame once; a table whose writer is gone gets its last poll and is dropped."""
        self.stats.polls += 1
        sent = 0
        for path, w in list(self._watched.items()):
            gone = final or not _alive(w.table.pid)
            try:
                sent += w.poller.poll_once(final=gone)
            except Exception:  # noqa: BLE001 - one table must not stop the others
                self.stats.errors += 1
                log.debug("polling %s failed", path, exc_info=True)
            if gone and not final:
                self._drop(path, w)
        self.stats.records += sent
        return sent

    def _drop(self, path: Path, w: _Watched) -> None:
        del self._watched[path]
        w.table.close()
        self.stats.tables_done += 1
        self.stats.tables = len(self._watched)
        if self._remove_done:
            with contextlib.suppress(OSError):
                path.unlink()

    def table_stats(self) -> dict[str, int]:
        """The plugins' own counters, summed over the tables watched now."""
        out: dict[str, int] = {}
        for w in self._watched.values():
            for k, v in w.table.stats().items():
                if k not in ("n_slots", "abi"):
                    out[k] = out.get(k, 0) + v
        return out

    def close(self) -> None:
        for w in self._watched.values():
            w.table.close()
        self._watched.clear()

