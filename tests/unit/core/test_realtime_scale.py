"""The pure parts of benchmarks/realtime_scale.py: schedule, lag, CPU, summary, and the job's collective rate."""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from ccld.producers.simulator.scenario import Expectation
from ccld.records import Verdict

BENCH = Path(__file__).parents[3] / "benchmarks" / "realtime_scale.py"


@pytest.fixture(scope="module")
def rs() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("realtime_scale_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


TIMES = [1.1, 1.1, 1.1, 2.1, 2.1, 3.1]  # three delivery bursts, one second apart


def test_replay_schedule_counts_what_is_due(rs: types.ModuleType) -> None:
    assert rs.due(TIMES, 0.0) == 0
    assert rs.due(TIMES, 1.1) == 3  # a message is due at its own time
    assert rs.due(TIMES, 2.5) == 5
    assert rs.due(TIMES, 99.0) == 6


def test_lag_is_the_age_of_the_oldest_unprocessed_message(rs: types.ModuleType) -> None:
    assert rs.behind_s(TIMES, 0, 0.5) == 0.0  # nothing due yet
    assert rs.behind_s(TIMES, 3, 2.0) == 0.0  # all that is due is done
    assert rs.behind_s(TIMES, 3, 2.6) == pytest.approx(0.5)  # the 2.1 burst waits
    assert rs.behind_s(TIMES, 1, 3.6) == pytest.approx(2.5)  # stuck in the first burst
    assert rs.behind_s(TIMES, 6, 50.0) == 0.0  # everything done


def test_lag_over_partitions_is_the_oldest_uncommitted_message_of_any_partition(rs: types.ModuleType) -> None:
    """Per partition its own schedule and committed offset; the lag is the worst partition's. Summing the
    offsets against the merged schedule would hide a partition that is stuck behind a busy one."""
    schedules = {0: [1.1, 2.1, 3.1], 2: [1.1, 1.1, 2.1]}
    assert rs.lag_over_partitions_s(schedules, {0: 0, 2: 0}, 0.5) == 0.0  # nothing due yet
    assert rs.lag_over_partitions_s(schedules, {0: 3, 2: 3}, 9.0) == 0.0  # everything committed
    # partition 0 is done; partition 2 still waits on its 2nd message (due at 1.1): 2.4 s, not the
    # 1.4 s that 4 of 6 committed on the merged schedule would say
    assert rs.lag_over_partitions_s(schedules, {0: 3, 2: 1}, 3.5) == pytest.approx(2.4)
    assert rs.lag_over_partitions_s(schedules, {0: 1, 2: 3}, 3.5) == pytest.approx(1.4)  # p0's 2.1 waits
    assert rs.lag_over_partitions_s(schedules, {0: 3}, 1.6) == pytest.approx(0.5)  # no offset yet: 0
    assert rs.lag_over_partitions_s({}, {}, 5.0) == 0.0
    assert rs.lag_over_partitions_s({7: TIMES}, {7: 3}, 2.6) == rs.behind_s(TIMES, 3, 2.6)  # one partition


def test_split_groups_sends_one_message_per_group(rs: types.ModuleType) -> None:
    """The schedule split as the producer splits with analysis_groups=G: same records, same send times,
    every message of one group, going to the partition the producer picks."""
    from ccld.producers.kafka import metrics_partition
    from ccld.producers.simulator.sim import simulate
    from ccld.records import COMM_COLUMN, comm_group

    sc = rs.job_scenario(64, 3.0)
    by_rank = list(rs.regroup(simulate(sc), "rank"))
    assert list(rs.split_groups(by_rank, 1)) == by_rank
    split = list(rs.split_groups(by_rank, 2))
    assert len(by_rank) < len(split) <= 2 * len(by_rank)
    assert sorted(r for _, b in split for r in map(repr, b.records())) == sorted(
        r for _, b in by_rank for r in map(repr, b.records()))
    assert sorted({t for t, _ in split}) == sorted({t for t, _ in by_rank})
    assert [t for t, _ in split] == sorted(t for t, _ in split)
    for _, b in split:
        groups = set(comm_group(b.columns[COMM_COLUMN], 2).tolist())
        assert len(groups) == 1 and b.by_group(2) == {groups.pop(): b}  # the producer's split is a no-op
    parts = {metrics_partition(b.job, b.comm_hash, rs.metrics_partitions_for(2), 2) for _, b in split}
    assert len(parts) == 2


def test_assigned_partitions_from_a_worker_log(rs: types.ModuleType) -> None:
    line = ("INFO aiokafka.consumer.group_coordinator: Setting newly assigned partitions {{TopicPartition(topic="
            "'p.metrics', partition={}), TopicPartition(topic='p.reports', partition=1), TopicPartition(topic="
            "'p.metrics', partition=3)}} for group p")
    log = "\n".join([line.format(0), "other", line.format(2)])
    assert rs.assigned_partitions(log, "p.metrics") == [2, 3]  # the last assignment
    assert rs.assigned_partitions("no assignment", "p.metrics") == []


def test_summary_reports_every_worker(rs: types.ModuleType) -> None:
    run = _run([0.5] * 20, workers=2, groups=2, messages_before_split=40, partitions=[1, 2])
    for i, x in enumerate(run["samples"]):
        x["worker-2_cpu_s"], x["worker-2_rss"] = 0.25 * i, 50 * 2**20
    s = rs.summarize(run, warmup_s=0.0)
    assert s["workers"] == 2 and s["groups"] == 2 and s["split_factor"] == pytest.approx(2.5)
    assert s["worker_roles"] == ["worker", "worker-2"]
    assert s["worker-2_cpu_pct_median"] == pytest.approx(25.0) and s["worker-2_rss_mb_median"] == 50
    assert s["worker_cpu_pct_median"] == pytest.approx(50.0) and s["producer_cpu_pct_median"] is None


def test_cpu_percent_of_one_core(rs: types.ModuleType) -> None:
    assert rs.cpu_percent([(0.0, 1.0), (1.0, 1.5), (3.0, 3.5)]) == pytest.approx([50.0, 100.0])
    assert rs.cpu_percent([(0.0, 1.0)]) == []


def _run(lags: list[float], **kw: Any) -> dict[str, Any]:
    samples = [{"t": float(i), "lag_s": lag, "producer_behind_s": 0.0, "worker_cpu_s": 0.5 * i,
                "worker_rss": (100 + i) * 2**20, "broker_cpu_s": None, "broker_rss": None}
               for i, lag in enumerate(lags)]
    return {"ranks": 64, "duration_s": float(len(lags)), "messages": 100, "records": 6400, "bytes": 640_000,
            "samples": samples, "drain_s": 1.0, "ttv_topic_s": 7.0, "ttv_inproc_s": 6.0, **kw}


def test_summary_keeps_up_and_rates(rs: types.ModuleType) -> None:
    s = rs.summarize(_run([5.0] * 10 + [0.9, 1.9] * 10), warmup_s=10.0)  # warm-up lag is not judged
    assert s["kept_up"] and s["sustained"]
    assert s["lag_max_s"] == 1.9 and s["lag_median_s"] == pytest.approx(1.4)
    assert s["records_per_s"] == pytest.approx(6400 / 30) and s["records_per_rank_s"] == pytest.approx(100 / 30)
    assert s["worker_cpu_pct_median"] == pytest.approx(50.0)
    assert s["broker_cpu_pct_median"] is None
    assert s["worker_rss_mb_growth_2nd_half"] == pytest.approx(9.0)
    assert s["ttv_within_slack"]


def test_summary_one_spike_breaks_kept_up_but_not_sustained(rs: types.ModuleType) -> None:
    s = rs.summarize(_run([0.9] * 29 + [2.5]), warmup_s=0.0)
    assert not s["kept_up"] and s["sustained"]


def test_summary_growing_lag_is_not_sustained(rs: types.ModuleType) -> None:
    s = rs.summarize(_run([0.1 * i for i in range(30)], drain_s=40.0), warmup_s=0.0)
    assert not s["kept_up"] and not s["sustained"]


def test_summary_never_drained_or_late_verdict(rs: types.ModuleType) -> None:
    s = rs.summarize(_run([0.5] * 30, drain_s=None, ttv_topic_s=8.5), warmup_s=0.0)
    assert not s["kept_up"] and not s["sustained"]
    assert not s["ttv_within_slack"]  # 8.5 > 6.0 + 2
    assert not rs.summarize(_run([0.5] * 30, ttv_topic_s=None))["ttv_within_slack"]


def test_largest_kept_up_stops_at_the_first_failure(rs: types.ModuleType) -> None:
    rows = [{"ranks": 1024, "kept_up": False}, {"ranks": 256, "kept_up": True}, {"ranks": 512, "kept_up": True},
            {"ranks": 2048, "kept_up": True}]
    assert rs.largest_kept_up(rows) == 512
    assert rs.largest_kept_up([{"ranks": 256, "kept_up": False}]) is None


def test_first_correct_verdict(rs: types.ModuleType) -> None:
    def v(kind: str, rank: int) -> Verdict:
        return Verdict.from_dict({"job": "j", "incident_id": f"{kind}{rank}", "state": "open", "kind": kind,
                                  "communicator": "c", "op_seq": 1, "op_type": "ALLREDUCE",
                                  "root_cause_ranks": [rank], "affected_ranks": [rank], "confidence": 1.0,
                                  "evidence": "", "onset_time": 0.0, "detected_time": 0.0})

    got = rs.first_correct(Expectation("S1", 5), [(3.0, v("S1", 5)), (2.0, v("S1", 4)), (2.5, v("S1", 5))])
    assert got is not None and got[0] == 2.5
    assert rs.first_correct(Expectation("H1", 5), [(1.0, v("S1", 5))]) is None


def test_proc_reads_this_process(rs: types.ModuleType) -> None:
    cpu, rss = rs.proc_cpu_rss(os.getpid())
    assert cpu is not None and cpu > 0 and rss is not None and rss > 10 * 2**20
    assert rs.proc_cpu_rss(None) == (None, None)


def test_the_job_runs_near_300_collectives_per_rank_second(rs: types.ModuleType) -> None:
    from ccld.producers.simulator.sim import simulate

    sc = rs.job_scenario(64, 8.0)
    assert sc.faults[0].onset_s == 4.0 and sc.expect[0].rank == sc.faults[0].rank
    rate = rs.collectives_per_rank_s(simulate(sc), 1.5, 4.0)
    assert 250 <= rate["median"] <= 350, rate
    with pytest.raises(ValueError):
        rs.job_scenario(100, 6.0)


def test_regroup_sends_what_rank_processes_send(rs: types.ModuleType) -> None:
    """Per delivery time: one message per rank (all its communicators), or per rank and communicator."""
    from ccld.producers.simulator.sim import simulate

    sc = rs.job_scenario(64, 4.0)
    stream = list(simulate(sc))
    by_rank = list(rs.regroup(stream, "rank"))
    by_rank_comm = list(rs.regroup(stream, "rank-comm"))
    rows = sorted(r for _, b in stream for r in map(repr, b.records()))
    for out in (by_rank, by_rank_comm):
        assert sorted(r for _, b in out for r in map(repr, b.records())) == rows  # nothing lost or repeated
        assert all(len(set(b.columns["rank"].tolist())) == 1 for _, b in out)
        assert [t for t, _ in out] == sorted(t for t, _ in out)
    per_time = {(t, int(b.columns["rank"][0])) for t, b in by_rank}
    assert len(per_time) == len(by_rank)  # one message per rank and delivery time
    by_host = list(rs.regroup(stream, "host"))
    assert sorted(r for _, b in by_host for r in map(repr, b.records())) == rows
    assert all(len(b.hosts) == 1 and b.producer.endswith(b.hosts[0]) for _, b in by_host)
    assert len({(t, b.hosts[0]) for t, b in by_host}) == len(by_host) < len(by_rank) / 4  # 8 ranks a host
    assert all(b.one_comm for _, b in by_rank_comm) and not all(b.one_comm for _, b in by_rank)
    assert len(by_rank) < len(by_rank_comm)
    seqs = [b.batch_seq for _, b in by_rank if b.producer == by_rank[0][1].producer]
    assert seqs == list(range(1, len(seqs) + 1))  # each rank a producer with its own sequence
    assert list(rs.regroup(stream, "comm")) == stream
    # the collective rate read back from the records does not depend on how they were grouped
    assert rs.collectives_per_rank_s(by_rank, 1.0, 3.0) == rs.collectives_per_rank_s(stream, 1.0, 3.0)
