"""A fleet over a simulated day: does the host tracker ask to drain exactly the bad machines, and how soon?

    python benchmarks/fleet.py [--seed 1] [--jobs 64] [--hosts 64] [--noise 0.25] [--workers 2] [--out F.json]

64 hosts of 8 GPUs (``gpu-h00`` ...). ``--jobs`` Megatron-style jobs of 8-256 ranks with every kind of
healthy noise (``false_alarms.draw_job``: checkpoints, restarts, re-created communicators, transients,
pauses, evaluation phases, skewed and drifting clocks), each on hosts drawn at random (the scenario's
``hosts``), starting at a random time of the day. Three hosts are bad: one has a GPU 1.3-2x slower in
compute (S1 on its rank in every job placed there), one a NIC that flaps to 30-60 % of its bandwidth (S2 on
the host's interface, on for 20-60 s, off for 10-30 s, in every job that reaches other nodes from it), one a
GPU that hangs now and then (H1 in 70 % of the jobs placed there). A quarter of the jobs (``--noise``) also get one
fault of any class on a random rank late in the job (``false_alarms.add_late_fault``): one-off faults, on good hosts
almost always. Every job is analyzed as the worker would (``ccld bench``'s in-process path, its end played
on), its verdicts moved to its start in the day and fed, in time order, to ``sinks.fleet.HostTracker``.

Reported, per rule (the default first, then others tried on the same verdicts): bad hosts flagged, good
hosts ever flagged, and for each bad host the hours and the jobs placed on it before it became a drain
candidate. The injected faults are used for scoring only; the tracker sees verdicts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ccld.producers.simulator.scenario import Scenario
from ccld.records import Verdict
from ccld.sinks.fleet import FleetSettings, HostTracker
from ccld.stack.bench import run_suite

DAY_S = 86_400.0
GPUS = 8
#: the rules tried on the same verdicts: (min incidents, min jobs); the default first
RULES = ((FleetSettings().min_incidents, FleetSettings().min_jobs), (2, 2), (3, 2), (3, 3), (4, 3), (5, 2))
BAD = ("slow-gpu", "flaky-nic", "hanging-gpu")
#: windows tried (days); the default first
WINDOWS_D = (FleetSettings().window_s / DAY_S, 2.0, 7.0)


def _false_alarms() -> ModuleType:
    path = Path(__file__).with_name("false_alarms.py")
    spec = importlib.util.spec_from_file_location("ccld_false_alarms", path)
    if spec is None or spec.loader is None:  # pragma: no cover - the file ships with the repository
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)
    spec.loader.exec_module(mod)
    return mod


def host_names(n: int) -> list[str]:
    return [f"gpu-h{i:02d}" for i in range(n)]


def draw_fleet(seed: int, jobs: int, hosts: int, max_duration_s: float, noise: float = 0.25,
               days: int = 1) -> dict[str, Any]:
    """The days: bad hosts, and each job's scenario and start (pure: the same seed gives the same days);
    ``jobs`` a day."""
    fa = _false_alarms()
    r = random.Random(seed)
    names = host_names(hosts)
    bad = dict(zip(BAD, r.sample(names, len(BAD)), strict=True))
    gpu = {role: r.randrange(GPUS) for role in BAD}  # the bad GPU's index on its host
    out = []
    for i in range(jobs * days):
        jr = random.Random(seed * 1_000_003 + i)
        sc = fa.draw_job(seed, i, max_ranks=256, max_duration_s=max_duration_s)
        if jr.random() < noise:
            sc = fa.add_late_fault(sc, i, seed)
        dur, ranks, gpn = float(sc["duration_s"]), int(sc["ranks"]), int(sc["gpus_per_node"])
        nodes = (ranks - 1) // gpn + 1
        if nodes > len(names):
            raise SystemExit(f"job {i} needs {nodes} hosts of {gpn} GPUs; the fleet has {len(names)} (--hosts)")
        placed = jr.sample(names, nodes)
        sc["hosts"] = placed
        sc["id"] = f"fleet-{seed}-{i:03d}"
        injected = []
        for role, host in bad.items():
            if host not in placed:
                continue
            node = placed.index(host)
            rank = node * gpn + gpu[role]
            if role == "slow-gpu" and rank < ranks:
                sc["faults"].append({"kind": "S1", "rank": rank, "onset_s": round(jr.uniform(5.0, dur / 3), 1),
                                     "factor": round(jr.uniform(1.3, 2.0), 2)})
            elif role == "flaky-nic" and nodes > 1:
                sc["faults"].append({"kind": "S2", "nic": host, "onset_s": round(jr.uniform(5.0, dur / 3), 1),
                                     "factor": round(jr.uniform(0.3, 0.6), 2), "on_s": round(jr.uniform(20.0, 60.0), 1),
                                     "off_s": round(jr.uniform(10.0, 30.0), 1)})
            elif role == "hanging-gpu" and rank < ranks and jr.random() < 0.7:
                sc["faults"].append({"kind": "H1", "rank": rank,
                                     "onset_s": round(jr.uniform(dur / 4, dur / 2), 1)})
            else:
                continue
            injected.append(role)
        # a fault that ends the job's communication early cuts the noise after it short: keep only the
        # restarts and re-creations before the first injected fault (as add_late_fault does)
        if injected:
            first = min(f["onset_s"] for f in sc["faults"] if f["kind"] in ("S1", "S2", "H1"))
            sc["faults"] = [f for f in sc["faults"] if f["kind"] not in ("restart", "recreate")
                            or f["onset_s"] < first - 60]
        sc["faults"].sort(key=lambda f: f["onset_s"])
        Scenario.from_dict(sc)
        out.append({"scenario": sc, "start_s": round(jr.uniform(0.0, days * DAY_S - dur), 1), "bad_roles": injected,
                    "hosts": placed})
    return {"seed": seed, "days": days, "hosts": names, "bad": bad, "bad_gpu": gpu, "jobs": out}


def events_of(day: Mapping[str, Any], verdicts: Mapping[str, Sequence[Verdict]]) -> list[list[Any]]:
    """Every verdict as the tracker takes it, its time moved into the day: [time, incident, job, class, hosts]."""
    starts = {j["scenario"]["id"]: float(j["start_s"]) for j in day["jobs"]}
    return [[round(starts[sid] + v.detected_time, 1), v.incident_id, sid, v.kind.value, list(v.root_cause_hosts)]
            for sid, vs in verdicts.items() for v in vs]


def timeline(bad: Mapping[str, str], placed: Sequence[tuple[float, Sequence[str]]], events: Sequence[Sequence[Any]],
             rule: tuple[int, int], window_s: float, horizon_s: float) -> dict[str, Any]:
    """Feed the events in time order; when each host first became a candidate under ``rule`` and ``window_s``,
    and how many jobs had been placed on it by then."""
    tracker = HostTracker(FleetSettings(min_incidents=rule[0], min_jobs=rule[1], window_s=window_s))
    flagged: dict[str, float] = {}
    for t, iid, job, kind, hosts in sorted(events, key=lambda e: e[0]):
        tracker.observe_claim(iid, job, kind, tuple(hosts), t)
        for h in tracker.standings(t):
            if h.candidate:
                flagged.setdefault(h.host, t)
    bad_hosts = set(bad.values())
    out: dict[str, Any] = {"rule": {"min_incidents": rule[0], "min_jobs": rule[1], "window_d": window_s / DAY_S},
                           "flagged_bad": sorted(bad_hosts & set(flagged)),
                           "flagged_good": sorted(set(flagged) - bad_hosts)}
    at = {h: round(t / 3600, 2) for h, t in flagged.items()}
    out["bad_hosts"] = {role: {"host": host, "flagged_h": at.get(host),
                               "jobs_placed_before": sum(1 for st, hs in placed if host in hs
                                                         and (host not in flagged or st <= flagged[host])),
                               "jobs_placed": sum(1 for _, hs in placed if host in hs)}
                        for role, host in bad.items()}  # fmt: skip
    out["recall"] = len(out["flagged_bad"]) / len(bad_hosts)
    out["precision"] = len(out["flagged_bad"]) / len(flagged) if flagged else None
    standings = tracker.standings(horizon_s, window_s=horizon_s)
    out["top"] = [h.to_dict() for h in standings[:6]]
    return out


def rescore(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every rule and window of ``RULES`` x ``WINDOWS_D`` on a report's events (no job analyzed again)."""
    placed = [(float(st), list(hs)) for st, hs in report["placements"]]
    horizon = report["days"] * DAY_S + 3600
    return [timeline(report["bad"], placed, report["events"], rule, w * DAY_S, horizon)
            for w in WINDOWS_D for rule in RULES]


def summary_line(res: Mapping[str, Any]) -> str:
    r = res["rule"]
    return (f"{r['min_incidents']} incidents of one part in {r['min_jobs']} jobs within {r['window_d']:g} d: bad "
            f"hosts flagged {len(res['flagged_bad'])}/{len(BAD)}, good hosts flagged {len(res['flagged_good'])}"
            + "".join(f"; {role} {b['host']} at {b['flagged_h']} h after {b['jobs_placed_before']} of "
                      f"{b['jobs_placed']} jobs" for role, b in res["bad_hosts"].items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=64, help="jobs a day")
    p.add_argument("--days", type=int, default=1)
    p.add_argument("--hosts", type=int, default=64)
    p.add_argument("--max-duration-s", type=float, default=240.0, help="each job's simulated length at most")
    p.add_argument("--noise", type=float, default=0.25, help="share of jobs with one fault on a random rank")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path)
    p.add_argument("--rescore", type=Path, nargs="+", metavar="REPORT",
                   help="try the rules again on these reports' events (no job analyzed again)")
    args = p.parse_args(argv)
    if args.rescore:
        for path in args.rescore:
            old = json.loads(path.read_text())
            print(f"{path} (seed {old['seed']}, {old['days']} d, noise {old['noise']}):")
            for res in rescore(old):
                print("  " + summary_line(res))
        return 0
    day = draw_fleet(args.seed, args.jobs, args.hosts, args.max_duration_s, args.noise, args.days)
    scenarios = [Scenario.from_dict(j["scenario"]) for j in day["jobs"]]
    t0 = time.perf_counter()

    def progress(i: int, sc: Scenario, vs: list[Verdict], wall: float) -> None:
        if i % 8 == 0 or i == len(scenarios):
            print(f"  {i} of {len(scenarios)} jobs analyzed ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
                  flush=True)

    verdicts = run_suite(scenarios, jobs=args.workers, progress=progress)
    opened = sum(1 for vs in verdicts.values() for v in vs if v.state.value == "open")
    report: dict[str, Any] = {
        "seed": args.seed, "days": args.days, "jobs_a_day": args.jobs, "hosts": args.hosts, "noise": args.noise,
        "bad": day["bad"], "job_hours": round(sum(sc.duration_s for sc in scenarios) / 3600, 1),
        "ranks": sum(sc.ranks for sc in scenarios), "incidents": opened,
        "faulted_jobs": sum(1 for j in day["jobs"] if j["bad_roles"]),
        "noise_jobs": sum(1 for j in day["jobs"] if j["scenario"]["expect"]),
        "wall_s": round(time.perf_counter() - t0, 1),
        # every verdict as the tracker takes it, and where each job ran: enough to try other rules later
        "events": events_of(day, verdicts), "placements": [[j["start_s"], j["hosts"]] for j in day["jobs"]],
    }  # fmt: skip
    report["rules"] = rescore(report)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    for res in report["rules"]:
        print(summary_line(res))
    default = report["rules"][0]
    return 0 if default["recall"] == 1.0 and not default["flagged_good"] else 1


if __name__ == "__main__":
    sys.exit(main())
