"""One job's analysis spread over several shards and one job stage, in one process.

Each shard is an ``Analyzer`` fed only the rows of its communicator group (``KernelBatch.by_group``)
and asked for reports (``Analyzer.reports``), never for verdicts; one ``JobStage`` decides from
all of them. This is the shape the worker takes when a job is spread over several workers (each
owns some groups, the stage gets the reports over a topic); in one process it proves the split
changes nothing: the verdicts are the single analyzer's (``tests/unit/analysis/test_sharded.py``).
"""

from __future__ import annotations

from ccld.records import KernelBatch, Verdict
from ccld.streams.analysis.analyzer import Analyzer
from ccld.streams.analysis.job_stage import JobStage
from ccld.streams.analysis.settings import AnalyzerSettings
from ccld.streams.analysis.shard import ShardReport


class ShardedAnalyzer:
    """``groups`` shard analyzers and one job stage: the ``Analyzer`` interface (ingest, evaluate)."""

    def __init__(self, groups: int, settings: AnalyzerSettings | None = None) -> None:
        self.settings = settings or AnalyzerSettings()
        self.shards = [Analyzer(self.settings, whole_jobs=groups <= 1) for _ in range(max(groups, 1))]
        self.stage = JobStage(self.settings)

    def ingest(self, batch: KernelBatch, now: float) -> None:
        for g, part in batch.by_group(len(self.shards)).items():
            self.shards[g].ingest(part, now)

    def evaluate(self, now: float) -> list[Verdict]:
        newest: dict[str, int] = {}
        by_job: dict[tuple[str, int], list[tuple[int, ShardReport]]] = {}
        for g, shard in enumerate(self.shards):
            for job, inc in shard.newest_incarnations().items():
                newest[job] = max(inc, newest.get(job, inc))
            for rep in shard.reports(now):
                by_job.setdefault((rep.job, rep.incarnation), []).append((g, rep))
        out = self.stage.restarted(newest, now)
        for reports in by_job.values():
            out.extend(self.stage.decide(reports, now, need=len(reports)))  # every shard of the job reports
        return out
