"""The worker's fast value check agrees with the detailed checks it stands in for."""

from __future__ import annotations

import numpy as np

from ccld.records import KernelBatch, batch_value_problems
from factories import make_kernel_record


def test_the_fast_value_check_never_passes_what_the_detailed_checks_refuse() -> None:
    """``batch_value_problems`` runs every column check only when a few array passes find something:
    one random cell per batch set to a value at or beyond the edge of what is possible, the fast path
    must agree with the detailed checks forced on."""
    import ccld.records as records

    rng = np.random.default_rng(11)
    base = KernelBatch.from_records([make_kernel_record(rank=r, comm_rank=r, send_counts=(5, 6), recv_counts=(7, 8))
                                     for r in range(4)])
    edges = [-(1 << 63), -2, -1, 0, 1, 3, 4, 5, 9, 10, 14, 15, 16, (1 << 62), (1 << 62) + 1, (1 << 63) - 1]
    names = sorted(base.columns)
    tried = refused = 0
    for _ in range(600):
        cols = {k: v.copy() for k, v in base.columns.items()}
        send, recv = base.send.copy(), base.recv.copy()
        target = names[int(rng.integers(len(names)))] if rng.random() < 0.85 else str(rng.choice(["send", "recv"]))
        value = edges[int(rng.integers(len(edges)))]
        row = int(rng.integers(base.n))
        if target in ("send", "recv"):
            (send if target == "send" else recv)[row, int(rng.integers(2))] = value
        else:
            cols[target][row] = value
        try:
            b = KernelBatch(job=base.job, incarnation=0, comm_hash=base.comm_hash, world_size=4, hosts=base.hosts,
                            columns=cols, send=send, recv=recv)
        except Exception:  # noqa: BLE001 - refused at construction (host index, negative rank): not a value check
            continue
        fast = batch_value_problems(b)
        original = records._all_plausible
        records._all_plausible = lambda _b: False  # type: ignore[assignment]
        try:
            detailed = batch_value_problems(b)
        finally:
            records._all_plausible = original
        assert fast == detailed, (target, row, value)
        tried += 1
        refused += bool(detailed)
    assert tried > 400 and 50 < refused < tried  # both outcomes were exercised


def test_a_row_that_left_its_op_before_it_entered_it_is_refused() -> None:
    """t_exit < t_enter on one rank's own clock is no measurement (issue 18: 240 such batches were analysed
    silently); an exit inside its own uncertainty of the entry is still fine."""
    late = KernelBatch.from_records([make_kernel_record(t_enter_ns=5_000_000, t_exit_ns=4_000_000)])
    assert batch_value_problems(late) == ["t_exit_ns before t_enter_ns (by more than t_exit_err_ns) in 1 of 1 rows "
                                          "(first row 0: 4000000)"]
    within = KernelBatch.from_records([make_kernel_record(t_enter_ns=5_000_000, t_exit_ns=4_000_000,
                                                          t_exit_err_ns=1_000_000)])
    assert batch_value_problems(within) == []
    assert batch_value_problems(KernelBatch.from_records([make_kernel_record(t_exit_ns=-1)])) == []
