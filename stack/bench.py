"""``ccld bench accuracy``: run scenarios through simulator + analyzer and score the verdicts.

Scoring (pure functions, ``score``) follows issue 3. Updates of one ``incident_id`` are one
incident; an incident is judged by its latest OPEN/UPDATE verdict (kind, root-cause ranks).
- recall: expected root causes matched by a correct incident (kind equal, rank among its
  root-cause ranks) / all expected;
- precision: incidents that correctly match some expectation / all incidents;
- rank_accuracy: expected root causes whose rank is among some incident's root-cause ranks / all;
- class_accuracy: of those, the share for which such an incident also has the right kind;
- false_alarms: incidents in scenarios that expect none;
- time-to-verdict: the first ``detected_time`` at which the incident said the right kind and rank,
  minus the onset of the matching fault, in simulated seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ccld.cli import count_arg
from ccld.errors import CcldError
from ccld.producers.simulator.scenario import BENIGN_KINDS, HANG_KINDS, SLOW_KINDS, Expectation, Scenario
from ccld.records import Verdict, VerdictState
from ccld.settings import Settings

log = logging.getLogger(__name__)

KINDS = HANG_KINDS + SLOW_KINDS
Runner = Callable[[Scenario], list[Verdict]]
#: Every scenario is played on past its end with no record from any rank for this long (job time): what a
#: live worker sees when a job ends. Longer than ``incident_close_silent_s`` (60 s), so the silence closes
#: what is open, and than every hang threshold that a stall at the end could reach.
PAST_END_S = 120.0
#: A verdict this long after the scenario's last second came after its end: the last records arrive a
#: delivery interval late and are judged at the next tick.
AFTER_END_GRACE_S = 2.0


# --------------------------------------------------------------------------------------------
# scoring (pure)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Incident:
    """All verdicts of one incident id, judged by the latest non-resolved one."""

    incident_id: str
    verdicts: tuple[Verdict, ...]  # OPEN/UPDATE verdicts in detection order
    resolved: bool

    @property
    def final(self) -> Verdict:
        return self.verdicts[-1]

    def matches(self, e: Expectation) -> bool:
        return e.named_by(self.final)

    def names(self, rank: int) -> bool:
        return rank in self.final.root_cause_ranks

    def first_correct_time(self, e: Expectation) -> float:
        return min(v.detected_time for v in self.verdicts if e.named_by(v))


def incidents(verdicts: Iterable[Verdict]) -> list[Incident]:
    """Group verdicts by incident id (a RESOLVED-only incident carries no claim and is dropped)."""
    groups: dict[str, list[Verdict]] = {}
    resolved: set[str] = set()
    for v in verdicts:
        if v.state == VerdictState.RESOLVED:
            resolved.add(v.incident_id)
        else:
            groups.setdefault(v.incident_id, []).append(v)
    return [
        Incident(iid, tuple(sorted(vs, key=lambda v: v.detected_time)), iid in resolved)
        for iid, vs in groups.items()
    ]


def onset_of(sc: Scenario, e: Expectation) -> float:
    """Onset of the fault behind an expectation (same kind and rank, else same kind, else earliest)."""
    faults = [f for f in sc.faults if not f.is_benign]
    for pick in (
        [f for f in faults if f.kind == e.kind and f.rank == e.rank],
        [f for f in faults if f.kind == e.kind],
        faults,
    ):
        if pick:
            return min(f.onset_s for f in pick)
    return 0.0


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    # nearest-rank percentile: the reported p95 is a time some verdict really took
    return xs[max(0, min(len(xs) - 1, math.ceil(q / 100 * len(xs)) - 1))]


def _ratio(num: int, den: int) -> float | None:
    return None if den == 0 else num / den


def score_scenario(sc: Scenario, verdicts: Sequence[Verdict]) -> dict[str, Any]:
    """Per-scenario judgement: which expectation each incident matched, the TTVs, ok or not."""
    incs = incidents(verdicts)
    exp_rows = []
    matched_incidents: set[str] = set()
    for e in sc.expect:
        correct = [i for i in incs if i.matches(e)]
        named = [i for i in incs if i.names(e.rank)]
        predicted = (correct or named)[0].final.kind.value if (correct or named) else None
        ttv = min(i.first_correct_time(e) for i in correct) - onset_of(sc, e) if correct else None
        matched_incidents.update(i.incident_id for i in correct)
        exp_rows.append({"kind": e.kind, "rank": e.rank, "matched": bool(correct), "rank_found": bool(named),
                         "predicted": predicted, "ttv_s": ttv,
                         # one fault, one incident: more is a page too many (a flapping link re-opened)
                         "incidents": len(correct)})
    stray = [i for i in incs if i.incident_id not in matched_incidents]
    # what the silence after the job's end brought: a new incident, or a claim changed (kind, roots)
    after = after_end(verdicts, sc.duration_s + AFTER_END_GRACE_S)
    ok = all(r["matched"] for r in exp_rows) and not stray and not after
    return {
        "id": sc.id,
        "ranks": sc.ranks,
        "expected": [e.to_dict() for e in sc.expect],
        "benign": sorted({f.kind for f in sc.faults if f.kind in BENIGN_KINDS}),
        "verdicts": [{**i.final.to_dict(), "updates": len(i.verdicts), "resolved": i.resolved} for i in incs],
        "expectations": exp_rows,
        "false_alarms": len(incs) if sc.is_healthy else 0,
        "stray": [i.final.kind.value for i in stray],
        "after_end": [f"{v.state.value} {v.kind.value}@{'/'.join(map(str, v.root_cause_ranks))}" for v in after],
        "ok": ok,
    }


def after_end(verdicts: Iterable[Verdict], end: float) -> list[Verdict]:
    """The verdicts detected after ``end`` that say something new: an OPEN, or an UPDATE whose kind or
    root ranks differ from its incident's claim before (closing and resolving are what the end should do)."""
    claim: dict[str, tuple[str, tuple[int, ...]]] = {}
    out = []
    for v in sorted(verdicts, key=lambda v: v.detected_time):
        if v.state not in (VerdictState.OPEN, VerdictState.UPDATE):
            continue
        now = (v.kind.value, tuple(v.root_cause_ranks))
        if v.detected_time > end and (v.state == VerdictState.OPEN or claim.get(v.incident_id) != now):
            out.append(v)
        claim[v.incident_id] = now
    return out


def score(scenarios: Sequence[Scenario], verdicts_by_scenario: Mapping[str, Sequence[Verdict]]) -> dict[str, Any]:
    """The whole report: overall metrics, per class, per scenario, and the confusion counts."""
    rows = [score_scenario(sc, verdicts_by_scenario.get(sc.id, ())) for sc in scenarios]
    exps = [e for r in rows for e in r["expectations"]]
    n_inc = sum(len(r["verdicts"]) for r in rows)
    n_correct_inc = n_inc - sum(len(r["stray"]) for r in rows)
    found = [e for e in exps if e["rank_found"]]
    ttv = [e["ttv_s"] for e in exps if e["ttv_s"] is not None]
    ttv_h = [e["ttv_s"] for e in exps if e["ttv_s"] is not None and e["kind"] in HANG_KINDS]
    ttv_s = [e["ttv_s"] for e in exps if e["ttv_s"] is not None and e["kind"] in SLOW_KINDS]
    overall = {
        "scenarios": len(rows),
        "ok": sum(r["ok"] for r in rows),
        "expected": len(exps),
        "incidents": n_inc,
        "precision": _ratio(n_correct_inc, n_inc),
        "recall": _ratio(sum(e["matched"] for e in exps), len(exps)),
        "rank_accuracy": _ratio(len(found), len(exps)),
        "class_accuracy": _ratio(sum(e["predicted"] == e["kind"] for e in found), len(found)),
        "false_alarms": sum(r["false_alarms"] for r in rows),
        # new incidents or changed claims in the silence after the jobs' ends (PAST_END_S)
        "after_end": sum(len(r["after_end"]) for r in rows),
        # incidents per expected fault it matched: 1 is ideal; "extra" counts every incident beyond the first
        "incidents_per_fault_mean": _ratio(sum(e["incidents"] for e in exps if e["matched"]),
                                           sum(1 for e in exps if e["matched"])),
        "incidents_per_fault_max": max((e["incidents"] for e in exps), default=0),
        "extra_incidents": sum(max(0, e["incidents"] - 1) for e in exps),
        "ttv_p50_s": _pct(ttv, 50),
        "ttv_p95_s": _pct(ttv, 95),
        "hang_ttv_p50_s": _pct(ttv_h, 50),
        "hang_ttv_p95_s": _pct(ttv_h, 95),
        "slow_ttv_p50_s": _pct(ttv_s, 50),
        "slow_ttv_p95_s": _pct(ttv_s, 95),
    }
    per_class = {}
    predicted_kinds = Counter(v["kind"] for r in rows for v in r["verdicts"])
    stray_kinds = Counter(k for r in rows for k in r["stray"])
    for k in KINDS:
        ek = [e for e in exps if e["kind"] == k]
        tk = [e["ttv_s"] for e in ek if e["ttv_s"] is not None]
        per_class[k] = {
            "expected": len(ek),
            "matched": sum(e["matched"] for e in ek),
            "recall": _ratio(sum(e["matched"] for e in ek), len(ek)),
            "incidents": predicted_kinds[k],
            "precision": _ratio(predicted_kinds[k] - stray_kinds[k], predicted_kinds[k]),
            "ttv_p50_s": _pct(tk, 50),
            "ttv_p95_s": _pct(tk, 95),
        }
    return {"overall": overall, "per_class": per_class, "confusion": confusion(rows), "scenarios": rows}


def confusion(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Rows: expected class, or ``none`` for an incident no expectation explains; columns: the
    class of the incident naming the expected rank, or ``missed``."""
    labels_r = [*KINDS, "none"]
    labels_c = [*KINDS, "missed"]
    m = [[0] * len(labels_c) for _ in labels_r]
    for r in rows:
        for e in r["expectations"]:
            m[labels_r.index(e["kind"])][labels_c.index(e["predicted"] or "missed")] += 1
        for k in r["stray"]:
            m[labels_r.index("none")][labels_c.index(k)] += 1
    return {"rows": labels_r, "cols": labels_c, "counts": m}


def plot_confusion(conf: Mapping[str, Any], path: Path) -> None:
    """Write the confusion matrix as a PNG (matplotlib, headless)."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = conf["counts"]
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    ax.imshow(np.log1p(np.asarray(counts, dtype=float)), cmap="Blues")  # log: one huge cell hides no other
    ax.set_xticks(range(len(conf["cols"])), conf["cols"])
    ax.set_yticks(range(len(conf["rows"])), conf["rows"])
    ax.set_xlabel("verdict naming the expected rank")
    ax.set_ylabel("expected root cause")
    top = math.log1p(max((max(row) for row in counts), default=0))
    for i, row in enumerate(counts):
        for j, v in enumerate(row):
            if v:
                ax.text(j, i, str(v), ha="center", va="center", color="white" if math.log1p(v) > top / 2 else "black")
    ax.set_title("CCL-D accuracy: expected class vs verdict")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------
def analyze_in_process(sc: Scenario, settings: Settings | None = None, past_end_s: float = PAST_END_S
                       ) -> list[Verdict]:
    """simulate -> analyze_batches, on the simulated clock, then ``past_end_s`` of silence (the job's
    end as a live worker sees it); the analyzer never sees ``expect``."""
    from ccld.producers.simulator.sim import simulate
    from ccld.streams.analysis.replay import analyze_batches

    analyzer = None if settings is None else settings.analyzer
    groups = 1 if settings is None else settings.analysis_groups
    return list(analyze_batches(simulate(sc), settings=analyzer, tick_s=1.0, groups=groups, past_end_s=past_end_s))


def _run_one(item: tuple[dict[str, Any], Settings | None, float]) -> tuple[str, list[dict[str, Any]], float]:
    raw, settings, past_end_s = item
    sc = Scenario.from_dict(raw)
    t0 = time.perf_counter()
    verdicts = analyze_in_process(sc, settings, past_end_s)
    return sc.id, [v.to_dict() for v in verdicts], time.perf_counter() - t0


def run_suite(
    scenarios: Sequence[Scenario], runner: Runner | None = None, *, settings: Settings | None = None, jobs: int = 1,
    progress: Callable[[int, Scenario, list[Verdict], float], None] | None = None, past_end_s: float = PAST_END_S,
) -> dict[str, list[Verdict]]:
    """Verdicts per scenario id. ``runner`` is the hook for other paths (``--through-kafka``:
    a callable ``run_through_kafka(scenario) -> list[Verdict]``); the default runs in process,
    on ``jobs`` processes when more than one."""
    out: dict[str, list[Verdict]] = {}
    by_id = {sc.id: sc for sc in scenarios}
    if runner is None and jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            items = [(sc.to_dict(), settings, past_end_s) for sc in scenarios]
            for i, (sid, vds, wall) in enumerate(pool.map(_run_one, items), 1):
                out[sid] = [Verdict.from_dict(v) for v in vds]
                if progress:
                    progress(i, by_id[sid], out[sid], wall)
        return out
    run = runner or (lambda sc: analyze_in_process(sc, settings, past_end_s))
    for i, sc in enumerate(scenarios, 1):
        t0 = time.perf_counter()
        out[sc.id] = run(sc)
        if progress:
            progress(i, sc, out[sc.id], time.perf_counter() - t0)
    return out


class _Shifted:
    """A batch sender that moves every timestamp ``offset_s`` later (see KafkaSuiteRunner)."""

    def __init__(self, producer: Any, offset_s: float) -> None:
        self.producer = producer
        self.offset_ms = int(round(offset_s * 1000))

    def send_batch(self, batch: Any, timestamp_ms: int | None = None) -> bool:
        ts = None if timestamp_ms is None else timestamp_ms + self.offset_ms
        return bool(self.producer.send_batch(batch, timestamp_ms=ts) is not False)


class KafkaSuiteRunner:
    """``--through-kafka``: every scenario through the real pipeline, one pipeline for the suite.

    The embedded broker (unless ``--bootstrap``) and a real Faust worker start once. Each scenario
    is published by the simulator's ``publish`` as job ``<scenario id>``; the worker's clock is
    the message timestamp and never goes back, so scenario k's simulated time is shifted to start
    after everything published before it, and the shift is taken off its verdicts again. After a
    scenario is flushed the runner waits until the worker's consumer group has committed every
    message sent, then ``settle_s`` more for the last evaluation, and keeps that job's verdicts.
    ``past_end_s`` more is the silence after the job's end: the worker's clock of a job that sends
    nothing runs on with the wall clock, so it costs that much wall time per scenario.
    """

    GAP_S = 600.0  # simulated seconds between two scenarios on the worker's clock

    def __init__(self, settings: Settings, *, settle_s: float = 4.0, timeout_s: float = 300.0,
                 workers: int = 1, past_end_s: float = 0.0) -> None:
        tag = f"{int(time.time())}-{os.getpid()}"
        self.settings = settings.replace(worker_app_id=f"ccld-bench-{tag}", topic_prefix=f"ccld-bench-{tag}.",
                                         worker_commit_interval_s=0.5)
        self.settle_s = settle_s
        self.past_end_s = past_end_s
        self.timeout_s = timeout_s
        self.workers = workers
        self.offset_s = 0.0
        self.sent = 0
        self._verdicts: dict[str, list[Verdict]] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> KafkaSuiteRunner:
        from ccld.producers.kafka import MetricsProducer
        from ccld.stack.up import Pipeline

        logs = Path(tempfile.mkdtemp(prefix="ccld-bench-"))
        pipeline = self._stack.enter_context(
            Pipeline(self.settings, log_dir=logs).start(worker=True, sink=False, workers=self.workers))
        self.pipeline = pipeline
        self.settings = pipeline.settings
        log.info("through Kafka at %s (worker log in %s)", self.settings.bootstrap, logs)
        self.producer = self._stack.enter_context(
            MetricsProducer(self.settings, producer_id="ccld-bench", background=False)
        )
        self._listener = threading.Thread(target=self._listen, name="ccld-bench-verdicts", daemon=True)
        self._listener.start()
        self._stack.callback(self._done.set)
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._stack.close()

    def _listen(self) -> None:
        from ccld.streams.tail import iter_verdicts

        for v in iter_verdicts(self.settings, from_beginning=True, stop=self._done.is_set):
            with self._lock:
                self._verdicts.setdefault(v.job, []).append(v)

    def _committed(self) -> int:
        """Messages of the metrics topic the worker has processed and committed (all partitions)."""
        from confluent_kafka import Consumer, TopicPartition

        from ccld.security import kafka_config

        c = Consumer(kafka_config(self.settings, **{"group.id": self.settings.worker_app_id,
                                                    "enable.auto.commit": False}))
        try:
            topic = self.settings.metrics_topic
            parts = c.list_topics(topic, timeout=10).topics[topic].partitions
            got = c.committed([TopicPartition(topic, p) for p in parts], timeout=10)
            return sum(max(tp.offset, 0) for tp in got)
        finally:
            c.close()

    def __call__(self, sc: Scenario) -> list[Verdict]:
        from ccld.producers.simulator.publish import publish

        offset = self.offset_s
        self.offset_s += sc.duration_s + self.GAP_S
        publish(sc, _Shifted(self.producer, offset), job=sc.id)
        self.producer.flush(60.0)
        # messages, not batches: with analysis groups a batch goes out as one message per group
        self.sent = self.producer.stats["sent_batches"]
        deadline = time.monotonic() + self.timeout_s
        while self._committed() < self.sent:
            if self.pipeline.dead_children():
                raise CcldError(f"the worker died; see its log ({', '.join(self.pipeline.dead_children())})")
            if time.monotonic() > deadline:
                log.warning("%s: the worker did not catch up within %.0f s", sc.id, self.timeout_s)
                break
            time.sleep(0.5)
        time.sleep(self.settle_s + self.past_end_s)
        with self._lock:
            got = list(self._verdicts.get(sc.id, ()))
        return [dataclasses.replace(v, onset_time=v.onset_time - offset, detected_time=v.detected_time - offset)
                for v in got]


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="BENCH")
    sub.required = True
    acc = sub.add_parser("accuracy", help="precision/recall/TTV of the analyzer on a scenario suite")
    acc.add_argument("--scenarios", required=True, help="JSON-lines scenario file")
    acc.add_argument("--out", help="write the JSON report here (and a confusion-matrix PNG beside it)")
    acc.add_argument("--through-kafka", action="store_true", help="run through the real pipeline")
    acc.add_argument("--limit", type=int, default=0, help="only the first N scenarios")
    acc.add_argument("--id", action="append", default=[], dest="ids", help="only this scenario id (repeatable)")
    acc.add_argument("--jobs", type=int, default=1, help="processes for the in-process path (default 1)")
    acc.add_argument("--workers", type=count_arg, default=1, help="worker processes for --through-kafka (default 1)")
    acc.add_argument("--past-end-s", type=float, default=None,
                     help=f"seconds of silence played after each scenario's end (default {PAST_END_S:.0f} in "
                          "process; through Kafka they are wall time, default 0)")
    acc.add_argument("--groups", type=int, default=0,
                     help="spread each job over this many communicator groups (analysis_groups): through Kafka, "
                          "one metrics partition each; in process, shards and one job stage (default: the setting)")


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def print_table(report: Mapping[str, Any]) -> None:
    o = report["overall"]
    print(f"\n{'class':6} {'expected':>8} {'matched':>8} {'recall':>7} {'incid.':>7} {'prec.':>7} "
          f"{'ttv p50':>8} {'ttv p95':>8}")
    for k, c in report["per_class"].items():
        print(f"{k:6} {c['expected']:8d} {c['matched']:8d} {_fmt(c['recall']):>7} {c['incidents']:7d} "
              f"{_fmt(c['precision']):>7} {_fmt(c['ttv_p50_s'], '.1f'):>8} {_fmt(c['ttv_p95_s'], '.1f'):>8}")
    print(f"\nscenarios {o['scenarios']} (ok {o['ok']}), expected root causes {o['expected']}, incidents "
          f"{o['incidents']}")
    print(f"precision {_fmt(o['precision'])}  recall {_fmt(o['recall'])}  rank accuracy {_fmt(o['rank_accuracy'])}"
          f"  class accuracy {_fmt(o['class_accuracy'])}  false alarms {o['false_alarms']}  after the end "
          f"{o['after_end']}")
    print(f"incidents per fault: mean {_fmt(o['incidents_per_fault_mean'])}, max {o['incidents_per_fault_max']}, "
          f"extra incidents {o['extra_incidents']}")
    print(f"time to verdict: p50 {_fmt(o['ttv_p50_s'], '.1f')} s, p95 {_fmt(o['ttv_p95_s'], '.1f')} s; hang p95 "
          f"{_fmt(o['hang_ttv_p95_s'], '.1f')} s; slow p95 {_fmt(o['slow_ttv_p95_s'], '.1f')} s")


def main(args: argparse.Namespace, settings: Settings) -> int:
    from ccld.producers.simulator.scenario import load_scenarios

    scenarios = load_scenarios(args.scenarios)
    if args.ids:
        scenarios = [s for s in scenarios if s.id in set(args.ids)]
    if args.limit > 0:
        scenarios = scenarios[: args.limit]
    if not scenarios:
        raise CcldError(f"no scenarios to run from {args.scenarios}")
    total = len(scenarios)
    t_start = time.perf_counter()

    def progress(i: int, sc: Scenario, verdicts: list[Verdict], wall: float) -> None:
        row = score_scenario(sc, verdicts)
        exp = ",".join(f"{e.kind}@{e.rank}" for e in sc.expect) or "healthy"
        shown = [f"{v['kind']}@{'/'.join(map(str, v['root_cause_ranks']))}" for v in row["verdicts"]]
        got = ",".join(shown[:4]) + (f",+{len(shown) - 4} more" if len(shown) > 4 else "") or "-"
        ttvs = [e["ttv_s"] for e in row["expectations"] if e["ttv_s"] is not None]
        ttv = f" ttv {max(ttvs):.1f}s" if ttvs else ""
        late = f" after the end: {','.join(row['after_end'])}" if row["after_end"] else ""
        print(f"[{i:>{len(str(total))}}/{total}] {'ok  ' if row['ok'] else 'FAIL'} {sc.id:28} {sc.ranks:5d} ranks "
              f"expect {exp:18} got {got}{ttv}{late} ({wall:.2f}s)", flush=True)

    if args.groups:
        settings = settings.replace(analysis_groups=args.groups,
                                    metrics_partitions=max(settings.metrics_partitions, args.groups))
    if args.past_end_s is not None and args.past_end_s < 0:
        raise CcldError(f"--past-end-s must be >= 0, got {args.past_end_s}")
    if args.through_kafka:
        with KafkaSuiteRunner(settings, workers=args.workers, past_end_s=args.past_end_s or 0.0) as kafka:
            verdicts = run_suite(scenarios, kafka, settings=settings, progress=progress)
    else:
        past = PAST_END_S if args.past_end_s is None else args.past_end_s
        verdicts = run_suite(scenarios, None, settings=settings, jobs=max(1, args.jobs), progress=progress,
                             past_end_s=past)
    report = score(scenarios, verdicts)
    report["overall"]["wall_s"] = round(time.perf_counter() - t_start, 1)
    print_table(report)
    print(f"wall time {report['overall']['wall_s']} s")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, default=str) + "\n")
        png = out.with_suffix(".png")
        plot_confusion(report["confusion"], png)
        print(f"report: {out}; confusion matrix: {png}")
    return 0
