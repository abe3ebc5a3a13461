"""NCCL's calls into the profiler plugin, on a virtual clock, polled and analysed: each fault named right.

Every rank of a 4-rank data-parallel job plays its all-reduces into its own copy of the plugin (kernel
channels with GPU times, proxy ops and steps), the aggregator's watcher polls the frames, the analyzer
judges them (``stack.nccl_check``). A hang or slowdown must be named on the right rank or link, once,
and a healthy job must stay silent for ten minutes and past its end.
"""

from __future__ import annotations

import shutil

import pytest

from ccld.probe.nccl_replay import RingJob
from ccld.records import AnomalyKind, Link, VerdictState
from ccld.stack.nccl_check import replay_verdicts

pytestmark = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="no C compiler")


def opened(job: RingJob, version: int = 6) -> list:  # type: ignore[type-arg]
    res = replay_verdicts(job, version=version)
    assert res.plugin["dropped_events"] == 0 and res.watch.errors == 0
    return [v for v in res.verdicts if v.state == VerdictState.OPEN]


@pytest.mark.parametrize("version", [6, 5, 4])
def test_a_rank_that_never_starts_its_next_all_reduce_is_h1(version: int) -> None:
    (v,) = opened(RingJob(fault="H1", rank=2, onset_s=15.0, duration_s=45.0), version)
    assert (v.kind, v.root_cause_ranks) == (AnomalyKind.H1, (2,)), v.describe()
    assert set(v.affected_ranks) == {0, 1, 3}


def test_a_channel_whose_proxy_steps_stop_is_h3_on_its_link() -> None:
    (v,) = opened(RingJob(fault="H3", rank=1, channel=1, onset_s=15.0, duration_s=45.0))
    assert (v.kind, v.link) == (AnomalyKind.H3, Link(1, 2)), v.describe()
    assert v.channel == 1


@pytest.mark.parametrize("factor", [3.0, 1.5])
def test_a_rank_whose_kernels_start_late_is_s1_and_no_link_is_blamed(factor: float) -> None:
    """Its upstream neighbour's sends wait for its buffers (a backlog before it): the lateness's shadow, no S2."""
    (v,) = opened(RingJob(fault="S1", rank=1, factor=factor, onset_s=15.0, duration_s=45.0))
    assert (v.kind, v.root_cause_ranks) == (AnomalyKind.S1, (1,)), v.describe()


@pytest.mark.parametrize("factor", [3.0, 1.5])
def test_a_slow_peer_link_is_s2_on_that_link(factor: float) -> None:
    (v,) = opened(RingJob(fault="S2", rank=2, factor=factor, onset_s=15.0, duration_s=45.0))
    assert (v.kind, v.link) == (AnomalyKind.S2, Link(2, 3)), v.describe()


def test_ten_minutes_of_a_healthy_job_and_its_end_give_no_verdict() -> None:
    res = replay_verdicts(RingJob(duration_s=600.0, channels=4), past_end_s=120.0)
    assert res.verdicts == [], [v.describe() for v in res.verdicts]
    assert res.calls > 100_000 and res.records > 2_000  # it ran: every rank's ops, polled and analysed


def test_communicators_of_part_of_the_job_name_global_ranks_and_links() -> None:
    """Two 4-rank communicators (ranks 0-3 and 4-7, each its own ring, comm ranks 0-3 in both): the verdicts
    name the job's ranks, from the ranks' own RANK, not their place in the communicator."""
    (h1,) = opened(RingJob(nranks=8, group_size=4, fault="H1", rank=6, onset_s=15.0, duration_s=45.0))
    assert (h1.kind, h1.root_cause_ranks, set(h1.affected_ranks)) == (AnomalyKind.H1, (6,), {4, 5, 7}), h1.describe()
    (h3,) = opened(RingJob(nranks=8, group_size=4, fault="H3", rank=7, channel=0, onset_s=15.0, duration_s=45.0))
    assert (h3.kind, h3.link) == (AnomalyKind.H3, Link(7, 4)), h3.describe()  # the ring closes within its group


PIPE = dict(nranks=4, shape="pipeline", compute_s=0.4, op_s=0.05, onset_s=15.0, duration_s=45.0)


@pytest.mark.parametrize(("fault", "want"), [
    (dict(fault="H1", rank=2), lambda v: (v.kind, v.root_cause_ranks) == (AnomalyKind.H1, (2,))),
    (dict(fault="H3", rank=1), lambda v: (v.kind, v.link) == (AnomalyKind.H3, Link(1, 2))),
    (dict(fault="S1", rank=2, factor=2.0), lambda v: (v.kind, v.root_cause_ranks) == (AnomalyKind.S1, (2,))),
    (dict(fault="S2", rank=1, factor=3.0), lambda v: (v.kind, v.link) == (AnomalyKind.S2, Link(1, 2))),
], ids=["H1", "H3", "S1", "S2"])  # fmt: skip
def test_a_pipeline_of_send_and_recv_names_the_stage_or_the_link(fault: dict, want) -> None:  # type: ignore[no-untyped-def,type-arg]
    """Four stages, each sending its micro-batches to the next through NCCL's point-to-point channels: a
    slow stage's upstream neighbour waits in its send for it and comes late to its own next receive; it is
    the victim, never named (the poller gives each op the end of the rank's op on any frame before it)."""
    (v,) = opened(RingJob(**PIPE, **fault))  # type: ignore[arg-type]
    assert want(v), v.describe()


def test_a_healthy_pipeline_and_its_end_give_no_verdict() -> None:
    res = replay_verdicts(RingJob(**{**PIPE, "duration_s": 120.0}), past_end_s=120.0)  # type: ignore[arg-type]
    assert res.verdicts == [], [v.describe() for v in res.verdicts]
