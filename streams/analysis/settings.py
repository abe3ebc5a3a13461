"""Thresholds of the analyzer: every one configurable (CCLD_ANALYZER_<NAME>)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AnalyzerSettings:
    """Decision thresholds; times are seconds on the analyzer's clock or a rank's own clock.

    Defaults are tuned on ``benchmarks/scenarios/standard.jsonl`` (1 s probe samples in the
    simulator; the real probe samples every 100 ms, which only makes every decision faster).
    """

    # --- slow ratio P = excess spread / excess time; P <= alpha: S2, P >= beta: S1, else S3
    alpha: float = 0.4  # P <= alpha: S2 (comm-slow)
    beta: float = 0.6  # P >= beta: S1 (comp-slow); in between: S3

    # --- hangs
    hang_min_s: float = 20.0  # never declare a not-entered hang (H1) shorter than this
    h2_min_s: float = 8.0  # signatures differ at one op sequence and nothing moved for this long
    h3_min_s: float = 15.0  # everyone entered a consistent op and counters stayed frozen this long
    barrier_hang_min_s: float = 45.0  # H1 at a barrier (checkpoints wait there) needs this long
    hang_op_factor: float = 8.0  # a hang also needs stall >= this x the longest healthy op time learned
    hang_max_s: float = 900.0  # learned tolerances never push a hang threshold beyond this
    pause_tolerance: float = 1.5  # a stall recurring like a benign pause seen before waits this x longer
    pause_memory: int = 8  # benign pauses remembered per communicator
    wait_edge_min_s: float = 2.0  # a communicator counts as waiting (wait-for edge) after this stall

    # --- slowness
    slow_factor: float = 3.0  # an op is slow when its time exceeds slow_factor x the learned baseline
    slow_min_excess_s: float = 0.02  # ... and exceeds the baseline by at least this much (seconds)
    slow_mad_k: float = 6.0  # ... and by this many median absolute deviations of the baseline
    slow_min_ops: int = 3  # "repeated counting": slow ops (of the window) before a slow verdict
    slow_window_ops: int = 5  # window of recent ops per signature the repeated counting looks at
    slow_resolve_ops: int = 6  # consecutive normal ops that resolve a slow incident
    baseline_min_ops: int = 6  # healthy ops per signature learned before slowness is judged
    baseline_ops: int = 32  # healthy ops per signature kept for the baseline (a moving window)
    culprit_share: float = 0.6  # the late arriver / backlog rank must be the same in this share of slow ops
    culprit_gap_share: float = 0.5  # a late arriver must have computed (been outside collectives) this share
    # of its lateness longer than its peers, on its own clock; otherwise it waited elsewhere: a victim

    # --- bookkeeping
    op_window: int = 16  # ops per communicator whose per-rank times are kept until complete
    finalize_timeout_s: float = 10.0  # an op missing some DONE records is closed after this long
    resolved_memory: int = 2048  # resolved incidents remembered for dedupe (state_dict stays bounded)
    batch_memory: int = 4096  # (producer, batch_seq) pairs remembered per producer for duplicate batches
    update_min_interval_s: float = 10.0  # at most one UPDATE per incident in this interval
