"""Thresholds of the analyzer: every one configurable (CCLD_ANALYZER_<NAME>)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AnalyzerSettings:
    """Decision thresholds; times are seconds on the analyzer's clock or a rank's own clock."""

    alpha: float = 0.4  # P <= alpha: S2 (comm-slow)
    beta: float = 0.6  # P >= beta: S1 (comp-slow); in between: S3
    hang_min_s: float = 20.0  # never declare a hang shorter than this
    slow_factor: float = 3.0  # an op is slow when its time exceeds slow_factor x the learned baseline
    slow_min_ops: int = 3  # "repeated counting": consecutive slow ops before a slow verdict
