"""`ccld simulate` as a person runs it, against a missing, a frozen and a healthy broker: never a silent 0.

Real `ccld simulate` processes and real Tansu brokers (one per test, so it can be frozen).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ccld.settings import Settings
from ccld.stack.broker import EmbeddedBroker, free_port
from ccld.topics import ensure_topics
from harness import raw_batches

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SCENARIO = json.dumps({"id": "chaos-sim", "seed": 3, "ranks": 8, "gpus_per_node": 8, "step_time_s": 0.25,
                       "duration_s": 12, "faults": [], "expect": []})


def simulate(bootstrap: str, prefix: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "ccld.cli", "simulate", SCENARIO, "--bootstrap", bootstrap,
         "--topic-prefix", prefix, "--set", "metrics_partitions=1", "--set", "producer_message_timeout_ms=2000",
         *extra],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("CCLD_")}, **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def expected_records() -> int:
    out = subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "simulate", SCENARIO, "--dry-run"],
                         capture_output=True, text=True, check=True, timeout=60)
    return int(json.loads(out.stdout)["records"])


def topic_for(broker: EmbeddedBroker) -> tuple[str, Settings]:
    prefix = f"s{uuid.uuid4().hex[:8]}."
    s = Settings.load({}, bootstrap=broker.bootstrap, topic_prefix=prefix, metrics_partitions=1)
    ensure_topics(s)
    return prefix, s


def freeze_during(proc: subprocess.Popen[str], broker: EmbeddedBroker, at_s: float, for_s: float) -> tuple[str, str]:
    time.sleep(at_s)
    assert broker.pid is not None and proc.poll() is None
    os.kill(broker.pid, signal.SIGSTOP)
    time.sleep(for_s)
    os.kill(broker.pid, signal.SIGCONT)
    return proc.communicate(timeout=90)


def test_missing_broker_fails_fast_and_says_so() -> None:
    t0 = time.monotonic()
    proc = simulate(f"127.0.0.1:{free_port()}", "x.", env={"CCLD_PRODUCER_CONNECT_TIMEOUT_S": "3"})
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode != 0, out
    assert "no Kafka broker answered" in err, err
    assert took < 30, f"ccld simulate took {took:.0f} s to give up on a missing broker"


def test_frozen_broker_without_spool_exits_nonzero_with_the_count(broker: EmbeddedBroker) -> None:
    prefix, _s = topic_for(broker)
    proc = simulate(broker.bootstrap, prefix, "--realtime")
    out, err = freeze_during(proc, broker, at_s=3.0, for_s=5.0)
    assert proc.returncode == 1, (out, err)
    line = out.strip().splitlines()[-1]
    lost = int(line.split(" lost ")[0].rsplit(", ", 1)[1])
    assert lost > 0 and "records were lost" in err, (out, err)


def test_frozen_broker_with_spool_delivers_everything(broker: EmbeddedBroker, tmp_path: Path) -> None:
    prefix, s = topic_for(broker)
    proc = simulate(broker.bootstrap, prefix, "--realtime", "--set", f"spool_dir={tmp_path / 'spool'}")
    out, err = freeze_during(proc, broker, at_s=3.0, for_s=5.0)
    assert proc.returncode == 0, (out, err)
    assert " 0 lost " in out and "spooled 0" in out, out
    batches = raw_batches(s, idle_s=3.0)
    seen = {(b.producer, b.batch_seq) for b in batches}
    records = sum(b.n for b in {(b.producer, b.batch_seq): b for b in batches}.values())
    assert records == expected_records(), (records, len(seen), out)
    # a simulated job starts at the wall clock, as a real one does: its ranks' clocks and its messages'
    # timestamps are today's (not 1970's: archive days, verdict times, the worker's far-clock count)
    started = time.time() - 120
    enters = [int(t) for b in batches for t in b.col("t_enter_ns") if t >= 0]
    assert enters and min(enters) / 1e9 > started and max(enters) / 1e9 < time.time() + 60, (min(enters), started)
