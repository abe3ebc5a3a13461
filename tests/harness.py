"""Helpers for integration tests: a real worker process and a verdict collector."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ccld.records import AnomalyKind, KernelBatch, Verdict
from ccld.settings import Settings
from ccld.stack.up import child_env
from ccld.streams.tail import iter_verdicts

if TYPE_CHECKING:
    from ccld.producers.attach.localrun import LocalJob


class WorkerProcess:
    """A real `ccld worker` (or another long-running ``ccld`` command) in a child process, its log kept.

    ``command`` is the ``ccld`` subcommand (``worker``, ``sink``); ``start`` returns once ``ready``
    appears in the log (Faust's "Worker ready" for the worker).
    """

    def __init__(self, settings: Settings, log_path: Path, *, command: str = "worker",
                 ready: str = "Worker ready") -> None:
        self.settings = settings
        self.log_path = log_path
        self.command = command
        self.ready = ready
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout_s: float = 60.0) -> WorkerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        start_len = self.log_path.stat().st_size if self.log_path.exists() else 0
        out = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        # run beside its log: Faust makes its data folder (<app id>-data) in the working directory
        self.proc = subprocess.Popen([sys.executable, "-P", "-m", "ccld.cli", self.command],
                                     env=child_env(self.settings), stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=self.log_path.parent)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.command} exited with {self.proc.returncode}:\n{self.log()}")
            # Faust's recovery service logs "Worker ready" once partitions are assigned and tables recovered.
            if self.ready in self.log_path.read_bytes()[start_len:].decode(errors="replace"):
                return self
            time.sleep(0.2)
        raise AssertionError(f"{self.command} not ready in {ready_timeout_s} s:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:] if self.log_path.exists() else "(no log)"


def start_up(env: dict[str, str], port: int, logs: Path, *extra: str, merged: bool = False) -> subprocess.Popen[str]:
    """``ccld up`` on ``port`` (0: a free one) with ``env``, its services' logs in ``logs``, ``extra`` arguments;
    stdout and stderr piped (``merged``: stderr into stdout), in a session of its own (``stop_up`` stops it)."""
    return subprocess.Popen([sys.executable, "-P", "-m", "ccld.cli", "up", "--port", str(port), "--logs", str(logs),
                             *extra], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merged else subprocess.PIPE, text=True, start_new_session=True)


def stop_up(up: subprocess.Popen[str], timeout_s: float = 40.0) -> None:
    """SIGTERM to a ``ccld up`` (it stops its children, then its broker); its group killed after ``timeout_s``."""
    up.send_signal(signal.SIGTERM)
    try:
        up.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(up.pid, signal.SIGKILL)
        up.wait()


def collect_verdicts(
    settings: Settings, timeout_s: float, until: Callable[[list[Verdict]], bool] = lambda vs: False
) -> list[Verdict]:
    """Distinct verdicts from the beginning of the topic until ``until(verdicts)`` or the timeout."""
    got: list[Verdict] = []
    deadline = time.monotonic() + timeout_s
    for v in iter_verdicts(settings, from_beginning=True, stop=lambda: time.monotonic() > deadline or until(got)):
        got.append(v)
    return got


def job_logs(job: LocalJob) -> str:
    """The end of every rank's log of a local torch job (what a failed assertion shows)."""
    return "\n".join(f"--- rank {r}:\n{job.log(r)[-1500:]}" for r in range(len(job.procs)))


def first_verdict(settings: Settings, kind: AnomalyKind, timeout_s: float, job: LocalJob) -> Verdict:
    """The first verdict of ``kind`` on the topic; fails with every verdict seen and the ranks' logs."""
    got = collect_verdicts(settings, timeout_s, until=lambda vs: any(v.kind is kind for v in vs))
    hits = [v for v in got if v.kind is kind]
    assert hits, f"no {kind} verdict; got {[v.describe() for v in got]}\n{job_logs(job)}"
    return hits[0]


def raw_messages(settings: Settings, topic: str, idle_s: float = 3.0) -> list[bytes]:
    """Every message of ``topic`` (all partitions) until nothing new arrives for ``idle_s``."""
    return [value for _, _, value in raw_records(settings, topic, idle_s)]


def raw_records(settings: Settings, topic: str, idle_s: float = 3.0) -> list[tuple[int, int, bytes]]:
    """``(partition, offset, value)`` of every message of ``topic`` until nothing new arrives for ``idle_s``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"raw-{time.time_ns()}",
                  "enable.auto.commit": False})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out: list[tuple[int, int, bytes]] = []
        last = time.monotonic()
        while time.monotonic() - last < idle_s:
            msg = c.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append((msg.partition() or 0, msg.offset() or 0, msg.value() or b""))
                last = time.monotonic()
        return out
    finally:
        c.close()


def raw_batches(settings: Settings, idle_s: float = 3.0) -> list[KernelBatch]:
    """Every metrics batch on ``settings.metrics_topic``, decoded."""
    from ccld.schemas.codec import decode_metrics

    return [decode_metrics(m) for m in raw_messages(settings, settings.metrics_topic, idle_s)]


def impossible_batches() -> dict[str, KernelBatch]:
    """Well-formed batches that each hold one impossible value (what the worker must dead-letter as bad-value)."""
    import dataclasses

    import numpy as np

    from factories import make_kernel_record

    good = KernelBatch.from_records([make_kernel_record(rank=r, comm_rank=r) for r in range(4)], producer="bad-p")

    def setting(name: str, value: int, row: int = 1) -> KernelBatch:
        col = good.columns[name].copy()
        col[row] = value
        return dataclasses.replace(good, columns={**good.columns, name: col})

    return {
        "rank >= world size": setting("rank", 4),
        "world size 0": dataclasses.replace(good, world_size=0),
        "comm_rank >= comm_size": setting("comm_rank", 4),
        "negative op sequence": setting("op_seq", -1),
        "int64-extreme time": setting("t_enter_ns", (1 << 63) - 1),
        "negative time": setting("t_exit_ns", -5),
        "unknown status": setting("status", 7),
        "unknown op type": setting("op_type", 42),
        "negative counter": dataclasses.replace(good, send=np.where(good.send == good.send[0, 0], -3, good.send)),
    }


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc): torchrun puts each worker in its own session, so a
    test that must stop a whole ``ccld run -- torchrun`` tree finds them here."""
    kids: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids[int(fields[1])].append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` and every process below it (torchrun puts each worker in its own session), then reap it."""
    for pid in [*descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def parse_exposition(text: str) -> dict[str, float]:
    """Prometheus text as ``{'name{a="1",b="x"}': value}`` (labels as rendered); comment lines skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def scrape(url: str, timeout_s: float = 5.0) -> tuple[str, str]:
    """``(content type, body)`` of a GET of ``url`` (a /metrics endpoint)."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return resp.headers.get("Content-Type", ""), resp.read().decode()
