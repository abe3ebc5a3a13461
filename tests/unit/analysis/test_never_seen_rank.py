"""A rank that hangs before its first op sends no record at all. In a group of two (a tensor or data-parallel
pair) nothing says which global rank the silent member is; the job's world size does: when exactly the ranks
never heard from are missing, they are named (H1), and the verdict says how it knows."""

from __future__ import annotations

from typing import Any

import pytest

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.streams.analysis.replay import analyze_batches

JOB: dict[str, Any] = {"id": "unseen", "seed": 7, "ranks": 8, "gpus_per_node": 4, "layout": {"tp": 2, "pp": 2, "dp": 2},
                       "channels": 4, "duration_s": 40.0, "workload": {"microbatches": 2, "layers": 2}}


@pytest.mark.parametrize("rank", [0, 5])
def test_a_rank_that_never_reported_is_named_by_elimination(rank: int) -> None:
    sc = Scenario.from_dict({**JOB, "faults": [{"kind": "H1", "rank": rank, "onset_s": 0.0}]})
    feed = list(simulate(sc))
    assert all(rank not in b.col("rank").tolist() for _, b in feed), "the hung rank must send nothing"
    opened = [v for v in analyze_batches(feed, past_end_s=60.0) if v.state.value == "open"]
    assert [(v.kind.value, v.root_cause_ranks) for v in opened] == [("H1", (rank,))]
    assert f"no record has come from rank {rank} on any communicator" in opened[0].evidence


def test_a_shard_of_a_job_does_not_guess() -> None:
    """Spread over shards, each sees some of the job's communicators: its unseen ranks are not the job's, so no
    shard names a rank by elimination (the hang is still found where a group is regular enough to infer it)."""
    sc = Scenario.from_dict({**JOB, "faults": [{"kind": "H1", "rank": 5, "onset_s": 0.0}]})
    opened = [v for v in analyze_batches(list(simulate(sc)), groups=2, past_end_s=60.0) if v.state.value == "open"]
    assert all(v.root_cause_ranks == (5,) for v in opened), [(v.kind.value, v.root_cause_ranks) for v in opened]


def test_a_pipeline_stage_that_never_reported_is_named_by_its_waiting_successor() -> None:
    """Two ranks, two pipeline stages: stage 0 hangs before its first op, so the job's only record is stage 1
    waiting in its first recv, a send/recv pair whose other member never reported (heldout-any-6's
    any-pp-H1-2-086: no verdict before)."""
    sc = Scenario.from_dict({"id": "unseen-pp", "seed": 9, "ranks": 2, "layout": {"tp": 1, "pp": 2, "dp": 1},
                             "channels": 8, "duration_s": 50.0, "workload": {"microbatches": 4, "layers": 1},
                             "faults": [{"kind": "H1", "rank": 0, "onset_s": 0.0}]})
    feed = list(simulate(sc))
    assert {r for _, b in feed for r in b.col("rank").tolist()} == {1}
    opened = [v for v in analyze_batches(feed, past_end_s=60.0) if v.state.value == "open"]
    assert [(v.kind.value, v.root_cause_ranks) for v in opened] == [("H1", (0,))]
    assert "no record has come from rank 0 on any communicator" in opened[0].evidence
