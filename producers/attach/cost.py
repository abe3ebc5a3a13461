"""What the attachment costs the job it watches, by what it consumes (off by default: ``CCLD_ATTACH_COST=1``).

Two measures, neither a difference of wall times (which the job's own noise swamps: a DDP step-time
A/B gave +3 ms against a 3.8-ms spread between two unattached baselines):

- the training thread's time inside the attachment: ``perf_counter_ns`` around each hook body (a call's
  identification before torch runs it and its bookkeeping after; the ``Work.wait`` and ``is_completed``
  patches' own part), summed in :class:`HookTime`. Torch's own time in the call is not in it.
- the CPU time of every thread the attachment adds to the process: its Python threads (named ``ccld-*``:
  the emitter, the Flight Recorder poller, the producer's delivery loop) and librdkafka's native ones
  (named ``rdk:*``), from ``/proc/self/task/<tid>/schedstat`` (nanoseconds; ``stat``'s clock ticks
  where the kernel has no schedstat). A host aggregator (``ccld run --aggregate``) is another process
  and is not in it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

ENV_COST = "CCLD_ATTACH_COST"
#: Python threads of the attachment are named so (op_tracker, fr_poll, outlets, producers.kafka)
THREAD_PREFIX = "ccld-"
#: librdkafka names its native threads so (rdk:main, rdk:broker1, ...)
NATIVE_PREFIX = "rdk:"
_TASKS = Path("/proc/self/task")
_TICK_NS = 1_000_000_000 // (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def cost_enabled(environ: dict[str, str] | os._Environ[str]) -> bool:
    return environ.get(ENV_COST, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass
class HookTime:
    """The training thread's time inside the attachment's hooks (plain ints: one writer at a time per
    hook; a lost increment under a racing second thread is a count, not a crash)."""

    ns: int = 0
    calls: int = 0
    max_ns: int = 0

    def add(self, ns: int) -> None:
        self.ns += ns
        self.calls += 1
        if ns > self.max_ns:
            self.max_ns = ns


def thread_cpu_ns(tid: int) -> int | None:
    """CPU time (user and system) of this process's thread ``tid``; None once it has exited."""
    try:
        return int((_TASKS / str(tid) / "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        # comm may hold spaces and parentheses: the fields start after the last ')'
        fields = (_TASKS / str(tid) / "stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) * _TICK_NS  # utime, stime (fields 14 and 15)
    except (OSError, ValueError, IndexError):
        return None


def attachment_threads() -> dict[int, str]:
    """The attachment's threads now: native thread id -> name."""
    out = {t.native_id: t.name for t in threading.enumerate()
           if t.name.startswith(THREAD_PREFIX) and t.native_id is not None}  # fmt: skip
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return out
    for tid in tids:
        try:
            name = (_TASKS / tid / "comm").read_text().strip()
        except OSError:
            continue
        if name.startswith(NATIVE_PREFIX):
            out[int(tid)] = name
    return out


def attachment_cpu_ns() -> int:
    """The CPU time the attachment's threads alive now have used since they started."""
    return sum(ns for tid in attachment_threads() if (ns := thread_cpu_ns(tid)) is not None)
