"""`ccld alert` as a real process: verdicts on the real broker reach a real Alertmanager and a local webhook.

Alertmanager is Debian's ``prometheus-alertmanager`` (``.ci/run`` installs it), started per module on a
free loopback port with no gossip; the tests that need it skip, saying so, only where it is not installed.
The webhook is a small ``http.server`` in a thread that answers what each test scripts.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from ccld.anomaly import CLASSES, AnomalyKind
from ccld.records import Verdict, VerdictState
from ccld.schemas.codec import encode_verdict
from ccld.settings import Settings
from ccld.stack.alertmanager import LocalAlertmanager, LocalWebhook, alertmanager_binary, list_alerts
from factories import make_verdict
from harness import WorkerProcess, start_up, stop_up

pytestmark = pytest.mark.integration


# --- helpers ----------------------------------------------------------------------------------------


def publish(settings: Settings, verdicts: list[Verdict]) -> None:
    """Each verdict on the verdicts topic, keyed by its incident as the worker keys them."""
    p = Producer({"bootstrap.servers": settings.bootstrap})
    for v in verdicts:
        p.produce(settings.verdicts_topic, key=v.incident_id.encode(), value=encode_verdict(v))
    assert p.flush(20) == 0


def wait_for(cond: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.3)
    return cond()


def counters(proc: WorkerProcess) -> dict[str, int]:
    """The last ``counters {...}`` line of a stopped ``ccld alert``'s log (it logs one at exit)."""
    lines = [ln for ln in proc.log_path.read_text().splitlines() if "counters {" in ln]
    assert lines, proc.log()
    return dict(json.loads(lines[-1].split("counters ", 1)[1]))


def committed(settings: Settings) -> int:
    """The group's committed offset of the verdicts topic's partition 0 (-1001: none)."""
    c = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": settings.alert_group})
    try:
        return int(c.committed([TopicPartition(settings.verdicts_topic, 0)], timeout=10)[0].offset)
    finally:
        c.close()


def incident(**over: Any) -> Verdict:
    """An H1 verdict with wall-clock times, as a worker sends one."""
    now = time.time()
    base: dict[str, Any] = dict(incident_id=uuid.uuid4().hex[:16], kind=AnomalyKind.H1, job="alert-job",
                                communicator="9f3c5a0e1d2b4c6f", op_seq=35, op_type="ALL_REDUCE",
                                root_cause_ranks=(13,), root_cause_hosts=("node-0001",), affected_ranks=(8, 9),
                                evidence="ranks 8,9 entered ALL_REDUCE #35 and waited 21.0 s; rank 13 never entered",
                                confidence=0.95, onset_time=now - 21, detected_time=now)
    base.update(over)
    return make_verdict(**base)


def alert_process(settings: Settings, tmp_path: Path, name: str = "alert") -> WorkerProcess:
    return WorkerProcess(settings, tmp_path / f"{name}.log", command="alert", ready="alerting:")


# --- Alertmanager -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a real Alertmanager on a free loopback port (no cluster gossip, a receiver that drops)."""
    if alertmanager_binary() is None:
        pytest.skip("Alertmanager is not installed: apt-get install prometheus-alertmanager (.ci/run does)")
    with LocalAlertmanager(tmp_path_factory.mktemp("alertmanager")) as am:
        yield am.url


def am_alerts(url: str, incident_id: str) -> list[dict[str, Any]]:
    """The alerts Alertmanager lists for one incident (resolved ones it does not list)."""
    return list_alerts(url, incident_id)


def test_incident_fires_keeps_firing_and_resolves_in_alertmanager(
    ccld_settings: Settings, alertmanager: str, tmp_path: Path
) -> None:
    s = ccld_settings.replace(alert_group=f"alert-{uuid.uuid4().hex[:8]}", alert_alertmanager_url=alertmanager,
                              alert_repeat_s=2.0, alert_retry_max_s=1.0)
    opened = incident()
    proc = alert_process(s, tmp_path).start()
    try:
        publish(s, [opened])

        def active() -> list[dict[str, Any]]:
            return [a for a in am_alerts(alertmanager, opened.incident_id) if a["status"]["state"] == "active"]

        alerts = wait_for(active, 30)
        assert len(alerts) == 1, f"{alerts}\n{proc.log()}"
        a = alerts[0]
        assert {k: v for k, v in a["labels"].items() if k != "severity"} == {
            "alertname": "CCLD_H1", "job": "alert-job", "kind": "H1", "ranks": "13", "hosts": "node-0001",
            "communicator": "9f3c5a0e1d2b4c6f", "incident_id": opened.incident_id}
        assert a["annotations"]["action"] == CLASSES[AnomalyKind.H1].action
        assert a["annotations"]["report"] == f"ccld report {opened.incident_id}"
        assert a["annotations"]["summary"] == opened.describe()
        assert a["annotations"]["evidence"] == opened.evidence
        first_end = a["endsAt"]

        # endsAt is 3 repeat periods (6 s) ahead: only the re-posts keep it firing 10 s later
        time.sleep(10)
        alerts = active()
        assert len(alerts) == 1, f"the open incident stopped firing: {alerts}\n{proc.log()}"
        assert alerts[0]["endsAt"] > first_end

        # an update with the same class and culprit is the same alert, not a second one
        update = incident(incident_id=opened.incident_id, state=VerdictState.UPDATE, affected_ranks=(8, 9, 10, 11),
                          op_seq=35)
        publish(s, [update])
        assert wait_for(lambda: any(x["annotations"]["summary"] == update.describe() for x in active()), 30), \
            proc.log()
        assert len(am_alerts(alertmanager, opened.incident_id)) == 1

        publish(s, [incident(incident_id=opened.incident_id, state=VerdictState.RESOLVED, affected_ranks=(8, 9))])
        assert wait_for(lambda: not active(), 30), f"still firing after resolved: {active()}\n{proc.log()}"
    finally:
        proc.stop()
    c = counters(proc)
    assert c["delivered_alertmanager"] == 3 and c["failures_alertmanager"] == 0 and c["reposts"] >= 2, c
    assert committed(s) == 3, "every accepted verdict's offset is committed"


# --- the webhook ------------------------------------------------------------------------------------


@pytest.fixture
def webhook() -> Iterator[Callable[..., LocalWebhook]]:
    made: list[LocalWebhook] = []

    def make(script: list[int], then: int = 200) -> LocalWebhook:
        made.append(LocalWebhook(script, then))
        return made[-1]

    yield make
    for w in made:
        w.close()


def test_webhook_that_fails_twice_loses_nothing_and_counts_the_failures(
    ccld_settings: Settings, webhook: Callable[..., LocalWebhook], tmp_path: Path
) -> None:
    hook = webhook([500, 500])
    s = ccld_settings.replace(alert_group=f"alert-{uuid.uuid4().hex[:8]}", alert_webhook_url=hook.url,
                              alert_retry_max_s=1.0)
    opened = incident(kind=AnomalyKind.S2, root_cause_ranks=(3,))
    sent = [opened,
            opened,  # a repeat at-least-once delivery put on the topic: delivered once
            incident(incident_id=opened.incident_id, kind=AnomalyKind.S3, state=VerdictState.UPDATE,
                     root_cause_ranks=(3,)),
            incident(incident_id=opened.incident_id, kind=AnomalyKind.S3, state=VerdictState.RESOLVED,
                     root_cause_ranks=(3,))]
    publish(s, sent)
    proc = alert_process(s, tmp_path).start()
    try:
        assert wait_for(lambda: len(hook.taken) == 3, 30), f"{hook.taken}\n{proc.log()}"
        assert wait_for(lambda: committed(s) == 4, 15), proc.log()
    finally:
        proc.stop()
    assert [(b["state"], b["kind"]) for b in hook.taken] == [("open", "S2"), ("update", "S3"), ("resolved", "S3")]
    assert hook.taken[0]["action"] == CLASSES[AnomalyKind.S2].action
    assert {k: hook.taken[0][k] for k in opened.to_dict()} == opened.to_dict()
    assert hook.attempts == 5
    c = counters(proc)
    assert (c["failures_webhook"], c["delivered_webhook"], c["duplicates"], c["backlog"]) == (2, 3, 1, 0), c


def test_a_webhook_that_is_down_holds_the_offsets_and_a_restart_delivers(
    ccld_settings: Settings, webhook: Callable[..., LocalWebhook], tmp_path: Path
) -> None:
    hook = webhook([], then=503)
    s = ccld_settings.replace(alert_group=f"alert-{uuid.uuid4().hex[:8]}", alert_webhook_url=hook.url,
                              alert_retry_max_s=0.5, alert_slack=True)
    sent = [incident(), incident(kind=AnomalyKind.H3, root_cause_ranks=(5,))]
    publish(s, sent)
    proc = alert_process(s, tmp_path).start()
    try:
        assert wait_for(lambda: hook.attempts >= 3, 30), proc.log()
    finally:
        proc.stop()
    assert not hook.taken
    assert committed(s) < 0, "nothing was accepted, so nothing may be committed"
    assert counters(proc)["failures_webhook"] >= 3

    hook.then = 200  # the receiver is back; a restarted service re-reads what it had not delivered
    proc = alert_process(s, tmp_path, "alert-2").start()
    try:
        assert wait_for(lambda: len(hook.taken) == 2, 30), proc.log()
        assert wait_for(lambda: committed(s) == 2, 15), proc.log()
    finally:
        proc.stop()
    texts = [b["text"] for b in hook.taken]  # Slack's shape: one text per verdict
    assert [sent[0].incident_id in texts[0], sent[1].incident_id in texts[1]] == [True, True], texts
    assert "H3 hardware-fault hang: open" in texts[1]


def test_a_restarted_service_keeps_the_open_incidents_firing(
    ccld_settings: Settings, alertmanager: str, tmp_path: Path
) -> None:
    s = ccld_settings.replace(alert_group=f"alert-{uuid.uuid4().hex[:8]}", alert_alertmanager_url=alertmanager,
                              alert_repeat_s=2.0, alert_retry_max_s=1.0)
    opened = incident(kind=AnomalyKind.H2, root_cause_ranks=(4,), mismatch_field="dtype")
    publish(s, [opened])

    def active() -> list[dict[str, Any]]:
        return [a for a in am_alerts(alertmanager, opened.incident_id) if a["status"]["state"] == "active"]

    first = alert_process(s, tmp_path).start()
    try:
        assert wait_for(active, 30), first.log()
        assert wait_for(lambda: committed(s) == 1, 15), first.log()
    finally:
        first.stop()
    # the open verdict is committed: the new process must rebuild the incident from the topic, not resend it
    second = alert_process(s, tmp_path, "alert-2").start()
    try:
        time.sleep(10)  # endsAt was at most 6 s ahead when the first process stopped
        assert len(active()) == 1, f"the restart let the open incident lapse\n{second.log()}"
    finally:
        second.stop()
    c = counters(second)
    assert (c["replayed"], c["delivered_alertmanager"], c["open_incidents"]) == (1, 0, 1), c
    assert c["reposts"] >= 1, c


# --- end to end: a real hung job, the real worker, the bridge, a real Alertmanager -------------------


def test_a_real_hung_job_pages_in_alertmanager_and_the_page_ends_when_the_job_is_killed(
    ccld_settings: Settings, alertmanager: str, tmp_path: Path
) -> None:
    """4 gloo ranks under the attachment, rank 2 stops before step 20; a real ``ccld worker`` finds the H1,
    a real ``ccld alert`` fires it in Alertmanager within 30 s of the verdict; the job is killed, its
    incident closes once the job has been silent ``incident_close_silent_s`` (10 s here), and the alert
    is resolved (issue 17, proof)."""
    pytest.importorskip("torch", reason="torch is not installed (pip install 'ccl-d[torch]')")
    from ccld.producers.attach.localrun import launch
    from ccld.producers.attach.run_command import prepare_env
    from harness import collect_verdicts, job_logs

    s = ccld_settings.replace(
        job=f"oncall-{uuid.uuid4().hex[:6]}", analyzer_hang_min_s=5.0, analyzer_h3_min_s=5.0,
        analyzer_incident_close_silent_s=10.0, producer_linger_ms=50,
        alert_group=f"alert-{uuid.uuid4().hex[:8]}", alert_alertmanager_url=alertmanager, alert_repeat_s=2.0,
        alert_retry_max_s=1.0,
    )
    site = tmp_path / "site"
    site.mkdir()
    env = prepare_env(s, str(site), sink="kafka", heartbeat_ms=100)
    job = launch(4, ["ccld.producers.attach.demo_job", "--fault", "stop", "--culprit", "2", "--at-step", "20",
                     "--compute-ms", "20"], tmp_path / "ranks", env=env)
    worker = WorkerProcess(s, tmp_path / "worker.log")
    bridge = alert_process(s, tmp_path)
    try:
        worker.start()
        bridge.start()
        got = collect_verdicts(s, 60, until=lambda vs: any(v.state is VerdictState.OPEN for v in vs))
        opened = [v for v in got if v.state is VerdictState.OPEN]
        assert opened and opened[0].kind is AnomalyKind.H1 and opened[0].root_cause_ranks == (2,), \
            f"{[v.describe() for v in got]}\n{job_logs(job)}"
        iid = opened[0].incident_id
        t_verdict = time.monotonic()
        assert wait_for(lambda: bool(am_alerts(alertmanager, iid)), 30), bridge.log()
        fired_s = time.monotonic() - t_verdict
        (alert,) = am_alerts(alertmanager, iid)
        assert alert["labels"]["alertname"] == "CCLD_H1" and alert["labels"]["ranks"] == "2", alert
        job.kill()  # a scheduler's cancel: every rank gone at once, no goodbye
        t_kill = time.monotonic()
        closed = collect_verdicts(s, 60, until=lambda vs: any(v.state is VerdictState.CLOSED for v in vs))
        assert any(v.state is VerdictState.CLOSED and v.incident_id == iid for v in closed), \
            [v.describe() for v in closed]
        assert wait_for(lambda: not am_alerts(alertmanager, iid), 30), bridge.log()
        print(f"ONCALL alert fired {fired_s:.1f} s after the verdict; resolved "
              f"{time.monotonic() - t_kill:.1f} s after the job was killed")
    finally:
        job.kill()
        bridge.stop()
        worker.stop()


# --- the cluster's view: a host that keeps breaking jobs ---------------------------------------------


FLEET = [  # three jobs meet the slow GPU of host bad-7 (rank 3 of node 0 or 1); one H1 on host once-9
    {"id": "fleet-a", "hosts": ["bad-7", "ok-1"], "faults": [{"kind": "S1", "rank": 3, "onset_s": 8, "factor": 3.0}]},
    {"id": "fleet-b", "hosts": ["ok-2", "bad-7"], "faults": [{"kind": "S1", "rank": 11, "onset_s": 8, "factor": 3.0}]},
    {"id": "fleet-c", "hosts": ["bad-7", "ok-3"], "faults": [{"kind": "S1", "rank": 3, "onset_s": 8, "factor": 2.5}]},
    {"id": "fleet-d", "hosts": ["once-9", "ok-4"], "faults": [{"kind": "H1", "rank": 2, "onset_s": 10}]},
]


def test_three_jobs_on_a_bad_host_make_it_a_drain_candidate_in_alertmanager_and_ccld_nodes(
    alertmanager: str, tmp_path: Path
) -> None:
    """`ccld up --alertmanager`, and `ccld simulate` of four jobs (stamped from the wall clock): three meet one
    host's slow GPU, one hangs on another host. CcldHostSuspect fires for the first host only, and `ccld nodes`
    names it a drain candidate and the other a host to watch."""
    import os
    import subprocess
    import sys

    tag = uuid.uuid4().hex[:8]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_")}
    env.update({"CCLD_TOPIC_PREFIX": f"f{tag}.", "CCLD_WORKER_APP_ID": f"fleet-{tag}", "CCLD_SINK_GROUP": f"s-{tag}",
                "CCLD_ALERT_GROUP": f"a-{tag}", "CCLD_ARCHIVE_DIR": str(tmp_path / "archive"),
                "CCLD_ALERT_REPEAT_S": "2", "CCLD_ALERT_RETRY_MAX_S": "1",
                # three jobs, as an operator would see them in a morning; the default asks four incidents a day
                "CCLD_FLEET_MIN_INCIDENTS": "3"})
    suite = tmp_path / "fleet.jsonl"
    suite.write_text("".join(json.dumps({"ranks": 16, "gpus_per_node": 8, "layout": {"tp": 4, "pp": 2, "dp": 2},
                                         "duration_s": 45, **sc}) + "\n" for sc in FLEET))
    up = start_up(env, 0, tmp_path / "logs", "--alertmanager", alertmanager, merged=True)
    try:
        assert up.stdout is not None
        boot = ""
        while not boot:
            line = up.stdout.readline()
            assert line, "ccld up exited before it printed its broker"
            boot = line.removeprefix("bootstrap: ").strip() if line.startswith("bootstrap: ") else ""
        env["CCLD_BOOTSTRAP"] = boot
        sim = subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "simulate", str(suite)], env=env,
                             capture_output=True, text=True, timeout=180)
        assert sim.returncode == 0, sim.stdout + sim.stderr

        def suspects() -> list[dict[str, Any]]:
            return [a for a in list_alerts(alertmanager) if a["labels"].get("alertname") == "CcldHostSuspect"
                    and a["labels"].get("host", "").startswith(("bad-7", "once-9", "ok-"))]

        got = wait_for(suspects, 120)
        logs = "".join((tmp_path / "logs" / f).read_text()[-3000:] for f in ("worker.log", "alert.log"))
        assert [a["labels"]["host"] for a in got] == ["bad-7"], logs
        assert "drain bad-7" in got[0]["annotations"]["action"], got[0]
        nodes = subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "nodes", "--json"], env=env,
                               capture_output=True, text=True, timeout=60)
        assert nodes.returncode == 0, nodes.stderr
        hosts = {h["host"]: h for h in json.loads(nodes.stdout)["hosts"]}
        assert hosts["bad-7"]["candidate"] and hosts["bad-7"]["jobs"] == 3, hosts
        assert "once-9" in hosts and not hosts["once-9"]["candidate"], hosts
        assert not any(h.startswith("ok-") for h in hosts), f"a victim host counted: {hosts}"
    finally:
        stop_up(up)
