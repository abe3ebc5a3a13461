"""The CLI as a person uses it: `ccld up`, `ccld broker`, `ccld verdicts`, in real processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ccld.producers.kafka import MetricsProducer
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.settings import Settings
from ccld.stack.broker import free_port
from harness import WorkerProcess

pytestmark = pytest.mark.integration


def ccld(*args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_")}
    return subprocess.Popen([sys.executable, "-P", "-m", "ccld.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env, start_new_session=True)


def read_until(proc: subprocess.Popen[str], prefix: str, timeout_s: float = 30.0) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError(f"no line starting with {prefix!r}:\n{''.join(seen)}")


def test_up_prints_bootstrap_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    proc = ccld("up", "--port", "0", "--logs", str(tmp_path / "logs"), "--set", f"archive_dir={tmp_path / 'a'}",
                cwd=tmp_path)
    try:
        line = read_until(proc, "bootstrap: ")
        host, port = line.split(": ", 1)[1].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5):
            pass
        time.sleep(3)  # worker and sink are up
        assert proc.poll() is None
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(40) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=2).close()  # the broker is gone too


def test_broker_on_a_busy_port_says_so(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = ccld("broker", "--port", str(port))
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2 and f"port {port} on 127.0.0.1 is busy" in out


def test_commands_without_a_broker_fail_clearly() -> None:
    port = free_port()
    proc = ccld("verdicts", "--bootstrap", f"127.0.0.1:{port}", "--timeout", "1")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "cannot reach Kafka" in out


def test_verdicts_json_lines_with_timeout(ccld_settings: Settings, running_worker: WorkerProcess) -> None:
    sc = Scenario.from_dict({"id": "cli-h1", "seed": 2, "ranks": 8, "layout": {"tp": 8, "pp": 1, "dp": 1},
                             "channels": 2, "step_time_s": 1.0, "duration_s": 90.0,
                             "faults": [{"kind": "H1", "rank": 2, "onset_s": 40.0}]})
    with MetricsProducer(ccld_settings, background=False) as p:
        for t, b in simulate(sc):
            p.send_batch(b, timestamp_ms=int(t * 1000))
    proc = ccld("verdicts", "--json", "--from-beginning", "--timeout", "20", "--bootstrap", ccld_settings.bootstrap,
                "--topic-prefix", ccld_settings.topic_prefix)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert any(v["kind"] == "H1" and v["root_cause_ranks"] == [2] for v in lines), out + running_worker.log()


def test_worker_exits_on_sigterm_even_when_its_broker_is_gone(tmp_path: Path) -> None:
    from ccld.stack.broker import EmbeddedBroker
    from ccld.topics import ensure_topics

    broker = EmbeddedBroker(0).start()
    try:
        s = Settings.load({}, bootstrap=broker.bootstrap, worker_app_id=f"gone-{time.time_ns()}",
                          worker_shutdown_grace_s=3.0)
        ensure_topics(s)
        worker = WorkerProcess(s, tmp_path / "worker.log").start()
    finally:
        broker.stop()
    time.sleep(1)
    t0 = time.monotonic()
    code = worker.stop(signal.SIGTERM, timeout_s=30)
    assert time.monotonic() - t0 < 15, worker.log()
    assert code in (0, 1), worker.log()


def test_simulate_without_a_broker_fails_within_its_connect_timeout() -> None:
    scenario = json.dumps({"id": "nobroker", "seed": 1, "ranks": 8, "step_time_s": 0.5, "duration_s": 5})
    t0 = time.monotonic()
    proc = ccld("simulate", scenario, "--bootstrap", f"127.0.0.1:{free_port()}", "--set",
                "producer_connect_timeout_s=2")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "no Kafka broker answered" in out, out
    assert time.monotonic() - t0 < 30, "simulate did not give up on a missing broker in bounded time"


def test_ccld_run_against_a_dead_broker_says_so_within_seconds_and_the_job_is_not_hurt(tmp_path: Path) -> None:
    """Issue 17: the job runs on (it must never be hurt), but the operator learns within ~5 s that
    nothing is monitored, and at the end how much was."""
    from ccld.stack.broker import free_port

    dead = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "run", "--bootstrap", dead, "--job", "blind",
                          "--", sys.executable, "-c", "import time, sys; time.sleep(8); sys.exit(3)"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    took = time.monotonic() - t0
    assert res.returncode == 3, res.stderr  # the job's own exit code, untouched
    warn = [line for line in res.stderr.splitlines() if "WARNING" in line and dead in line]
    assert warn and "NOT monitored" in warn[0], res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith(f"ccld run: nothing was monitored: Kafka at {dead}") \
        or f"nothing was monitored: Kafka at {dead}" in res.stderr, res.stderr
    assert took < 30, took


def test_ccld_topics_refuses_to_leave_workers_idle_on_a_topic_with_too_few_partitions(ccld_settings: Settings) -> None:
    """The compose `topics` service exited 0 with a warning when the metrics topic already had fewer
    partitions than configured, so `--scale worker=N` left workers idle. Now it adds them, or (a broker
    that cannot add partitions, like Tansu) fails with one line saying what to do (issue 17, item 7)."""
    have = ccld_settings.metrics_partitions
    res = subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "topics", "--bootstrap", ccld_settings.bootstrap,
                          "--topic-prefix", ccld_settings.topic_prefix, "--set", f"metrics_partitions={have + 2}"],
                         capture_output=True, text=True, timeout=60)
    if res.returncode == 0:  # a broker that grows topics (Apache Kafka): then it really has them now
        assert f"{ccld_settings.metrics_topic}: {have + 2} partitions" in res.stdout, res.stdout + res.stderr
    else:
        assert res.returncode == 2, res.stderr
        line = res.stderr.strip().splitlines()[-1]
        assert f"topic {ccld_settings.metrics_topic} has {have} partitions, the settings ask for {have + 2}" in line
        assert "Traceback" not in res.stderr


def topic_config(settings: Settings, topic: str) -> dict[str, str]:
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    (fut,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return {k: e.value for k, e in fut.result(timeout=10).items()}


def test_topics_carry_their_retention_and_ccld_topics_sets_a_changed_one(
    ccld_settings: Settings, worker_factory: Callable[[Settings], WorkerProcess]
) -> None:
    """Topics are created with how long and how much they keep (metrics hours, verdicts weeks); `ccld topics`
    run again with other settings changes them on the existing topics; the worker's state log is compacted
    with a delete horizon and hourly segments (Kafka compacts closed segments only)."""
    s = ccld_settings
    want = {s.metrics_topic: str(6 * 3_600_000), s.verdicts_topic: str(28 * 86_400_000),
            s.deadletter_topic: str(7 * 86_400_000), s.reports_topic: str(6 * 3_600_000)}  # fmt: skip
    assert {t: topic_config(s, t).get("retention.ms") for t in want} == want
    assert topic_config(s, s.metrics_topic).get("retention.bytes") == "-1"
    res = subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "topics", "--bootstrap", s.bootstrap,
                          "--topic-prefix", s.topic_prefix, "--set", f"metrics_partitions={s.metrics_partitions}",
                          "--set", "metrics_retention_ms=7200000", "--set", "metrics_retention_bytes=1073741824"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert f"{s.metrics_topic}: {s.metrics_partitions} partitions, keeps 2 h, 1 GiB per partition" in res.stdout
    got = topic_config(s, s.metrics_topic)
    assert (got.get("retention.ms"), got.get("retention.bytes")) == ("7200000", "1073741824"), got
    assert topic_config(s, s.verdicts_topic).get("retention.ms") == want[s.verdicts_topic]  # the others as they were

    worker_factory(s).start()  # Faust creates the state log with the worker's table
    changelog = f"{s.worker_app_id}-analyzer-state-changelog"
    deadline = time.monotonic() + 60
    while True:
        try:
            log = topic_config(s, changelog)
            break
        except Exception:  # noqa: BLE001 - not created yet
            assert time.monotonic() < deadline, f"{changelog} never appeared"
            time.sleep(1)
    assert log.get("cleanup.policy") == "compact", log
    assert (log.get("delete.retention.ms"), log.get("segment.ms")) == ("86400000", "3600000"), log
