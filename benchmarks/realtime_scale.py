"""A real job's load in real time: R ranks at about 300 collectives/s per rank, through the embedded broker
and a real ``ccld worker``, with a fault half way.

Usage: python benchmarks/realtime_scale.py [--ranks 256 512 1024] [--duration-s 600] [--workers 1]
       [--groups 1] [--fault S1|H1] [--layer-ms 3.5] [--warmup-s 10] [--worker-cpu N]
       [--out benchmarks/results/realtime-scale.json]

Per R: the simulator's Megatron-style workload (tp 8, pp 4, dp R/32; ``--layer-ms`` sets the collective
rate, measured again from the records' op sequence numbers) is generated first, because it cannot be
generated faster than real time at thousands of ranks, into a file in the temporary directory (pickled
batches, read back in order: 10 minutes of 4,096 ranks are about 69 million records, more than this
machine's memory; ``--spool-dir`` puts the file elsewhere, and it is deleted after the run). What goes out is what the
producers send: the bounded record format (docs/wire-format.md, "Record format and its cost"), regrouped the way
rank processes send it (``--messages``): ``rank`` (the default, today's producers) one message per
rank and delivery interval holding all of its communicators; ``rank-comm`` one per rank, communicator
and interval (producers before they merged communicators); ``comm`` one per communicator holding all
its ranks (the simulator's own grouping, which no real producer sends); ``host`` one per host and
interval holding all its ranks (what a per-host aggregator would send; none exists yet). A forked producer process
replays the batches by their timestamps on the wall clock through ``MetricsProducer`` (encoding and
lz4 on the way, as a probe does), stamped with wall-clock time. The broker and the worker are
``ccld.stack.up.Pipeline``'s (the worker commits every 0.5 s, so the committed offset is a
fine-grained progress signal).

Every second the parent samples: the worker group's committed offset of each of the job's metrics
partitions; the consumer lag in seconds, i.e. how long ago the oldest message the workers have not
committed was due (from the replay schedule of each partition, the largest over the partitions:
Tansu's high watermark is wrong, see the platform notes, and is never read); how far the producer
itself is behind its schedule; CPU and RSS of the broker, every worker and the producer (from /proc).
Samples fall 0.1 s before each second's delivery burst, the top of the lag's saw-tooth. The worker
acks an event only once a snapshot (at the end of each burst, at most every 0.2 s, else every 1 s)
covers it, then commits (every 0.5 s), so the committed lag has a floor of about 1 s even on an
idle worker: ``kept_up`` is the issue's bound (lag < 2 s at every sample after ``--warmup-s`` until
the end of the job, and everything committed afterwards), ``sustained`` is capacity (lag p95 < 2 s,
not growing from the first to the last quarter, drained within 10 s).

A listener reads the verdicts topic; the time from the fault's onset (on the wall clock) to the
first verdict naming it is compared with the analyzer's own time-to-verdict on the same batches
in process (must be within +2 s; run only when the worker caught up, or with ``--always-inproc``).

``--workers N --groups G``: N worker processes (``Pipeline.start(workers=N)``) and the job spread over
G metrics partitions (``analysis_groups=G``, ``metrics_partitions=max(4, G)``). With G > 1 the schedule
is generated already split the way the producer splits (``regroup``, then each batch's
``KernelBatch.by_group(G)``, every part its own message at the same send time), so one scheduled
message is one Kafka message (the producer's own split is then a no-op), and each message goes to
``metrics_partition(job, comm, P, G)``. The messages/s in are counted after the split (the
multiplication factor of the split is in each row). Which worker reads which partition is the
consumer group's choice: two of the job's partitions may land on one worker.

``--worker-cpu N``: every thread of the workers on core N alone, the broker, the producer and this process
on the others (``os.sched_setaffinity``, as ``taskset`` would): what one worker core holds.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import multiprocessing
import os
import pickle
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ccld.cli import count_arg
from ccld.producers.simulator.scenario import Expectation, Scenario
from ccld.records import COMM_COLUMN, KernelBatch, Verdict

RESULTS = Path(__file__).resolve().parent / "results"
LAG_LIMIT_S = 2.0  # the issue's bound on consumer lag
TTV_SLACK_S = 2.0  # the verdict on the topic may come this much later than the in-process one
COMMIT_INTERVAL_S = 0.5


# --------------------------------------------------------------------------------------------
# pure parts (tests/unit/core/test_realtime_scale.py)
# --------------------------------------------------------------------------------------------
def job_scenario(ranks: int, duration_s: float, *, fault: str = "S1", layer_ms: float = 3.5,
                 seed: int = 7) -> Scenario:
    """The job: Megatron-style, tp 8 x pp 4 x dp R/32, 8 channels; one fault on one rank half way."""
    if ranks % 32:
        raise ValueError(f"--ranks must be a multiple of 32 (tp 8 x pp 4), got {ranks}")
    rank = ranks // 3 + 1  # some rank in the middle of the job, not on stage 0
    f: dict[str, Any] = {"kind": fault, "rank": rank, "onset_s": round(duration_s / 2, 1)}
    if fault == "S1":
        f["factor"] = 3.0
    return Scenario.from_dict({
        "id": f"realtime-{ranks}", "seed": seed, "ranks": ranks, "gpus_per_node": 8,
        "layout": {"tp": 8, "pp": 4, "dp": ranks // 32}, "channels": 8, "duration_s": duration_s,
        "clock_skew_s": 1.0, "jitter": 0.02, "clock_drift_ppm": 20.0,
        "workload": {"microbatches": 4, "layers": 2, "layer_ms": layer_ms, "hidden": 4096, "dp_buckets": 4},
        "faults": [f], "expect": [{"kind": fault, "rank": rank}],
    })


def collectives_per_rank_s(batches: Iterable[tuple[float, KernelBatch]], since_s: float,
                           until_s: float) -> dict[str, float]:
    """Collectives each rank issued per second, read back from the records delivered between
    ``since_s`` and ``until_s``.

    Every record carries its op's sequence number on its communicator (state records the newest
    op's), so the ops a rank has issued on a communicator are its highest sequence number + 1;
    summed over the rank's communicators, counted after the last batch delivered by either end,
    divided by the time between those two batches.
    Median, min and max over ranks.
    """
    newest: dict[tuple[int, int], int] = {}
    start: dict[int, int] | None = None
    t_start = t_end = 0.0  # delivery times of the newest batches counted at either end

    def totals() -> dict[int, int]:
        per_rank: dict[int, int] = defaultdict(int)
        for (_, r), top in newest.items():
            per_rank[r] += top + 1
        return per_rank

    for t, b in batches:
        if t > since_s and start is None:
            start, t_start = totals(), t_end
        if t > until_s:
            break
        t_end = t
        if not b.n:
            continue
        ranks = b.columns["rank"]
        seqs = b.columns["op_seq"]
        comms = b.columns[COMM_COLUMN]  # a batch may hold several communicators (``--messages rank``)
        for c, r in {(int(c), int(r)) for c, r in zip(comms.tolist(), ranks.tolist(), strict=True)}:
            key = (c, r)
            top = int(seqs[(ranks == r) & (comms == c)].max())
            if top > newest.get(key, -1):
                newest[key] = top
    end = totals()
    start = start or {}
    rates = [(n - start.get(r, 0)) / (t_end - t_start) for r, n in end.items()] if t_end > t_start else []
    if not rates:
        return {"median": 0.0, "min": 0.0, "max": 0.0}
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates)}


def due(times: Sequence[float], elapsed_s: float) -> int:
    """How many messages of the schedule (sorted send times, s from the start) are due at ``elapsed_s``."""
    return bisect.bisect_right(times, elapsed_s)


def behind_s(times: Sequence[float], done: int, elapsed_s: float) -> float:
    """How long ago the first message not ``done`` was due (0 when none is due yet).

    With ``done`` = the consumer group's committed offset this is the consumer lag in seconds; with
    ``done`` = messages the producer has sent, how far the producer is behind its schedule.
    """
    if done >= len(times) or times[done] > elapsed_s:
        return 0.0
    return elapsed_s - times[done]


def lag_over_partitions_s(schedules: Mapping[int, Sequence[float]], committed: Mapping[int, int],
                          elapsed_s: float) -> float:
    """The consumer lag of a job spread over several partitions: per partition ``p`` (its messages' send
    times, sorted, in ``schedules[p]``; the k-th is committed when ``committed[p]`` > k), how long ago
    its oldest message not committed was due; the largest over the partitions (0 when all is done)."""
    return max((behind_s(times, committed.get(p, 0), elapsed_s) for p, times in schedules.items()), default=0.0)


def split_groups(batches: Iterable[tuple[float, KernelBatch]], groups: int) -> Iterable[tuple[float, KernelBatch]]:
    """Each batch as the producer sends it with ``analysis_groups=groups``: one batch per communicator
    group (``KernelBatch.by_group``, in group order), all at the batch's own send time."""
    for t, b in batches:
        if groups <= 1:
            yield t, b
            continue
        for _, part in sorted(b.by_group(groups).items()):
            yield t, part


def assigned_partitions(log: str, topic: str) -> list[int]:
    """The partitions of ``topic`` in a worker log's last assignment (aiokafka's "Setting newly
    assigned partitions" line); [] when the log has none."""
    last = [line for line in log.splitlines() if "Setting newly assigned partitions" in line]
    if not last:
        return []
    return sorted({int(m) for m in re.findall(rf"topic='{re.escape(topic)}', partition=(\d+)", last[-1])})


def metrics_partitions_for(groups: int) -> int:
    """Partitions of the metrics topic in these runs: 4 (the default), more when the job needs more."""
    return max(4, groups)


def cpu_percent(samples: Sequence[tuple[float, float]]) -> list[float]:
    """Per interval between successive ``(wall s, cpu s)`` samples: CPU use in percent of one core."""
    out = []
    for (w0, c0), (w1, c1) in zip(samples, samples[1:], strict=False):
        if w1 > w0:
            out.append(100.0 * (c1 - c0) / (w1 - w0))
    return out


def first_correct(expect: Expectation, verdicts: Iterable[tuple[float, Verdict]]) -> tuple[float, Verdict] | None:
    """The earliest ``(wall time, verdict)`` whose verdict names the expected root cause."""
    hits = [(w, v) for w, v in verdicts if expect.named_by(v)]
    return min(hits, key=lambda x: x[0]) if hits else None


def summarize(run: Mapping[str, Any], *, warmup_s: float = 10.0, lag_limit_s: float = LAG_LIMIT_S,
              ttv_slack_s: float = TTV_SLACK_S) -> dict[str, Any]:
    """The per-R figures from one run's raw measurements.

    ``run``: ``duration_s``, ``messages``, ``records``, ``bytes``, ``samples`` (one dict a second:
    ``t`` s since the start of the replay, ``committed``, ``lag_s``, ``producer_behind_s``, and per role
    ``<role>_cpu_s`` / ``<role>_rss`` (bytes)), ``drain_s`` (after the last scheduled message until
    everything was committed; None: never), ``ttv_topic_s`` and ``ttv_inproc_s`` (None: no verdict).
    """
    dur = float(run["duration_s"])
    samples = list(run["samples"])
    steady = [s for s in samples if warmup_s <= s["t"] <= dur]
    lags = [s["lag_s"] for s in steady]
    prod = [s["producer_behind_s"] for s in steady]
    out: dict[str, Any] = {
        "ranks": run["ranks"], "duration_s": dur,
        "messages_per_s": run["messages"] / dur, "records_per_s": run["records"] / dur,
        "bytes_per_s": run["bytes"] / dur, "records_per_rank_s": run["records"] / dur / run["ranks"],
        "lag_max_s": max(lags, default=None), "lag_median_s": statistics.median(lags) if lags else None,
        "producer_behind_max_s": max(prod, default=None), "drain_s": run.get("drain_s"),
    }
    out["workers"], out["groups"] = int(run.get("workers", 1)), int(run.get("groups", 1))
    before = run.get("messages_before_split")
    out["messages_before_split_per_s"] = None if before is None else before / dur
    out["split_factor"] = None if not before else run["messages"] / before
    out["partitions"] = run.get("partitions")
    out["assigned_metrics_partitions"] = run.get("assigned_metrics_partitions")
    # every process sampled: broker, producer, worker, worker-2, ...
    roles = ["broker", "worker", "producer"]
    roles += sorted({k[:-len("_cpu_s")] for s in samples for k in s if k.endswith("_cpu_s")} - set(roles))
    for role in roles:
        cpu = cpu_percent([(s["t"], s[f"{role}_cpu_s"]) for s in steady if s.get(f"{role}_cpu_s") is not None])
        rss = [s[f"{role}_rss"] / 2**20 for s in steady if s.get(f"{role}_rss") is not None]
        out[f"{role}_cpu_pct_median"] = statistics.median(cpu) if cpu else None
        out[f"{role}_rss_mb_median"] = statistics.median(rss) if rss else None
        # RSS growth over the second half of the steady part: flat after warm-up is the goal
        half = rss[len(rss) // 2:]
        out[f"{role}_rss_mb_growth_2nd_half"] = (half[-1] - half[0]) if len(half) >= 2 else None
    out["worker_roles"] = [r for r in roles if r == "worker" or r.startswith("worker-")]
    drained = run.get("drain_s") is not None
    out["lag_p95_s"] = _quantile(lags, 0.95)
    # what the worker got through while the job ran (committed messages per second, steady part)
    ok = [x for x in steady if x.get("committed") is not None]
    span = ok[-1]["t"] - ok[0]["t"] if len(ok) >= 2 else 0.0
    out["worker_messages_per_s"] = (ok[-1]["committed"] - ok[0]["committed"]) / span if span > 0 else None
    out["worker_records_per_s"] = (None if out["worker_messages_per_s"] is None
                                   else out["worker_messages_per_s"] * run["records"] / max(run["messages"], 1))
    out["kept_up"] = bool(lags) and max(lags) < lag_limit_s and drained
    # keeps pace at all: lag mostly under the bound and not growing (last quarter vs first quarter)
    q = max(len(lags) // 4, 1)
    growth = statistics.median(lags[-q:]) - statistics.median(lags[:q]) if lags else None
    out["lag_growth_s"] = growth
    out["sustained"] = (bool(lags) and (out["lag_p95_s"] or 0.0) < lag_limit_s and growth is not None
                        and growth < 1.0 and run.get("drain_s") is not None and float(run["drain_s"]) < 10.0)
    loads = [x["load1"] for x in steady if x.get("load1") is not None]
    out["load1_median"] = statistics.median(loads) if loads else None
    share = run.get("inproc_analysis_cpu_share")
    out["inproc_analyzer_cpu_pct"] = None if share is None else 100.0 * share  # the analyzer alone, same batches
    ttv_t, ttv_i = run.get("ttv_topic_s"), run.get("ttv_inproc_s")
    out["ttv_topic_s"], out["ttv_inproc_s"] = ttv_t, ttv_i
    out["ttv_within_slack"] = ttv_t is not None and ttv_i is not None and ttv_t <= ttv_i + ttv_slack_s
    return out


def _quantile(xs: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile (a value that was really measured); None for no values."""
    if not xs:
        return None
    ys = sorted(xs)
    return ys[max(0, min(len(ys) - 1, int(np.ceil(q * len(ys))) - 1))]


def largest_kept_up(rows: Sequence[Mapping[str, Any]], key: str = "kept_up") -> int | None:
    """The largest R kept up with, below the smallest R that was not (a larger lucky run does not count)."""
    best = None
    for r in sorted(rows, key=lambda r: r["ranks"]):
        if not r[key]:
            break
        best = r["ranks"]
    return best


# --------------------------------------------------------------------------------------------
# /proc
# --------------------------------------------------------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu_rss(pid: int | None) -> tuple[float | None, int | None]:
    """CPU seconds (user + system) and RSS bytes of a process, from /proc; (None, None) when gone."""
    if pid is None:
        return None, None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None, None
    fields = stat[stat.rindex(")") + 2:].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14 and 15 of stat)
    rss = None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return cpu, rss


# --------------------------------------------------------------------------------------------
# generating, replaying, measuring
# --------------------------------------------------------------------------------------------
class BatchFile:
    """``(send time, batch)`` pairs written once, in order, to a file and read back as often as needed
    (the producer, the collective-rate count and the in-process analyzer each take one pass), so the
    job's length is bounded by the disk, not by memory. ``times`` keeps every send time (8 bytes a message)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.times: list[float] = []
        self._f: Any = path.open("wb")

    def append(self, t: float, batch: KernelBatch) -> None:
        pickle.dump((t, batch), self._f, protocol=pickle.HIGHEST_PROTOCOL)
        self.times.append(t)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def __len__(self) -> int:
        return len(self.times)

    def __iter__(self) -> Iterator[tuple[float, KernelBatch]]:
        if self._f is not None:
            raise RuntimeError("the batch file is still being written")
        with self.path.open("rb") as f:
            for _ in range(len(self.times)):
                yield pickle.load(f)  # noqa: S301 - our own file, written just before by this run


@dataclass
class Generated:
    scenario: Scenario
    batches: BatchFile
    records: int
    bytes: int
    gen_s: float
    groups: int = 1
    partitions: int = 4  # of the metrics topic
    messages_before_split: int = 0
    schedules: dict[int, list[float]] | None = None  # per metrics partition: its messages' send times


MESSAGES = ("rank", "rank-comm", "comm", "host")


def regroup(batches: Iterable[tuple[float, KernelBatch]], how: str) -> Iterable[tuple[float, KernelBatch]]:
    """The simulator's batches (one per communicator and delivery time, all its ranks) as rank processes
    send them: per delivery time, one batch per rank (``rank``) or per rank and communicator
    (``rank-comm``), each rank a producer with its own batch sequence; ``comm`` leaves them as they are;
    ``host`` is one batch per host (all its ranks and communicators), what a per-host aggregator would send."""
    if how == "comm":
        yield from batches
        return
    if how not in MESSAGES:
        raise ValueError(f"messages: one of {MESSAGES}, not {how!r}")
    seq: dict[int, int] = defaultdict(int)
    at: dict[tuple[str, int], list[KernelBatch]] = {}  # this delivery time's batches per job incarnation
    t_at = 0.0
    end: list[tuple[float, KernelBatch | None]] = [(float("inf"), None)]
    for t, b in itertools.chain(batches, end):
        if t != t_at and at:
            for same in at.values():  # a batch holds one job incarnation (a restart starts another)
                if how == "host":
                    whole = KernelBatch.concat(same)
                    host = whole.columns["host_idx"]
                    for h in np.unique(host).tolist():
                        part = whole.take(np.flatnonzero(host == h))
                        seq[-1 - h] += 1
                        yield t_at, part.take(np.arange(part.n), producer=f"{part.job}-host-{part.hosts[0]}",
                                              batch_seq=seq[-1 - h])
                    continue
                for rank, part in sorted(KernelBatch.concat(same).by_rank().items()):
                    if how == "rank":
                        pieces = [part]
                    else:  # one per communicator of this rank
                        comm = part.columns[COMM_COLUMN]
                        pieces = [part.take(np.flatnonzero(comm == c)) for c in dict.fromkeys(comm.tolist())]
                    for piece in pieces:
                        seq[rank] += 1
                        yield t_at, piece.take(np.arange(piece.n), producer=f"{piece.job}-rank-{rank}",
                                               batch_seq=seq[rank])
            at = {}
        if b is not None:
            at.setdefault((b.job, b.incarnation), []).append(b)
            t_at = t


def generate(sc: Scenario, progress: Callable[[str], None], messages: str = "rank", groups: int = 1,
             spool_dir: Path | None = None) -> Generated:
    """The job's messages as the producers send them (``regroup``, then split by communicator group when
    ``groups`` > 1), written to a ``BatchFile`` in ``spool_dir`` (the temporary directory by default),
    with each message's metrics partition (``metrics_partition``) and per partition its schedule."""
    from ccld.producers.simulator.sim import simulate
    from ccld.records import metrics_partition
    from ccld.schemas.codec import encode_batch

    t0 = time.perf_counter()
    partitions = metrics_partitions_for(groups)
    fd, name = tempfile.mkstemp(prefix="ccld-realtime-", suffix=".batches", dir=spool_dir)
    os.close(fd)
    batches = BatchFile(Path(name))
    schedules: dict[int, list[float]] = defaultdict(list)
    records = nbytes = before = 0
    next_report = 30.0

    for t, whole in regroup(simulate(sc), messages):
        before += 1
        for _, b in split_groups([(t, whole)], groups):
            batches.append(t, b)
            schedules[metrics_partition(b.job, b.comm_hash, partitions, groups)].append(t)
            records += b.n
            nbytes += len(encode_batch(b))  # the Avro value the producer hands to librdkafka (before lz4)
        if t >= next_report:
            progress(f"  generated {t:.0f} of {sc.duration_s:.0f} simulated s ({time.perf_counter() - t0:.0f} s)")
            next_report += 30.0
    batches.close()
    return Generated(sc, batches, records, nbytes, time.perf_counter() - t0, groups=groups, partitions=partitions,
                     messages_before_split=before, schedules=dict(sorted(schedules.items())))


def _replay(batches: Iterable[tuple[float, KernelBatch]], settings: Any, start_at: Any, sent: Any) -> None:
    """The producer process (forked before any Kafka client exists): wait for the go, then read the
    batches in order and send each when its time comes, stamped with the wall clock."""
    from ccld.producers.kafka import MetricsProducer

    while start_at.value == 0.0:
        time.sleep(0.01)
    if start_at.value < 0:  # the run was called off
        return
    with MetricsProducer(settings, producer_id="realtime-scale", background=False) as p:
        p.check_broker()
        t0 = start_at.value
        i = 0
        for t, b in batches:  # read ahead of its time by one message only: memory stays flat
            ahead = t - (time.time() - t0)
            if ahead > 0:
                sent.value = i  # what was due is out; say so before sleeping
                time.sleep(ahead)
            p.send_batch(b, timestamp_ms=int(round((t0 + t) * 1000)))
            i += 1
        sent.value = i
        p.flush(60)


class Sampler(threading.Thread):
    """Once a second: the worker group's committed offsets of the job's partitions, the lags, CPU and RSS
    of every process. ``schedules``: per partition, the send times of its messages; ``times``: all of
    them (what the producer works through)."""

    def __init__(self, settings: Any, schedules: Mapping[int, Sequence[float]], times: Sequence[float],
                 start_at: float, pids: Mapping[str, Callable[[], int | None]], sent: Any,
                 progress: Callable[[str], None]) -> None:
        super().__init__(name="realtime-scale-sampler", daemon=True)
        self.settings, self.schedules, self.times, self.start_at = settings, schedules, times, start_at
        self.pids, self.sent, self.progress = pids, sent, progress
        self.samples: list[dict[str, Any]] = []
        self.offsets: dict[int, int] = {p: 0 for p in schedules}
        self.committed = 0  # over all the job's partitions
        self.stop = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        from ccld.security import kafka_config

        c = Consumer(kafka_config(self.settings, **{"group.id": self.settings.worker_app_id,
                                                    "enable.auto.commit": False}))
        tp = [TopicPartition(self.settings.metrics_topic, p) for p in self.schedules]
        next_at = self.start_at
        try:
            while not self.stop.is_set():
                now = time.time()
                if now < next_at:
                    time.sleep(min(next_at - now, 0.2))
                    continue
                next_at += 1.0
                try:
                    for got in c.committed(tp, timeout=5):
                        self.offsets[got.partition] = max(self.offsets[got.partition], got.offset)
                    self.committed = sum(self.offsets.values())
                except Exception as exc:  # noqa: BLE001 - a slow answer is one missed sample, not a failed run
                    self.progress(f"  (committed offsets not read: {exc})")
                elapsed = time.time() - self.start_at
                s: dict[str, Any] = {
                    "t": round(elapsed, 3), "committed": self.committed, "sent": int(self.sent.value),
                    "due": due(self.times, elapsed),
                    "lag_s": round(lag_over_partitions_s(self.schedules, self.offsets, elapsed), 3),
                    "producer_behind_s": round(behind_s(self.times, int(self.sent.value), elapsed), 3),
                    "load1": os.getloadavg()[0],  # the machine's run queue: other jobs compete for its cores
                }
                if len(self.schedules) > 1:
                    s["committed_by_partition"] = dict(self.offsets)
                    s["lag_by_partition_s"] = {p: round(behind_s(ts, self.offsets[p], elapsed), 3)
                                               for p, ts in self.schedules.items()}
                for role, pid in self.pids.items():
                    s[f"{role}_cpu_s"], s[f"{role}_rss"] = proc_cpu_rss(pid())
                self.samples.append(s)
                if len(self.samples) % 10 == 0:
                    self.progress(
                        f"  t={elapsed:5.0f}s sent {s['sent']}/{len(self.times)} committed {s['committed']} "
                        f"lag {s['lag_s']:.2f}s producer behind {s['producer_behind_s']:.2f}s "
                        f"RSS worker {(s.get('worker_rss') or 0) / 2**20:.0f} MB "
                        + "".join(f"{r} {(s.get(r + '_rss') or 0) / 2**20:.0f} MB "
                                  for r in self.pids if r.startswith("worker-")) +
                        f"broker {(s.get('broker_rss') or 0) / 2**20:.0f} MB")
        finally:
            c.close()


def _set_affinity(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` (librdkafka's included: ``sched_setaffinity`` on a pid moves one thread)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def pin_workers(pipeline: Any, workers: Sequence[str], cpu: int, *, broker_pid: int | None, producer_pid: int | None,
                progress: Callable[[str], None]) -> None:
    """The workers on core ``cpu`` alone; the broker, the producer and this process on the others: what one
    worker core holds, with nothing else on it."""
    rest = set(os.sched_getaffinity(0)) - {cpu}
    if not rest:
        raise SystemExit(f"--worker-cpu {cpu} leaves no core for the broker and the producer")
    for name in workers:
        _set_affinity(pipeline.children[name].pid, {cpu})
    for pid in (broker_pid, producer_pid, os.getpid()):
        if pid is not None:
            _set_affinity(pid, rest)
    progress(f"  workers on core {cpu}; broker, producer and sampler on {sorted(rest)}")


def in_process_ttv(g: Generated, expect: Expectation, onset_s: float) -> float | None:
    """The analyzer's own time-to-verdict on the same batches, on the simulated clock (with the job's
    communicators over ``g.groups`` shards and one job stage, as the workers analyze them: the parts of
    one split batch share its producer and sequence number, which one analyzer would take for duplicates)."""
    from ccld.settings import Settings
    from ccld.streams.analysis.replay import analyze_batches

    verdicts = analyze_batches(g.batches, settings=Settings.load({}).analyzer, tick_s=1.0, groups=g.groups)
    hit = first_correct(expect, ((v.detected_time, v) for v in verdicts))
    return None if hit is None else hit[0] - onset_s


def run_one(ranks: int, args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    sc = job_scenario(ranks, args.duration_s, fault=args.fault, layer_ms=args.layer_ms)
    fault = sc.faults[0]
    progress(f"R={ranks}: generating {args.duration_s:.0f} s of the job ({args.fault} on rank {fault.rank} at "
             f"{fault.onset_s:.0f} s)")
    g = generate(sc, progress, args.messages, args.groups, args.spool_dir)
    try:
        return measure(g, args, progress)
    finally:
        g.batches.delete()


def measure(g: Generated, args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    """Replay ``g`` through the broker and the workers and measure it (``run_one``'s second half)."""
    from ccld.settings import Settings
    from ccld.stack.broker import HOST, free_port
    from ccld.stack.up import Pipeline
    from ccld.streams.tail import iter_verdicts

    sc, ranks = g.scenario, g.scenario.ranks
    fault, expect = sc.faults[0], sc.expect[0]
    since = min(10.0, fault.onset_s / 2)  # a minute before the fault is enough to read the rate back
    coll = collectives_per_rank_s(g.batches, since, min(fault.onset_s, since + 60.0))
    progress(f"R={ranks}: {len(g.batches):,} messages, {g.records:,} records, {g.bytes / 1e6:,.0f} MB in "
             f"{g.gen_s:.0f} s; {g.records / sc.duration_s:,.0f} records/s, {g.bytes / sc.duration_s / 1e6:.1f} MB/s; "
             f"collectives/s per rank before the fault: median {coll['median']:.0f} "
             f"(min {coll['min']:.0f}, max {coll['max']:.0f})")
    times = g.batches.times
    schedules = g.schedules or {}
    if args.groups > 1:
        progress(f"R={ranks}: split over {args.groups} groups: {g.messages_before_split:,} messages before, "
                 f"{len(times):,} after (x{len(times) / max(g.messages_before_split, 1):.2f}); per partition "
                 + ", ".join(f"{p}: {len(ts):,}" for p, ts in schedules.items()))

    tag = f"{int(time.time())}-{os.getpid()}-{ranks}"
    port = free_port()
    settings = Settings.load({}).replace(bootstrap="", worker_app_id=f"realtime-{tag}",
                                         topic_prefix=f"realtime-{tag}.",
                                         worker_commit_interval_s=COMMIT_INTERVAL_S,
                                         metrics_partitions=g.partitions, analysis_groups=args.groups)
    ctx = multiprocessing.get_context("fork")
    start_at = ctx.Value("d", 0.0)
    sent = ctx.Value("q", 0)
    # fork the producer before this process starts any Kafka client (librdkafka threads do not survive a fork)
    producer = ctx.Process(target=_replay, args=(g.batches, settings.replace(bootstrap=f"{HOST}:{port}"), start_at,
                                                 sent), name="realtime-producer", daemon=True)
    producer.start()
    logs = Path(tempfile.mkdtemp(prefix="ccld-realtime-"))
    verdicts: list[tuple[float, Verdict]] = []
    done = threading.Event()
    try:
        pipeline_cm = Pipeline(settings, port=port, log_dir=logs).start(worker=True, sink=False,
                                                                         workers=args.workers)
    except BaseException:
        start_at.value = -1.0
        raise
    with pipeline_cm as pipeline:
        s = pipeline.settings
        t_ready = time.monotonic()
        workers = [n for n in pipeline.children if n == "worker" or n.startswith("worker-")]
        waiting = list(workers)
        while waiting:
            waiting = [n for n in waiting if b"Worker ready" not in (logs / f"{n}.log").read_bytes()]
            if waiting and (pipeline.dead_children() or time.monotonic() - t_ready > 120):
                start_at.value = -1.0
                raise SystemExit(f"the worker did not start; see {logs / (waiting[0] + '.log')}")
            time.sleep(0.1)
        progress(f"R={ranks}: {len(workers)} worker(s) ready after {time.monotonic() - t_ready:.1f} s (logs in {logs})")
        if args.worker_cpu is not None:
            pin_workers(pipeline, workers, args.worker_cpu, broker_pid=pipeline.broker.pid if pipeline.broker else None,
                        producer_pid=producer.pid, progress=progress)

        def listen() -> None:
            for v in iter_verdicts(s, from_beginning=True, stop=done.is_set):
                verdicts.append((time.time(), v))

        listener = threading.Thread(target=listen, name="realtime-scale-verdicts", daemon=True)
        listener.start()
        time.sleep(3.0)  # the group's first assignment
        t0 = time.time() + 2.0  # the producer connects meanwhile
        start_at.value = t0
        broker = pipeline.broker
        pids: dict[str, Callable[[], int | None]] = {
            "broker": lambda: broker.pid if broker is not None else None,
            "producer": lambda: producer.pid,
        }
        for name in workers:  # the pid of the process running now (a restarted child is another)
            pids[name] = lambda name=name: pipeline.children[name].pid  # type: ignore[misc]
        sampler = Sampler(s, schedules, times, t0, pids, sent, progress)
        sampler.start()
        progress(f"R={ranks}: replaying in real time for {sc.duration_s:.0f} s")
        producer.join(sc.duration_s + 120)
        if producer.is_alive():
            progress(f"R={ranks}: the producer did not finish; stopping it")
            producer.terminate()
        deadline = time.time() + args.drain_wait_s
        while sampler.committed < len(times) and time.time() < deadline and not pipeline.dead_children():
            time.sleep(0.1)
        drain_s = time.time() - t0 - times[-1] if sampler.committed >= len(times) else None
        time.sleep(3.0)  # the last evaluation
        sampler.stop.set()
        sampler.join(10)
        done.set()
        listener.join(10)
        dead = pipeline.dead_children()
        assigned = {n: assigned_partitions((logs / f"{n}.log").read_text(errors="replace"), s.metrics_topic)
                    for n in workers}
    hit = first_correct(expect, verdicts)
    ttv_topic = None if hit is None else hit[0] - (t0 + fault.onset_s)
    ttv_clock = None if hit is None else hit[1].detected_time - (t0 + fault.onset_s)
    ttv_inproc, inproc_s = None, None
    if drain_s is not None or args.always_inproc:
        progress(f"R={ranks}: in-process analyzer on the same batches")
        t_a = time.process_time()  # CPU time: other jobs on the machine do not count
        ttv_inproc = in_process_ttv(g, expect, fault.onset_s)
        inproc_s = time.process_time() - t_a
    else:  # the worker fell behind: its verdict time says nothing, and the analysis would take minutes
        progress(f"R={ranks}: the worker did not catch up; in-process analysis skipped (--always-inproc runs it)")
    raw = {
        "ranks": ranks, "workers": args.workers, "groups": args.groups, "partitions": list(schedules),
        "worker_cpu": args.worker_cpu,
        "messages_before_split": g.messages_before_split,
        "messages_per_partition": {p: len(ts) for p, ts in schedules.items()},
        "duration_s": sc.duration_s, "messages": len(times), "records": g.records, "bytes": g.bytes,
        "generate_s": g.gen_s, "collectives_per_rank_s": coll, "samples": sampler.samples, "drain_s": drain_s,
        "ttv_topic_s": ttv_topic, "ttv_topic_analyzer_clock_s": ttv_clock, "ttv_inproc_s": ttv_inproc,
        "inproc_analysis_s": inproc_s,
        "inproc_analysis_cpu_share": None if inproc_s is None else inproc_s / sc.duration_s,
        "fault": {"kind": fault.kind, "rank": fault.rank, "onset_s": fault.onset_s, "factor": fault.factor},
        "verdicts": [{"wall_s_after_start": round(w - t0, 2), **v.to_dict()} for w, v in verdicts],
        "dead_children": dead, "producer_exit": producer.exitcode, "worker_log": str(logs / "worker.log"),
        "worker_logs": [str(logs / f"{n}.log") for n in workers], "assigned_metrics_partitions": assigned,
    }
    summ = summarize(raw, warmup_s=args.warmup_s)
    progress(
        f"R={ranks}: {summ['records_per_s']:,.0f} records/s, {summ['bytes_per_s'] / 1e6:.1f} MB/s; lag max "
        f"{_f(summ['lag_max_s'])} s (median {_f(summ['lag_median_s'])}); drain {_f(drain_s)} s; kept up: "
        f"{summ['kept_up']}; TTV on the topic {_f(ttv_topic)} s vs in process {_f(ttv_inproc)} s; CPU % "
        + " ".join(f"{w} {_f(summ[w + '_cpu_pct_median'], '.0f')}" for w in summ["worker_roles"]) +
        f" broker {_f(summ['broker_cpu_pct_median'], '.0f')} producer "
        f"{_f(summ['producer_cpu_pct_median'], '.0f')}; metrics partitions per worker {assigned}")
    return {"summary": summ, "raw": raw}


def _f(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def _workers(results: Sequence[Mapping[str, Any]]) -> str:
    w = {int(r["summary"].get("workers", 1)) for r in results} or {1}
    g = {int(r["summary"].get("groups", 1)) for r in results} or {1}
    if w == {1} and g == {1}:
        return "One worker"
    return f"{'/'.join(map(str, sorted(w)))} workers, {'/'.join(map(str, sorted(g)))} groups"


def plot(results: Sequence[Mapping[str, Any]], stem: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in results:
        xs = [s["t"] for s in r["raw"]["samples"]]
        ys = [s["lag_s"] for s in r["raw"]["samples"]]
        ax.plot(xs, ys, label=f"R = {r['summary']['ranks']}")
    ax.axhline(LAG_LIMIT_S, color="grey", ls="--", lw=1, label=f"{LAG_LIMIT_S:.0f} s bound")
    if results:
        ax.axvline(results[0]["raw"]["duration_s"] / 2, color="red", ls=":", lw=1, label="fault onset")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds since the start of the replay")
    ax.set_ylabel("consumer lag (s)")
    ax.set_title(f"{_workers(results)}, real-time job: consumer lag")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(stem.with_name(stem.name + "-lag.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = sorted((r["summary"] for r in results), key=lambda s: s["ranks"])
    rs = [s["ranks"] for s in rows]
    ax.plot(rs, [s["records_per_s"] for s in rows], "o-", label="records/s offered")
    ax.plot(rs, [s["worker_records_per_s"] or np.nan for s in rows], "x-", label="records/s the worker committed")
    kept = [s["records_per_s"] if s["sustained"] else np.nan for s in rows]
    ax.plot(rs, kept, "s", ms=10, mfc="none", label="sustained (lag p95 < 2 s, not growing)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks R (about 300 collectives/s each)")
    ax.set_ylabel("records/s")
    ax2 = ax.twinx()
    ax2.plot(rs, [s["worker_cpu_pct_median"] or 0 for s in rows], "^--", color="tab:red", label="worker CPU %")
    ax2.set_ylabel("worker CPU (% of one core)")
    ax2.set_ylim(0, 110)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    ax.set_title(f"{_workers(results)}, real-time job: throughput against R")
    fig.tight_layout()
    paths.append(stem.with_name(stem.name + "-throughput.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def print_table(rows: Sequence[Mapping[str, Any]]) -> None:
    print(f"\n{'R':>6} {'wkrs':>4} {'grps':>4} {'msg/s':>6} {'split':>5} {'coll/s/rank':>11} "
          f"{'records/s':>10} {'MB/s':>6} {'lag med':>8} {'lag p95':>8} "
          f"{'lag max':>8} {'drain':>6} {'kept':>5} {'sust.':>5} {'TTV topic':>9} {'TTV in-proc':>11} "
          f"{'wkr CPU%':>11} {'brk CPU%':>8} {'prd CPU%':>8} {'wkr RSS':>8} {'brk RSS':>8}")
    for s in rows:
        wcpu = "/".join(_f(s.get(f"{w}_cpu_pct_median"), ".0f") for w in s.get("worker_roles", ["worker"]))
        print(f"{s['ranks']:>6} {s.get('workers', 1):>4} {s.get('groups', 1):>4} {s['messages_per_s']:>6,.0f} "
              f"{_f(s.get('split_factor'), '.2f'):>5} {_f(s.get('collectives_per_rank_s'), '.0f'):>11} "
              f"{s['records_per_s']:>10,.0f} "
              f"{s['bytes_per_s'] / 1e6:>6.1f} {_f(s['lag_median_s']):>8} {_f(s['lag_p95_s']):>8} "
              f"{_f(s['lag_max_s']):>8} {_f(s['drain_s'], '.1f'):>6} {'yes' if s['kept_up'] else 'no':>5} "
              f"{'yes' if s['sustained'] else 'no':>5} {_f(s['ttv_topic_s'], '.1f'):>9} "
              f"{_f(s['ttv_inproc_s'], '.1f'):>11} {wcpu:>11} "
              f"{_f(s['broker_cpu_pct_median'], '.0f'):>8} {_f(s['producer_cpu_pct_median'], '.0f'):>8} "
              f"{_f(s['worker_rss_mb_median'], '.0f'):>8} {_f(s['broker_rss_mb_median'], '.0f'):>8}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--ranks", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    ap.add_argument("--duration-s", type=float, default=600.0, help="seconds of the job played (fault at half)")
    ap.add_argument("--workers", type=count_arg, default=1, help="worker processes (Pipeline.start(workers=N))")
    ap.add_argument("--groups", type=count_arg, default=1,
                    help="spread the job over this many metrics partitions (analysis_groups; the schedule is split "
                         "by communicator group as the producer splits it)")
    ap.add_argument("--fault", choices=["S1", "H1"], default="S1")
    ap.add_argument("--layer-ms", type=float, default=3.5, help="compute per layer; 3.5 gives ~300 collectives/s")
    ap.add_argument("--warmup-s", type=float, default=10.0, help="lag is judged after this many seconds")
    ap.add_argument("--drain-wait-s", type=float, default=30.0,
                    help="after the replay, wait this long at most for the worker to commit everything")
    ap.add_argument("--always-inproc", action="store_true",
                    help="run the in-process analyzer even when the worker fell behind (minutes at thousands of ranks)")
    ap.add_argument("--messages", choices=MESSAGES, default="rank",
                    help="how records are grouped into messages: per rank (today's producers), per rank and "
                         "communicator (before), per communicator (the simulator's own grouping)")
    ap.add_argument("--spool-dir", type=Path, default=None,
                    help="where the generated job is written before the replay (default: the temporary "
                         "directory; 10 minutes of 4,096 ranks take about 20 GB)")
    ap.add_argument("--out", type=Path, default=RESULTS / "realtime-scale.json")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--worker-cpu", type=int, default=None,
                    help="pin the worker processes (every thread) to this core and everything else to the others")
    args = ap.parse_args(argv)

    def progress(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    results = []
    for r in args.ranks:
        res = run_one(r, args, progress)
        res["summary"]["collectives_per_rank_s"] = res["raw"]["collectives_per_rank_s"]["median"]
        results.append(res)
        args.out.parent.mkdir(parents=True, exist_ok=True)  # written after every R: a long run keeps what it measured
        rows = [x["summary"] for x in results]
        args.out.write_text(json.dumps({"run": {"id": uuid.uuid4().hex[:8], "workers": args.workers,
                                                "groups": args.groups,
                                                "duration_s": args.duration_s, "fault": args.fault,
                                                "layer_ms": args.layer_ms, "cpus": os.cpu_count(),
                                                "messages": args.messages, "worker_cpu": args.worker_cpu},
                                        "rows": rows, "largest_kept_up": largest_kept_up(rows),
                                        "largest_sustained": largest_kept_up(rows, "sustained"),
                                        "results": results}, indent=1, default=str) + "\n")
    rows = [x["summary"] for x in results]
    print_table(rows)
    print(f"\nlargest R kept up with (lag < {LAG_LIMIT_S:.0f} s throughout after {args.warmup_s:.0f} s): "
          f"{largest_kept_up(rows)}; largest R sustained (lag p95 < {LAG_LIMIT_S:.0f} s, not growing): "
          f"{largest_kept_up(rows, 'sustained')}; results: {args.out}")
    if not args.no_plot and results:
        for p in plot(results, args.out.with_suffix("")):
            print(f"plot: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
