"""How starved of CPUs this rank's host was: Linux CPU pressure (PSI), sampled by the attachment.

A gloo job's communication runs on CPU threads, so on a host whose cores are taken by other work a
send over loopback that takes half a millisecond takes several, on both ends, while no link is at
fault (benchmarks/RESULTS.md, "A real job, for 30 minutes"). The kernel's pressure stall information
counts the time in which at least one runnable task waited for a CPU ("some", ``total`` in
microseconds since boot): ``cpu.pressure`` of the process's cgroup (cgroup v2, a container's own
tasks) when the kernel gives one, else the host's ``/proc/pressure/cpu``. The attachment's emitter
thread reads it once per state interval and sends its growth, with the wall time it grew over, with
the rank's next batch (``KernelBatch.cpu_wait``: wait = stalled time, run = the rest of the wall
time). The analyzer holds a slow-communication verdict while the communicator's members' hosts were
stalled that share of the time (``starved_wait_share``).

Why not the process's own run-queue wait (schedstat, what this module read first): measured here
(benchmarks/RESULTS.md, "A loaded host is not a slow link, measured again"), a gloo rank's threads run
in bursts of a fraction of a millisecond after each wakeup, and their wait to be scheduled is about as
long as the burst whether the host is idle or six busy processes hold both cores (the scheduler
favours a waking thread): wait / (wait + run) was 0.52-0.56 healthy and 0.51-0.65 starved. The host's
stall share was 0.15 healthy and 0.95 starved.
Nor the training thread's own (``/proc/<pid>/task/<tid>/schedstat``): measured on a 4-rank DDP job
(benchmarks/RESULTS.md, "Real DDP on gloo, slow from step 0"), the ranks' training threads waited for a
CPU within a few points of each other (10-17 % of the wall time quiet, 21-39 % busy), while the rank that
arrived last changed from op to op by tens of ms: the wait does not tell which rank was held up.

Reading costs one small file read per interval, on the emitter thread, never the training thread.
Anything that goes wrong (no ``/proc``, a kernel without PSI or booted with ``psi=0``) makes the
sample missing, never an error in the job: the analyzer then holds nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: the host's CPU pressure
HOST_PRESSURE = "/proc/pressure/cpu"
#: where cgroup v2 is mounted (a cgroup's own pressure is ``<mount><path>/cpu.pressure``)
CGROUP_ROOT = "/sys/fs/cgroup"


def psi_some_us(text: str) -> int:
    """The ``some`` line's ``total`` (microseconds stalled) of a PSI file's text."""
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "some":
            for part in rest.split():
                key, _, value = part.partition("=")
                if key == "total":
                    return int(value)
    raise ValueError(f"not a PSI file (no 'some ... total='): {text[:80]!r}")


def pressure_file(cgroup_file: str = "/proc/self/cgroup", root: str = CGROUP_ROOT,
                  host: str = HOST_PRESSURE) -> str | None:  # fmt: skip
    """The process's cgroup's ``cpu.pressure`` (cgroup v2) when it has one, else the host's, else None."""
    try:
        with open(cgroup_file, encoding="ascii") as f:
            for line in f:
                if line.startswith("0::"):
                    path = line[3:].strip().rstrip("/")
                    own = f"{root}{path}/cpu.pressure"
                    if path and os.path.exists(own):
                        return own
    except (OSError, ValueError):
        pass
    return host if os.path.exists(host) else None


def pressure_ns(path: str | None, clock: Callable[[], int] = time.monotonic_ns) -> tuple[int, int] | None:
    """(wall ns not stalled, wall ns stalled), both cumulative (their growth is what a sample is), or
    None when ``path`` is None or unreadable."""
    if path is None:
        return None
    try:
        with open(path, encoding="ascii") as f:
            stalled = psi_some_us(f.read()) * 1000
    except (OSError, ValueError):
        return None
    return clock() - stalled, stalled


def pressure_reader() -> Callable[[], tuple[int, int] | None]:
    """``pressure_ns`` of this process's pressure file, found once (``pressure_file``)."""
    path = pressure_file()
    return lambda: pressure_ns(path)


@dataclass
class CpuWaitSampler:
    """The host's CPU stall and the rest of the wall time since the previous sample: ``sample()`` ->
    (stalled ns, not stalled ns). ``read`` returns both as cumulative counters (``pressure_ns``)."""

    read: Callable[[], tuple[int, int] | None] = field(default_factory=pressure_reader)
    _last: tuple[int, int] | None = field(default=None, init=False)  # (not stalled, stalled) at the previous sample
    failures: int = field(default=0, init=False)

    def sample(self) -> tuple[int, int] | None:
        """(stalled ns, not stalled ns) since the previous sample; None at the first one, when
        unreadable, or when no time passed."""
        try:
            now = self.read()
        except Exception:  # noqa: BLE001 - the job must never see this fail
            now = None
        if now is None:
            self.failures += 1
            self._last = None
            return None
        last, self._last = self._last, now
        if last is None:
            return None
        wait, run = max(now[1] - last[1], 0), max(now[0] - last[0], 0)
        return (wait, run) if wait + run > 0 else None
