"""Scenario files: typed, validated descriptions of a simulated job and the faults injected into it.

One scenario is one JSON object (one line of a ``.jsonl`` file)::

    {"id": "s2-1024-a", "seed": 7, "ranks": 1024, "gpus_per_node": 8,
     "layout": {"tp": 8, "pp": 4, "dp": 32}, "channels": 8, "step_time_s": 2.0, "duration_s": 600,
     "clock_skew_s": 3.0, "jitter": 0.05,
     "faults": [{"kind": "S2", "rank": 517, "peer": 518, "onset_s": 120, "factor": 0.25}],
     "expect": [{"kind": "S2", "rank": 517}]}

Defaults of the top level: seed 0, gpus_per_node 8, layout tp = min(8, ranks), pp 1, dp the rest,
channels 4, step_time_s 2.0, duration_s 180, clock_skew_s 1.0, jitter 0.02, sample_interval_s 1.0,
faults [], expect []. Fault kinds and the defaults of their fields are in ``FAULT_FIELDS``;
``onset_s`` defaults to 60 s. Slowdowns (S1, S2, S3) may be intermittent: ``on_s`` seconds on,
``off_s`` off, repeating from the onset (default: on until the end). ``channels`` is 1 to 64
hardware channels per communicator; the records carry at most 8, more fold onto ``c % 8``.
A link fault (H3, S2, S3) sits on one directed link ``rank -> peer`` of one communicator family,
``comm``: ``tp`` (the default: ``peer`` the next rank of the tensor-parallel ring, NVLink inside a
node), ``dp`` (the next rank of the data-parallel ring, ``rank + tp*pp`` wrapping: a network link
when it crosses nodes) or ``pp`` (the pipeline send/recv pair to the adjacent stage, ``rank + tp``
forward or ``rank - tp`` backward; default forward, backward on the last stage) or ``ep`` (an
expert group's all_to_all: ``peer`` any other member of the group, default the next one; the
layout's ``ep`` splits the data-parallel replicas into expert groups, ``Layout``). Or, H3 and S2
only, on a whole host's network interface: ``{"kind": "S2", "nic": 3}`` (or ``"node-0003"``) and
no rank or peer slows (stops) every network link leaving node 3 (its ring successors and pipeline
partners on other nodes: ``Fault.links``). Links other than ``tp`` need the Megatron-style
workload. ``hosts`` names the job's nodes (one distinct name per node, in rank order; default
``node-0000``, ``node-0001``, ...), so jobs of a fleet can share machines; a ``nic`` may then be given by
its host's name. ``expect`` is ground truth for scoring only:
the simulator never hands it (or the faults) to the analyzer.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ccld.anomaly import CLASSES, Family, kinds_of
from ccld.errors import ScenarioError
from ccld.producers.simulator.workload import Workload
from ccld.records import Verdict

HANG_KINDS = kinds_of(Family.HANG)
SLOW_KINDS = kinds_of(Family.SLOW)
BENIGN_KINDS = ("transient", "checkpoint", "restart", "recreate")
RECREATE_FAMILIES = ("tp", "dp", "pp")
MISMATCH_FIELDS = ("op", "dtype", "count", "order")
LINK_COMMS = ("tp", "dp", "pp", "ep")  # communicator families a link fault may sit on
#: NCCL runs up to 32 channels per communicator on current GPUs (more on newer versions); the
#: probe folds channel c onto frame slot c % 8, and so does the simulator.
MAX_HW_CHANNELS = 64

#: kind -> {field: default}; ``None`` as default means "required" for rank, "derived" for peer,
#: "not recurring" for every_s.
FAULT_FIELDS: dict[str, dict[str, Any]] = {
    **{k.value: dict(c.fault_fields) for k, c in CLASSES.items()},
    "transient": {"rank": None, "onset_s": 60.0, "delay_s": 1.0},
    "checkpoint": {"onset_s": 60.0, "pause_s": 10.0, "writer_rank": 0, "every_s": None},
    # Megatron-style workload only: the job restarts as a new incarnation after down_s; a family of
    # communicators is destroyed and created again (new hashes, op sequences from 0)
    "restart": {"onset_s": 60.0, "down_s": 20.0},
    "recreate": {"onset_s": 60.0, "family": "dp"},
}

_TOP_KEYS = frozenset(
    {"id", "seed", "ranks", "gpus_per_node", "layout", "channels", "step_time_s", "duration_s",
     "clock_skew_s", "clock_drift_ppm", "jitter", "sample_interval_s", "faults", "expect", "workload", "hosts"}
)


@dataclass(frozen=True)
class Layout:
    """3-D parallel layout: tensor (fastest, inside a node), pipeline, data parallel; ``ep`` experts.

    Expert parallelism splits the data-parallel dimension as Megatron does: ``ep`` consecutive
    data-parallel replicas of one (stage, tensor index) form an expert group, whose MoE layers
    exchange tokens with all_to_all (``ep`` divides ``dp``; 1: a dense model)."""

    tp: int
    pp: int
    dp: int
    ep: int = 1

    @property
    def size(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class Fault:
    """One injected event; fields that do not apply to the kind keep their neutral values."""

    kind: str
    onset_s: float
    rank: int = -1
    peer: int = -1
    factor: float = 1.0
    mismatch: str = ""
    compute_factor: float = 1.0
    link_factor: float = 1.0
    delay_s: float = 0.0
    pause_s: float = 0.0
    writer_rank: int = -1
    every_s: float | None = None
    down_s: float = 0.0
    family: str = ""
    on_s: float | None = None  # intermittent slowdown: on for on_s ...
    off_s: float = 0.0  # ... then off for off_s, repeating (None: on from onset to the end)
    comm: str = ""  # a link fault: the family of its communicator (tp, dp, pp)
    nic: int = -1  # a NIC fault: the node whose network links it slows or stops
    #: a link fault's links (family, src, dst): one, or every network link leaving the NIC's node
    links: tuple[tuple[str, int, int], ...] = ()

    @property
    def is_benign(self) -> bool:
        return self.kind in BENIGN_KINDS

    @property
    def bandwidth(self) -> float:
        """The share of its bandwidth a link fault leaves its links: ``factor`` (S2), ``link_factor``
        (S3), none (H3)."""
        return 0.0 if self.kind == "H3" else self.factor if self.kind == "S2" else self.link_factor

    def active(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
        """Whether the fault is in effect at true time ``t`` (any shape; ``inf`` is never)."""
        with np.errstate(invalid="ignore"):
            on = np.isfinite(t) & (t >= self.onset_s)
            if self.on_s is None:
                return on
            phase = np.mod(np.where(on, t - self.onset_s, 0.0), self.on_s + self.off_s)
            return on & (phase < self.on_s)


@dataclass(frozen=True)
class Expectation:
    """One expected root cause: the class and the rank a correct verdict names."""

    kind: str
    rank: int

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rank": self.rank}

    def named_by(self, v: Verdict) -> bool:
        """Whether verdict ``v`` states this root cause: the same class, and the rank among its
        root causes (the one rule the accuracy benchmark, the demo and the golden tests score by)."""
        return v.kind.value == self.kind and self.rank in v.root_cause_ranks


@dataclass(frozen=True)
class Scenario:
    """A simulated job: size, layout, timing, and the faults injected (ground truth in ``expect``)."""

    id: str
    ranks: int
    layout: Layout
    seed: int = 0
    gpus_per_node: int = 8
    channels: int = 4
    step_time_s: float = 2.0
    duration_s: float = 180.0
    clock_skew_s: float = 1.0
    clock_drift_ppm: float = 0.0  # each host's clock runs fast or slow by up to this much
    jitter: float = 0.02
    sample_interval_s: float = 1.0
    faults: tuple[Fault, ...] = ()
    expect: tuple[Expectation, ...] = ()
    workload: Workload | None = None  # None: the simple four-ops-per-step model of engine.py
    hosts: tuple[str, ...] = ()  # one name per node (empty: node-0000, node-0001, ...)
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_healthy(self) -> bool:
        """No expected root cause: every verdict on this scenario is a false alarm."""
        return not self.expect

    def tp_next(self, rank: int) -> int:
        """The next rank of ``rank``'s tensor-parallel ring (wrapping)."""
        tp = self.layout.tp
        return (rank // tp) * tp + (rank % tp + 1) % tp

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    @property
    def nodes(self) -> int:
        return (self.ranks - 1) // self.gpus_per_node + 1

    def host_name(self, node: int) -> str:
        """The name of node ``node``: from ``hosts``, else ``node-NNNN``."""
        return self.hosts[node] if self.hosts else f"node-{node:04d}"

    def link_peers(self, comm: str, rank: int) -> tuple[int, ...]:
        """The ranks ``rank`` sends to in its ``comm`` family (ring successor, pipeline partners)."""
        lay = self.layout
        if comm == "tp":
            return (self.tp_next(rank),) if lay.tp > 1 else ()
        if comm == "dp":
            stride = lay.tp * lay.pp
            return ((rank + stride) % self.ranks,) if lay.dp > 1 else ()
        if comm == "ep":  # every other member of its expert group, the next one first
            return tuple(q for q in self.ep_members(rank) if q != rank) if lay.ep > 1 else ()
        stage = (rank // lay.tp) % lay.pp  # pp: forward to the next stage, backward to the previous
        return tuple(p for p, ok in ((rank + lay.tp, stage < lay.pp - 1), (rank - lay.tp, stage > 0)) if ok)

    def ep_members(self, rank: int) -> tuple[int, ...]:
        """The expert group of ``rank``, starting at the member after it (wrapping)."""
        lay = self.layout
        stride = lay.tp * lay.pp
        dp_i, base = rank // stride, rank % stride
        first = dp_i - dp_i % lay.ep
        order = [first + (dp_i - first + j) % lay.ep for j in range(1, lay.ep + 1)]
        return tuple(base + d * stride for d in order)

    def nic_links(self, node: int) -> tuple[tuple[str, int, int], ...]:
        """Every network link leaving ``node``: (family, src, dst) with src on it and dst on another node."""
        out = []
        for r in range(node * self.gpus_per_node, min((node + 1) * self.gpus_per_node, self.ranks)):
            for comm in LINK_COMMS:
                out += [(comm, r, d) for d in self.link_peers(comm, r) if self.node_of(d) != node]
        return tuple(out)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Scenario:
        """Validate and type one scenario; every problem raises ScenarioError naming it."""
        if not isinstance(d, Mapping):
            raise ScenarioError(f"a scenario is a JSON object, got {type(d).__name__}")
        sid = str(d.get("id", "")).strip()
        if not sid:
            raise ScenarioError("a scenario needs a non-empty 'id'")
        unknown = set(d) - _TOP_KEYS
        if unknown:
            raise ScenarioError(f"scenario {sid}: unknown keys {sorted(unknown)}; known: {sorted(_TOP_KEYS)}")
        ranks = _int(d, "ranks", None, sid, lo=2)
        gpn = _int(d, "gpus_per_node", 8, sid, lo=1)
        layout = _layout(d.get("layout"), ranks, gpn, sid)
        sc = cls(
            id=sid,
            ranks=ranks,
            layout=layout,
            seed=_int(d, "seed", 0, sid, lo=0),
            gpus_per_node=gpn,
            channels=_int(d, "channels", 4, sid, lo=1, hi=MAX_HW_CHANNELS),
            step_time_s=_float(d, "step_time_s", 2.0, sid, lo=0.05),
            duration_s=_float(d, "duration_s", 180.0, sid, lo=1.0),
            clock_skew_s=_float(d, "clock_skew_s", 1.0, sid, lo=0.0),
            clock_drift_ppm=_float(d, "clock_drift_ppm", 0.0, sid, lo=0.0, hi=1000.0),
            jitter=_float(d, "jitter", 0.02, sid, lo=0.0, hi=0.5),
            sample_interval_s=_float(d, "sample_interval_s", 1.0, sid, lo=0.01),
            workload=None if d.get("workload") is None else Workload.from_dict(d["workload"], sid),
            raw=dict(d),
        )
        sc = _replace(sc, hosts=_hosts(d.get("hosts"), sc))
        if layout.ep > 1 and sc.workload is None:
            raise ScenarioError(f"scenario {sid}: expert parallelism (layout ep={layout.ep}) needs the Megatron-style "
                                "workload (a 'workload' object)")
        if layout.ep > 1 and sc.workload is not None and sc.workload.moe_every > sc.workload.layers:
            raise ScenarioError(f"scenario {sid}: workload moe_every = {sc.workload.moe_every} > layers = "
                                f"{sc.workload.layers}: no layer would be a mixture of experts")
        faults = d.get("faults", [])
        expect = d.get("expect", [])
        if not isinstance(faults, list) or not isinstance(expect, list):
            raise ScenarioError(f"scenario {sid}: 'faults' and 'expect' must be lists")
        parsed = tuple(_fault(f, sc, i) for i, f in enumerate(faults))
        exp = tuple(_expectation(e, sc, i) for i, e in enumerate(expect))
        return _replace(sc, faults=parsed, expect=exp)

    def to_dict(self) -> dict[str, Any]:
        """The scenario as given (defaults are not written out)."""
        return dict(self.raw)


def _replace(sc: Scenario, **changes: Any) -> Scenario:
    return dataclasses.replace(sc, **changes)


def _int(d: Mapping[str, Any], key: str, default: int | None, sid: str, lo: int = 0, hi: int | None = None) -> int:
    if key not in d or d[key] is None:
        if default is None:
            raise ScenarioError(f"scenario {sid}: '{key}' is required")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or float(v) != int(v):
        raise ScenarioError(f"scenario {sid}: '{key}' must be an integer, got {v!r}")
    v = int(v)
    if v < lo or (hi is not None and v > hi):
        raise ScenarioError(f"scenario {sid}: '{key}' = {v} out of range [{lo}, {hi if hi is not None else 'inf'}]")
    return v


def _float(
    d: Mapping[str, Any], key: str, default: float | None, sid: str, lo: float = 0.0, hi: float | None = None
) -> float:
    if key not in d or d[key] is None:
        if default is None:
            raise ScenarioError(f"scenario {sid}: '{key}' is required")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
        raise ScenarioError(f"scenario {sid}: '{key}' must be a finite number, got {v!r}")
    v = float(v)
    if v < lo or (hi is not None and v > hi):
        raise ScenarioError(f"scenario {sid}: '{key}' = {v} out of range [{lo}, {hi if hi is not None else 'inf'}]")
    return v


def _layout(raw: Any, ranks: int, gpn: int, sid: str) -> Layout:
    if raw is None:
        tp = min(gpn, ranks)
        raw = {"tp": tp, "pp": 1, "dp": ranks // tp}
    if not isinstance(raw, Mapping) or set(raw) - {"tp", "pp", "dp", "ep"}:
        raise ScenarioError(f"scenario {sid}: 'layout' must be an object with keys tp, pp, dp (and ep)")
    tp = _int(raw, "tp", 1, sid, lo=1)
    pp = _int(raw, "pp", 1, sid, lo=1)
    dp = _int(raw, "dp", max(ranks // (tp * pp), 1), sid, lo=1)
    ep = _int(raw, "ep", 1, sid, lo=1)
    layout = Layout(tp, pp, dp, ep)
    if layout.size != ranks:
        raise ScenarioError(f"scenario {sid}: layout tp*pp*dp = {tp}*{pp}*{dp} = {layout.size} != ranks {ranks}")
    if tp > gpn or gpn % tp:
        raise ScenarioError(f"scenario {sid}: tensor-parallel groups ({tp}) must fit a node of {gpn} GPUs")
    if dp % ep:
        raise ScenarioError(f"scenario {sid}: expert groups (ep={ep}) must divide the data-parallel size {dp}")
    return layout


def _fault(raw: Any, sc: Scenario, i: int) -> Fault:
    where = f"scenario {sc.id}: fault #{i}"
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where} must be an object")
    kind = raw.get("kind")
    if kind not in FAULT_FIELDS:
        raise ScenarioError(f"{where}: unknown kind {kind!r}; known: {', '.join(FAULT_FIELDS)}")
    spec = FAULT_FIELDS[kind]
    unknown = set(raw) - set(spec) - {"kind"}
    if unknown:
        raise ScenarioError(f"{where} ({kind}): unknown keys {sorted(unknown)}; known: {sorted(spec)}")
    vals = {k: raw.get(k, v) for k, v in spec.items()}
    f: dict[str, Any] = {"kind": kind}
    f["onset_s"] = _float(vals, "onset_s", 60.0, sc.id, lo=0.0)
    if f["onset_s"] >= sc.duration_s:
        raise ScenarioError(f"{where}: onset_s {f['onset_s']} is not before duration_s {sc.duration_s}")
    if "peer" in spec:
        f.update(_link_target(raw, vals, sc, where, kind))
    elif "rank" in spec:
        f["rank"] = _int(vals, "rank", None, sc.id, lo=0, hi=sc.ranks - 1)
    if kind == "H2":
        if vals["mismatch"] not in MISMATCH_FIELDS:
            raise ScenarioError(f"{where}: mismatch must be one of {MISMATCH_FIELDS}, got {vals['mismatch']!r}")
        if vals["mismatch"] == "order" and sc.layout.dp < 2:
            raise ScenarioError(f"{where}: an 'order' mismatch needs data-parallel groups (dp >= 2)")
        if sc.layout.tp < 2 and sc.layout.dp < 2:
            raise ScenarioError(f"{where}: H2 needs a collective group (tp >= 2 or dp >= 2)")
        f["mismatch"] = vals["mismatch"]
    if kind == "S1":
        f["factor"] = _float(vals, "factor", None, sc.id, lo=1.0)
    if kind == "S2":
        f["factor"] = _float(vals, "factor", None, sc.id, lo=1e-3, hi=1.0)
    if kind == "S3":
        f["compute_factor"] = _float(vals, "compute_factor", None, sc.id, lo=1.0)
        f["link_factor"] = _float(vals, "link_factor", None, sc.id, lo=1e-3, hi=1.0)
    if kind in ("restart", "recreate") and sc.workload is None:
        raise ScenarioError(f"{where}: {kind} needs the Megatron-style workload (a 'workload' object)")
    if kind == "restart":
        f["down_s"] = _float(vals, "down_s", None, sc.id, lo=0.0)
    if kind == "recreate":
        if vals["family"] not in RECREATE_FAMILIES:
            raise ScenarioError(f"{where}: family must be one of {RECREATE_FAMILIES}, got {vals['family']!r}")
        f["family"] = vals["family"]
    if "on_s" in spec and vals["on_s"] is not None:
        f["on_s"] = _float(vals, "on_s", None, sc.id, lo=sc.step_time_s)
        f["off_s"] = _float(vals, "off_s", 0.0, sc.id, lo=0.0)
    if kind == "transient":
        f["delay_s"] = _float(vals, "delay_s", None, sc.id, lo=0.0)
    if kind == "checkpoint":
        f["pause_s"] = _float(vals, "pause_s", None, sc.id, lo=0.0)
        f["writer_rank"] = _int(vals, "writer_rank", None, sc.id, lo=0, hi=sc.ranks - 1)
        if vals["every_s"] is not None:
            f["every_s"] = _float(vals, "every_s", None, sc.id, lo=sc.step_time_s)
    return Fault(**f)


def _link_target(raw: Mapping[str, Any], vals: Mapping[str, Any], sc: Scenario, where: str, kind: str
                 ) -> dict[str, Any]:
    """rank, peer, comm, nic and links of a link fault (one link of a family, or a host's NIC)."""
    if vals.get("nic") is not None:
        extra = sorted({"rank", "peer", "comm"} & set(raw))
        if extra:
            raise ScenarioError(f"{where}: a NIC fault names its node only ('nic'), not {extra}")
        node = _node(vals["nic"], sc, where)
        if sc.workload is None:
            raise ScenarioError(f"{where}: a NIC fault needs the Megatron-style workload (a 'workload' object)")
        links = sc.nic_links(node)
        if not links:
            raise ScenarioError(f"{where}: node {node} has no network link (every peer of its ranks is on it)")
        return {"rank": min(src for _, src, _ in links), "peer": -1, "comm": "", "nic": node, "links": links}
    rank = _int(vals, "rank", None, sc.id, lo=0, hi=sc.ranks - 1)
    comm = vals["comm"]
    if comm not in LINK_COMMS:
        raise ScenarioError(f"{where}: comm must be one of {LINK_COMMS}, got {comm!r}")
    if comm != "tp" and sc.workload is None:
        raise ScenarioError(f"{where}: a link of comm {comm!r} needs the Megatron-style workload (a 'workload' object)")
    peers = sc.link_peers(comm, rank)
    peer = (peers[0] if peers else -1) if vals["peer"] is None else _int(vals, "peer", None, sc.id, lo=0)
    if peer not in peers:
        size = {"tp": sc.layout.tp, "dp": sc.layout.dp, "pp": sc.layout.pp, "ep": sc.layout.ep}[comm]
        if comm == "tp":
            rule = "the next rank of the same tensor-parallel group"
        elif comm == "dp":
            rule = "the next rank of the same data-parallel ring (rank + tp*pp, wrapping)"
        elif comm == "ep":
            rule = "another member of the same expert group (ep consecutive data-parallel replicas)"
        else:
            rule = "the rank of the adjacent pipeline stage (rank + tp forward, rank - tp backward)"
        raise ScenarioError(
            f"{where}: link {rank}->{peer} does not exist; {'an' if comm == 'ep' else 'a'} {comm} link fault "
            f"needs peer = {rule} "
            f"({comm}={size}{', no links' if not peers else ', so peer ' + ' or '.join(map(str, peers))})"
        )
    return {"rank": rank, "peer": peer, "comm": comm, "links": ((comm, rank, peer),)}


def _hosts(v: Any, sc: Scenario) -> tuple[str, ...]:
    """``hosts``: absent, or one distinct non-empty name per node."""
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(h, str) and h.strip() for h in v):
        raise ScenarioError(f"scenario {sc.id}: 'hosts' must be a list of host names, got {v!r}")
    if len(v) != sc.nodes or len(set(v)) != len(v):
        raise ScenarioError(f"scenario {sc.id}: 'hosts' needs {sc.nodes} distinct names (one per node of "
                            f"{sc.gpus_per_node} GPUs), got {len(v)} ({len(set(v))} distinct)")
    return tuple(str(h) for h in v)


def _node(v: Any, sc: Scenario, where: str) -> int:
    """A node index from ``3``, ``"node-0003"`` or (with ``hosts``) the node's host name."""
    node = v
    if isinstance(v, str) and v in sc.hosts:
        node = sc.hosts.index(v)
    elif isinstance(v, str) and v.startswith("node-") and v[5:].isdigit():
        node = int(v[5:])
    if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < sc.nodes:
        raise ScenarioError(f"{where}: nic must be a node index 0..{sc.nodes - 1}, 'node-NNNN' or a name of "
                            f"'hosts', got {v!r}")
    return node


def _expectation(raw: Any, sc: Scenario, i: int) -> Expectation:
    where = f"scenario {sc.id}: expect #{i}"
    if not isinstance(raw, Mapping) or set(raw) != {"kind", "rank"}:
        raise ScenarioError(f"{where} must be an object with exactly the keys kind and rank")
    if raw["kind"] not in HANG_KINDS + SLOW_KINDS:
        raise ScenarioError(f"{where}: kind must be one of {HANG_KINDS + SLOW_KINDS}, got {raw['kind']!r}")
    return Expectation(str(raw["kind"]), _int(raw, "rank", None, sc.id, lo=0, hi=sc.ranks - 1))


def iter_scenarios(path: str | Path) -> Iterator[Scenario]:
    """Scenarios of a JSON-lines file (blank lines and lines starting with # are skipped)."""
    p = Path(path)
    try:
        lines = p.read_text().splitlines()
    except OSError as exc:
        raise ScenarioError(f"cannot read scenarios from {p}: {exc}") from exc
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ScenarioError(f"{p}:{n}: not JSON: {exc}") from exc
        try:
            sc = Scenario.from_dict(d)
        except ScenarioError as exc:
            raise ScenarioError(f"{p}:{n}: {exc}") from exc
        if sc.id in seen:
            raise ScenarioError(f"{p}:{n}: duplicate scenario id {sc.id!r}")
        seen.add(sc.id)
        yield sc


def load_scenarios(path: str | Path) -> list[Scenario]:
    return list(iter_scenarios(path))
