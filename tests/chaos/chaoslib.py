"""Chaos-test helpers: a broker that can be frozen, killed and restarted; producing; reading results back."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import KernelBatch, Verdict
from ccld.schemas.codec import decode_verdict, encode_batch
from ccld.settings import Settings
from ccld.stack.broker import EmbeddedBroker, tansu_binary, wait_until_answers
from harness import WorkerProcess, raw_messages


class ChaosBroker:
    """A Tansu broker on a fixed loopback port that can be frozen, thawed, killed and started again."""

    def __init__(self) -> None:
        first = EmbeddedBroker(0).start()  # picks a free port and proves the binary works
        self.port = first.port
        self.bootstrap = first.bootstrap
        self._embedded: EmbeddedBroker | None = first
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        pid = self._embedded.pid if self._embedded is not None else (
            self._proc.pid if self._proc is not None and self._proc.poll() is None else None)
        if pid is None:
            raise AssertionError("the chaos broker is not running")
        return pid

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        if self._embedded is not None and self._embedded._proc is not None:
            self._embedded._proc.wait(10)
            self._embedded = None
        elif self._proc is not None:
            self._proc.wait(10)
            self._proc = None

    def restart(self) -> None:
        """Start a fresh broker on the same port (in memory: it comes back empty)."""
        # Started directly, not with EmbeddedBroker: its free-port check fails on the killed broker's
        # TIME_WAIT sockets, which Tansu's own listener (SO_REUSEADDR) does not mind.
        url = f"tcp://127.0.0.1:{self.port}"
        self._proc = subprocess.Popen([tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url",
                                       url, "--storage-engine", "memory://tansu/"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                      env={**os.environ, "RUST_LOG": "warn"})
        wait_until_answers(self.bootstrap, timeout_s=20)

    def stop(self) -> None:
        try:
            os.kill(self.pid, signal.SIGCONT)
        except (AssertionError, ProcessLookupError):
            pass
        if self._embedded is not None:
            self._embedded.stop()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)


def committed(settings: Settings) -> int:
    """Offsets of the metrics topic the worker's group has committed (all partitions); 0 when none."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": settings.worker_app_id,
                  "enable.auto.commit": False})
    try:
        topic = settings.metrics_topic
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        got = c.committed([TopicPartition(topic, p) for p in parts], timeout=10)
        return sum(max(tp.offset, 0) for tp in got)
    finally:
        c.close()


def wait_for(cond: Callable[[], bool], timeout_s: float, every_s: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every_s)
    return cond()


def raw_verdicts(settings: Settings, idle_s: float = 2.0) -> list[Verdict]:
    """Every verdict message on the topic, duplicates included (what de-duplicating consumers never see)."""
    return [decode_verdict(m) for m in raw_messages(settings, settings.verdicts_topic, idle_s)]


def worker_counters(worker: WorkerProcess) -> dict[str, int]:
    """Partition 0's counters from the worker's newest ``counters`` log line ({} before the first)."""
    lines = re.findall(r"counters (\{.*\})", worker.log_path.read_text(errors="replace"))
    return dict(json.loads(lines[-1]).get("0", {})) if lines else {}


def scenario_batches(sid: str, fault: dict[str, Any] | None, duration_s: float) -> list[tuple[float, KernelBatch]]:
    """A small simulated job (8 ranks, 1 s steps): ``(simulated time, batch)`` pairs, job id ``sid``."""
    sc = Scenario.from_dict({
        "id": sid, "seed": 5, "ranks": 8, "layout": {"tp": 4, "pp": 1, "dp": 2}, "channels": 2,
        "step_time_s": 1.0, "duration_s": duration_s, "clock_skew_s": 2.0, "jitter": 0.02,
        "faults": [fault] if fault else [], "expect": [{"kind": fault["kind"], "rank": fault["rank"]}] if fault else [],
    })
    return list(simulate(sc))


def produce(settings: Settings, batches: list[tuple[float, KernelBatch]], *, offset_s: float = 0.0,
            extra: dict[str, Any] | None = None) -> int:
    """Send ``batches`` stamped ``offset_s + t`` (ms) with a plain confluent producer; returns records acked."""
    acked = [0]

    def counter(n: int) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, msg: Any) -> None:
            if err is None:
                acked[0] += n
        return on_delivery

    p = Producer({"bootstrap.servers": settings.bootstrap, "linger.ms": 5, **(extra or {})})
    for t, b in batches:
        p.produce(settings.metrics_topic, encode_batch(b), partition=0, timestamp=int((offset_s + t) * 1000),
                  on_delivery=counter(b.n))
        p.poll(0)
    assert p.flush(30) == 0, "the broker did not take every batch"
    return acked[0]


def produce_raw(settings: Settings, values: list[bytes], extra: dict[str, Any] | None = None) -> None:
    p = Producer({"bootstrap.servers": settings.bootstrap, **(extra or {})})
    for v in values:
        p.produce(settings.metrics_topic, v, partition=0)
    assert p.flush(30) == 0, "the broker did not take every message"


def record_result(fault: str, injected: str, *, produced: int, delivered: int, verdicts_expected: int,
                  verdicts_received: int, verdicts_raw: int, **extra: Any) -> None:
    """Append one measured row to ``$CCLD_CHAOS_REPORT`` (JSON lines) when set: benchmarks/results is built from it."""
    path = os.environ.get("CCLD_CHAOS_REPORT")
    if not path:
        return
    row = {"fault": fault, "injected": injected, "produced": produced, "delivered": delivered,
           "lost": produced - delivered, "verdicts_expected": verdicts_expected,
           "verdicts_received": verdicts_received, "duplicated": verdicts_raw - verdicts_received, **extra}
    with Path(path).open("a") as f:
        f.write(json.dumps(row) + "\n")
