"""`ccld up` keeps the pipeline alive: a killed worker or broker comes back; SIGTERM still stops everything.

Real processes only: `ccld up` with its embedded broker, worker and sink; faults are kill -9.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from ccld.settings import Settings
from ccld.stack.broker import EmbeddedBroker, free_port, port_is_free
from chaoslib import (
    Lines,
    alive,
    archived,
    archived_by,
    children_of,
    produce,
    raw_verdicts,
    record_result,
    scenario_batches,
    wait_for,
)
from harness import collect_verdicts, start_up, stop_up

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def leave_time_wait(port: int) -> None:
    """Leave a TIME_WAIT socket on ``port``, as a stopped broker does (the listener's side closed first)."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        served, _ = listener.accept()
        served.close()  # the server side closes first: its (port, client) pair goes to TIME_WAIT
        time.sleep(0.1)
        client.close()
    time.sleep(0.2)


def test_broker_restarts_on_its_own_port_at_once() -> None:
    port = free_port()
    leave_time_wait(port)
    with socket.socket() as s:  # the precondition: without SO_REUSEADDR the port looks busy for a minute
        with pytest.raises(OSError):
            s.bind(("127.0.0.1", port))
    assert port_is_free(port)
    b = EmbeddedBroker(port)
    try:
        b.start(timeout_s=10)
        AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=5)
        b.stop()
        assert port_is_free(port), "a stopped broker's port looked busy"
        b.start(timeout_s=10)  # and once more, right after its own stop
        assert b.running
    finally:
        b.stop()


def test_up_restarts_a_killed_worker_and_broker_and_stops_cleanly(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_")}
    env.update({"CCLD_TOPIC_PREFIX": f"u{tag}.", "CCLD_WORKER_APP_ID": f"up-{tag}", "CCLD_SINK_GROUP": f"sink-{tag}",
                "CCLD_ARCHIVE_DIR": str(tmp_path / "archive")})
    port = free_port()
    archive = tmp_path / "archive"
    s = Settings.load(env, bootstrap=f"127.0.0.1:{port}")
    up = start_up(env, port, tmp_path / "logs")
    out, err = Lines(up.stdout), Lines(up.stderr)
    seen: set[int] = set()
    try:
        out.wait_for("Ctrl-C stops everything", 30)
        kids = children_of(up.pid)
        seen |= set(kids)
        worker = next(pid for pid, cmd in kids.items() if cmd.endswith("ccld.cli worker "))
        broker = next(pid for pid, cmd in kids.items() if "tansu" in cmd)

        os.kill(worker, signal.SIGKILL)
        err.wait_for("worker exited with code -9", 15)
        err.wait_for("worker restarted", 15)
        assert up.poll() is None and alive(broker), "ccld up fell over with its worker"
        seen |= set(children_of(up.pid))

        os.kill(broker, signal.SIGKILL)
        err.wait_for("the embedded broker is back", 20)
        assert up.poll() is None
        topics = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=10).topics
        assert f"u{tag}.metrics" in topics, "topics were not recreated on the restarted broker"
        seen |= set(children_of(up.pid))

        # end to end after both restarts: a job that hangs now is reported once and archived
        t0 = time.monotonic()
        job = scenario_batches("after-restarts", {"kind": "H1", "rank": 3, "onset_s": 15.0}, 50.0)
        produced = sum(b.n for _, b in job)
        acked = produce(s, job)
        assert acked == produced
        got = collect_verdicts(s, 60, until=lambda vs: any(3 in v.root_cause_ranks for v in vs))
        found_s = time.monotonic() - t0
        assert any(v.kind.value == "H1" and v.root_cause_ranks == (3,) for v in got), \
            "".join(err.seen) + (tmp_path / "logs" / "worker.log").read_text(errors="replace")[-3000:]
        time.sleep(2)  # time for a duplicate to show up
        raw = raw_verdicts(s)
        per_key = Counter(v.dedupe_key for v in raw)
        assert all(n == 1 for n in per_key.values()), f"duplicated verdicts: {per_key}"
        assert wait_for(lambda: sum(archived(archive, s.verdicts_topic).values()) >= len(raw), 30), \
            "the restarted sink did not archive the verdicts"
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(40)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            raise
    assert up.returncode == 0
    left = [pid for pid in seen | set(children_of(up.pid)) if alive(pid)]
    assert not left, f"ccld up left processes behind: {left}"
    rows = archived(archive, s.verdicts_topic)
    assert rows and all(n == 1 for n in rows.values()), f"verdict offsets archived more than once: {rows}"
    record_result("ccld up: worker killed, then the embedded broker killed", f"SIGKILL of the worker, then of "
                  f"the broker; both restarted by ccld up; a job hanging afterwards reported in {found_s:.0f} s",
                  produced=produced, delivered=acked, verdicts_expected=1, verdicts_received=len(per_key),
                  verdicts_raw=len(raw))


def test_up_renews_its_broker_past_the_memory_cap_only_when_nothing_is_in_flight(tmp_path: Path) -> None:
    """The embedded broker never compacts or expires a log: past ``up_broker_renew_mb`` (1 MB here, so always)
    ``ccld up`` restarts it empty, but only once no record has arrived for ``up_renew_quiet_s`` and nothing is
    unread, unarchived, open or pending (each condition unit-tested in ``test_renew.py``). Every row of the job
    before is archived before the renewal, and a job that hangs after it is found and archived."""
    tag = uuid.uuid4().hex[:8]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_")}
    env.update({"CCLD_TOPIC_PREFIX": f"r{tag}.", "CCLD_WORKER_APP_ID": f"rn-{tag}", "CCLD_SINK_GROUP": f"sink-{tag}",
                "CCLD_ARCHIVE_DIR": str(tmp_path / "archive"), "CCLD_UP_BROKER_RENEW_MB": "1",
                "CCLD_UP_RENEW_QUIET_S": "6"})
    port = free_port()
    archive = tmp_path / "archive"
    s = Settings.load(env, bootstrap=f"127.0.0.1:{port}")
    up = start_up(env, port, tmp_path / "logs")
    out, err = Lines(up.stdout), Lines(up.stderr)
    try:
        out.wait_for("Ctrl-C stops everything", 30)
        before = scenario_batches("before-renewal", None, 20.0)
        produced = sum(b.n for _, b in before)
        assert produce(s, before) == produced
        line = err.wait_for("restarting it empty", 120)
        assert "over up_broker_renew_mb (1)" in line, line
        rows = Counter({k: n for k, n in archived_by(archive, s.metrics_topic, "job").items()
                        if k[0] == "before-renewal"})
        assert sum(rows.values()) == produced, f"{sum(rows.values())} of {produced} rows archived before the renewal"
        err.wait_for("the embedded broker is renewed", 30)

        hung = scenario_batches("after-renewal", {"kind": "H1", "rank": 3, "onset_s": 15.0}, 50.0)
        produce(s, hung)
        got = collect_verdicts(s, 90, until=lambda vs: any(3 in v.root_cause_ranks for v in vs))
        assert any(v.kind.value == "H1" and v.root_cause_ranks == (3,) for v in got), \
            "".join(err.seen) + (tmp_path / "logs" / "worker.log").read_text(errors="replace")[-3000:]
        assert wait_for(lambda: any(k[0] == "after-renewal" for k in archived_by(archive, s.verdicts_topic, "job")),
                        30), "the verdict after the renewal was not archived"
    finally:
        stop_up(up)
    assert up.returncode == 0, "ccld up did not stop within 40 s of SIGTERM"
