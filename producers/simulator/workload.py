"""The Megatron-style workload of a scenario: its parameters and the op sizes and times they give.

A scenario with a ``workload`` object is simulated op by op the way a tensor-, pipeline- and
data-parallel job issues its collectives (``megatron.py``); one without it keeps the simple model
of ``engine.py`` (four ops per step), so every scenario file written before stays valid.

Sizes come from the model shape, times from size and bandwidth (NVLink inside a node, the
network across nodes), so op durations of 50 us to tens of ms and 100 to 1,000 collectives per
second per rank come out of the model rather than out of a constant:

- activations of one micro-batch: ``seq_len x hidden`` bf16 values;
- tensor-parallel ring all-reduce after attention and after the MLP of every layer, forward and
  backward (with ``seq_parallel``: an all-gather before and a reduce-scatter after each instead);
- pipeline send/recv of the activations (forward) and their gradients (backward) between stages;
- data-parallel gradient reduce-scatter in ``dp_buckets`` buckets, issued during the backward
  pass of the last micro-batch and overlapping it, then the parameter all-gather (distributed
  optimizer) of the same buckets at the end of the step;
- ``12 x hidden^2`` parameters per layer, sharded over the tensor-parallel group;
- with expert parallelism (layout ``ep`` > 1), every ``moe_every``-th layer's MLP is a mixture of
  experts: after the attention's tensor-parallel op the tokens of the micro-batch are dispatched to
  their ``topk`` experts with an all_to_all over the expert group, the experts compute, and a second
  all_to_all combines them (forward and backward); each rank's routed count differs from op to op
  (what the router sent it), so the all_to_all's count is every rank's own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ccld.errors import ScenarioError

LATENCY_S = 15e-6  # launch + first-hop latency of any collective


@dataclass(frozen=True)
class Workload:
    """Shape and speed of the simulated model; every field optional in a scenario file."""

    microbatches: int = 4  # per step and pipeline stage (1F1B schedule)
    layers: int = 2  # transformer layers per pipeline stage
    layer_ms: float = 4.0  # forward compute of one layer for one micro-batch (backward: 2x)
    hidden: int = 4096
    seq_len: int = 2048
    seq_parallel: bool = False  # all-gather + reduce-scatter instead of all-reduce (tensor parallel)
    dp_buckets: int = 4  # gradient buckets reduce-scattered during the backward pass
    nvlink_gbps: float = 200.0  # GB/s inside a node
    net_gbps: float = 25.0  # GB/s per rank across nodes
    eval_every: int = 0  # steps between evaluation phases (forward only, no gradient sync); 0: none
    eval_steps: int = 2  # steps per evaluation phase
    pause_rate: float = 0.0  # chance per rank and step of a pause before its step (GC, data loader)
    pause_ms: float = 100.0  # how long such a pause lasts at most
    moe_every: int = 1  # with layout ep > 1: every moe_every-th layer of a stage is a mixture of experts
    topk: int = 2  # experts each token is routed to

    @classmethod
    def from_dict(cls, d: Any, sid: str) -> Workload:
        where = f"scenario {sid}: workload"
        if not isinstance(d, Mapping):
            raise ScenarioError(f"{where} must be an object")
        known = {f.name: f for f in fields(cls)}
        unknown = set(d) - set(known) - {"kind"}
        if unknown:
            raise ScenarioError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
        if d.get("kind", "megatron") != "megatron":
            raise ScenarioError(f"{where}: kind must be 'megatron', got {d.get('kind')!r}")
        limits: dict[str, tuple[float, float]] = {
            "microbatches": (1, 64), "layers": (1, 32), "layer_ms": (0.05, 1000.0), "hidden": (256, 65536),
            "seq_len": (64, 1 << 20), "dp_buckets": (1, 64), "nvlink_gbps": (1.0, 10000.0),
            "net_gbps": (0.1, 10000.0), "eval_every": (0, 100000), "eval_steps": (1, 1000),
            "pause_rate": (0.0, 1.0), "pause_ms": (0.0, 60000.0), "moe_every": (1, 32), "topk": (1, 16),
        }
        out: dict[str, Any] = {}
        for name, f in known.items():
            if name not in d:
                continue
            v = d[name]
            if f.type in ("bool", bool):
                if not isinstance(v, bool):
                    raise ScenarioError(f"{where}: {name!r} must be true or false, got {v!r}")
                out[name] = v
                continue
            integral = f.type in ("int", int)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)) or (
                integral and float(v) != int(v)
            ):
                raise ScenarioError(f"{where}: {name!r} must be a{'n integer' if integral else ' number'}, got {v!r}")
            lo, hi = limits[name]
            if not lo <= v <= hi:
                raise ScenarioError(f"{where}: {name!r} = {v} out of range [{lo}, {hi}]")
            out[name] = int(v) if integral else float(v)
        return cls(**out)

    # -- sizes and times ------------------------------------------------------------------------
    @property
    def act_bytes(self) -> float:
        return 2.0 * self.seq_len * self.hidden

    @property
    def act_elems(self) -> int:
        return self.seq_len * self.hidden

    def grad_bytes(self, tp: int) -> float:
        """Gradient bytes of one tensor-parallel shard of one stage (bf16)."""
        return 2.0 * 12 * self.hidden * self.hidden * self.layers / tp

    def tp_op_s(self, tp: int) -> float:
        """One tensor-parallel ring collective on the activations (NVLink)."""
        factor = (tp - 1) / tp * (1.0 if self.seq_parallel else 2.0)
        return LATENCY_S + factor * self.act_bytes / (self.nvlink_gbps * 1e9)

    def pp_op_s(self, same_node: bool) -> float:
        return LATENCY_S + self.act_bytes / ((self.nvlink_gbps if same_node else self.net_gbps) * 1e9)

    def dp_op_s(self, tp: int, dp: int) -> float:
        """One bucket's reduce-scatter (or all-gather) over the data-parallel ring (network)."""
        return LATENCY_S + (dp - 1) / dp * self.grad_bytes(tp) / self.dp_buckets / (self.net_gbps * 1e9)

    def a2a_op_s(self, ep: int, same_node: bool) -> float:
        """One MoE dispatch (or combine) all_to_all: a micro-batch's tokens to their ``topk``
        experts, of which ``(ep - 1) / ep`` leave the rank (NVLink or the network)."""
        gbps = self.nvlink_gbps if same_node else self.net_gbps
        return LATENCY_S + self.topk * (ep - 1) / ep * self.act_bytes / (gbps * 1e9)

    @property
    def fwd_s(self) -> float:
        return self.layer_ms / 1000.0

    @property
    def tp_ops_per_layer(self) -> int:
        return 4 if self.seq_parallel else 2
