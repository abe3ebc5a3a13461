"""The simulator emits what a real probe would: record semantics, clocks, counters, faults."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from ccld.producers.simulator.engine import IN_FLIGHT
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import DType, KernelRecord, OpType, Status

Key = tuple[int, int, int]  # comm, rank, op_seq


def run(**kw: Any) -> tuple[list[tuple[float, KernelRecord]], Scenario]:
    d: dict[str, Any] = {"id": "t", "seed": 5, "ranks": 16, "layout": {"tp": 4, "pp": 2, "dp": 2},
                         "duration_s": 40, "step_time_s": 1.0, "clock_skew_s": 2.0}
    d.update(kw)
    sc = Scenario.from_dict(d)
    out: list[tuple[float, KernelRecord]] = []
    last = 0.0
    for t, batch in simulate(sc):
        assert t >= last  # non-decreasing delivery time
        last = t
        assert len(set(batch.col("rank").tolist())) <= batch.n
        out.extend((t, r) for r in batch.records())
    return out, sc


def by_op(recs: list[tuple[float, KernelRecord]]) -> dict[Key, list[KernelRecord]]:
    ops: dict[Key, list[KernelRecord]] = defaultdict(list)
    for _, r in recs:
        ops[(r.comm_hash, r.rank, r.op_seq)].append(r)
    return ops


def test_healthy_run_obeys_record_semantics() -> None:
    recs, sc = run()
    ops = by_op(recs)
    assert ops
    seqs: dict[tuple[int, int], list[int]] = defaultdict(list)
    for (comm, rank, seq), rs in ops.items():
        seqs[(comm, rank)].append(seq)
        statuses = [r.status for r in rs]
        assert statuses.count(Status.DONE) <= 1 and statuses.count(Status.ENTERED) <= 1
        if Status.ENTERED in statuses:
            assert statuses[0] == Status.ENTERED
        if Status.DONE in statuses:
            assert statuses[-1] == Status.DONE
        assert len({r.t_enter_ns for r in rs}) == 1  # one enter time per op on a rank
        assert len({(r.op_type, r.dtype, r.count, r.peer) for r in rs}) == 1
        for r in rs:
            assert r.t_enter_ns > 0 and r.t_sample_ns >= r.t_enter_ns
            if r.status == Status.DONE:
                assert r.t_exit_ns == r.t_sample_ns >= r.t_enter_ns
            else:
                assert r.t_exit_ns == -1
            if r.status == Status.ENTERED:
                assert r.t_sample_ns == r.t_enter_ns
            assert len(r.send_counts) == sc.channels
        sends = np.array([r.send_counts for r in rs])
        recvs = np.array([r.recv_counts for r in rs])
        assert (np.diff(sends, axis=0) >= 0).all() and (np.diff(recvs, axis=0) >= 0).all()
    for s in seqs.values():  # op_seq per communicator: 0, 1, 2, ... with no gap on every rank
        assert sorted(s) == list(range(len(s)))
    # a healthy fast op is its DONE record, plus one PROGRESS only where a 100 ms poll fell inside it
    fast = defaultdict(list)
    for _, r in recs:
        if r.op_type == OpType.ALL_REDUCE:
            fast[(r.comm_hash, r.rank, r.op_seq)].append(r.status)
    assert fast and all(st[-1] == Status.DONE and st[:-1] in ([], [Status.PROGRESS]) for st in fast.values())
    assert any(st == [Status.DONE] for st in fast.values())


def test_clock_skew_separates_hosts_but_not_ranks_of_one_host() -> None:
    recs, _ = run(ranks=32, layout={"tp": 8, "pp": 1, "dp": 4}, duration_s=20)
    exits: dict[tuple[int, int], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for _, r in recs:
        if r.status == Status.DONE:
            exits[(r.comm_hash, r.op_seq)][r.host].append(r.t_exit_ns)
    cross: list[float] = []
    inside: list[float] = []
    for hosts in exits.values():
        means = [np.mean(v) for v in hosts.values()]
        if len(means) > 1:
            cross.append(float(max(means) - min(means)) / 1e9)
        inside.extend((max(v) - min(v)) / 1e9 for v in hosts.values())
    # members of a ring leave together: same-host exits agree, hosts disagree by their skew
    assert max(inside) < 0.05
    assert max(cross) > 0.5


def test_slow_link_sender_recv_runs_ahead_of_send() -> None:
    recs, sc = run(faults=[{"kind": "S2", "rank": 5, "onset_s": 15, "factor": 0.05}])
    lead: dict[int, list[int]] = defaultdict(list)
    for t, r in recs:
        if r.op_type == OpType.ALL_REDUCE and r.status == Status.PROGRESS and t > 16:
            lead[r.rank].append(r.recv_counts[0] - r.send_counts[0])
    assert lead[5] and min(lead[5]) > 0 and max(lead[5]) <= IN_FLIGHT  # sender of the slow link
    assert max(lead[6]) < 0  # its peer: starved, sends ahead of what it receives
    assert all(max(v) <= 0 for rank, v in lead.items() if rank != 5)
    before = [r.t_exit_ns - r.t_enter_ns for t, r in recs if r.rank == 4 and r.op_type == OpType.ALL_REDUCE
              and r.status == Status.DONE and t < 14]
    after = [r.t_exit_ns - r.t_enter_ns for t, r in recs if r.rank == 4 and r.op_type == OpType.ALL_REDUCE
             and r.status == Status.DONE and t > 18]
    assert np.median(after) > 5 * np.median(before)


def test_h1_rank_never_enters_and_peers_heartbeat_with_frozen_counters() -> None:
    recs, sc = run(faults=[{"kind": "H1", "rank": 6, "onset_s": 15}])
    tp_comm = {r.rank: r.comm_hash for _, r in recs if r.op_type == OpType.ALL_REDUCE}
    comm = tp_comm[6]
    last_seq = {rk: max(r.op_seq for _, r in recs if r.comm_hash == comm and r.rank == rk) for rk in (4, 5, 6, 7)}
    k = last_seq[4]
    assert last_seq[5] == last_seq[7] == k and last_seq[6] == k - 1
    assert max(t for t, r in recs if r.rank == 6) < 17  # the culprit goes silent
    beats = [(t, r) for t, r in recs if r.comm_hash == comm and r.op_seq == k and r.rank == 4]
    assert beats[-1][0] > sc.duration_s - 1.5  # heartbeats until the end of the run
    assert all(r.status != Status.DONE for _, r in beats)
    assert {r.send_counts for _, r in beats if r.status == Status.PROGRESS} == {(0,) * sc.channels}


def test_h3_freezes_consistent_op_with_backlog_at_the_dead_link() -> None:
    recs, sc = run(faults=[{"kind": "H3", "rank": 1, "onset_s": 15}])
    stuck = [r for t, r in recs if t > 30 and r.op_type == OpType.ALL_REDUCE and r.rank < 4]
    assert {r.rank for r in stuck} == {0, 1, 2, 3}
    assert len({(r.op_seq, r.op_type, r.dtype, r.count) for r in stuck}) == 1  # consistent signatures
    last = {r.rank: (r.send_counts[0], r.recv_counts[0]) for r in stuck}
    first_frozen = {r.rank: (r.send_counts[0], r.recv_counts[0]) for r in reversed(stuck)}
    assert last == first_frozen  # counters do not move
    s1, r1 = last[1]
    assert r1 - s1 == IN_FLIGHT  # data backs up in front of the dead link 1->2
    assert 0 < s1 < stuck[0].count  # it stopped mid-operation


def test_h2_mismatch_names_one_field_on_the_culprit() -> None:
    recs, _ = run(faults=[{"kind": "H2", "rank": 2, "onset_s": 15, "mismatch": "dtype"}])
    hung = [r for t, r in recs if t > 30 and r.op_type == OpType.ALL_REDUCE and r.rank < 4]
    assert {r.rank: r.dtype for r in hung} == {0: DType.BFLOAT16, 1: DType.BFLOAT16, 2: DType.FLOAT32,
                                               3: DType.BFLOAT16}
    recs, _ = run(faults=[{"kind": "H2", "rank": 2, "onset_s": 15, "mismatch": "order"}])
    dp = {r.rank: r.op_type for t, r in recs if t > 30 and r.comm_size == 2 and r.op_type in
          (OpType.REDUCE_SCATTER, OpType.ALL_GATHER)}
    assert dp[2] == OpType.ALL_GATHER and dp[10] == OpType.REDUCE_SCATTER


def test_same_seed_same_output_other_seed_differs() -> None:
    def digest(seed: int) -> list[tuple[float, int, bytes]]:
        sc = Scenario.from_dict({"id": "d", "seed": seed, "ranks": 16, "duration_s": 20, "jitter": 0.05})
        return [(t, b.comm_hash, b.col("t_exit_ns").tobytes() + b.send.tobytes()) for t, b in simulate(sc)]

    assert digest(3) == digest(3)
    assert digest(3) != digest(4)


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[int | None, int]] = []

    def send_batch(self, batch: object, timestamp_ms: int | None = None) -> bool:
        self.sent.append((timestamp_ms, getattr(batch, "n", 0)))
        return True


def test_publish_stamps_each_batch_with_its_simulated_delivery_time() -> None:
    from ccld.producers.simulator.publish import publish
    from ccld.stack.bench import _Shifted

    sc = Scenario.from_dict({"id": "p", "ranks": 8, "duration_s": 15})
    fake = FakeProducer()
    counts = publish(sc, fake)
    want = [(int(t * 1000), b.n) for t, b in simulate(sc)]
    assert fake.sent == want and counts == {"batches": len(want), "records": sum(n for _, n in want), "refused": 0}
    shifted = FakeProducer()
    publish(sc, _Shifted(shifted, 1000.0))
    assert [ts for ts, _ in shifted.sent] == [ts + 1_000_000 for ts, _ in want if ts is not None]


def test_a_done_record_says_where_the_ranks_previous_op_ended() -> None:
    """As the probe and the attachment do: the latest exit of the same rank's ops on any communicator at or
    before this op's entry (its own clock), -1 before its first; read back from the records themselves."""
    recs, _ = run(layout={"tp": 2, "pp": 4, "dp": 2}, duration_s=20)
    done: dict[int, list[KernelRecord]] = defaultdict(list)
    for _, r in recs:
        if r.status == Status.DONE:
            done[r.rank].append(r)
    assert len(done) == 16
    n_gap = 0
    for rs in done.values():
        exits = np.sort(np.array([r.t_exit_ns for r in rs]))
        for r in rs:
            j = int(np.searchsorted(exits, r.t_enter_ns, side="right")) - 1
            want = int(exits[j]) if j >= 0 and exits[j] != r.t_exit_ns else -1
            assert r.t_prev_exit_ns == want, r
            n_gap += want >= 0 and r.t_enter_ns > want
    assert n_gap > 100  # ranks compute between ops: the gaps are not all zero
