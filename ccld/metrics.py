"""Prometheus' text exposition format (0.0.4) from plain values: counters, gauges, fixed-bucket histograms.

No client library and no I/O: each service builds ``Family`` objects from the counters it keeps anyway
(a processor's ``report()``, an archiver's ``counters``) when it is scraped, and ``render`` turns them
into the text Prometheus reads. ``Histogram`` is the one piece of state: observations into fixed
buckets, counted as they happen. ``ccld.metrics_http`` serves the text for processes without a web
server of their own; the worker serves it from Faust's.

Conventions (docs/operations.md, "Metrics"): names start with ``ccld_``, counters end in ``_total``,
times are seconds, and labels have few values (``partition``, ``kind``, ``state``; never a rank).
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

#: The Content-Type of the text format, as Prometheus asks for it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Kind = Literal["counter", "gauge", "histogram"]

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: labels the histogram's own samples use; a family may not declare them
_RESERVED = frozenset({"le", "quantile"})


@dataclass(frozen=True)
class Sample:
    """One line of a family: the sample name (the family's, or with ``_bucket``/``_sum``/``_count``), labels, value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


class Family:
    """One metric: its name, type, help text and samples, one per label set (``add`` sums repeats)."""

    def __init__(self, name: str, kind: Kind, help_text: str, labelnames: Sequence[str] = ()) -> None:
        if not _NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        if kind == "counter" and not name.endswith("_total"):
            raise ValueError(f"counter {name!r} must end in _total")
        for label in labelnames:
            if not _LABEL.fullmatch(label) or label.startswith("__") or label in _RESERVED:
                raise ValueError(f"invalid label name {label!r} for {name}")
        if len(set(labelnames)) != len(labelnames):
            raise ValueError(f"repeated label name in {name}: {labelnames}")
        self.name = name
        self.kind: Kind = kind
        self.help = help_text
        self.labelnames = tuple(labelnames)
        self._values: dict[tuple[str, ...], float] = {}
        self._extra: list[Sample] = []  # histogram samples, laid out by Histogram.family

    def add(self, value: float, **labels: object) -> Family:
        """Add ``value`` to the sample of these labels (every declared label, no other); returns the family."""
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {tuple(labels)}")
        key = tuple(str(labels[n]) for n in self.labelnames)
        self._values[key] = self._values.get(key, 0) + value
        return self

    @property
    def samples(self) -> list[Sample]:
        out = [Sample(self.name, tuple(zip(self.labelnames, key, strict=True)), v) for key, v in self._values.items()]
        return out + self._extra


class Histogram:
    """Observations counted into fixed buckets (upper bounds, ``le``), plus their sum and count.

    Thread-safe: the event loop or a service thread observes while a scrape may read from another.
    """

    def __init__(self, name: str, help_text: str, buckets: Sequence[float]) -> None:
        bounds = [float(b) for b in buckets]
        if not bounds or any(not math.isfinite(b) for b in bounds) or bounds != sorted(set(bounds)):
            raise ValueError(f"histogram {name}: buckets must be finite and strictly increasing, got {buckets}")
        Family(name, "histogram", help_text)  # validates the name
        self.name = name
        self.help = help_text
        self.buckets = tuple(bounds)
        self._counts = [0] * (len(bounds) + 1)  # the last one: above every bound (only in +Inf)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)  # the first bound >= value: "le" is inclusive
        with self._lock:
            self._counts[i] += 1
            self._sum += value

    def family(self) -> Family:
        """The histogram as it is now: cumulative ``_bucket`` samples up to ``+Inf``, ``_sum`` and ``_count``."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        fam = Family(self.name, "histogram", self.help)
        running = 0
        for bound, n in zip((*self.buckets, math.inf), counts, strict=True):
            running += n
            fam._extra.append(Sample(f"{self.name}_bucket", (("le", format_value(bound)),), running))
        fam._extra.append(Sample(f"{self.name}_sum", (), total))
        fam._extra.append(Sample(f"{self.name}_count", (), running))
        return fam


def format_value(value: float) -> str:
    """A sample value as the text format writes it: integers plainly, ``+Inf``, ``-Inf``, ``NaN``."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def escape_label(value: str) -> str:
    r"""A label value inside double quotes: backslash, double quote and newline escaped (``\\``, ``\"``, ``\n``)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    r"""A HELP text: backslash and newline escaped (a double quote stays as it is)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def render(families: Iterable[Family]) -> str:
    """The exposition text of ``families`` in the order given: ``# HELP``, ``# TYPE``, then the samples."""
    lines: list[str] = []
    seen: set[str] = set()
    for fam in families:
        if fam.name in seen:
            raise ValueError(f"metric {fam.name} rendered twice")
        seen.add(fam.name)
        lines.append(f"# HELP {fam.name} {escape_help(fam.help)}")
        lines.append(f"# TYPE {fam.name} {fam.kind}")
        for s in fam.samples:
            labels = ",".join(f'{k}="{escape_label(v)}"' for k, v in s.labels)
            lines.append(f"{s.name}{{{labels}}} {format_value(s.value)}" if labels else
                         f"{s.name} {format_value(s.value)}")
    return "\n".join(lines) + "\n" if lines else ""
