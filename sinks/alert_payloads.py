"""Verdicts as alerts, with no I/O: Alertmanager and webhook payloads, and the table of open incidents.

An incident is one Alertmanager alert. Its labels (``alertname`` ``CCLD_<kind>``, ``severity``,
``job``, ``kind``, ``ranks``, ``hosts``, ``communicator``, ``incident_id``) identify it, so an
``update`` with the same class and culprits re-sends the same alert and Alertmanager keeps one. An
``update`` that changes them (S2 refined to S3, another culprit) resolves the alert under the old
labels and fires the new one, so no stale alert is left firing. ``resolved`` (and ``closed``,
where ``VerdictState`` has it) sets ``endsAt`` to now. Open incidents are re-posted every
``alert_repeat_s`` with ``endsAt`` a few periods ahead: Alertmanager resolves an alert that is not
re-sent, and so an alert whose sender died resolves by itself instead of firing forever.
A host that the fleet tracker (``sinks.fleet``) makes a drain candidate is one more alert,
``CcldHostSuspect`` (labels ``host``, ``severity`` warning), re-posted like an open incident while it
stays a candidate and resolved when it no longer is. ``ccld.sinks.alerts`` does the consuming and the HTTP.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ccld.records import Verdict, VerdictState
from ccld.sinks.fleet import HostStanding, describe, drain_action

#: ``endsAt`` of a firing alert is this many repeat periods ahead: one lost re-post does not resolve it.
TTL_REPEATS = 3
#: States that end an incident (``closed`` counts once ``VerdictState`` has it).
ENDING_STATES = frozenset(s for s in VerdictState if s.value in ("resolved", "closed"))
#: Open incidents kept at most (the oldest is forgotten, counted in ``evicted``, and its alert ends by itself).
OPEN_MAX = 10_000
#: Resolved incident ids remembered, so a late repeat of their ``open`` does not fire them again.
RESOLVED_MEMORY = 10_000
#: The alert of a drain candidate (``sinks.fleet``): one per host, while it is a candidate.
SUSPECT_ALERT = "CcldHostSuspect"
#: A verdict time this far from the wall clock is not wall time (the simulator stamps simulated seconds).
PLAUSIBLE_CLOCK_S = 7 * 86_400.0

Labels = Mapping[str, str]


def report_command(incident_id: str) -> str:
    """Where an operator reads the whole incident (a command, not a URL: there is no web UI)."""
    return f"ccld report {incident_id}"


def iso(t: float) -> str:
    """Epoch seconds as RFC 3339 UTC, as Alertmanager's API wants its times."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def alert_labels(v: Verdict) -> dict[str, str]:
    """The labels that identify an incident's alert (empty values left out: Alertmanager reads them as absent)."""
    out = {
        "alertname": f"CCLD_{v.kind.value}",
        "severity": "critical" if v.kind.is_hang else "warning",  # a hang stops the job; a slowdown only costs
        "job": v.job,
        "kind": v.kind.value,
        "ranks": ",".join(map(str, v.root_cause_ranks)),
        "hosts": ",".join(v.root_cause_hosts),
        "communicator": v.communicator,
        "incident_id": v.incident_id,
    }
    return {k: value for k, value in out.items() if value}


def alert_annotations(v: Verdict) -> dict[str, str]:
    """What a person reads on the alert: the one-line summary, the evidence, the runbook line, the report."""
    info = v.kind.info
    return {
        "summary": v.describe(),
        "evidence": v.evidence,
        "action": info.action,
        "class": f"{v.kind.value} {info.title}",
        "report": report_command(v.incident_id),
    }


def am_alert(labels: Labels, annotations: Mapping[str, str], starts_at: float, ends_at: float) -> dict[str, Any]:
    """One postable alert of Alertmanager's v2 API (it refuses an alert that starts after it ends)."""
    return {"labels": dict(labels), "annotations": dict(annotations),
            "startsAt": iso(min(starts_at, ends_at)), "endsAt": iso(ends_at)}


def start_time(v: Verdict, now: float) -> float:
    """When the alert started: the verdict's detection time when it is wall time, else now."""
    return v.detected_time if abs(v.detected_time - now) <= PLAUSIBLE_CLOCK_S else now


@dataclass(frozen=True)
class Step:
    """What one verdict changes for the receivers: the alert it fires, if any, and the label sets it resolves."""

    verdict: Verdict
    starts_at: float
    fire: Labels | None
    resolve: tuple[Labels, ...] = ()


def alertmanager_alerts(step: Step, now: float, ttl_s: float) -> list[dict[str, Any]]:
    """The body of ``POST /api/v2/alerts`` for one step: resolutions first, then the firing alert."""
    notes = alert_annotations(step.verdict)
    out = [am_alert(labels, notes, step.starts_at, now) for labels in step.resolve]
    if step.fire is not None:
        out.append(am_alert(step.fire, notes, step.starts_at, now + ttl_s))
    return out


def webhook_body(v: Verdict) -> dict[str, Any]:
    """The generic webhook's JSON: the verdict as ``ccld verdicts --json`` prints it, plus the runbook line."""
    return {**v.to_dict(), "action": v.kind.info.action, "report": report_command(v.incident_id)}


def _slack_escape(text: str) -> str:
    # Slack reads &, < and > as markup (a link 3->4 would vanish); these three are all it asks to escape
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(v: Verdict) -> dict[str, str]:
    """A Slack-compatible incoming-webhook body: one message with the verdict, the action and the report."""
    head = f"*CCL-D {v.kind.value} {v.kind.info.title}: {v.state.value}* (job {v.job})"
    lines = [head, v.describe(), f"*Action:* {v.kind.info.action}", f"*Report:* `{report_command(v.incident_id)}`"]
    return {"text": "\n".join(_slack_escape(line) for line in lines)}


@dataclass
class OpenIncident:
    """An incident whose alert is firing: its newest verdict and the labels last fired for it."""

    verdict: Verdict
    labels: Labels
    starts_at: float
    partition: int
    posted_at: float | None = None  # wall time Alertmanager last took its firing alert; None: not yet


class IncidentTable:
    """The open incidents, by incident id; the state machine open -> update* -> resolved (or closed).

    ``apply`` returns the ``Step`` a verdict causes, or None for a verdict about an incident that
    already ended (the worker never reopens one, so it is a late repeat). Verdicts are applied in
    topic order, which is incident order: one incident's verdicts share a key and a partition.
    """

    def __init__(self, *, open_max: int = OPEN_MAX, resolved_memory: int = RESOLVED_MEMORY) -> None:
        self.open: OrderedDict[str, OpenIncident] = OrderedDict()
        self.resolved: OrderedDict[str, int] = OrderedDict()  # incident id -> its partition
        self.open_max = open_max
        self.resolved_memory = resolved_memory
        self.evicted = 0

    def apply(self, v: Verdict, partition: int, now: float) -> Step | None:
        iid = v.incident_id
        if iid in self.resolved:
            return None
        labels = alert_labels(v)
        inc = self.open.get(iid)
        if v.state in ENDING_STATES:
            self.open.pop(iid, None)
            self.resolved[iid] = partition
            while len(self.resolved) > self.resolved_memory:
                self.resolved.popitem(last=False)
            # resolve what was fired, and the verdict's own labels in case its open came before our memory
            old = () if inc is None or inc.labels == labels else (inc.labels,)
            return Step(v, start_time(v, now) if inc is None else inc.starts_at, None, (labels, *old))
        if inc is None:
            # an update without its open (it was evicted, or before the topic's retention) fires like an open
            inc = self.open[iid] = OpenIncident(v, labels, start_time(v, now), partition)
            while len(self.open) > self.open_max:
                self.open.popitem(last=False)
                self.evicted += 1
            return Step(v, inc.starts_at, labels)
        old = () if inc.labels == labels else (inc.labels,)
        inc.verdict, inc.labels, inc.partition = v, labels, partition
        self.open.move_to_end(iid)
        return Step(v, inc.starts_at, labels, old)

    def due(self, now: float, every_s: float) -> list[OpenIncident]:
        """Open incidents Alertmanager has not taken for ``every_s`` (or ever)."""
        return [i for i in self.open.values() if i.posted_at is None or now - i.posted_at >= every_s]

    def posted(self, incident_id: str, now: float) -> None:
        inc = self.open.get(incident_id)
        if inc is not None:
            inc.posted_at = now

    def forget_partitions(self, partitions: set[int]) -> None:
        """Forget every incident of these partitions: another consumer owns them now, or they are re-read."""
        for iid in [i for i, inc in self.open.items() if inc.partition in partitions]:
            del self.open[iid]
        for iid in [i for i, p in self.resolved.items() if p in partitions]:
            del self.resolved[iid]


def suspect_labels(host: str) -> dict[str, str]:
    return {"alertname": SUSPECT_ALERT, "severity": "warning", "host": host}


def suspect_alert(h: HostStanding, starts_at: float, ends_at: float) -> dict[str, Any]:
    """``CcldHostSuspect`` for a drain candidate (``sinks.fleet``): one alert per host, its runbook action."""
    jobs = ", ".join(dict.fromkeys(i.job for i in h.recent))
    notes = {"summary": describe(h), "action": drain_action(h), "score": f"{h.score:.2f}",
             "recent_jobs": jobs, "list": "ccld nodes"}
    return am_alert(suspect_labels(h.host), notes, starts_at, ends_at)


def suspect_ended_alert(host: str, starts_at: float, now: float) -> dict[str, Any]:
    """The same alert resolved: the host is no longer a drain candidate (its incidents aged out of the window)."""
    return am_alert(suspect_labels(host), {"summary": f"{host}: no longer a drain candidate"}, starts_at, now)


def repost_alerts(incidents: list[OpenIncident], now: float, ttl_s: float) -> list[dict[str, Any]]:
    """The body that keeps open incidents firing: each one's newest alert, ``endsAt`` moved ahead."""
    return [am_alert(i.labels, alert_annotations(i.verdict), i.starts_at, now + ttl_s) for i in incidents]
