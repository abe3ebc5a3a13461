"""`ccld alert`'s loop with in-memory stand-ins for the consumer, the receiver and the clock (no network).

The integration tests run the real thing against a real broker, Alertmanager and HTTP server; these pin
the order of things: an offset is committed only after its verdict was taken, failures are retried and
counted, a payload refused for good is skipped, a full backlog pauses the consumer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import ccld.sinks.alerts as alerts
from ccld.errors import ConfigError
from ccld.records import AnomalyKind, Verdict, VerdictState
from ccld.schemas.codec import encode_verdict
from ccld.settings import Settings
from ccld.sinks.alerts import AlertService, DeliveryError, alertmanager_url, shown_url
from factories import make_verdict


class Clock:
    """Stands in for the ``time`` module inside ``ccld.sinks.alerts``: waiting is advancing."""

    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return 1_760_000_000.0 + self.t


class Msg:
    def __init__(self, offset: int, value: bytes) -> None:
        self._offset, self._value = offset, value

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value


class Target:
    """A receiver endpoint that fails as scripted (an exception per call), then takes everything."""

    def __init__(self, script: list[DeliveryError]) -> None:
        self.url = "http://hook"
        self.script = list(script)
        self.taken: list[Any] = []

    def post(self, body: Any) -> None:
        if self.script:
            raise self.script.pop(0)
        self.taken.append(body)


class FakeConsumer:
    """Hands out the scripted messages (at most as many as asked); stops the loop once ``done()``."""

    def __init__(self, values: list[bytes], clock: Clock, stop: threading.Event, done: Callable[[], bool],
                 target: Target) -> None:
        self.msgs = [Msg(i, v) for i, v in enumerate(values)]
        self.clock, self.stop, self.done, self.target = clock, stop, done, target
        self.commits: list[tuple[int, int]] = []  # (offset committed, verdicts taken when it was)
        self.paused = False
        self.pauses = 0
        self.loops = 0

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[Msg]:
        self.loops += 1
        self.clock.t += max(timeout, 0.01)
        if self.done() or self.loops > 10_000:
            self.stop.set()
        if self.paused:
            return []
        out, self.msgs = self.msgs[:num_messages], self.msgs[num_messages:]
        return out

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        self.commits += [(tp.offset, len(self.target.taken)) for tp in offsets]

    def assignment(self) -> list[Any]:
        return []

    def pause(self, parts: list[Any]) -> None:
        self.paused = True
        self.pauses += 1

    def resume(self, parts: list[Any]) -> None:
        self.paused = False

    def seek(self, tp: Any) -> None:
        raise AssertionError("asked for no more than there was room for")

    def close(self) -> None:
        pass


def run(verdicts: list[Verdict], script: list[DeliveryError], monkeypatch: pytest.MonkeyPatch,
        done: Callable[[Target], bool], **settings: Any) -> tuple[AlertService, Target, FakeConsumer]:
    clock = Clock()
    monkeypatch.setattr(alerts, "time", clock)
    service = AlertService(Settings.load({}, bootstrap="kafka:9092", alert_webhook_url="http://hook", **settings))
    target = Target(script)
    service.receivers[0].target = target
    stop = threading.Event()
    consumer = FakeConsumer([encode_verdict(v) for v in verdicts], clock, stop, lambda: done(target), target)
    monkeypatch.setattr(service, "_consumer", lambda: consumer)
    service.run(stop)
    return service, target, consumer


def incident(state: VerdictState = VerdictState.OPEN, **over: Any) -> Verdict:
    return make_verdict(incident_id="inc-1", state=state, **over)


def test_offsets_are_committed_only_after_the_webhook_took_the_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    opened = incident()
    sent = [opened, opened, incident(VerdictState.UPDATE, root_cause_ranks=(2,)), incident(VerdictState.RESOLVED)]
    fail = [DeliveryError("500", retry=True), DeliveryError("timed out", retry=True)]
    service, target, consumer = run(sent, fail, monkeypatch, lambda t: len(t.taken) == 3)
    assert [b["state"] for b in target.taken] == ["open", "update", "resolved"]
    # offset o is committable once the verdicts at offsets below it were taken: 1 -> 1, 2 -> 1 (a repeat), 3 -> 2
    needed = {1: 1, 2: 1, 3: 2, 4: 3}
    assert consumer.commits and all(taken >= needed[o] for o, taken in consumer.commits), consumer.commits
    assert consumer.commits[-1][0] == 4
    c = service.counters
    assert (c["failures_webhook"], c["delivered_webhook"], c["duplicates"], c["verdicts"]) == (2, 3, 1, 3)


def test_a_payload_refused_for_good_is_counted_and_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = [incident(), make_verdict(incident_id="inc-2")]
    service, target, consumer = run(sent, [DeliveryError("400 bad labels", retry=False)], monkeypatch,
                                    lambda t: len(t.taken) == 1)
    assert [b["incident_id"] for b in target.taken] == ["inc-2"]
    assert (service.counters["rejected_webhook"], service.counters["failures_webhook"]) == (1, 0)
    assert consumer.commits[-1][0] == 2


def test_retries_back_off_up_to_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    fail = [DeliveryError("503", retry=True) for _ in range(6)]
    service, target, consumer = run([incident()], fail, monkeypatch, lambda t: len(t.taken) == 1,
                                    alert_retry_max_s=2.0)
    assert service.counters["failures_webhook"] == 6
    # waits 0.5, 1, 2, 2, 2, 2 s: the loop's clock advanced by at least their sum
    assert consumer.clock.t - 1000.0 >= 9.5


def test_a_full_backlog_pauses_consuming_and_loses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = [make_verdict(incident_id=f"i{n}") for n in range(5)]
    fail = [DeliveryError("down", retry=True) for _ in range(3)]
    service, target, consumer = run(sent, fail, monkeypatch, lambda t: len(t.taken) == 5, alert_backlog_max=2)
    assert [b["incident_id"] for b in target.taken] == [f"i{n}" for n in range(5)]
    assert consumer.pauses >= 1 and service.counters["pauses"] == consumer.pauses
    assert consumer.commits[-1][0] == 5


def test_a_receiver_is_required_and_alertmanager_urls_are_completed() -> None:
    with pytest.raises(ConfigError, match="needs a receiver"):
        AlertService(Settings.load({}, bootstrap="kafka:9092"))
    with pytest.raises(ConfigError, match="http:// or https://"):
        Settings.load({}, alert_webhook_url="hooks.example.com/x")
    assert alertmanager_url("http://am:9093/") == "http://am:9093/api/v2/alerts"
    assert alertmanager_url("http://am:9093/api/v2/alerts") == "http://am:9093/api/v2/alerts"


def test_logs_never_show_a_webhook_s_path_or_credentials() -> None:
    assert shown_url("https://hooks.slack.com/services/T000/B000/XXXX") == "https://hooks.slack.com/..."
    assert shown_url("http://user:secret@10.0.0.5:8080/hook?token=t") == "http://10.0.0.5:8080/..."
    assert shown_url("http://10.0.0.5:8080") == "http://10.0.0.5:8080"


def test_a_host_root_cause_in_four_incidents_of_two_jobs_fires_ccld_host_suspect(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fleet tracker in the bridge: the drain candidate fires one CcldHostSuspect with the runbook's action;
    the host of a single incident and the victims' hosts do not; /metrics carries every host's standing."""
    from ccld.metrics import render
    from ccld.sinks.sink_metrics import alert_families

    clock = Clock()
    monkeypatch.setattr(alerts, "time", clock)
    now = clock.time()
    sent = [make_verdict(incident_id=f"i{n}", job=job, kind=kind, root_cause_hosts=(host,), detected_time=now - 60,
                         affected_ranks=(0, 1, 2))
            for n, (job, kind, host) in enumerate([("j1", AnomalyKind.S1, "bad-1"), ("j1", AnomalyKind.S1, "bad-1"),
                                                   ("j2", AnomalyKind.H1, "bad-1"), ("j3", AnomalyKind.S3, "bad-1"),
                                                   ("j3", AnomalyKind.S2, "once-2")])]
    service = AlertService(Settings.load({}, bootstrap="kafka:9092", alert_alertmanager_url="http://am:9093"))
    target = Target([])
    service.receivers[0].target = target
    stop = threading.Event()

    def suspects() -> list[dict[str, Any]]:
        return [a for body in target.taken for a in body if a["labels"]["alertname"] == "CcldHostSuspect"]

    consumer = FakeConsumer([encode_verdict(v) for v in sent], clock, stop, lambda: bool(suspects()), target)
    monkeypatch.setattr(service, "_consumer", lambda: consumer)
    service.run(stop)
    (alert,) = suspects()
    assert alert["labels"] == {"alertname": "CcldHostSuspect", "severity": "warning", "host": "bad-1"}
    assert "drain bad-1" in alert["annotations"]["action"] and "S1:" in alert["annotations"]["action"]
    assert "4 incidents" in alert["annotations"]["summary"]
    assert set(alert["annotations"]["recent_jobs"].split(", ")) == {"j1", "j2", "j3"}
    assert service.counters["suspect_hosts"] == 1
    text = render(alert_families(service))
    assert 'ccld_host_drain_candidate{host="bad-1"} 1' in text and 'ccld_host_drain_candidate{host="once-2"} 0' in text
