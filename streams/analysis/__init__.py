"""The analyzer: pure functions from kernel records to verdicts."""

from ccld.streams.analysis.analyzer import Analyzer, analyze_batches
from ccld.streams.analysis.settings import AnalyzerSettings

__all__ = ["Analyzer", "AnalyzerSettings", "analyze_batches"]
