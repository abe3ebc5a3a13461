"""Start N ranks of a Python module on this machine (torchrun's environment, no agent), and kill them.

For fault tests and demos: each rank is its own process in its own session, so one rank
can be stopped (SIGSTOP) or killed alone, and ``kill()`` reaps every rank's process group
whatever state it is in. ``ccld run`` semantics are kept: pass ``attach_env`` (from
``attach_env_for``) to give every rank the attachment.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalJob:
    """The rank processes of one local job and their log files."""

    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]
    _files: list[object] = field(default_factory=list)

    def pid(self, rank: int) -> int:
        return self.procs[rank].pid

    def wait_for_line(self, rank: int, text: str, timeout_s: float) -> bool:
        """Wait until rank's log contains ``text`` (False on timeout or when the rank exited)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.log(rank):
                return True
            if self.procs[rank].poll() is not None:
                return text in self.log(rank)
            time.sleep(0.05)
        return False

    def log(self, rank: int) -> str:
        try:
            return self.logs[rank].read_text(errors="replace")
        except OSError:
            return ""

    def wait(self, timeout_s: float) -> list[int | None]:
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return [p.poll() for p in self.procs]

    def kill(self) -> None:
        """SIGKILL every rank's process group (stopped ranks included) and reap them."""
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for f in self._files:
            close = getattr(f, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> LocalJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def launch(
    world: int,
    module_args: Sequence[str],
    log_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    rank_env: Mapping[int, Mapping[str, str]] | None = None,
    prefix: Sequence[Sequence[str]] | None = None,
    master_addr: str = "127.0.0.1",
    python: str = sys.executable,
) -> LocalJob:
    """Start ``python -m <module_args>`` as ranks 0..world-1 with torchrun's variables.

    ``prefix[rank]`` is prepended to that rank's command (``ip netns exec NS``), and
    ``rank_env[rank]`` adds variables to it.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    files: list[object] = []
    base = dict(os.environ if env is None else env)
    try:
        for rank in range(world):
            e = dict(base)
            e.update(
                RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                GROUP_RANK="0", MASTER_ADDR=master_addr, MASTER_PORT=str(port), PYTHONUNBUFFERED="1",
            )  # fmt: skip
            e.update((rank_env or {}).get(rank, {}))
            log = log_dir / f"rank{rank}.log"
            fh = open(log, "wb")  # noqa: SIM115 - closed by kill()
            files.append(fh)
            cmd = [*(prefix[rank] if prefix else ()), python, "-m", *module_args]
            procs.append(subprocess.Popen(cmd, env=e, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True))
            logs.append(log)
    except BaseException:
        LocalJob(procs, logs, files).kill()
        raise
    return LocalJob(procs, logs, files)
