"""Chaos-test helpers: a broker that can be frozen, killed and restarted; producing; reading results back."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import KernelBatch, Verdict
from ccld.schemas.codec import decode_verdict, encode_batch
from ccld.settings import Settings
from ccld.stack.broker import EmbeddedBroker, tansu_binary, wait_until_answers
from ccld.stack.up import child_env
from harness import WorkerProcess, collect_verdicts, raw_batches, raw_messages


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
        # Started directly rather than through EmbeddedBroker only to keep the process handle here (the
        # port check would pass: stack.broker.port_is_free binds with SO_REUSEADDR, as Tansu's listener does).
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


def snapshots(settings: Settings, partition: int = 0) -> list[tuple[int, bytes]]:
    """Every snapshot on the worker's changelog for ``partition``, oldest first: (its next offset, raw value)."""
    import zlib

    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"snap-{time.time_ns()}",
                  "enable.auto.commit": False})
    out: list[tuple[int, bytes]] = []
    try:
        c.assign([TopicPartition(f"{settings.worker_app_id}-analyzer-state-changelog", partition, OFFSET_BEGINNING)])
        last = time.monotonic()
        while time.monotonic() - last < 2.0:  # no end-of-partition: Tansu's high watermark is wrong
            m = c.poll(0.2)
            if m is None or m.error() is not None:
                continue
            last = time.monotonic()
            raw = m.value() or b""
            out.append((int(json.loads(zlib.decompress(raw)).get("next_offset", -1)), raw))
        return out
    finally:
        c.close()


def republish_snapshot(settings: Settings, raw: bytes, partition: int = 0) -> None:
    """Append ``raw`` to the changelog as the partition's newest snapshot (what a restarted worker restores)."""
    p = Producer({"bootstrap.servers": settings.bootstrap})
    p.produce(f"{settings.worker_app_id}-analyzer-state-changelog", raw, key=f"{settings.metrics_topic}:{partition}",
              partition=partition)
    assert p.flush(10) == 0


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
    return dict(counters_by_partition(worker).get("0", {}))


def counters_by_partition(worker: WorkerProcess) -> dict[str, dict[str, int]]:
    """Every partition's counters from the worker's newest ``counters`` log line ({} before the first)."""
    lines = re.findall(r"counters (\{.*\})", worker.log_path.read_text(errors="replace"))
    return dict(json.loads(lines[-1])) if lines else {}


def archived(root: Path, topic: str) -> Counter[tuple[int, int]]:
    """Rows of ``topic`` in a Parquet archive per source ``(partition, offset)`` (a duplicate counts twice).

    Safe to call while a sink writes: a file the sink replaced or removed meanwhile is skipped.
    """
    return Counter({(p, o): n for (_, p, o), n in archived_by(root, topic, None).items()})


def archived_by(root: Path, topic: str, column: str | None) -> Counter[tuple[Any, int, int]]:
    """Rows of ``topic`` per ``(value of column, partition, offset)`` (``column`` None: the value is None).

    Every file counts, whatever job, day or incarnation it is named by (``sinks/layout.py``; the old layout's
    ``<topic>/<partition>/...`` too), so a row overwritten or deleted shows as missing.
    """
    import pyarrow.parquet as pq

    from ccld.sinks.layout import parse, topic_dir

    hive = topic_dir(root, topic)
    found = [(path, parse(hive, path)) for path in sorted(hive.glob("job=*/date=*/*.parquet"))]
    paths = [(path, name.partition, name.job) for path, name in found if name is not None]
    old = root / topic
    paths += [(path, int(path.relative_to(old).parts[0]), None) for path in sorted(old.rglob("*.parquet"))]
    rows: Counter[tuple[Any, int, int]] = Counter()
    for path, partition, job in paths:
        from_path = column == "job" and job is not None  # the Hive layout's files hold no job column
        try:
            table = pq.read_table(path, columns=["offset"] if column is None or from_path else ["offset", column])
        except FileNotFoundError:  # replaced or removed by the sink meanwhile
            continue
        values = [job if from_path else None] * table.num_rows if column is None or from_path else \
            table.column(column).to_pylist()
        rows.update((v, partition, int(o)) for v, o in zip(values, table.column("offset").to_pylist(), strict=True))
    return rows


def count_line(fault: str, *, produced: int, delivered: int, verdicts_expected: int, verdicts_received: int,
               verdicts_raw: int) -> str:
    """The one line a chaos test prints (``pytest -s``) with the counts its RESULTS row quotes."""
    return (f"CHAOS {fault}: records produced {produced}, delivered {delivered}, lost {produced - delivered}; "
            f"verdicts expected {verdicts_expected}, received {verdicts_received}, "
            f"duplicated {verdicts_raw - verdicts_received}")


def small_scenario(sid: str, fault: dict[str, Any] | None, duration_s: float) -> Scenario:
    """A small simulated job (8 ranks, 1 s steps) with at most one fault, job id ``sid``."""
    return Scenario.from_dict({
        "id": sid, "seed": 5, "ranks": 8, "layout": {"tp": 4, "pp": 1, "dp": 2}, "channels": 2,
        "step_time_s": 1.0, "duration_s": duration_s, "clock_skew_s": 2.0, "jitter": 0.02,
        "faults": [fault] if fault else [], "expect": [{"kind": fault["kind"], "rank": fault["rank"]}] if fault else [],
    })


def scenario_batches(sid: str, fault: dict[str, Any] | None, duration_s: float) -> list[tuple[float, KernelBatch]]:
    """``small_scenario``'s ``(simulated time, batch)`` pairs."""
    return list(simulate(small_scenario(sid, fault, duration_s)))


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
    """Print the counts on one line and append the row to ``$CCLD_CHAOS_REPORT`` (JSON lines) when set:
    benchmarks/results is built from it."""
    print(count_line(fault, produced=produced, delivered=delivered, verdicts_expected=verdicts_expected,
                     verdicts_received=verdicts_received, verdicts_raw=verdicts_raw), flush=True)
    path = os.environ.get("CCLD_CHAOS_REPORT")
    if not path:
        return
    row = {"fault": fault, "injected": injected, "produced": produced, "delivered": delivered,
           "lost": produced - delivered, "verdicts_expected": verdicts_expected,
           "verdicts_received": verdicts_received, "duplicated": verdicts_raw - verdicts_received, **extra}
    with Path(path).open("a") as f:
        f.write(json.dumps(row) + "\n")


def fault_during_outage(broker: ChaosBroker, settings: Settings, worker: WorkerProcess, spool_dir: Path, *,
                        outage_at_s: float, outage_s: float, onset_s: float, duration_s: float,
                        rank: int = 5) -> dict[str, Any]:
    """A real-time ``ccld simulate`` with the spool on, the broker frozen while a rank hangs (H1 at ``onset_s``).

    The producer must keep every record through the outage and replay it; the worker, which sees nothing
    during the freeze, must then name the rank once. Returns what was measured (the caller asserts).
    """
    scenario = {"id": "outage-fault", "seed": 11, "ranks": 8, "gpus_per_node": 8, "step_time_s": 0.25,
                "duration_s": duration_s, "faults": [{"kind": "H1", "rank": rank, "onset_s": onset_s}],
                "expect": [{"kind": "H1", "rank": rank}]}
    dry = subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "simulate", json.dumps(scenario), "--dry-run"],
                         env=child_env(settings), capture_output=True, text=True, check=True, timeout=120)
    expected = int(json.loads(dry.stdout)["records"])
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "ccld.cli", "simulate", json.dumps(scenario), "--realtime",
         "--flush-timeout-s", "120", "--set", "producer_message_timeout_ms=2000", "--set", f"spool_dir={spool_dir}"],
        env=child_env(settings), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    t0 = time.monotonic()
    time.sleep(outage_at_s)
    broker.freeze()
    try:
        time.sleep(outage_s)
    finally:
        broker.thaw()
    thawed = time.time()
    out, err = proc.communicate(timeout=duration_s + 240)
    got = collect_verdicts(settings, 90, until=lambda vs: any(rank in v.root_cause_ranks for v in vs))
    hit = [v for v in got if v.kind.value == "H1" and rank in v.root_cause_ranks]
    # When the worker had the broker's ack for it: its log line (local wall time, as time.time()).
    sent_at = [datetime.strptime(m, "%Y-%m-%d %H:%M:%S,%f").timestamp() for m in re.findall(
        r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) INFO ccld\.streams\.app: verdict \[open\] H1 rank",
        worker.log_path.read_text(errors="replace"))]
    verdict_after_thaw_s = sent_at[0] - thawed if sent_at else None
    time.sleep(2)  # time for a repeat to show up
    raw = raw_verdicts(settings)
    batches = {(b.producer, b.batch_seq): b for b in raw_batches(settings, idle_s=3.0)}
    return {"returncode": proc.returncode, "stdout": out, "stderr": err[-3000:], "expected_records": expected,
            "records_on_broker": sum(b.n for b in batches.values()), "verdict": hit[0] if hit else None,
            "verdicts_raw": [v for v in raw if v.state.value == "open"], "wall_s": time.monotonic() - t0,
            "verdict_after_thaw_s": verdict_after_thaw_s}


def children_of(pid: int) -> dict[int, str]:
    """pid -> command line of the direct children of ``pid`` (from /proc: no psutil needed)."""
    out: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is not alive
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


class Lines:
    """Lines of a pipe, read in a thread so a test can wait for one with a deadline."""

    def __init__(self, stream: object) -> None:
        self.q: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.q.put(line)

    def wait_for(self, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.q.get(timeout=0.2)
            except queue.Empty:
                continue
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} within {timeout_s} s; saw:\n{''.join(self.seen)}")


def publish_verdicts(settings: Settings, prefix: str, n: int) -> list[str]:
    """``n`` distinct verdicts (incident ids ``<prefix>-<i>``) straight onto the verdicts topic; returns the ids."""
    from ccld.records import AnomalyKind, VerdictState
    from ccld.schemas.codec import encode_verdict

    p = Producer({"bootstrap.servers": settings.bootstrap, "linger.ms": 5})
    ids = []
    for i in range(n):
        v = Verdict(incident_id=f"{prefix}-{i}", state=VerdictState.OPEN, kind=AnomalyKind.H1, job=prefix,
                    communicator="00000000000000aa", op_seq=i, op_type="ALL_REDUCE", root_cause_ranks=(i % 8,),
                    affected_ranks=tuple(range(8)), confidence=0.9, evidence="chaos", onset_time=float(i),
                    detected_time=float(i) + 20.0)
        p.produce(settings.verdicts_topic, encode_verdict(v), key=v.incident_id.encode())
        p.poll(0)
        ids.append(v.incident_id)
    assert p.flush(30) == 0, "the broker did not take every verdict"
    return ids
