"""Flight Recorder post-mortem: read PyTorch Flight Recorder dumps and name the broken ranks."""

from ccld.streams.flight_recorder.cli import ImportResult, analyse
from ccld.streams.flight_recorder.diagnose import Diagnosis, diagnose
from ccld.streams.flight_recorder.model import DumpSet, build

__all__ = ["Diagnosis", "DumpSet", "ImportResult", "analyse", "build", "diagnose"]
