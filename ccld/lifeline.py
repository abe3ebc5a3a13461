"""Children that die with their supervisor: `ccld up`'s broker, worker and sink must not outlive it.

`ccld up` starts its children in sessions of their own (a Ctrl-C in the terminal must reach
`ccld up` alone, which then stops them in order), so a ``kill -9`` of `ccld up` reaches none of
them: they ran on and kept the broker's port. Two mechanisms, because each has a gap:

- ``PR_SET_PDEATHSIG`` (Linux): the kernel signals the child when its parent goes. It fires when
  the parent *thread* that forked the child exits, which is not the same as the process, and it
  exists on Linux only. The Tansu broker is not Python: it gets it from ``die_with_parent``, run
  between fork and exec (and kept across exec).
- A lifeline pipe: the supervisor holds the only write end (never inherited); a Python child
  inherits the read end, named in ``CCLD_SUPERVISOR`` (``<pid>:<fd>``), and a thread of
  ``watch_supervisor`` reads it. Reading returns end-of-file once the supervisor process is gone,
  whichever thread spawned the child and however it died; the child then stops itself (SIGTERM,
  its usual clean stop) and exits anyway after a short grace.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: The variable that hands a child its supervisor's pid and the read end of the lifeline: ``<pid>:<fd>``.
ENV = "CCLD_SUPERVISOR"

#: How long a child whose supervisor is gone may take over its own clean stop before it exits anyway.
GRACE_S = 3.0

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _prctl_pdeathsig() -> Callable[[int], bool] | None:
    """``prctl(PR_SET_PDEATHSIG, sig)`` as a function, loaded now; None where there is no such call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def set_pdeathsig(sig: int) -> bool:
        return int(prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)) == 0

    return set_pdeathsig


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when this process's spawning thread ends.

    libc is loaded here, in the parent, so the forked child only makes one system call before exec.
    None off Linux (pass it on: ``preexec_fn=None`` is Popen's default).
    """
    set_pdeathsig = _prctl_pdeathsig()
    if set_pdeathsig is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        set_pdeathsig(sig)
        if os.getppid() != parent:  # the parent died between the fork and the prctl: no signal will come
            os.kill(os.getpid(), sig)

    return preexec


class Lifeline:
    """The supervisor's side: a pipe whose write end only this process holds, handed to children by fd."""

    def __init__(self) -> None:
        # os.pipe() fds are not inheritable: no child gets the write end, so closing it here (or dying) is EOF.
        self._read, self._write = os.pipe()

    def env(self) -> dict[str, str]:
        return {ENV: f"{os.getpid()}:{self._read}"}

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self._read,)

    def close(self) -> None:
        """Cut the line: children still watching it stop themselves."""
        for fd in (self._read, self._write):
            try:
                os.close(fd)
            except OSError:
                pass
        self._read = self._write = -1


def watch_supervisor(grace_s: float = GRACE_S) -> bool:
    """In a child of `ccld up`: stop this process when the supervisor is gone. False when not started by one.

    Reads (and removes, so our own children do not inherit it) ``CCLD_SUPERVISOR``.
    """
    value = os.environ.pop(ENV, "")
    if not value:
        return False
    try:
        pid_text, _, fd_text = value.partition(":")
        supervisor, fd = int(pid_text), int(fd_text)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise ValueError(f"fd {fd} is not a pipe")
    except (ValueError, OSError) as exc:
        log.warning("ignoring %s=%r: %s", ENV, value, exc)
        return False
    os.set_inheritable(fd, False)
    set_pdeathsig = _prctl_pdeathsig()
    if set_pdeathsig is not None:
        set_pdeathsig(signal.SIGTERM)  # the kernel's notice; the pipe below covers where it does not come
    threading.Thread(target=_watch, args=(fd, supervisor, grace_s), name="ccld-supervisor-watch", daemon=True).start()
    return True


def _watch(fd: int, supervisor: int, grace_s: float) -> None:
    while True:
        try:
            if not os.read(fd, 1):  # nobody writes: only end-of-file, once the supervisor is gone, comes back
                break
        except InterruptedError:
            continue
        except OSError as exc:
            log.warning("cannot watch the supervisor (pid %d): %s", supervisor, exc)
            return
    log.warning("the supervisor (pid %d) is gone; stopping", supervisor)
    os.kill(os.getpid(), signal.SIGTERM)  # the command's own clean stop (its SIGTERM handler)
    time.sleep(grace_s)
    log.error("still running %.0f s after the supervisor went; exiting", grace_s)
    logging.shutdown()
    os._exit(1)
