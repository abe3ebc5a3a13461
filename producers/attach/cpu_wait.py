"""How long this process's threads waited for a CPU: Linux schedstat run-queue delay, sampled by the attachment.

A gloo job's communication runs on CPU threads, so on a host whose cores are taken by other work a
send over loopback that takes half a millisecond takes several, on both ends, while no link is at
fault (benchmarks/RESULTS.md, "A real job, for 30 minutes"). The kernel counts, per thread, the
time it ran and the time it was runnable but waiting for a CPU (``/proc/<pid>/task/<tid>/schedstat``,
first and second fields, ns, kept when the kernel has ``CONFIG_SCHED_INFO``, as every distribution
kernel does). The attachment's emitter thread sums both over the process's threads once per state
interval and sends their growth with the rank's next batch (``KernelBatch.cpu_wait``). What matters
is the wait against the time the process wanted a CPU (wait / (wait + run)), not against the wall
time: a training process that mostly waits for its GPU (or, in the tests' gloo jobs, sleeps for it)
is runnable a small part of each second, and on a loaded host waits for most of that part. The
analyzer holds a slow-communication verdict while the communicator's members waited that way
(``starved_wait_share``).

Reading costs one ``listdir`` and one small read per thread (tens of microseconds for a training
process's few dozen threads), on the emitter thread, never the training thread. Anything that goes
wrong (no ``/proc``, no schedstat, a thread that exits between listing and reading) makes the
sample missing, never an error in the job.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

#: where the kernel lists this process's threads
TASK_DIR = "/proc/self/task"


def schedstat_ns(schedstat: str) -> tuple[int, int]:
    """(on-CPU ns, run-queue wait ns) of one thread's ``schedstat`` line ("<on-cpu> <run_delay> <timeslices>")."""
    parts = schedstat.split()
    if len(parts) < 2:
        raise ValueError(f"not a schedstat line: {schedstat!r}")
    return int(parts[0]), int(parts[1])


def process_schedstat_ns(task_dir: str = TASK_DIR) -> tuple[int, int] | None:
    """(on-CPU ns, run-queue wait ns) of every thread of the process together, or None when unreadable.

    A thread gone between the listing and its read takes its times with it: the sums may step back,
    which ``CpuWaitSampler`` reads as nothing rather than negative time."""
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return None
    run = wait = read = 0
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/schedstat", encoding="ascii") as f:
                r, w = schedstat_ns(f.read())
            run, wait, read = run + r, wait + w, read + 1
        except (OSError, ValueError):
            continue
    return (run, wait) if read else None


@dataclass
class CpuWaitSampler:
    """The process's run-queue wait and on-CPU time since the previous sample: ``sample()`` -> (wait ns, run ns)."""

    read: Callable[[], tuple[int, int] | None] = process_schedstat_ns
    _last: tuple[int, int] | None = field(default=None, init=False)  # (run, wait) at the previous sample
    failures: int = field(default=0, init=False)

    def sample(self) -> tuple[int, int] | None:
        """(wait ns, run ns) since the previous sample; None at the first one, when unreadable, or when
        the process wanted no CPU at all meanwhile (nothing to say about its host's load)."""
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
