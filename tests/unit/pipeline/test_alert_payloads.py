"""Verdicts as alerts: Alertmanager labels and times, webhook and Slack bodies, the open-incident state machine."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ccld.anomaly import CLASSES, AnomalyKind
from ccld.records import Link, VerdictState
from ccld.sinks.alert_payloads import (
    ENDING_STATES,
    IncidentTable,
    alert_labels,
    alertmanager_alerts,
    iso,
    repost_alerts,
    slack_body,
    webhook_body,
)
from factories import make_verdict

NOW = 1_760_000_000.0  # wall-clock seconds


def verdict(**over: Any) -> Any:
    base: dict[str, Any] = dict(incident_id="inc-1", job="train-7", communicator="9f3c5a0e1d2b4c6f",
                                root_cause_ranks=(13,), root_cause_hosts=("node-0001",), affected_ranks=(8, 9),
                                evidence="rank 13 never entered", detected_time=NOW - 5)
    base.update(over)
    return make_verdict(**base)


def seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_labels_identify_the_incident_and_leave_out_empty_values() -> None:
    assert alert_labels(verdict()) == {
        "alertname": "CCLD_H1", "severity": "critical", "job": "train-7", "kind": "H1", "ranks": "13",
        "hosts": "node-0001", "communicator": "9f3c5a0e1d2b4c6f", "incident_id": "inc-1"}
    slow = alert_labels(verdict(kind=AnomalyKind.S2, root_cause_ranks=(3, 4), root_cause_hosts=()))
    assert (slow["alertname"], slow["severity"], slow["ranks"], "hosts" in slow) == ("CCLD_S2", "warning", "3,4", False)


def test_an_open_verdict_fires_with_the_runbook_line_and_a_future_end() -> None:
    table = IncidentTable()
    v = verdict()
    step = table.apply(v, 0, NOW)
    assert step is not None
    [alert] = alertmanager_alerts(step, NOW, ttl_s=180.0)
    assert alert["labels"] == alert_labels(v)
    assert alert["annotations"] == {"summary": v.describe(), "evidence": "rank 13 never entered",
                                    "action": CLASSES[AnomalyKind.H1].action, "class": "H1 not-entered hang",
                                    "report": "ccld report inc-1"}
    assert seconds(alert["startsAt"]) == NOW - 5  # the detection time, when it is wall time
    assert seconds(alert["endsAt"]) == NOW + 180


def test_update_with_the_same_labels_refires_the_same_alert() -> None:
    table = IncidentTable()
    table.apply(verdict(), 0, NOW)
    step = table.apply(verdict(state=VerdictState.UPDATE, affected_ranks=(8, 9, 10)), 0, NOW + 10)
    assert step is not None and step.resolve == ()
    [alert] = alertmanager_alerts(step, NOW + 10, ttl_s=180.0)
    assert alert["labels"] == alert_labels(verdict())
    assert seconds(alert["startsAt"]) == NOW - 5, "an update keeps the incident's start"


def test_update_that_changes_the_class_resolves_the_old_alert_and_fires_the_new() -> None:
    table = IncidentTable()
    table.apply(verdict(kind=AnomalyKind.S2, root_cause_ranks=(3,)), 0, NOW)
    step = table.apply(verdict(kind=AnomalyKind.S3, root_cause_ranks=(3,), link=Link(3, 4),
                               state=VerdictState.UPDATE), 0, NOW + 10)
    assert step is not None
    old, new = alertmanager_alerts(step, NOW + 10, ttl_s=180.0)
    assert (old["labels"]["alertname"], seconds(old["endsAt"])) == ("CCLD_S2", NOW + 10)
    assert (new["labels"]["alertname"], seconds(new["endsAt"])) == ("CCLD_S3", NOW + 190)
    assert table.open["inc-1"].labels["alertname"] == "CCLD_S3"


def test_resolved_ends_the_alert_now_and_later_repeats_are_ignored() -> None:
    table = IncidentTable()
    table.apply(verdict(), 0, NOW)
    step = table.apply(verdict(state=VerdictState.RESOLVED), 0, NOW + 30)
    assert step is not None and step.fire is None
    [alert] = alertmanager_alerts(step, NOW + 30, ttl_s=180.0)
    assert seconds(alert["endsAt"]) == NOW + 30 and alert["labels"] == alert_labels(verdict())
    assert "inc-1" not in table.open
    assert table.apply(verdict(state=VerdictState.UPDATE), 0, NOW + 40) is None  # a late repeat


def test_resolved_without_its_open_still_resolves_and_never_starts_after_it_ends() -> None:
    table = IncidentTable()
    step = table.apply(verdict(state=VerdictState.RESOLVED, detected_time=NOW + 60), 0, NOW)
    assert step is not None
    [alert] = alertmanager_alerts(step, NOW, ttl_s=180.0)
    assert alert["startsAt"] == alert["endsAt"] == iso(NOW)  # Alertmanager refuses a start after the end


def test_simulated_clock_times_start_the_alert_now() -> None:
    table = IncidentTable()
    step = table.apply(verdict(detected_time=92.0), 0, NOW)  # the simulator's clock: seconds since its start
    assert step is not None and step.starts_at == NOW


def test_resolved_and_closed_are_the_ending_states() -> None:
    assert VerdictState.RESOLVED in ENDING_STATES
    assert {s.value for s in ENDING_STATES} <= {"resolved", "closed"}
    assert VerdictState.OPEN not in ENDING_STATES and VerdictState.UPDATE not in ENDING_STATES


def test_open_incidents_are_due_for_a_repost_every_period() -> None:
    table = IncidentTable()
    table.apply(verdict(), 0, NOW)
    table.apply(verdict(incident_id="inc-2"), 1, NOW)
    assert [i.verdict.incident_id for i in table.due(NOW, 60.0)] == ["inc-1", "inc-2"]  # never posted yet
    table.posted("inc-1", NOW)
    assert [i.verdict.incident_id for i in table.due(NOW + 59, 60.0)] == ["inc-2"]
    assert [i.verdict.incident_id for i in table.due(NOW + 60, 60.0)] == ["inc-1", "inc-2"]
    [alert, _] = repost_alerts(table.due(NOW + 60, 60.0), NOW + 60, ttl_s=180.0)
    assert seconds(alert["endsAt"]) == NOW + 240 and alert["labels"]["incident_id"] == "inc-1"


def test_forgetting_a_partition_forgets_its_open_and_resolved_incidents() -> None:
    table = IncidentTable()
    table.apply(verdict(), 0, NOW)
    table.apply(verdict(incident_id="inc-2"), 1, NOW)
    table.apply(verdict(incident_id="inc-3"), 1, NOW)
    table.apply(verdict(incident_id="inc-3", state=VerdictState.RESOLVED), 1, NOW)
    table.forget_partitions({1})
    assert list(table.open) == ["inc-1"]
    # re-read from the partition's beginning, inc-3's open fires again until its resolved is read again
    assert table.apply(verdict(incident_id="inc-3"), 1, NOW) is not None


def test_the_table_is_bounded() -> None:
    table = IncidentTable(open_max=2, resolved_memory=1)
    for i in range(3):
        table.apply(verdict(incident_id=f"i{i}"), 0, NOW)
    assert list(table.open) == ["i1", "i2"] and table.evicted == 1
    for i in (1, 2):
        table.apply(verdict(incident_id=f"i{i}", state=VerdictState.RESOLVED), 0, NOW)
    assert list(table.resolved) == ["i2"]


def test_webhook_body_is_the_verdict_plus_the_action() -> None:
    v = verdict(kind=AnomalyKind.H3, link=Link(5, 6))
    body = webhook_body(v)
    assert {k: body[k] for k in v.to_dict()} == v.to_dict()
    assert body["action"] == CLASSES[AnomalyKind.H3].action and body["report"] == "ccld report inc-1"


def test_slack_body_is_one_escaped_text() -> None:
    v = verdict(kind=AnomalyKind.S2, link=Link(3, 4), evidence="backlog on 3->4 & rising")
    body = slack_body(v)
    assert list(body) == ["text"]
    text = body["text"]
    assert text.startswith("*CCL-D S2 comm-slow: open* (job train-7)")
    assert "3-&gt;4 &amp; rising" in text and "->" not in text
    assert CLASSES[AnomalyKind.S2].action.split(":")[0] in text and "`ccld report inc-1`" in text
