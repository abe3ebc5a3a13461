"""The reference ring schedule: numpy emulation reduces and gathers correctly; counts; hangs."""

from __future__ import annotations

import numpy as np
import pytest

from ccld.probe.errors import ProbeError
from ccld.probe.ring_plan import RingOp, channel_range, emulate, expected_counts, fold, frozen_counts


@pytest.mark.parametrize("nranks", [2, 3, 4])
@pytest.mark.parametrize(("n", "channels", "slot"), [(0, 2, 4), (5, 8, 1), (333, 3, 16), (1000, 8, 7)])
def test_emulated_allreduce_and_allgather(nranks: int, n: int, channels: int, slot: int) -> None:
    rng = np.random.default_rng(n + nranks)
    ins = [rng.integers(-1000, 1000, n).astype(np.float32) for _ in range(nranks)]
    counts: dict[tuple[int, int, str], int] = {}

    def hook(rank: int, ch: int, kind: str) -> None:
        counts[(rank, ch, kind)] = counts.get((rank, ch, kind), 0) + 1

    out = emulate(RingOp.ALL_REDUCE, ins, channels, slot, 2, hook)
    want = np.sum(np.stack(ins), axis=0) if n else np.zeros(0, np.float32)
    for o in out:
        np.testing.assert_array_equal(o, want)
    exp = expected_counts(RingOp.ALL_REDUCE, n, nranks, channels, slot)
    for r in range(nranks):
        for c in range(channels):
            assert counts.get((r, c, "send"), 0) == counts.get((r, c, "recv"), 0) == exp[c]
    gathered = emulate(RingOp.ALL_GATHER, ins, channels, slot, 3)
    for o in gathered:
        np.testing.assert_array_equal(o, np.concatenate(ins))


def test_expected_counts_by_hand() -> None:
    # 4 ranks, 8 channels, 1 MiB of float32, 64 Ki-element slots: 32,768 elements per channel,
    # one round of 4 x 64 Ki elements -> 2 (R - 1) = 6 messages per channel
    assert expected_counts(RingOp.ALL_REDUCE, 262_144, 4, 8, 65_536) == [6] * 8
    assert expected_counts(RingOp.ALL_REDUCE, 262_144, 4, 8, 4_096) == [12] * 8
    assert expected_counts(RingOp.ALL_GATHER, 262_144, 4, 8, 4_096) == [24] * 8
    assert channel_range(10, 2, 3) == (6, 4)
    assert fold([1] * 20) == (3, 3, 3, 3, 2, 2, 2, 2)
    assert fold([4, 5]) == (4, 5)


def test_frozen_counts_agree_with_the_emulation() -> None:
    """Two implementations of the protocol (counters vs. FIFOs with data) stall at the same place."""
    n, R, C, P, S = 900, 4, 3, 16, 2
    ins = [np.ones(n, np.float32) for _ in range(R)]
    for stop_rank, stop_step in [(2, 0), (1, 5), (3, 17), (0, 30)]:
        got: dict[tuple[int, int, str], int] = {}

        def hook(rank: int, ch: int, kind: str, got: dict[tuple[int, int, str], int] = got) -> None:
            got[(rank, ch, kind)] = got.get((rank, ch, kind), 0) + 1

        emulate(RingOp.ALL_REDUCE, ins, C, P, S, hook, stop=(stop_rank, stop_step))
        frozen = frozen_counts(RingOp.ALL_REDUCE, n, R, C, P, S, stop_rank, stop_step)
        for r in range(R):
            for c in range(C):
                assert frozen[r][c] == (got.get((r, c, "send"), 0), got.get((r, c, "recv"), 0)), (stop_rank, r, c)
        # the stopped rank sent exactly the sends of its first stop_step steps
        assert frozen[stop_rank][0][0] < expected_counts(RingOp.ALL_REDUCE, n, R, C, P)[0]


def test_a_single_slot_ring_is_refused() -> None:
    with pytest.raises(ProbeError, match="at least 2 slots"):
        emulate(RingOp.ALL_REDUCE, [np.ones(4, np.float32)] * 3, 1, 1, 1)
    with pytest.raises(ProbeError, match="at least 2 ranks"):
        frozen_counts(RingOp.ALL_REDUCE, 4, 1, 1, 1, 2, -1, -1)
