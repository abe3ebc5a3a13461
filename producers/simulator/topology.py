"""Who talks to whom: hosts, tensor/pipeline/data-parallel communicators and their hashes.

Rank order is tensor-parallel fastest, then pipeline stage, then data-parallel replica:
``rank = (dp_i * pp + pp_i) * tp + tp_i``. Tensor groups are consecutive ranks inside one node
(``rank // tp``) and their rings run in increasing rank order; data-parallel groups join the
ranks of one (stage, tensor index); pipeline traffic uses one two-rank communicator per pair of
adjacent stages (the way PyTorch creates a communicator per send/recv pair); expert groups
(layout ``ep`` > 1) join ``ep`` consecutive data-parallel replicas of one (stage, tensor index) for
the MoE layers' all_to_all; ``world`` is used for barriers. Communicator hashes are derived only
from a family tag and the group's ranks, so they are the same on every rank and in every run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ccld.producers.simulator.scenario import Scenario
from ccld.records import to_signed64

I64 = npt.NDArray[np.int64]


def comm_hash_of(tag: str, ranks: npt.ArrayLike) -> int:
    """Deterministic signed 64-bit communicator hash from a family tag and the member ranks."""
    h = hashlib.blake2b(tag.encode() + np.asarray(ranks, dtype="<i8").tobytes(), digest_size=8)
    return to_signed64(int.from_bytes(h.digest(), "little"))


@dataclass(frozen=True, eq=False)
class Topology:
    """Communicator tables of one job; per-rank arrays are indexed by global rank."""

    n: int
    tp: int
    pp: int
    dp: int
    host_of: I64  # rank -> node index
    hosts: tuple[str, ...]
    comm_hash: tuple[int, ...]  # comm id -> signed hash
    comm_size: tuple[int, ...]
    comm_hosts: tuple[tuple[str, ...], ...]  # comm id -> host table of its batches
    comm_family: tuple[str, ...]
    tp_comm: I64  # rank -> tensor comm id (-1 when tp == 1)
    tp_crank: I64
    dp_comm: I64  # rank -> data-parallel comm id (-1 when dp == 1)
    dp_crank: I64
    dp_lhost: I64  # rank -> index of its host in its data-parallel comm's host table
    pps_comm: I64  # rank -> pair comm where it sends to the next stage (-1 on the last stage)
    pps_lhost: I64
    ppr_comm: I64  # rank -> pair comm where it receives from the previous stage (-1 on stage 0)
    ppr_lhost: I64
    world_comm: int
    ep_comm: I64 | None = None  # rank -> expert group comm id (None: a dense model, ep == 1)
    ep_crank: I64 | None = None

    @property
    def n_comms(self) -> int:
        return len(self.comm_hash)

    def stage_ranks(self, p: int) -> I64:
        """Ranks of pipeline stage ``p`` in increasing order (tensor groups contiguous)."""
        r = np.arange(self.n, dtype=np.int64)
        return r[(r // self.tp) % self.pp == p]

    @classmethod
    def build(cls, sc: Scenario) -> Topology:
        n, tp, pp, dp = sc.ranks, sc.layout.tp, sc.layout.pp, sc.layout.dp
        r = np.arange(n, dtype=np.int64)
        host_of = r // sc.gpus_per_node
        hosts = tuple(sc.host_name(i) for i in range(int(host_of[-1]) + 1))
        tp_i, pp_i, dp_i = r % tp, (r // tp) % pp, r // (tp * pp)
        hashes: list[int] = []
        sizes: list[int] = []
        chosts: list[tuple[str, ...]] = []
        fams: list[str] = []
        neg = np.full(n, -1, dtype=np.int64)
        zero = np.zeros(n, dtype=np.int64)

        def add(tag: str, members: I64) -> int:
            hashes.append(comm_hash_of(tag, members))
            sizes.append(int(members.shape[0]))
            # members are sorted, so their nodes are non-decreasing and unique() keeps that order
            chosts.append(tuple(hosts[h] for h in np.unique(host_of[members]).tolist()))
            fams.append(tag)
            return len(hashes) - 1

        tp_comm, tp_crank = neg.copy(), zero.copy()
        if tp > 1:
            for g in range(n // tp):
                tp_comm[g * tp : (g + 1) * tp] = add("tp", r[g * tp : (g + 1) * tp])
            tp_crank = tp_i.copy()
        dp_comm, dp_crank, dp_lhost = neg.copy(), zero.copy(), zero.copy()
        if dp > 1:
            for p in range(pp):
                for t in range(tp):
                    members = r[(pp_i == p) & (tp_i == t)]
                    dp_comm[members] = add("dp", members)
                    _, inv = np.unique(host_of[members], return_inverse=True)
                    dp_lhost[members] = inv
            dp_crank = dp_i.copy()
        pps_comm, pps_lhost, ppr_comm, ppr_lhost = neg.copy(), zero.copy(), neg.copy(), zero.copy()
        if pp > 1:
            for src in r[pp_i < pp - 1].tolist():
                dst = src + tp
                cid = add("pp", np.array([src, dst], dtype=np.int64))
                pps_comm[src] = ppr_comm[dst] = cid
                ppr_lhost[dst] = 0 if host_of[src] == host_of[dst] else 1
        ep_comm = ep_crank = None
        ep = sc.layout.ep
        if ep > 1:
            ep_comm, ep_crank = neg.copy(), dp_i % ep
            for p in range(pp):
                for t in range(tp):
                    for g in range(dp // ep):
                        members = r[(pp_i == p) & (tp_i == t) & (dp_i // ep == g)]
                        ep_comm[members] = add("ep", members)
        world = add("world", r)
        return cls(
            n=n, tp=tp, pp=pp, dp=dp, host_of=host_of, hosts=hosts, comm_hash=tuple(hashes),
            comm_size=tuple(sizes), comm_hosts=tuple(chosts), comm_family=tuple(fams),
            tp_comm=tp_comm, tp_crank=tp_crank, dp_comm=dp_comm, dp_crank=dp_crank, dp_lhost=dp_lhost,
            pps_comm=pps_comm, pps_lhost=pps_lhost, ppr_comm=ppr_comm, ppr_lhost=ppr_lhost,
            world_comm=world, ep_comm=ep_comm, ep_crank=ep_crank,
        )
