"""False alarms per job-day: long healthy jobs with every kind of noise, analyzed as the worker would.

    python benchmarks/false_alarms.py [--seed 1] [--job-hours 48] [--max-wall-s S] [--workers N] [--out FILE.json]
    python benchmarks/false_alarms.py --late-faults [--jobs 36] [--max-duration-s 1800] [--out FILE.json]
    python benchmarks/false_alarms.py --seed 1 --only 17        # one job of the draw again, verdicts in full

The accuracy suites run jobs of a minute or two; a false alarm once a day per job would never show
there. This benchmark draws healthy Megatron-style jobs from ranges wider than the standard
suite's (8 to 4,096 ranks, weighted towards small jobs so job-hours accumulate; tens of minutes to
hours of simulated time each) with every noise kind the simulator has (``NOISE_KINDS``), plays
each through ``simulate()`` into ``analyze_batches`` with the default ``AnalyzerSettings`` and an
evaluation every simulated second, batch by batch as they come (a job of hours is never held in
memory), and counts every OPEN verdict as one false alarm. Rates come with the exact 95 % Poisson
upper bound (``poisson_upper``), overall, per class and per noise kind (a verdict is charged to the
noise kinds active in its job around its onset, ``attribute``).

``--late-faults`` plays the same long jobs with one fault each (the classes in turn, on a random
rank or link), injected after at least 80 % of the job's healthy time, and scores them with
``ccld bench accuracy``'s rules (``stack/bench.py``): recall, rank and class accuracy, time to
verdict; an OPEN verdict before the fault's onset counts as a false alarm on healthy time.

Job ``i`` of seed ``s`` is a pure function of ``(s, i)`` (``draw_job``), so any job can be played
again alone with ``--only i``, and its scenario (printed with every false alarm) can become a test.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import resource
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import KernelBatch, Verdict, VerdictState
from ccld.stack.bench import score
from ccld.streams.analysis.replay import analyze_batches
from ccld.streams.analysis.settings import AnalyzerSettings


def _load_make_standard() -> ModuleType:
    """The suite generator (not a package): its layouts, held-out ranges and fault parameters."""
    path = Path(__file__).with_name("scenarios") / "make_standard.py"
    spec = importlib.util.spec_from_file_location("ccld_make_standard", path)
    if spec is None or spec.loader is None:  # pragma: no cover - the file ships with the repository
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


MS = _load_make_standard()

#: every noise kind the simulator has; the first five are properties of the whole job, the rest events
NOISE_KINDS = ("jitter", "pauses", "eval", "skew", "drift", "checkpoint", "restart", "recreate", "transient")
ALWAYS_ON = NOISE_KINDS[:5]
SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: small jobs most of the time (job-hours accumulate at 50-100x real time), a few large ones
SIZE_WEIGHTS = (24, 22, 16, 12, 9, 6, 4, 3, 2, 2)
#: simulated length of a job by size, (shortest, longest), drawn log-uniform: a job of 4,096 ranks
#: plays at about real time on one core, one of 8 ranks about 100x faster
DURATION_S: dict[int, tuple[float, float]] = {
    8: (1200, 4 * 3600), 16: (1200, 4 * 3600), 32: (1200, 3 * 3600), 64: (1200, 2 * 3600), 128: (1200, 5400),
    256: (1200, 3600), 512: (900, 2400), 1024: (600, 1800), 2048: (600, 1200), 4096: (600, 720),
}
#: the chance that a job has each noise kind (heavy-tailed jitter is in every job: the model's t4 noise)
NOISE_CHANCE = {"pauses": 0.6, "eval": 0.4, "skew": 0.8, "drift": 0.7, "checkpoint": 0.6, "restart": 0.25,
                "recreate": 0.3, "transient": 0.7}
#: a verdict is charged to a noise event that was active within this long before its onset
ATTRIBUTE_BEFORE_S = 120.0
#: late faults: the fault starts in this share of the job, and the job goes on at least TAIL_S after
LATE_SHARE = (0.8, 0.92)
LATE_TAIL_S = 90.0
FAULT_KINDS = MS.ALL_KINDS


# --------------------------------------------------------------------------------------------
# drawing jobs (pure: job i of seed s is always the same)
# --------------------------------------------------------------------------------------------
def _log_uniform(r: random.Random, lo: float, hi: float) -> float:
    return math.exp(r.uniform(math.log(lo), math.log(hi)))


def _when(r: random.Random, lo: float, tail: float, dur: float) -> float:
    """An event's onset from ``lo`` to ``tail`` before the end (squeezed into short CI jobs)."""
    lo = min(lo, dur / 4)
    return round(r.uniform(lo, max(lo, dur - tail)), 1)


def draw_job(seed: int, index: int, *, duration_s: float | None = None, max_ranks: int | None = None,
             max_duration_s: float | None = None, any_shape: bool = False) -> dict[str, Any]:
    """Scenario ``index`` of the draw ``seed``: a healthy Megatron-style job with its noise.

    ``duration_s`` fixes the length (short CI runs), ``max_duration_s`` caps it, ``max_ranks``
    leaves out larger sizes; each changes the job, so the same settings give the same draw again.
    ``any_shape`` draws every other job's layout from the any-shape family (``make_standard.SHAPES``:
    pure data parallel, pipeline only, tensor only, MoE, 3D; 1-8 GPUs per node) instead.
    """
    r = random.Random(seed * 1_000_003 + index)
    sizes = [(s, w) for s, w in zip(SIZES, SIZE_WEIGHTS, strict=True) if max_ranks is None or s <= max_ranks]
    ranks = r.choices([s for s, _ in sizes], [w for _, w in sizes])[0]
    tp, pp, dp = r.choice(MS.MEGATRON_LAYOUTS[ranks])
    ep, gpn, shape = 1, 8, "3d"
    if any_shape and index % 2:
        shape = r.choice(MS.SHAPES)
        tp, pp, dp, ep, gpn = MS.AnyShape(r.randrange(1 << 30), MS.AnyProfile(max_ranks=max_ranks or 512)).layout(shape)
        ranks = tp * pp * dp
    lo, hi = DURATION_S[min(SIZES, key=lambda size: (abs(size - ranks), size))]
    dur = duration_s if duration_s is not None else _log_uniform(r, lo, hi)
    if max_duration_s is not None:
        dur = min(dur, max_duration_s)
    dur = round(dur, 1)
    big = ranks >= 2048  # the lighter workload of the suites' big jobs: their steps stay seconds long
    w: dict[str, Any] = {
        "microbatches": 2 if big else r.choice((1, 2, 4, 8, 16)),
        "layers": 1 if big else r.choice((1, 2, 3, 4)),
        "layer_ms": round(r.uniform(1.5, 12.0) * (2 if big else 1), 2),
        "hidden": r.choice((1024, 2048, 4096, 8192)),
        "seq_parallel": r.random() < 0.3,
        "dp_buckets": r.choice((2, 4, 8)),
    }
    if shape == "dp":
        w["dp_buckets"] = 1
    if tp == 1:
        w["seq_parallel"] = False
    if pp > 1:  # a deep pipeline of many micro-batches is a minute a step
        w["microbatches"] = min(w["microbatches"], max(1, 256 // pp))
    if ep > 1:
        w["moe_every"] = r.choice((1, 1, 2)) if w["layers"] >= 2 else 1
        w["topk"] = r.choice((1, 2, 2, 4))
    has = {k: r.random() < p for k, p in NOISE_CHANCE.items()}
    if has["pauses"]:  # GC, data loader: a rank now and then starts its step late
        w["pause_rate"] = round(_log_uniform(r, 0.002, 0.05), 4)
        w["pause_ms"] = round(_log_uniform(r, 20.0, 1500.0), 1)
    if has["eval"]:
        w["eval_every"] = r.randint(20, 400)
        w["eval_steps"] = r.randint(1, 20)
    faults: list[dict[str, Any]] = []
    if has["checkpoint"]:  # recurring, from any rank; the first after a minute or more
        every = round(r.uniform(300.0, 2400.0), 1)
        first = _when(r, 60.0, dur - min(every, dur / 2), dur)
        # 2-40 s: below barrier_hang_min_s (45 s), beyond which a barrier wait is reported as H1 by design
        faults.append({"kind": "checkpoint", "onset_s": first, "every_s": every,
                       "pause_s": round(_log_uniform(r, 2.0, 40.0), 1), "writer_rank": r.randrange(ranks)})
    if has["restart"]:
        for _ in range(r.randint(1, 3)):
            faults.append({"kind": "restart", "onset_s": _when(r, 120.0, 60.0, dur),
                           "down_s": round(_log_uniform(r, 5.0, 180.0), 1)})
    if has["recreate"]:
        fams = [f for f, n in (("tp", tp), ("pp", pp), ("dp", dp)) if n > 1]
        for _ in range(r.randint(1, 3)):
            faults.append({"kind": "recreate", "onset_s": _when(r, 60.0, 30.0, dur),
                           "family": r.choice(fams)})
    if has["transient"]:  # one rank delayed once, up to several seconds; one every 2 to 20 minutes
        for _ in range(max(1, round(dur / r.uniform(120.0, 1200.0)))):
            faults.append({"kind": "transient", "rank": r.randrange(ranks), "onset_s": _when(r, 30.0, 10.0, dur),
                           "delay_s": round(_log_uniform(r, 0.02, 5.0), 3)})
    faults.sort(key=lambda f: f["onset_s"])
    sc = {
        "id": f"fa-{seed}-{index:04d}" + (f"-{shape}" if shape != "3d" else ""),
        "seed": r.randrange(1, 1_000_000),
        "ranks": ranks,
        "gpus_per_node": gpn,
        "layout": {"tp": tp, "pp": pp, "dp": dp, **({"ep": ep} if ep > 1 else {})},
        "channels": r.choice((1, 2, 4, 8, 16, 32, 64)),
        "duration_s": dur,
        "clock_skew_s": round(r.uniform(0.0, 15.0), 2) if has["skew"] else 0.0,
        "clock_drift_ppm": round(r.uniform(0.0, 300.0), 1) if has["drift"] else 0.0,
        "jitter": round(r.uniform(0.005, 0.12), 3),  # wider than the held-out 0.005-0.1
        "workload": w,
        "faults": faults,
        "expect": [],
    }
    Scenario.from_dict(sc)  # every drawn job must validate
    return sc


def add_late_fault(job: Mapping[str, Any], index: int, seed: int) -> dict[str, Any]:
    """The same job with one fault of class ``FAULT_KINDS[index % 6]`` on a random rank (its link
    for H3, S2, S3), starting in the last fifth of the job (``LATE_SHARE``). Restarts and recreated
    communicators from a minute before the onset on are dropped: they would end the fault."""
    r = random.Random(seed * 7_000_003 + index)
    sc = json.loads(json.dumps(job))
    dur = float(sc["duration_s"])
    onset = round(dur * r.uniform(*LATE_SHARE), 1)
    sc["duration_s"] = max(dur, round(onset + LATE_TAIL_S, 1))
    sc["faults"] = [f for f in sc["faults"] if f["kind"] not in ("restart", "recreate") or f["onset_s"] < onset - 60]
    kind = FAULT_KINDS[index % len(FAULT_KINDS)]
    maker = MS.Maker(seed * 7_000_003 + index, check=False, profile=MS.WIDE)  # the held-out ranges
    rank = r.randrange(sc["ranks"])
    sc["faults"].append(maker.fault(sc, kind, rank, onset))
    sc["expect"] = [{"kind": kind, "rank": rank}]
    sc["id"] = sc["id"] + f"-{kind}"
    Scenario.from_dict(sc)
    return sc


def noise_windows(sc: Scenario) -> dict[str, list[tuple[float, float]]]:
    """When each noise kind acts in the job, in simulated seconds: the whole job for the kinds that
    are a property of it, each event's span for checkpoints, restarts, re-creations and transients."""
    w = sc.workload
    whole = [(0.0, sc.duration_s)]
    out: dict[str, list[tuple[float, float]]] = {"jitter": whole} if sc.jitter > 0 else {}
    if w is not None and w.pause_rate > 0:
        out["pauses"] = whole
    if w is not None and w.eval_every:
        out["eval"] = whole
    if sc.clock_skew_s > 0:
        out["skew"] = whole
    if sc.clock_drift_ppm > 0:
        out["drift"] = whole
    for f in sc.faults:
        if f.kind == "checkpoint":
            t = f.onset_s
            while t < sc.duration_s:
                out.setdefault("checkpoint", []).append((t, t + f.pause_s))
                if f.every_s is None:
                    break
                t += f.every_s
        elif f.kind == "restart":
            out.setdefault("restart", []).append((f.onset_s, f.onset_s + f.down_s))
        elif f.kind == "recreate":
            out.setdefault("recreate", []).append((f.onset_s, f.onset_s))
        elif f.kind == "transient":
            out.setdefault("transient", []).append((f.onset_s, f.onset_s + f.delay_s))
    return out


def attribute(v: Verdict, windows: Mapping[str, Sequence[tuple[float, float]]]) -> list[str]:
    """The noise kinds active around verdict ``v``'s onset: from ``ATTRIBUTE_BEFORE_S`` before it
    to its detection (the analyzer's clock is the simulated one, so the times compare directly)."""
    lo, hi = v.onset_time - ATTRIBUTE_BEFORE_S, v.detected_time
    return [k for k in NOISE_KINDS if any(a <= hi and b >= lo for a, b in windows.get(k, ()))]


# --------------------------------------------------------------------------------------------
# counting (pure)
# --------------------------------------------------------------------------------------------
def false_alarms(verdicts: Sequence[Verdict], before: float = math.inf) -> list[Verdict]:
    """Every OPEN verdict detected before ``before`` (a healthy job: all of them) is one false alarm."""
    return [v for v in verdicts if v.state == VerdictState.OPEN and v.detected_time < before]


def poisson_upper(k: int, conf: float = 0.95) -> float:
    """Exact two-sided upper bound of a Poisson mean after ``k`` events: the mean at which seeing
    ``k`` or fewer has probability (1 - conf) / 2, i.e. chi2.ppf(1 - (1 - conf) / 2, 2k + 2) / 2
    (bisection on the Poisson distribution function, so scipy is not needed)."""
    tail = (1.0 - conf) / 2.0

    def cdf(lam: float) -> float:
        term = total = math.exp(-lam)
        for i in range(1, k + 1):
            term *= lam / i
            total += term
        return total

    lo, hi = 0.0, max(10.0, 4.0 * (k + 1))
    while cdf(hi) > tail:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if cdf(mid) > tail:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def rate_row(k: int, hours: float) -> dict[str, Any]:
    """``k`` false alarms in ``hours`` job-hours: the rate and its 95 % upper bound per job-day."""
    days = hours / 24.0
    return {"false_alarms": k, "job_hours": round(hours, 3),
            "per_job_day": None if days <= 0 else k / days,
            "upper95_per_job_day": None if days <= 0 else poisson_upper(k) / days}


# --------------------------------------------------------------------------------------------
# running one job (streaming)
# --------------------------------------------------------------------------------------------
@dataclass
class JobResult:
    """What one played job gives back (plain data: it crosses process boundaries)."""

    index: int
    scenario: dict[str, Any]
    wall_s: float
    batches: int
    records: int
    sim_s: float  # simulated seconds actually played (the last batch's arrival)
    maxrss_mb: float
    verdicts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def job_hours(self) -> float:
        return float(self.scenario["duration_s"]) / 3600.0


def _counted(batches: Iterator[tuple[float, KernelBatch]], tally: list[float]) -> Iterator[tuple[float, KernelBatch]]:
    """Pass the simulator's batches on as they come, counting them (tally: batches, records, last t)."""
    for t, b in batches:
        tally[0] += 1
        tally[1] += b.n
        tally[2] = t
        yield t, b


def play(index: int, raw: Mapping[str, Any], settings: AnalyzerSettings | None = None) -> JobResult:
    """simulate -> analyze_batches with an evaluation every simulated second, as the worker does;
    batches are consumed as the simulator yields them, so memory stays that of the analyzer's state."""
    sc = Scenario.from_dict(raw)
    tally = [0.0, 0.0, 0.0]
    t0 = time.perf_counter()
    verdicts = analyze_batches(_counted(simulate(sc), tally), settings=settings or AnalyzerSettings(), tick_s=1.0)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # kB on Linux
    return JobResult(index, dict(raw), wall, int(tally[0]), int(tally[1]), tally[2], rss,
                     [v.to_dict() for v in verdicts])


def _play_item(item: tuple[int, dict[str, Any]]) -> JobResult:
    return play(*item)


# --------------------------------------------------------------------------------------------
# reports (pure)
# --------------------------------------------------------------------------------------------
def _onset(sc: Scenario) -> float:
    """The injected fault's onset (late-fault jobs); healthy jobs: never."""
    return min((f.onset_s for f in sc.faults if not f.is_benign), default=math.inf)


def summarize(results: Sequence[JobResult]) -> dict[str, Any]:
    """Job-hours, false alarms and their bounds overall, by class and by noise kind.

    Healthy time of a late-fault job (before its fault) counts too: verdicts opened then are
    false alarms, and its hours up to the onset are exposure.
    """
    hours = 0.0
    fa: list[tuple[Verdict, list[str], str]] = []  # verdict, noise kinds charged, job id
    exposure: Counter[str] = Counter()  # noise kind -> job-hours of jobs that have it
    events: Counter[str] = Counter()
    jobs_with: Counter[str] = Counter()
    for res in results:
        sc = Scenario.from_dict(res.scenario)
        onset = _onset(sc)
        healthy_h = min(sc.duration_s, onset) / 3600.0
        hours += healthy_h
        win = noise_windows(sc)
        for k, spans in win.items():
            exposure[k] += healthy_h
            jobs_with[k] += 1
            events[k] += 0 if k in ALWAYS_ON else sum(1 for a, _ in spans if a < onset)
        for v in false_alarms([Verdict.from_dict(d) for d in res.verdicts], before=onset):
            fa.append((v, attribute(v, win), sc.id))
    by_class = Counter(v.kind.value for v, _, _ in fa)
    by_noise = Counter(k for _, ks, _ in fa for k in ks)
    unexplained = sum(1 for _, ks, _ in fa if not set(ks) - set(ALWAYS_ON))
    return {
        "jobs": len(results),
        "overall": rate_row(len(fa), hours),
        "by_class": {k: by_class[k] for k in FAULT_KINDS},
        "by_noise": {k: {**rate_row(by_noise[k], exposure[k]), "jobs": jobs_with[k],
                         "events": events[k] if k not in ALWAYS_ON else None} for k in NOISE_KINDS},
        # charged to no event (only to what the whole job always has): the rules misread steady noise
        "false_alarms_without_event": unexplained,
        "false_alarms_list": [{"job": job, "noise": ks, **v.to_dict()} for v, ks, job in fa],
    }


def late_fault_report(results: Sequence[JobResult]) -> dict[str, Any]:
    """``ccld bench accuracy``'s scoring of the late-fault jobs (recall, rank, class, TTV)."""
    scs = [Scenario.from_dict(r.scenario) for r in results]
    verdicts = {r.scenario["id"]: [Verdict.from_dict(d) for d in r.verdicts] for r in results}
    rep = score(scs, verdicts)
    rep.pop("scenarios")  # per-job rows are in the jobs list already
    return rep


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def _noise_of(raw: Mapping[str, Any]) -> str:
    sc = Scenario.from_dict(raw)
    win = noise_windows(sc)
    return ",".join(k if k in ALWAYS_ON else f"{k}x{len(win[k])}" for k in NOISE_KINDS if k in win and k != "jitter")


def run_jobs(items: Iterator[tuple[int, dict[str, Any]]], *, workers: int, stop: Callable[[], bool],
             on_result: Callable[[JobResult], None]) -> None:
    """Play jobs from ``items`` (lazily: only what is needed is drawn) until ``stop()`` says enough;
    jobs already running are finished and counted."""
    if workers <= 1:
        for item in items:
            if stop():
                return
            on_result(_play_item(item))
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        running: set[Future[JobResult]] = set()
        exhausted = False
        while True:
            while not exhausted and len(running) < workers and not stop():
                nxt = next(items, None)
                if nxt is None:
                    exhausted = True
                    break
                running.add(pool.submit(_play_item, nxt))
            if not running:
                return
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                on_result(fut.result())


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_summary(s: Mapping[str, Any]) -> None:
    o = s["overall"]
    print(f"\njobs {s['jobs']}, healthy job-hours {o['job_hours']:.2f} ({o['job_hours'] / 24:.3f} job-days), "
          f"false alarms {o['false_alarms']}, rate {_fmt(o['per_job_day'])} per job-day, "
          f"95 % upper bound {_fmt(o['upper95_per_job_day'])} per job-day")
    print("by class: " + ", ".join(f"{k} {n}" for k, n in s["by_class"].items()))
    print(f"{'noise':11} {'jobs':>5} {'events':>7} {'job-hours':>10} {'false al.':>9} {'bound/job-day':>13}")
    for k, r in s["by_noise"].items():
        ev = "-" if r["events"] is None else str(r["events"])
        print(f"{k:11} {r['jobs']:5d} {ev:>7} {r['job_hours']:10.2f} {r['false_alarms']:9d} "
              f"{_fmt(r['upper95_per_job_day']):>13}")


def results_of(report: Mapping[str, Any]) -> list[JobResult]:
    """The jobs of a written report, as ``play`` gave them back."""
    return [JobResult(int(j["index"]), dict(j["scenario"]), float(j["wall_s"]), int(j["batches"]),
                      int(j["records"]),
                      # reports written before sim_s was kept: the job's length, what a finished job played
                      float(j.get("sim_s", j["scenario"]["duration_s"])), float(j["maxrss_mb"]),
                      list(j["verdicts"])) for j in report["jobs"]]


def _commit() -> str:
    """The checkout's commit, "+dirty" when its tracked files differ from it: which analyzer a report is of."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def merge_reports(paths: Sequence[Path], out: str | None, replayed: Sequence[Path] = ()) -> int:
    """One summary over several runs of the same draw (a run continued with ``--start``); a job played twice,
    or reports of different draws, are refused rather than counted twice or mixed.

    ``replayed`` reports hold jobs played again (on a newer analyzer, with ``--start i --jobs 1``): each of
    their jobs replaces the same job of ``paths``, which must hold it; the merged report lists them."""
    reports = [json.loads(p.read_text()) for p in paths]
    replays = [json.loads(p.read_text()) for p in replayed]
    keys = {(r["seed"], r["late_faults"], r["max_ranks"], r["max_duration_s"], r.get("any_shape", False))
            for r in reports + replays}
    if len(keys) > 1:
        raise SystemExit(f"the reports are of different draws (seed, late faults, max ranks, max duration, any "
                         f"shape): {keys}")
    seen = Counter(res.index for r in reports for res in results_of(r))
    if twice := sorted(i for i, n in seen.items() if n > 1):
        raise SystemExit(f"jobs played in more than one report: {twice}")
    again = Counter(int(j["index"]) for r in replays for j in r["jobs"])
    if twice := sorted(i for i, n in again.items() if n > 1):
        raise SystemExit(f"jobs replayed in more than one report: {twice}")
    if missing := sorted(set(again) - set(seen)):
        raise SystemExit(f"replayed jobs that no report played first: {missing}")
    jobs = [j for r in reports for j in r["jobs"] if int(j["index"]) not in again]
    jobs += [j | {"replayed_from": str(p)} for p, r in zip(replayed, replays, strict=True) for j in r["jobs"]]
    jobs.sort(key=lambda j: j["index"])
    results = results_of({"jobs": jobs})
    first = reports[0]
    merged = {k: first[k] for k in ("seed", "late_faults", "max_ranks", "max_duration_s", "analyzer", "tick_s")}
    merged["any_shape"] = first.get("any_shape", False)
    merged["wall_s"] = round(sum(float(r["wall_s"]) for r in reports + replays), 1)
    merged["merged_from"] = [str(p) for p in paths]
    if replayed:
        merged["replayed"] = {str(p): sorted(int(j["index"]) for j in r["jobs"]) for p, r in zip(replayed, replays,
                                                                                                   strict=True)}
    commits = sorted({str(r.get("commit", "unknown")) for r in reports + replays})
    merged["commits"] = commits
    merged["false_alarms"] = summarize(results)
    merged["jobs"] = jobs
    indexes = [r.index for r in results]
    print(f"{len(results)} jobs (indexes {indexes[0]}-{indexes[-1]}"
          f"{'' if indexes == list(range(indexes[0], indexes[-1] + 1)) else ', with gaps'})")
    print_summary(merged["false_alarms"])
    if out:
        Path(out).write_text(json.dumps(merged, indent=1, default=str) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seed", type=int, default=1, help="the draw (job i of seed s is always the same job)")
    ap.add_argument("--job-hours", type=float, default=48.0, help="stop once this many job-hours are played")
    ap.add_argument("--jobs", type=int, default=0, help="stop after this many jobs (0: no limit)")
    ap.add_argument("--max-wall-s", type=float, default=0.0, help="start no job after this many seconds (0: no limit)")
    ap.add_argument("--workers", type=int, default=1, help="processes (default 1)")
    ap.add_argument("--start", type=int, default=0, help="first job index of the draw")
    ap.add_argument("--only", type=int, default=None, help="play only job INDEX of the draw, verdicts in full")
    ap.add_argument("--max-ranks", type=int, default=None, help="leave out larger jobs (changes the draw)")
    ap.add_argument("--max-duration-s", type=float, default=None, help="cap each job's length (changes the draw)")
    ap.add_argument("--late-faults", action="store_true", help="one late fault per job; score recall and TTV")
    ap.add_argument("--any-shape", action="store_true",
                    help="every other job of any shape: pure data parallel, pipeline only, tensor only, MoE "
                         "(changes the draw)")
    ap.add_argument("--show", type=int, default=5, help="print this many false alarms in full (default 5)")
    ap.add_argument("--out", help="write the JSON report here (rewritten after every job)")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="REPORT",
                    help="play nothing: the summary of these reports' jobs together (runs of one draw continued "
                         "with --start), written to --out")
    ap.add_argument("--replayed", nargs="+", type=Path, default=[], metavar="REPORT",
                    help="with --merge: reports of jobs played again (on a newer analyzer); each replaces the same "
                         "job of the merged reports")
    args = ap.parse_args(argv)
    if args.replayed and not args.merge:
        ap.error("--replayed needs --merge")
    if args.merge:
        return merge_reports(args.merge, args.out, args.replayed)

    def job(i: int) -> dict[str, Any]:
        raw = draw_job(args.seed, i, max_ranks=args.max_ranks, max_duration_s=args.max_duration_s,
                       any_shape=args.any_shape)
        return add_late_fault(raw, i, args.seed) if args.late_faults else raw

    if args.only is not None:
        first, last = args.only, args.only + 1
    else:
        first, last = args.start, args.start + args.jobs if args.jobs else sys.maxsize
    items = ((i, job(i)) for i in range(first, last))
    commit = _commit()
    results: list[JobResult] = []
    t_start = time.perf_counter()
    shown = 0

    def report() -> dict[str, Any]:
        ordered = sorted(results, key=lambda r: r.index)
        out: dict[str, Any] = {"seed": args.seed, "late_faults": args.late_faults, "any_shape": args.any_shape,
                               "max_ranks": args.max_ranks,
                               "max_duration_s": args.max_duration_s, "analyzer": "AnalyzerSettings() defaults",
                               "commit": commit,
                               "tick_s": 1.0, "wall_s": round(time.perf_counter() - t_start, 1),
                               "false_alarms": summarize(ordered)}
        if args.late_faults:
            out["late_faults_score"] = late_fault_report(ordered)
        out["jobs"] = [{"index": r.index, "id": r.scenario["id"], "ranks": r.scenario["ranks"],
                        "job_hours": round(r.job_hours, 4), "wall_s": round(r.wall_s, 1), "sim_s": r.sim_s,
                        "batches": r.batches, "records": r.records, "maxrss_mb": round(r.maxrss_mb),
                        "scenario": r.scenario, "verdicts": r.verdicts} for r in ordered]
        return out

    def on_result(res: JobResult) -> None:
        nonlocal shown
        results.append(res)
        sc = Scenario.from_dict(res.scenario)
        onset = _onset(sc)
        vs = [Verdict.from_dict(d) for d in res.verdicts]
        fa = false_alarms(vs, before=onset)
        total_h = sum(min(r.scenario["duration_s"], _onset(Scenario.from_dict(r.scenario))) for r in results) / 3600
        extra = ""
        if args.late_faults:
            row = score([sc], {sc.id: vs})["scenarios"][0]["expectations"][0]
            extra = f" fault {row['kind']}@{row['rank']} {'found' if row['matched'] else 'MISSED'}" + (
                f" ttv {row['ttv_s']:.1f}s" if row["ttv_s"] is not None else "")
        print(f"[{res.index:4d}] {sc.ranks:5d} ranks {res.job_hours:6.2f} h sim  wall {res.wall_s:7.1f} s "
              f"({sc.duration_s / max(res.wall_s, 1e-9):5.1f}x)  verdicts {len(vs)} false alarms {len(fa)}{extra}"
              f"  rss {res.maxrss_mb:.0f} MB  [{_noise_of(res.scenario)}]  total {total_h:.2f} job-h "
              f"{time.perf_counter() - t_start:.0f} s", flush=True)
        for v in fa:
            if shown < args.show or args.only is not None:
                shown += 1
                print(f"  FALSE ALARM in {sc.id} (seed {args.seed}, job {res.index}; noise "
                      f"{attribute(v, noise_windows(sc))}):\n    {v.describe()}\n    onset {v.onset_time:.1f} s, "
                      f"detected {v.detected_time:.1f} s\n    scenario: {json.dumps(res.scenario)}", flush=True)
        if args.only is not None:
            for v in vs:
                print("  " + v.describe())
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report(), indent=1, default=str) + "\n")

    def stop() -> bool:
        hours = sum(r.job_hours for r in results)
        if args.only is None and args.job_hours > 0 and hours >= args.job_hours:
            return True
        return bool(args.max_wall_s) and time.perf_counter() - t_start >= args.max_wall_s

    try:
        run_jobs(items, workers=args.workers, stop=stop, on_result=on_result)
    except KeyboardInterrupt:
        print("interrupted: the report counts the jobs finished so far", flush=True)
    rep = report()
    print_summary(rep["false_alarms"])
    if args.late_faults:
        o = rep["late_faults_score"]["overall"]
        print(f"late faults: {o['expected']} jobs, recall {_fmt(o['recall'], '.3f')}, "
              f"rank {_fmt(o['rank_accuracy'], '.3f')}, class {_fmt(o['class_accuracy'], '.3f')}, "
              f"precision {_fmt(o['precision'], '.3f')}; TTV p50 "
              f"{_fmt(o['ttv_p50_s'], '.1f')} s, hang p95 {_fmt(o['hang_ttv_p95_s'], '.1f')} s, slow p95 "
              f"{_fmt(o['slow_ttv_p95_s'], '.1f')} s")
        for k, c in rep["late_faults_score"]["per_class"].items():
            print(f"  {k}: {c['matched']}/{c['expected']} ttv p50 {_fmt(c['ttv_p50_s'], '.1f')} s "
                  f"p95 {_fmt(c['ttv_p95_s'], '.1f')} s")
    print(f"wall {rep['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
