"""Thresholds of the analyzer: every one configurable (CCLD_ANALYZER_<NAME>)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ccld.errors import ConfigError


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
    cadence_ops: int = 32  # recent ops per communicator learned as a signature pattern (H2 without majority)
    wait_edge_min_s: float = 2.0  # a communicator counts as waiting (wait-for edge) after this stall

    # --- slowness
    slow_factor: float = 1.3  # an op is slow when its time exceeds slow_factor x the learned baseline
    slow_min_excess_s: float = 1e-5  # ... and exceeds the baseline by at least this much (s; ops last 50 us and up)
    slow_mad_k: float = 6.0  # ... and by this many mean absolute deviations of the baseline
    slow_min_ops: int = 3  # "repeated counting": slow ops (of the window) before a slow verdict
    slow_window_ops: int = 5  # window of recent ops per signature the repeated counting looks at
    slow_resolve_ops: int = 6  # consecutive normal ops that resolve a slow incident
    baseline_min_ops: int = 6  # healthy ops per signature learned before slowness is judged
    baseline_warmup_s: float = 10.0  # ... and a communicator's first seconds (pipeline fill) are never judged
    baseline_ops: int = 32  # horizon (ops) of the moving baseline per signature (it follows the training phase)
    culprit_share: float = 0.6  # the late arriver / backlog rank must be the same in this share of slow ops
    culprit_gap_share: float = 0.5  # late arriver computed >= this share of its lateness longer than peers, else victim

    # --- bookkeeping
    finalize_timeout_s: float = 10.0  # an op missing some DONE records is closed after this long
    resolved_memory: int = 2048  # resolved incidents remembered for dedupe (state_dict stays bounded)
    batch_memory: int = 4096  # (producer, batch_seq) pairs remembered per producer for duplicate batches
    producer_memory: int = 256  # producers whose batch sequence numbers are remembered
    job_expiry_s: float = 3600.0  # a job incarnation silent this long (and without open incidents) is dropped
    update_min_interval_s: float = 10.0  # at most one UPDATE per incident in this interval (class changes: at once)

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ConfigError(f"analyzer setting {f.name} must not be negative, got {getattr(self, f.name)}")
        if not 0.0 <= self.alpha <= self.beta <= 1.0:
            raise ConfigError(f"analyzer thresholds need 0 <= alpha <= beta <= 1, got {self.alpha}, {self.beta}")
        if not 1 <= self.slow_min_ops <= self.slow_window_ops:
            raise ConfigError(
                f"analyzer needs 1 <= slow_min_ops <= slow_window_ops, got {self.slow_min_ops}, {self.slow_window_ops}"
            )
