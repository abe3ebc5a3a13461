"""One incident gathered from the Parquet archive into a small typed model, for ``ccld report``.

``load_incident`` reads the incident's verdicts and its job's metrics rows around the onset;
``build_incident`` is the pure part (archive rows in, ``Incident`` out) the tests feed directly.

Times: verdicts carry the analyzer's clock (Kafka message timestamps, in seconds); metric rows
carry each rank's own clock (``t_enter_ns``, ``t_exit_ns``, ``t_sample_ns``), which may be seconds
apart between hosts. Each rank's clock is put on the analyzer's by the smallest gap between a
sample's time and the Kafka timestamp of the message that carried it: a message leaves after its
samples, so the smallest gap is the clock offset plus the shortest shipping delay, the best bound
the archive allows (the NTP minimum filter). The model keeps every time in seconds from the onset.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ccld.anomaly import CLASSES, AnomalyClass
from ccld.errors import CcldError
from ccld.ranks import rank_ranges as core_rank_ranges
from ccld.records import Verdict, VerdictState
from ccld.sinks.catalog import has_topic, read_table, read_verdicts, scan
from ccld.sinks.layout import day

#: seconds of metrics shown before the onset and after the first verdict
BEFORE_S = 30.0
AFTER_S = 15.0
#: at most this many ranks get a row of the timeline (the culprits and their peers first)
MAX_RANKS = 64
#: the Kafka timestamp has millisecond resolution: part of the alignment's error
_TS_RESOLUTION_S = 1e-3

_STATE_ORDER = {VerdictState.OPEN: 0, VerdictState.UPDATE: 1, VerdictState.RESOLVED: 2, VerdictState.CLOSED: 2}
_METRIC_COLUMNS = ("kafka_ts_ms", "job", "communicator", "rank", "op_seq", "op_type", "status", "t_enter_ns",
                   "t_exit_ns", "t_sample_ns", "send_counts", "recv_counts")


@dataclass(frozen=True)
class OpBar:
    """One op of one rank on the timeline, in seconds from the onset (analyzer clock)."""

    rank: int
    communicator: str
    op_seq: int
    op_type: str
    start_s: float
    end_s: float
    #: False: no exit seen; the bar ends at the rank's last sample inside the op
    done: bool
    #: the op the verdict names (its communicator and sequence number)
    verdict_op: bool


@dataclass(frozen=True)
class Sample:
    """One metrics row's sample time on the timeline; ``idle``: a heartbeat outside any op."""

    rank: int
    t_s: float
    idle: bool


@dataclass(frozen=True)
class KernelTime:
    """How long one rank spent in one completed op of the verdict's communicator and op type."""

    rank: int
    t_s: float  # the op's start, seconds from the onset
    duration_s: float


@dataclass(frozen=True)
class Backlog:
    """A sample's per-channel send backlog (RecvCount - SendCount, as the analyzer reads it)."""

    rank: int
    t_s: float
    channels: tuple[int, ...]


@dataclass(frozen=True)
class Incident:
    """Everything ``ccld report`` shows about one incident."""

    incident_id: str
    verdicts: tuple[Verdict, ...]  # every state, in order
    onset: float  # analyzer clock, seconds
    window: tuple[float, float]  # seconds from the onset
    ranks_shown: tuple[int, ...]
    ranks_hidden: tuple[int, ...]
    bars: tuple[OpBar, ...]
    samples: tuple[Sample, ...]
    kernel_times: tuple[KernelTime, ...]
    backlog: tuple[Backlog, ...]
    #: rank -> seconds added to its own clock to reach the analyzer's
    clock_offsets_s: Mapping[int, float] = field(default_factory=dict)
    metric_rows: int = 0

    @property
    def current(self) -> Verdict:
        """The newest classification: the last open or update (a resolution repeats it)."""
        live = [v for v in self.verdicts if v.state in (VerdictState.OPEN, VerdictState.UPDATE)]
        return (live or list(self.verdicts))[-1]

    @property
    def info(self) -> AnomalyClass:
        return CLASSES[self.current.kind]

    @property
    def culprits(self) -> tuple[int, ...]:
        return self.current.root_cause_ranks

    def rel(self, t: float) -> float:
        """An analyzer-clock time in seconds from the onset."""
        return t - self.onset


def verdict_from_row(row: Mapping[str, Any]) -> Verdict:
    """An archive row (``parquet.verdicts_table``'s columns) back into a Verdict."""
    d = dict(row)
    src, dst = d.pop("link_src", None), d.pop("link_dst", None)
    d["link"] = None if src is None or dst is None else {"src": src, "dst": dst}
    details = d.get("details")
    d["details"] = json.loads(details) if isinstance(details, str) and details else {}
    return Verdict.from_dict(d)


def archived_verdicts(root: Path, topic: str) -> list[Verdict]:
    """Every verdict the archive holds (every state, both layouts), as Verdicts."""
    return [verdict_from_row(row) for row in read_verdicts(root, topic)]


def incident_verdicts(rows: Iterable[Mapping[str, Any]], incident_id: str) -> list[Verdict]:
    """The incident's distinct verdicts (repeats dropped on ``dedupe_key``), in the order they happened."""
    seen: dict[str, tuple[int, Verdict]] = {}
    for row in rows:
        if row.get("incident_id") != incident_id:
            continue
        v = verdict_from_row(row)
        seen.setdefault(v.dedupe_key, (int(row.get("offset") or 0), v))
    return [v for _, v in sorted(seen.values(), key=lambda ov: (ov[1].detected_time, _STATE_ORDER[ov[1].state],
                                                                ov[0]))]


def window_of(verdicts: Sequence[Verdict]) -> tuple[float, float, float]:
    """(onset, start, end) on the analyzer clock: from before the onset to after the first verdict."""
    onset = min(v.onset_time for v in verdicts)
    first = min(v.detected_time for v in verdicts)
    return onset, onset - BEFORE_S, max(first, onset) + AFTER_S


def pick_ranks(verdict: Verdict, present: Iterable[int], comm_members: Iterable[int],
               limit: int = MAX_RANKS) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shown, hidden): the culprits, the link's ends, the affected ranks, the verdict's communicator, the rest."""
    everyone = sorted(set(present) | set(verdict.root_cause_ranks) | set(verdict.affected_ranks))
    link = () if verdict.link is None else (verdict.link.src, verdict.link.dst)
    order: list[int] = []
    for group in (verdict.root_cause_ranks, link, sorted(verdict.affected_ranks), sorted(comm_members), everyone):
        for r in group:
            if r not in order:
                order.append(r)
    shown = tuple(sorted(order[:limit]))
    return shown, tuple(r for r in everyone if r not in shown)


def clock_offsets(table: pa.Table) -> dict[int, float]:
    """rank -> seconds to add to its own clock (see the module docstring): min(Kafka time - sample time)."""
    if table.num_rows == 0:
        return {}
    rank = table["rank"].to_numpy()
    ts = table["kafka_ts_ms"].to_numpy().astype(np.float64) / 1e3
    sample = table["t_sample_ns"].to_numpy()
    ok = sample > 0
    gap = ts[ok] - sample[ok].astype(np.float64) / 1e9
    out: dict[int, float] = {}
    for r in np.unique(rank[ok]):
        out[int(r)] = float(gap[rank[ok] == r].min())
    return out


def build_incident(incident_id: str, verdicts: Sequence[Verdict], metrics: pa.Table) -> Incident:
    """The model from the incident's verdicts and its job's metric rows in the window (the pure part)."""
    if not verdicts:
        raise CcldError(f"incident {incident_id} has no verdicts")
    onset, lo, hi = window_of(verdicts)
    current = [v for v in verdicts if v.state in (VerdictState.OPEN, VerdictState.UPDATE)] or list(verdicts)
    v = current[-1]
    offsets = clock_offsets(metrics)
    members = set()
    if metrics.num_rows:
        in_comm = metrics.filter(pc.equal(metrics["communicator"], v.communicator))
        members = {int(r) for r in pc.unique(in_comm["rank"]).to_pylist()}
    shown, hidden = pick_ranks(v, offsets, members)
    keep = set(shown)
    # Row by row in Python below: only the ranks drawn and the verdict's communicator, not a whole big job.
    wanted = metrics.filter(pc.is_in(metrics["rank"], pa.array(sorted(keep | members), metrics["rank"].type))) \
        if metrics.num_rows else metrics
    rows = wanted.to_pylist()

    def at(rank: int, ns: int) -> float:
        """A rank-clock time in seconds from the onset."""
        return ns / 1e9 + offsets[rank] - onset

    # One bar per (rank, communicator, op): its entry, and its exit or the last sample inside it.
    ops: dict[tuple[int, str, int], dict[str, Any]] = {}
    samples: list[Sample] = []
    kernel: list[KernelTime] = []
    backlog: list[Backlog] = []
    for r in rows:
        rank = int(r["rank"])
        if rank not in offsets:
            continue
        status = r["status"]
        if rank in keep and r["t_sample_ns"] > 0:
            samples.append(Sample(rank, at(rank, r["t_sample_ns"]), status == "IDLE"))
        if status == "IDLE" or r["t_enter_ns"] < 0:
            continue  # a heartbeat between ops: its op_seq is the last op's, already ended
        key = (rank, r["communicator"], int(r["op_seq"]))
        op = ops.setdefault(key, {"enter": r["t_enter_ns"], "exit": -1, "last": -1, "type": r["op_type"]})
        op["enter"] = min(op["enter"], r["t_enter_ns"])
        if status == "DONE" and r["t_exit_ns"] >= r["t_enter_ns"]:
            op["exit"] = r["t_exit_ns"]
        op["last"] = max(op["last"], r["t_sample_ns"])
        if r["communicator"] == v.communicator and status == "PROGRESS" and r["send_counts"]:
            lag = tuple(max(int(rc) - int(sc), 0) for sc, rc in zip(r["send_counts"], r["recv_counts"], strict=False))
            backlog.append(Backlog(rank, at(rank, r["t_sample_ns"]), lag))
    bars: list[OpBar] = []
    for (rank, comm, seq), op in ops.items():
        done = op["exit"] >= 0
        end = op["exit"] if done else max(op["last"], op["enter"])
        start_s, end_s = at(rank, op["enter"]), at(rank, end)
        if comm == v.communicator and done and op["type"] == v.op_type.upper():
            kernel.append(KernelTime(rank, start_s, end_s - start_s))
        if rank in keep:
            bars.append(OpBar(rank, comm, seq, op["type"], start_s, end_s, done,
                              comm == v.communicator and seq == v.op_seq))
    bars.sort(key=lambda b: (b.rank, b.start_s))
    return Incident(
        incident_id=incident_id, verdicts=tuple(verdicts), onset=onset, window=(lo - onset, hi - onset),
        ranks_shown=shown, ranks_hidden=hidden, bars=tuple(bars), samples=tuple(sorted(samples, key=lambda s: s.t_s)),
        kernel_times=tuple(sorted(kernel, key=lambda k: k.t_s)), backlog=tuple(sorted(backlog, key=lambda b: b.t_s)),
        clock_offsets_s=offsets, metric_rows=metrics.num_rows,
    )


def read_metrics(root: Path, topic: str, job: str, lo: float, hi: float) -> pa.Table:
    """The job's metric rows whose messages reached Kafka between ``lo`` and ``hi`` (analyzer seconds)."""
    # a second of slack each side: a sample is shipped up to an interval after it was taken
    lo_ms, hi_ms = int((lo - 1.0) * 1e3), int((hi + 1.0) * 1e3)
    parts: list[pa.Table] = []
    first, last = day(lo_ms), day(hi_ms)
    for f in scan(root, topic=topic, job=job):  # the Hive layout: only the job's folders are read
        if f.date is not None and not first <= f.date <= last:
            continue  # a folder of another day
        t = read_table(f, columns=_METRIC_COLUMNS,
                       filters=[("job", "=", job), ("kafka_ts_ms", ">=", lo_ms), ("kafka_ts_ms", "<=", hi_ms)])
        if t.num_rows:
            parts.append(t)
    if not parts:
        return pa.table({c: pa.array([], pa.int64()) for c in _METRIC_COLUMNS})
    return pa.concat_tables(parts, promote_options="default")


def load_incident(root: Path, incident_id: str, *, verdicts_topic: str, metrics_topic: str) -> Incident:
    """Read one incident from an archive; a missing archive or an unknown id is a ``CcldError`` (one line)."""
    if not root.is_dir():
        raise CcldError(f"archive {root} does not exist (give the sink's folder with --archive DIR)")
    if not has_topic(root, verdicts_topic):
        raise CcldError(f"archive {root} holds no verdicts (no {verdicts_topic} folder)")
    verdicts = incident_verdicts(read_verdicts(root, verdicts_topic), incident_id)
    if not verdicts:
        raise CcldError(f"incident {incident_id} is not in the archive {root} (`ccld archive summary {root}` "
                        "counts its incidents)")
    onset, lo, hi = window_of(verdicts)
    metrics = read_metrics(root, metrics_topic, verdicts[0].job, lo, hi)
    return build_incident(incident_id, verdicts, metrics)


def alignment_note() -> str:
    """What the timeline's x axis is, in words, for the page."""
    return ("x: seconds from the onset on the analyzer's clock (Kafka message timestamps). Each rank's own "
            "clock is shifted by the smallest gap between one of its samples and the timestamp of the message "
            "that carried it, so a rank's bars may sit late by that sample's shipping delay "
            f"(plus {_TS_RESOLUTION_S * 1e3:.0f} ms of timestamp resolution); durations are exact.")


def rank_ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7,8"``: a run of three or more becomes a range (``ccld.ranks``)."""
    return core_rank_ranges(ranks, min_run=3)
