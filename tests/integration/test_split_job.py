"""One job spread over several workers: communicator groups on their own metrics partitions, each
analyzed by whichever worker owns it, and a job stage on the reports topic that decides.

Real broker, real ``ccld worker`` processes, scenarios of the standard accuracy suite (Megatron
layouts: a hang in one communicator leaves victims waiting in communicators of other groups).
The verdicts must be the single-process analyzer's, and a worker killed with SIGKILL must hand its
partitions (shards and job stage alike) to the other with no verdict lost or sent twice.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from ccld.producers.kafka import MetricsProducer
from ccld.producers.simulator.publish import publish
from ccld.producers.simulator.scenario import Scenario, load_scenarios
from ccld.producers.simulator.sim import simulate
from ccld.records import Verdict, VerdictState
from ccld.settings import Settings
from ccld.streams.analysis.replay import analyze_batches
from ccld.topics import ensure_topics
from harness import WorkerProcess, collect_verdicts

pytestmark = pytest.mark.integration

SUITE = Path(__file__).resolve().parents[2] / "benchmarks" / "scenarios" / "standard.jsonl"
GROUPS = 4


def scenario(sid: str) -> Scenario:
    return next(sc for sc in load_scenarios(SUITE) if sc.id == sid)


@pytest.fixture
def split(bootstrap: str, tmp_path: Path) -> Settings:
    tag = uuid.uuid4().hex[:10]
    s = Settings.load({}, bootstrap=bootstrap, topic_prefix=f"s{tag}.", metrics_partitions=GROUPS,
                      analysis_groups=GROUPS, worker_app_id=f"ccld-split-{tag}", worker_tick_s=0.5,
                      worker_commit_interval_s=0.5, log_level="INFO")
    ensure_topics(s)
    return s


def opened(vs: list[Verdict], job: str) -> list[tuple[str, tuple[int, ...], str]]:
    return sorted((v.kind.value, v.root_cause_ranks, v.communicator) for v in vs
                  if v.job == job and v.state is VerdictState.OPEN)


def in_process(sc: Scenario) -> list[tuple[str, tuple[int, ...], str]]:
    return opened(analyze_batches(simulate(sc, job=sc.id), tick_s=1.0), sc.id)


def run(settings: Settings, sc: Scenario, offset_s: float) -> None:
    with MetricsProducer(settings, producer_id=f"p-{sc.id}", background=False) as p:

        class Shifted:  # the worker's clock never goes back: a later scenario starts after the earlier one
            @staticmethod
            def send_batch(batch: object, timestamp_ms: int | None = None) -> bool:
                return p.send_batch(batch, timestamp_ms=None if timestamp_ms is None else  # type: ignore[arg-type]
                                    timestamp_ms + int(offset_s * 1000))

        publish(sc, Shifted(), job=sc.id)
        p.flush(60.0)
        assert p.stats["delivered_records"] == p.stats["sent_records"] > 0


def wait_for(settings: Settings, jobs: dict[str, int], timeout_s: float) -> list[Verdict]:
    """Verdicts until each job has at least its expected number of OPEN verdicts, then 3 s more for repeats."""
    def enough(vs: list[Verdict]) -> bool:
        return all(len(opened(vs, j)) >= n for j, n in jobs.items())

    got = collect_verdicts(settings, timeout_s, until=enough)
    time.sleep(3.0)
    return collect_verdicts(settings, 3.0) if enough(got) else got


def test_a_job_over_two_workers_gets_the_single_analyzers_verdicts(split: Settings, tmp_path: Path) -> None:
    workers = [WorkerProcess(split, tmp_path / f"w{i}" / "worker.log").start() for i in range(2)]
    try:
        cases = [scenario("H1-16-002"), scenario("S1-16-147")]
        want = {sc.id: in_process(sc) for sc in cases}
        assert all(want.values()), want
        offset = 0.0
        for sc in cases:
            run(split, sc, offset)
            offset += sc.duration_s + 600.0
        got = wait_for(split, {sid: len(w) for sid, w in want.items()}, 180.0)
        logs = "\n".join(w.log()[-3000:] for w in workers)
        for sid, w in want.items():
            assert opened(got, sid) == w, f"{sid}: {[v.describe() for v in got if v.job == sid]}\n{logs}"
        # exactly once on the topic (consumers de-duplicate, but nothing should need it here)
        keys = Counter(v.dedupe_key for v in got)
        assert max(keys.values()) == 1, keys
        # both workers did a share: each owns metrics partitions of the job and reports from them
        assert all('"reports":' in w.log() for w in workers), logs
    finally:
        for w in workers:
            w.stop()


def test_a_killed_worker_hands_shards_and_stage_to_the_other(split: Settings, tmp_path: Path) -> None:
    workers = [WorkerProcess(split, tmp_path / f"w{i}" / "worker.log").start() for i in range(2)]
    try:
        first, second = scenario("H1-16-002"), scenario("H2-16-061")
        want1, want2 = in_process(first), in_process(second)
        run(split, first, 0.0)
        got = wait_for(split, {first.id: len(want1)}, 180.0)
        assert opened(got, first.id) == want1, [v.describe() for v in got]
        workers[1].stop(signal.SIGKILL)  # its shards, and perhaps the job stage, go to the survivor
        run(split, second, first.duration_s + 600.0)
        got = wait_for(split, {first.id: len(want1), second.id: len(want2)}, 240.0)
        assert opened(got, second.id) == want2, f"{[v.describe() for v in got]}\n{workers[0].log()[-4000:]}"
        assert opened(got, first.id) == want1
        keys = Counter(v.dedupe_key for v in got)
        assert max(keys.values()) == 1, keys
    finally:
        for w in workers:
            w.stop()
