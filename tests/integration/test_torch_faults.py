"""Real gloo ranks with the attachment, real injected faults, verdicts from the real worker.

Each test starts 4 ranks of ``ccld.producers.attach.demo_job`` on loopback (each in its own
session, always SIGKILLed in the end) with the environment ``ccld run`` gives them, and a
real ``ccld worker`` on the bundled broker; it asserts the kind and root-cause rank of the
verdict arriving on the verdicts topic. The first tests need no broker: the ranks write
their records to JSON-lines files and the records themselves are checked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'ccl-d[torch]')")

from ccld.producers.attach.localrun import LocalJob, launch  # noqa: E402
from ccld.producers.attach.netns import NetnsJob, netns_refusal  # noqa: E402
from ccld.producers.attach.outlets import read_jsonl  # noqa: E402
from ccld.producers.attach.run_command import prepare_env  # noqa: E402
from ccld.producers.attach.session import ENV_DETAIL  # noqa: E402
from ccld.records import AnomalyKind, DType, KernelRecord, OpType, Status  # noqa: E402
from ccld.settings import Settings  # noqa: E402
from harness import WorkerProcess, collect_verdicts, first_verdict, job_logs, kill_tree  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.torch]

WORLD = 4
CULPRIT = 2
DEMO = "ccld.producers.attach.demo_job"


def start(
    tmp_path: Path, settings: Settings, args: list[str], *, sink: str = "kafka", heartbeat_ms: int = 100,
    detail: str | None = None, module: str = DEMO,
) -> LocalJob:  # fmt: skip
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    env = prepare_env(settings, str(site), sink=sink, heartbeat_ms=heartbeat_ms)
    if detail is not None:  # "all": every op's DONE record (the tests that check each call)
        env[ENV_DETAIL] = detail
    return launch(WORLD, [module, *args], tmp_path / "ranks", env=env)


# ---------------------------------------------------------------- records only (no broker)
Runner = Callable[..., tuple[list[KernelRecord], LocalJob]]


@pytest.fixture
def jsonl_run(tmp_path: Path) -> Iterator[Runner]:
    jobs: list[LocalJob] = []

    def run(
        args: list[str], wait_s: float, detail: str | None = None,
        until: Callable[[list[KernelRecord]], bool] | None = None,
    ) -> tuple[list[KernelRecord], LocalJob]:  # fmt: skip
        """Records after the job ends, or (``until``) as soon as they satisfy ``until``; at most wait_s."""
        out = tmp_path / "records"
        job = start(tmp_path, Settings.load({}, job="records"), args, sink=f"jsonl:{out}", detail=detail)
        jobs.append(job)
        if until is None:
            job.wait(wait_s)
        else:  # a hung job never ends: poll its records (start-up on a loaded machine takes seconds)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and not until(read_jsonl(sorted(out.glob("*.jsonl")))):
                time.sleep(0.5)
        return read_jsonl(sorted(out.glob("*.jsonl"))), job

    yield run
    for j in jobs:
        j.kill()


def test_trace_ids_agree_across_ranks_for_every_kind_of_call(
    jsonl_run: Runner,
) -> None:
    steps = 6
    recs, job = jsonl_run(["--mix", "--steps", str(steps), "--compute-ms", "5"], 60, detail="all")
    assert [p.returncode for p in job.procs] == [0] * WORLD, job_logs(job)
    done = [r for r in recs if r.status is Status.DONE]
    assert {r.rank for r in done} == set(range(WORLD))
    by_round: dict[tuple[int, int], list[KernelRecord]] = defaultdict(list)
    for r in done:
        by_round[(r.comm_hash, r.op_seq)].append(r)
    sizes = defaultdict(set)
    for (_comm, _seq), rows in by_round.items():
        size = rows[0].comm_size
        sizes[size].add(_comm)
        assert len(rows) == size, rows  # every member reported the round exactly once
        assert sorted(r.comm_rank for r in rows) == list(range(size))
        assert len({(r.dtype, r.count) for r in rows}) == 1, rows
        if size == 2 and {r.op_type for r in rows} <= {OpType.SEND, OpType.RECV}:
            send = next(r for r in rows if r.comm_rank == 0)
            recv = next(r for r in rows if r.comm_rank == 1)
            assert (send.op_type, send.peer, recv.op_type, recv.peer) == (OpType.SEND, 1, OpType.RECV, 0)
        else:
            assert len({(r.op_type, r.peer) for r in rows}) == 1, rows
        assert all(r.t_exit_ns >= r.t_enter_ns > 0 for r in rows)
    # world: all_reduce, all_gather, broadcast, reduce_scatter, barrier per step; even/odd groups: one each
    world = [c for c in sizes[WORLD]]
    assert len(world) == 1
    world_ops = sorted((s, by_round[(world[0], s)][0].op_type) for (c, s) in by_round if c == world[0])
    assert len(world_ops) == 5 * steps
    assert world_ops[:5] == [
        (0, OpType.ALL_REDUCE), (1, OpType.ALL_GATHER), (2, OpType.BROADCAST), (3, OpType.REDUCE_SCATTER),
        (4, OpType.BARRIER),
    ]  # fmt: skip
    # 2-rank comms: the even and odd subgroups plus the 4 ring channels (the blocking send/recv of
    # 0->1 and 2->3 continue the sequence of the ring's channels in the same direction)
    assert len(sizes[2]) == 2 + WORLD
    for rank in range(WORLD):
        mine = [x for x in done if x.rank == rank]
        assert len(mine) == steps * (5 + 1 + 2 + 1)


def test_a_rank_that_never_enters_leaves_its_peers_heartbeating(
    jsonl_run: Runner,
) -> None:
    def beating(recs: list[KernelRecord]) -> bool:  # every waiting peer beat 3 times in op 8
        n = defaultdict(int)
        for r in recs:
            n[r.rank] += r.status is Status.PROGRESS and r.op_seq == 8
        return all(n[rank] >= 3 for rank in set(range(WORLD)) - {CULPRIT})

    args = ["--fault", "sleep", "--culprit", str(CULPRIT), "--at-step", "8", "--compute-ms", "10"]
    recs, job = jsonl_run(args, 40, until=beating)
    assert all(p.poll() is None for p in job.procs), job_logs(job)  # everyone is hung, nobody crashed
    last: dict[int, KernelRecord] = {}
    progress: dict[int, list[int]] = defaultdict(list)
    for r in recs:
        last[r.rank] = r
        if r.status is Status.PROGRESS:
            progress[r.rank].append(r.t_sample_ns)
    # the culprit's communicator state: idle after op 7, every interval (1 s)
    assert (last[CULPRIT].status, last[CULPRIT].op_seq) == (Status.IDLE, 7)
    for rank in set(range(WORLD)) - {CULPRIT}:
        assert last[rank].op_seq == 8 and last[rank].status is Status.PROGRESS
        beats = progress[rank]
        assert len(beats) >= 3  # shipped 100 ms after entering, then the state of every interval
        assert all(b > a for a, b in zip(beats, beats[1:], strict=False))


def test_a_silent_dtype_mismatch_is_visible_in_the_records(jsonl_run: Runner) -> None:
    # int32 and float32 have the same size, so gloo sums garbage without noticing (no hang, no
    # error); the Trace IDs still show the culprit's different dtype at every step from the fault on
    recs, job = jsonl_run(["--fault", "dtype", "--culprit", str(CULPRIT), "--at-step", "3", "--steps", "8"], 40,
                          detail="all")  # fmt: skip
    assert [p.returncode for p in job.procs] == [0] * WORLD, job_logs(job)
    dtypes: dict[int, set[tuple[int, DType]]] = defaultdict(set)
    for r in recs:
        if r.status is Status.DONE:
            dtypes[r.op_seq].add((r.rank, r.dtype))
    for seq in range(8):
        odd = {rank for rank, dt in dtypes[seq] if dt is not DType.FLOAT32}
        assert odd == ({CULPRIT} if seq >= 3 else set()), (seq, dtypes[seq])


@pytest.mark.parametrize("named", [True, False], ids=["--job", "no-job"])
def test_ccld_run_attaches_every_rank_torchrun_starts(tmp_path: Path, named: bool) -> None:
    """With ``--job`` the ranks take that name; without, torchrun's rendezvous id (``ccld run`` also hands them
    its launch's name, which their settings must let through: it once kept every rank from attaching)."""
    import sys

    out = tmp_path / "records"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD)]
    job = ["--job", "via-torchrun"] if named else []
    cmd = [sys.executable, "-m", "ccld.cli", "run", *job, "--sink", f"jsonl:{out}", "--",
           *torchrun, "-m", DEMO, "--steps", "12", "--compute-ms", "5"]  # fmt: skip
    env = {**os.environ, ENV_DETAIL: "all"}  # every op's DONE record: all 12 are checked
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        text, _ = proc.communicate(timeout=90)
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, text.decode(errors="replace")[-3000:]
    recs = read_jsonl(sorted(out.glob("*.jsonl")))
    assert {r.rank for r in recs} == set(range(WORLD)), text.decode(errors="replace")[-3000:]
    (job_name,) = {r.job for r in recs}
    assert job_name == "via-torchrun" if named else job_name.startswith("torchelastic-"), job_name
    assert b"attachment not active" not in text
    assert {r.op_seq for r in recs if r.status is Status.DONE} == set(range(12))
    assert len(list(out.glob("*.jsonl"))) == WORLD  # the torchrun agent itself ran no collective


def test_a_dead_broker_costs_the_job_nothing(tmp_path: Path) -> None:
    from ccld.producers.attach.localrun import free_port

    dead = Settings.load({}, bootstrap=f"127.0.0.1:{free_port()}", job="dead-broker")  # nobody listens
    job = start(tmp_path, dead, ["--steps", "100", "--compute-ms", "5"])
    try:
        t0 = time.monotonic()
        codes = job.wait(60)
        took = time.monotonic() - t0
    finally:
        job.kill()
    assert codes == [0] * WORLD, job_logs(job)
    assert took < 20, took  # 100 steps of 5 ms plus start-up; the exit flush waits 0.5 s at most
    assert "Traceback" not in job_logs(job) and "attachment not active" not in job_logs(job)
    for rank in range(WORLD):  # each rank says, once, at exit, that its records were lost
        assert job.log(rank).count("lost:") == 1, job.log(rank)


# ---------------------------------------------------------------- real broker + worker
@pytest.fixture
def faulty_job(
    tmp_path: Path, fast: Settings, worker_factory: Callable[[Settings], WorkerProcess]
) -> Iterator[Callable[[list[str]], LocalJob]]:
    jobs: list[LocalJob] = []

    def run(args: list[str]) -> LocalJob:
        job = start(tmp_path, fast, args)  # ranks first: torch imports while the worker starts
        jobs.append(job)
        worker_factory(fast).start()
        return job

    yield run
    for j in jobs:
        j.kill()


@pytest.mark.parametrize("fault", ["sleep", "stop", "sigstop-from-outside"])
def test_h1_rank_never_enters(fault: str, fast: Settings, faulty_job: Callable[[list[str]], LocalJob]) -> None:
    t0 = time.monotonic()
    outside = fault == "sigstop-from-outside"
    args = [
        "--fault",
        "pause" if outside else fault,
        "--culprit",
        str(CULPRIT),
        "--at-step",
        "20",
        "--compute-ms",
        "20",
    ]
    job = faulty_job(args)
    if outside:  # the culprit pauses 3 s before step 20: stop it there, from the test process
        assert job.wait_for_line(CULPRIT, "pauses before step 20", 40), job_logs(job)
        os.kill(job.pid(CULPRIT), signal.SIGSTOP)
    v = first_verdict(fast, AnomalyKind.H1, 50, job)
    assert v.root_cause_ranks == (CULPRIT,), v.describe()
    assert set(v.affected_ranks) == set(range(WORLD)) - {CULPRIT}
    assert v.op_seq == 20 and v.op_type == "all_reduce"
    assert time.monotonic() - t0 < 55


def test_h2_rank_calls_a_different_collective(fast: Settings, faulty_job: Callable[[list[str]], LocalJob]) -> None:
    job = faulty_job(["--fault", "op", "--culprit", str(CULPRIT), "--at-step", "20", "--compute-ms", "20"])
    v = first_verdict(fast, AnomalyKind.H2, 50, job)
    assert v.root_cause_ranks == (CULPRIT,) and v.mismatch_field == "op_type", v.describe()


def test_h2_through_ccld_run_and_torchrun(
    tmp_path: Path, fast: Settings, worker_factory: Callable[[Settings], WorkerProcess]
) -> None:
    """The whole chain a user runs: `ccld run ... -- torchrun ...`, the broker, the worker."""
    import sys

    cmd = [
        sys.executable, "-m", "ccld.cli", "run", "--bootstrap", fast.bootstrap, "--topic-prefix", fast.topic_prefix,
        "--job", "via-ccld-run", "--heartbeat-ms", "100", "--",
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
        "-m", DEMO, "--fault", "op", "--culprit", "1", "--at-step", "15", "--compute-ms", "20",
    ]  # fmt: skip
    log = open(tmp_path / "run.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        worker_factory(fast).start()
        got = collect_verdicts(fast, 50, until=lambda vs: any(v.kind is AnomalyKind.H2 for v in vs))
        hits = [v for v in got if v.kind is AnomalyKind.H2 and v.job == "via-ccld-run"]
        assert hits, f"{[v.describe() for v in got]}\n{(tmp_path / 'run.log').read_text(errors='replace')[-3000:]}"
        assert hits[0].root_cause_ranks == (1,), hits[0].describe()
    finally:
        kill_tree(proc)
        log.close()


# at step 40: slow after a healthy start (the learned baseline says so); at step 0: slow from the
# job's first step, so no healthy history exists and only the peers can say it is slow
@pytest.mark.parametrize("at_step", [40, 0])
def test_s1_rank_computes_slower(
    at_step: int, fast: Settings, faulty_job: Callable[[list[str]], LocalJob]
) -> None:
    job = faulty_job([
        "--fault", "slow", "--slow-factor", "6", "--culprit", str(CULPRIT), "--at-step", str(at_step),
        "--compute-ms", "30", "--duration-s", "120",  # outlives the watch; the test ends at the S1
    ])  # fmt: skip
    assert job.wait_for_line(CULPRIT, "ready", 60), job_logs(job)
    ready = time.time()
    v = first_verdict(fast, AnomalyKind.S1, 50, job)
    assert v.root_cause_ranks == (CULPRIT,), v.describe()
    assert v.p is not None and v.p >= fast.analyzer.beta
    if at_step == 0:
        assert v.detected_time - ready <= 30.0, v.describe()  # within 30 s of the job's start
        assert v.onset_time <= v.detected_time - 2.0, v.describe()  # dated from its first slow op


# ---------------------------------------------------------------- S2: namespaces + tc
# torch/gloo exposes no send/recv counters, so the link cannot be named: the verdict says comm-slow
# (S2, P <= alpha) with no root-cause rank rather than guessing one.
def test_s2_one_ranks_link_is_throttled(
    tmp_path: Path, fast: Settings, worker_factory: Callable[[Settings], WorkerProcess]
) -> None:
    reason = netns_refusal()
    if reason:
        print(f"S2 test skipped: {reason}")
        pytest.skip(reason)
    with NetnsJob(WORLD, fast.bootstrap) as net:
        site = tmp_path / "site"
        site.mkdir()
        env = prepare_env(fast, str(site), sink="kafka", heartbeat_ms=100)
        job = launch(
            WORLD, [DEMO, "--compute-ms", "20", "--duration-s", "50", "--elements", "262144"], tmp_path / "ranks",
            env=env, prefix=net.prefixes(), rank_env=net.rank_env(), master_addr=net.addr(0),
        )  # fmt: skip
        try:
            worker_factory(fast).start()
            assert job.wait_for_line(0, "ready", 60), job_logs(job)  # torch's start-up: 18 s on a loaded machine
            time.sleep(5)  # a healthy baseline first
            shaping = net.throttle(CULPRIT)
            v = first_verdict(fast, AnomalyKind.S2, 25, job)
            print(f"S2 with {shaping}: {v.describe()}")
            assert v.p is not None and v.p <= fast.analyzer.alpha, v.describe()
            assert v.root_cause_ranks == () and "cannot be named" in v.evidence, v.describe()
        finally:
            job.kill()


def test_a_healthy_job_killed_all_at_once_gets_no_verdict(
    fast: Settings, faulty_job: Callable[[list[str]], LocalJob]
) -> None:
    """A scheduler's cancel: every rank SIGKILLed mid-run, no goodbye (issue 18, item 4). Ops in flight at
    the kill stop with their ranks; that is the job's end, not a hang (``analyzer_cut_min_s``)."""
    job = faulty_job(["--compute-ms", "20", "--duration-s", "60", "--mix"])
    assert job.wait_for_line(0, "ready", 40), job_logs(job)
    time.sleep(10)  # running: all_reduce, other collectives and ring p2p in flight all the time
    job.kill()
    # past every hang threshold of ``fast`` (5 s) several times over. Hangs only: the claim is about the
    # kill; a slowdown the job really had before it (gloo on a busy 2-core CI machine) is another matter
    got = collect_verdicts(fast, 25)
    assert [v for v in got if v.kind.is_hang] == [], [v.describe() for v in got]


# ---------------------------------------------------------------- slow from the first step: DDP
NET = "ccld.producers.attach.net_job"


@pytest.fixture
def spinners() -> Iterator[Callable[[int], None]]:
    """``spin(n)``: n processes that each keep a core busy until the test ends (a busy machine)."""
    import sys

    procs: list[subprocess.Popen[bytes]] = []

    def spin(n: int) -> None:
        procs.extend(subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
                     for _ in range(n))

    yield spin
    for p in procs:
        kill_tree(p)


@pytest.mark.parametrize("factor", [2.0, 1.5], ids=["2x", "1.5x"])
def test_a_ddp_rank_slow_from_its_first_step_on_a_busy_machine_names_no_healthy_rank(
    factor: float, tmp_path: Path, fast: Settings, worker_factory: Callable[[Settings], WorkerProcess],
    spinners: Callable[[int], None],
) -> None:
    """Pure data parallel: one stage of 4 ranks whose gradient all-reduce DDP's C++ reducer issues (the
    attachment sees it through Flight Recorder, its exits known only between two polls), rank 2 computing
    ``factor`` x longer (20 -> 40 or 30 ms a step) from step 0, so no healthy history exists, and both cores
    kept busy by two spinning processes: the ranks' timing is the scheduler's as much as the job's. Rank 2
    or nothing; a healthy rank is never named (the gap test alone once named one, S1 at cpu_wait_share
    0.8). On a quiet machine the S1 on rank 2 comes in 20-30 s, not in every run: benchmarks/RESULTS.md."""
    spinners(2)
    job = start(tmp_path, fast, ["--shape", "pipe", "--dp", str(WORLD), "--micro-batches", "1", "--compute-ms", "10",
                                 "--fault", "slow", "--slow-factor", str(factor), "--culprit", str(CULPRIT),
                                 "--at-step", "0", "--duration-s", "90"], module=NET)  # fmt: skip
    try:
        worker_factory(fast).start()
        assert job.wait_for_line(CULPRIT, "ready", 60), job_logs(job)
        got = collect_verdicts(fast, 40)
        named = {r for v in got for r in v.root_cause_ranks}
        assert named <= {CULPRIT}, f"a healthy rank named: {[v.describe() for v in got]}"
        print(f"{factor}x on a busy machine: {[v.describe() for v in got] or 'no verdict'}")
    finally:
        job.kill()


# ---------------------------------------------------------------- FSDP: all_gather and reduce_scatter only
@pytest.mark.parametrize("fault", ["slow", "sleep"])
def test_an_fsdp_rank_slow_from_its_first_step_or_stopped_is_named(
    fault: str, tmp_path: Path, fast: Settings, worker_factory: Callable[[Settings], WorkerProcess]
) -> None:
    """FSDP2 on gloo (``fully_shard``, 4 layers over 4 ranks): every collective is torch's own all-gather of
    a layer's parameters or reduce-scatter of its gradients, the ranks' only peers are each other. Rank 2
    computes 2x longer in every layer from step 0 (no healthy history: S1 from its peers alone), or stops for good at
    step 20 (H1: the others wait in the next step's first all-gather)."""
    args = ["--shape", "fsdp", "--compute-ms", "40", "--duration-s", "120", "--culprit", str(CULPRIT), "--fault", fault]
    args += ["--slow-factor", "2", "--at-step", "0"] if fault == "slow" else ["--at-step", "20"]
    job = start(tmp_path, fast, args, module=NET)
    try:
        worker_factory(fast).start()
        assert job.wait_for_line(CULPRIT, "ready", 60), job_logs(job)
        ready = time.time()
        kind = AnomalyKind.S1 if fault == "slow" else AnomalyKind.H1
        # its compute is spent inside the layers (net_job.layer_compute), so it is late at every layer's
        # collectives: 10-12 s here beside two or three busy loops (benchmarks/RESULTS.md)
        v = first_verdict(fast, kind, 90, job)
        assert v.root_cause_ranks == (CULPRIT,), v.describe()
        assert v.op_type in ("all_gather", "reduce_scatter"), v.describe()
        # how soon: benchmarks/RESULTS.md (CI asserts the rank and class only)
        print(f"FSDP {fault}: {v.describe()} {v.detected_time - ready:.1f} s after the ranks were ready")
        if fault == "sleep":
            assert set(v.affected_ranks) == set(range(WORLD)) - {CULPRIT}, v.describe()
        others = [u.describe() for u in collect_verdicts(fast, 1) if set(u.root_cause_ranks) - {CULPRIT}]
        assert others == [], others  # no healthy rank named, before or with it
    finally:
        job.kill()


# ---------------------------------------------------------------- pipeline only: one stall is no link hang
def test_a_pipeline_ranks_one_long_pause_is_at_most_one_incident_on_it(
    tmp_path: Path, fast: Settings, worker_factory: Callable[[Settings], WorkerProcess]
) -> None:
    """Four pipeline stages of one rank each, send/recv between them and nothing else (no data-parallel
    group). Rank 2 stops once for 20 s (a slow checkpoint write, a preempted host) and goes on: its
    neighbours wait in their receives from it and their sends to it the whole time. That is rank 2's
    stall, not a link's: no H3, and at most one incident, naming rank 2 (an H1 while it is stopped, past
    the 5-s threshold of ``fast``), none after it goes on."""
    job = start(tmp_path, fast, ["--shape", "pipe", "--dp", "1", "--compute-ms", "20", "--duration-s", "120",
                                 "--fault", "pause", "--pause-s", "20", "--culprit", str(CULPRIT), "--at-step", "60"],
                module=NET)  # fmt: skip
    try:
        worker_factory(fast).start()
        assert job.wait_for_line(CULPRIT, "goes on", 120), job_logs(job)
        time.sleep(15)  # the job runs on after the pause: no late incident comes
        got = collect_verdicts(fast, 3)
        assert [v.describe() for v in got if v.kind is AnomalyKind.H3] == []
        named = {r for v in got for r in v.root_cause_ranks}
        seen = "\n".join(v.describe() for v in got) or "no verdict"
        assert named <= {CULPRIT}, seen
        assert len({v.incident_id for v in got}) <= 1, seen
        print(f"pipeline pause: {seen}")
    finally:
        job.kill()


def test_a_healthy_ddp_job_on_a_busy_machine_gets_no_verdict(
    tmp_path: Path, fast: Settings, worker_factory: Callable[[Settings], WorkerProcess],
    spinners: Callable[[int], None],
) -> None:  # fmt: skip
    """The DDP job of the slow-from-step-0 tests with no fault, both cores kept busy by two spinning
    processes the whole time: the ranks' lateness is the scheduler's, spread over every rank, and no rank
    may be named for it. ``CCLD_BUSY_DDP_S`` sets how long it runs (90 s in CI; 600 s for the record in
    benchmarks/RESULTS.md)."""
    run_s = float(os.environ.get("CCLD_BUSY_DDP_S", "90"))
    spinners(2)
    job = start(tmp_path, fast, ["--shape", "pipe", "--dp", str(WORLD), "--micro-batches", "1", "--compute-ms", "10",
                                 "--duration-s", str(run_s + 60)], module=NET)  # fmt: skip
    try:
        worker_factory(fast).start()
        assert job.wait_for_line(0, "ready", 60), job_logs(job)
        got = collect_verdicts(fast, run_s)
        assert [p.poll() for p in job.procs] == [None] * WORLD, job_logs(job)  # it ran the whole time
        assert got == [], [v.describe() for v in got]
    finally:
        job.kill()
