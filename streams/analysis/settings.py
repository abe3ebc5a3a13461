"""Thresholds of the analyzer (``AnalyzerSettings``, every one ``CCLD_ANALYZER_<NAME>``).

They are defined in ``ccld.settings`` with every other setting, so the core never imports a
stage; the analyzer's modules import them from here.
"""

from ccld.settings import AnalyzerSettings

__all__ = ["AnalyzerSettings"]
