"""The NCCL profiler plugin end to end in one process: NCCL's calls replayed, frames polled, the analyzer's verdicts.

``replay_verdicts(job)`` builds the plugin, plays every rank of a ``RingJob`` into its own copy of it on a
virtual clock (``probe.nccl_replay.VirtualReplay``), polls the tables every ``poll_s`` with the aggregator's
watcher (``probe.nccl_watch.TableWatcher``: the GPU probe's poller and record format), feeds each poll's
batches to the real ``Analyzer``, evaluates once a second of job time, and plays on ``past_end_s`` after the
job's end as a live worker's clock does. Minutes of a job take seconds; the unit tests and
``benchmarks/nccl_plugin.py`` use it.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ccld.probe import nccl_build
from ccld.probe.nccl_replay import RingJob, VirtualReplay, ticks
from ccld.probe.nccl_watch import TableWatcher, WatchStats, announce
from ccld.records import KernelBatch, Verdict
from ccld.streams.analysis.analyzer import Analyzer
from ccld.streams.analysis.settings import AnalyzerSettings


@dataclass
class ReplayResult:
    verdicts: list[Verdict]
    watch: WatchStats
    plugin: dict[str, int]  # the plugins' own counters, summed over the ranks
    records: int
    wall_s: float
    calls: int = 0


def replay_verdicts(job: RingJob, *, plugin: str | Path | None = None, version: int = 6, poll_s: float = 0.1,
                    past_end_s: float = 60.0, settings: AnalyzerSettings | None = None,
                    job_name: str = "nccl-replay") -> ReplayResult:  # fmt: skip
    lib = Path(plugin) if plugin is not None else nccl_build.build()
    t_wall = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ccld-nccl-") as tmp:
        d = Path(tmp)
        announce(d)
        now = [0.0]
        rep = VirtualReplay(job, lib, d, version=version)
        batches: list[KernelBatch] = []
        watcher = TableWatcher(d, batches.append, clock_ns=lambda: rep.clock_ns(now[0]),
                               name_job=lambda env: (job_name, 0), remove_done=False)  # fmt: skip
        watcher.scan()
        an = Analyzer(settings) if settings is not None else Analyzer()
        out: list[Verdict] = []
        calls = records = 0
        every = max(1, int(round(1.0 / poll_s)))
        for n, t in enumerate(ticks(job.duration_s + past_end_s, poll_s), start=1):
            now[0] = t
            calls += rep.advance(t)
            watcher.poll()
            for b in batches:
                records += b.n
                an.ingest(b, t)
            batches.clear()
            if n % every == 0:
                out.extend(an.evaluate(t))
                watcher.scan()  # new communicators and channels, once a second as the aggregator does
        plugin_stats = watcher.table_stats()
        watcher.close()
    return ReplayResult(out, watcher.stats, plugin_stats, records, time.perf_counter() - t_wall, calls)
