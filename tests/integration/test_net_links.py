"""A real slow network link in real jobs: ranks in network namespaces, one rank's link shaped with ``tc``.

Each rank is a host of its own (its own network and UTS namespace: its veth is the host's NIC), the
job is ``ccld.producers.attach.net_job`` with the attachment ``ccld run`` gives, and a real worker on
the bundled broker judges it. Shaping rank ``CULPRIT``'s link slows every transfer that crosses it:
the pipeline send/recv pairs to and from it and its data-parallel group's gradient all-reduce,
from the first step or from the middle of the run. The verdict must name that host's NIC (or a
link through it), and no rank may get S1: every rank computes at its usual pace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'ccl-d[torch]')")

from ccld.producers.attach.localrun import LocalJob, launch  # noqa: E402
from ccld.producers.attach.netns import NetnsJob, netns_refusal  # noqa: E402
from ccld.producers.attach.run_command import prepare_env  # noqa: E402
from ccld.records import AnomalyKind, Verdict  # noqa: E402
from ccld.settings import Settings  # noqa: E402
from ccld.streams.analysis.incidents import ENDS  # noqa: E402
from harness import WorkerProcess, collect_verdicts, job_logs  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.torch, pytest.mark.slow]

WORLD = 4
CULPRIT = 2
JOB = "ccld.producers.attach.net_job"
#: after a link is named, how long to wait for a finding that narrows it to the host's NIC
NARROW_S = 12.0


@pytest.fixture
def net(fast: Settings) -> Iterator[NetnsJob]:
    reason = netns_refusal()
    if reason:
        pytest.skip(reason)
    with NetnsJob(WORLD, fast.bootstrap) as n:
        yield n


def run_job(tmp_path: Path, settings: Settings, net: NetnsJob, args: list[str]) -> LocalJob:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    env = prepare_env(settings, str(site), sink="kafka", heartbeat_ms=100)
    return launch(
        WORLD, [JOB, *args], tmp_path / "ranks", env=env, prefix=net.prefixes(own_hosts=True),
        rank_env=net.rank_env(), master_addr=net.addr(0),
    )  # fmt: skip


def watch(settings: Settings, timeout_s: float, done: Callable[[list[Verdict]], bool]) -> list[Verdict]:
    got = collect_verdicts(settings, timeout_s, until=done)
    for v in got:  # what a failure (and RESULTS.md) shows
        print(f"  {v.detected_time:.1f} {v.describe()}")
    return got


def names_the_fault(host: str) -> Callable[[Verdict], bool]:
    """S2 naming the shaped host's NIC, or a link into or out of it (a pair's link alone cannot tell
    which end's NIC is slow; the host's data-parallel group being slow too narrows it to the NIC)."""
    return lambda v: v.kind is AnomalyKind.S2 and (
        v.root_cause_hosts == (host,) or (v.link is not None and CULPRIT in (v.link.src, v.link.dst)))


def says_where(v: Verdict) -> bool:
    """A link, or a communicator slow as a whole that spans fewer hosts than the job (the world
    all-reduce, slow on every rank, says nothing about where)."""
    ends = {e.partition("@")[2] for e in v.details.get(ENDS, "").split(",") if e}
    return v.link is not None or 0 < len(ends) < WORLD


@pytest.mark.parametrize("when", ["middle", "start"])
def test_pipeline_and_ddp_over_a_slow_link(
    when: str, tmp_path: Path, fast: Settings, net: NetnsJob, worker_factory: Callable[[Settings], WorkerProcess]
) -> None:
    if when == "start":
        net.throttle(CULPRIT)
    job = run_job(tmp_path, fast, net, ["--shape", "pipe", "--duration-s", "85"])
    try:
        worker_factory(fast).start()
        assert job.wait_for_line(0, "ready", 40), job_logs(job)
        if when == "middle":
            time.sleep(8)  # a healthy baseline first
            net.throttle(CULPRIT)
        t0 = time.time()
        named = names_the_fault(net.host(CULPRIT))
        first: list[float] = []  # when a verdict first named the link or the NIC

        def enough(vs: list[Verdict]) -> bool:
            if any(v.root_cause_hosts == (net.host(CULPRIT),) for v in vs):
                return True  # the NIC itself: nothing more specific to wait for
            if not first and any(named(v) for v in vs):
                first.append(time.time())
            return bool(first) and time.time() - first[0] > NARROW_S

        # 60 s: from the start the link is named in about 10 s and the NIC in 15-17 s (20-55 s for the link
        # alone while the siblings' reference was their median, halfway to the two slow pairs); under
        # the whole suite's load the sibling pairs' baselines fill later
        got = watch(fast, 60, enough)
        hits = [v for v in got if named(v)]
        since = "the shaping" if when == "middle" else "the first rank was ready"
        for v in hits[:1] + hits[-1:]:
            print(f"RESULT pipe+ddp {when}: {v.state.value} named by {v.detected_time - t0:.1f} s after {since}: "
                  f"{v.describe()}")
        assert hits, [v.describe() for v in got]
        # one fault, one incident: every slow finding that says where (a link, or a group of some hosts)
        # is in the incident of the first (the code before item 5 opened one per link and group)
        where = [v for v in got if v.kind is AnomalyKind.S2 and says_where(v)]
        assert len({v.incident_id for v in where}) == 1, [v.describe() for v in where]
        # no innocent rank: no S1 at all (every rank computes at its pace), no verdict that names ranks
        # without the shaped one
        assert not [v for v in got if v.kind is AnomalyKind.S1], [v.describe() for v in got]
        assert all(CULPRIT in v.root_cause_ranks for v in got if v.root_cause_ranks), [v.describe() for v in got]
    finally:
        job.kill()


# ---------------------------------------------------------------- MoE: all_to_all of routed sizes
def run_moe(tmp_path: Path, settings: Settings, args: list[str]) -> LocalJob:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    env = prepare_env(settings, str(site), sink="kafka", heartbeat_ms=100)
    return launch(WORLD, [JOB, "--shape", "moe", *args], tmp_path / "ranks", env=env)


@pytest.mark.parametrize("fault", ["none", "hung-expert", "slow-expert"])
def test_moe_all_to_all_of_varying_sizes(
    fault: str, tmp_path: Path, fast: Settings, worker_factory: Callable[[Settings], WorkerProcess]
) -> None:
    """Healthy: no verdict (the most loaded expert is late at every combine, by design, and the ranks'
    sizes differ in every all_to_all). An expert that hangs before the combine: H1 naming it, not an
    H2 for the sizes its peers wait with. An expert that computes 6x longer from the middle: S1 naming
    it (late at every combine, never at the dispatch), nothing else."""
    args = ["--duration-s", "35"]
    if fault == "hung-expert":
        args += ["--fault", "sleep", "--culprit", str(CULPRIT), "--at-step", "60"]
    if fault == "slow-expert":
        # at K > 1 the attachment details a dispatch with its combine (ccld.bounded.RunSample): each
        # sampled alone, the analyzer could not keep them apart and named nobody here
        # (the job outlives the watch: on a loaded machine step 250 came 22 s in, and the test ends at the S1)
        args = ["--duration-s", "120", "--fault", "slow", "--culprit", str(CULPRIT), "--at-step", "250",
                "--slow-factor", "6"]
    job = run_moe(tmp_path, fast, args)
    try:
        worker_factory(fast).start()
        assert job.wait_for_line(0, "ready", 40), job_logs(job)
        if fault == "none":
            got = watch(fast, 35, lambda vs: False)
            assert job.wait(30) == [0] * WORLD, job_logs(job)  # the routed sizes agreed: gloo ran every step
            print(f"RESULT moe healthy: {len(got)} verdicts")
            assert got == [], [v.describe() for v in got]
        elif fault == "slow-expert":
            assert job.wait_for_line(CULPRIT, "slows 6x from step", 60), job_logs(job)
            t0 = time.time()
            got = watch(fast, 40, lambda vs: any(v.kind is AnomalyKind.S1 for v in vs))
            shown = "; ".join(f"{v.kind.value} {v.root_cause_ranks} {v.op_type}" for v in got)
            print(f"RESULT moe slow expert: {shown} ({time.time() - t0:.1f} s after it slowed)")
            assert [(v.kind, v.root_cause_ranks, v.op_type) for v in got] == [
                (AnomalyKind.S1, (CULPRIT,), "all_to_all")], [v.describe() for v in got]
        else:
            assert job.wait_for_line(CULPRIT, "sleeps forever", 40), job_logs(job)
            t0 = time.time()
            got = watch(fast, 40, lambda vs: any(v.kind.is_hang for v in vs))
            hangs = [v for v in got if v.kind.is_hang]
            print("RESULT moe hung expert: " + (f"{hangs[0].kind.value} {hangs[0].root_cause_ranks} "
                                                f"{time.time() - t0:.1f} s after it stopped" if hangs else "no hang"))
            assert hangs and hangs[0].kind is AnomalyKind.H1 and hangs[0].root_cause_ranks == (CULPRIT,), (
                [v.describe() for v in got])
            assert hangs[0].op_type == "all_to_all", hangs[0].describe()
            assert not [v for v in got if v.kind is AnomalyKind.H2], [v.describe() for v in got]
    finally:
        job.kill()
