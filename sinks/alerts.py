"""`ccld alert`'s service: consume verdicts, deliver them to Alertmanager and/or a webhook, commit after 2xx.

At-least-once: a verdict's offset is committed only once every receiver answered 2xx for it (or
refused that one payload for good with 400, 413 or 422: retrying the same bytes cannot help, so it
is counted in ``rejected_<receiver>`` and logged). Any other failure (refused connection, timeout,
5xx, 401/403/404/429) is retried with backoff, from 0.5 s doubling up to ``alert_retry_max_s``, for
as long as it takes; each failed attempt is counted in ``failures_<receiver>``. The consumer pauses
while ``alert_backlog_max`` verdicts wait, so a receiver that is down holds offsets, not memory, and
a restart re-reads what was not delivered. Repeats are dropped on ``Verdict.dedupe_key``.

On every partition assignment the partition is read from its beginning: what lies before the
committed offset was delivered already and only rebuilds the table of open incidents, which are then
re-posted to Alertmanager every ``alert_repeat_s`` (a restarted service keeps their alerts firing).
Every verdict, replayed or new, also feeds the fleet tracker (``sinks.fleet``): a host that becomes a
drain candidate fires ``CcldHostSuspect`` in Alertmanager (re-posted like an open incident, resolved when
it no longer is one), and every host's standing is on ``/metrics`` (``ccld_host_suspect_score``).
Counters go to the log as one JSON line (``counters {...}``) when they change, at most every 5 s,
and at exit.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from ccld.errors import CcldError, ConfigError, SchemaError
from ccld.kafka_events import KafkaLog
from ccld.schemas.codec import decode_verdict
from ccld.security import kafka_config
from ccld.settings import Settings
from ccld.sinks.alert_backlog import Backlog, Entry
from ccld.sinks.alert_payloads import (
    TTL_REPEATS,
    IncidentTable,
    Step,
    alertmanager_alerts,
    repost_alerts,
    slack_body,
    suspect_alert,
    suspect_ended_alert,
    webhook_body,
)
from ccld.sinks.fleet import HostStanding, HostTracker, fleet_settings

log = logging.getLogger(__name__)

#: Log the counters (when they changed) at most this often (seconds), as the worker does.
COUNTERS_EVERY_S = 5.0
#: Answers that refuse the payload itself: sending the same bytes again cannot succeed.
REFUSED_FOR_GOOD = frozenset({400, 413, 422})
#: The first retry waits this long (seconds); each further failure doubles it up to ``alert_retry_max_s``.
FIRST_RETRY_S = 0.5
#: Deliveries in one round at most before the consumer is polled again (stop and rebalances stay prompt).
ROUND_MAX = 50
#: Dedupe keys remembered (a repeat older than this many verdicts is sent again: at-least-once allows it).
DEDUPE_MEMORY = 100_000
#: Open incidents re-posted in one request at most.
REPOST_BATCH = 500


class DeliveryError(CcldError):
    """A receiver did not take a payload; ``retry`` says whether sending it again can help."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


def shown_url(url: str) -> str:
    """A URL fit for a log line: scheme, host and port only (a Slack webhook's path is its secret)."""
    parts = urllib.parse.urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    rest = "/..." if parts.path not in ("", "/") or parts.query else ""
    return f"{parts.scheme}://{parts.hostname}{port}{rest}"


class HttpTarget:
    """One endpoint that takes JSON by POST; any 2xx means taken. ``shown`` is what logs may print of it."""

    def __init__(self, url: str, timeout_s: float, *, secret: bool = True) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.shown = shown_url(url) if secret else url

    def post(self, body: Any) -> None:
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "ccld-alert"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                resp.read()
                status = int(resp.status)
        except urllib.error.HTTPError as exc:  # a 4xx/5xx answer: the receiver is there and said no
            text = exc.read(300).decode(errors="replace").strip()
            raise DeliveryError(f"{self.shown} answered {exc.code} {exc.reason}: {text}",
                                retry=exc.code not in REFUSED_FOR_GOOD) from exc
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:  # refused, reset, timed out
            cause = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise DeliveryError(f"{self.shown}: {cause}", retry=True) from exc
        if not 200 <= status < 300:
            raise DeliveryError(f"{self.shown} answered {status}", retry=True)


@dataclass
class Receiver:
    """A named destination: where it is, the body one step becomes, and when it may be tried again."""

    name: str
    target: HttpTarget
    body: Callable[[Step, float], Any]
    retry_at: float = 0.0  # monotonic
    delay_s: float = 0.0
    failing_since: float | None = None  # monotonic; for the log line when it is back

    def failed(self, now: float, max_s: float) -> float:
        self.delay_s = min(max(self.delay_s * 2, FIRST_RETRY_S), max_s)
        self.retry_at = now + self.delay_s
        if self.failing_since is None:
            self.failing_since = now
        return self.delay_s

    def succeeded(self) -> float | None:
        """Clears the backoff; returns how long it had been failing (None: it was not)."""
        down = None if self.failing_since is None else time.monotonic() - self.failing_since
        self.delay_s, self.retry_at, self.failing_since = 0.0, 0.0, None
        return down


def alertmanager_url(base: str) -> str:
    """The v2 alerts endpoint of an Alertmanager given by its base URL (or by the endpoint itself)."""
    base = base.rstrip("/")
    return base if base.endswith("/api/v2/alerts") else f"{base}/api/v2/alerts"


def receivers_for(settings: Settings) -> list[Receiver]:
    ttl_s = TTL_REPEATS * settings.alert_repeat_s
    out: list[Receiver] = []
    if settings.alert_alertmanager_url:
        # an Alertmanager URL holds no secret, and its path helps when the answer is 404
        out.append(Receiver("alertmanager", HttpTarget(alertmanager_url(settings.alert_alertmanager_url),
                                                       settings.alert_timeout_s, secret=False),
                            lambda step, now: alertmanager_alerts(step, now, ttl_s)))
    if settings.alert_webhook_url:
        shape = slack_body if settings.alert_slack else webhook_body
        out.append(Receiver("webhook", HttpTarget(settings.alert_webhook_url, settings.alert_timeout_s),
                            lambda step, now: shape(step.verdict)))
    if not out:
        raise ConfigError("ccld alert needs a receiver: --alertmanager URL and/or --webhook URL "
                          "(or CCLD_ALERT_ALERTMANAGER_URL / CCLD_ALERT_WEBHOOK_URL)")
    return out


class AlertService:
    """The alert consumer of one process; ``run`` until ``stop`` is set."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = settings.verdicts_topic
        self.receivers = receivers_for(settings)
        self.am = next((r for r in self.receivers if r.name == "alertmanager"), None)
        self.backlog = Backlog([r.name for r in self.receivers], settings.alert_backlog_max)
        self.table = IncidentTable()
        self.seen: OrderedDict[str, None] = OrderedDict()
        self.counters: dict[str, int] = dict.fromkeys((
            "messages", "verdicts", "duplicates", "undecodable", "stale", "replayed", "pauses", "reposts",
            "repost_failures", "commits", "commit_errors", "kafka_errors", "backlog", "open_incidents",
            "suspect_hosts", "suspect_posts", "suspect_post_failures"), 0)
        for r in self.receivers:
            for what in ("delivered", "failures", "rejected"):
                self.counters[f"{what}_{r.name}"] = 0
        self.kafka_log = KafkaLog()
        self._replay_until: dict[int, int] = {}  # partition -> committed offset: below it, only rebuild the table
        self._paused = False
        self._report_at = 0.0
        self._repost_check_at = 0.0
        self.fleet = HostTracker(fleet_settings(settings))
        self.hosts: list[HostStanding] = []  # the tracker's standings as last computed (read by /metrics)
        self._suspects: dict[str, tuple[float, float]] = {}  # candidate host -> (alert start, last posted)
        self._fleet_at = 0.0
        self._reported = ""
        self.final_line = ""  # the counters at exit, gauges taken before the consumer closed

    # --- Kafka --------------------------------------------------------------------------------

    def _consumer(self) -> Consumer:
        return Consumer(kafka_config(self.settings, **{
            "group.id": self.settings.alert_group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",  # a new group delivers what the topic holds, once
            "session.timeout.ms": self.settings.session_timeout_ms,
            "heartbeat.interval.ms": self.settings.heartbeat_ms,
            "logger": self.kafka_log,
            "error_cb": self._on_error,
        }))

    def _on_error(self, err: KafkaError) -> None:
        self.counters["kafka_errors"] += 1
        self.kafka_log.error(err)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        parts = {tp.partition for tp in partitions}
        try:
            committed = consumer.committed(partitions, timeout=10)
        except KafkaException as exc:
            # without the committed offsets nothing can be replayed: start where the group is (alerts
            # of incidents opened before it are not re-posted until their next verdict)
            log.warning("cannot read the committed offsets of %s: %s; open incidents are not rebuilt", parts, exc)
            self._paused = False
            return
        self.table.forget_partitions(parts)
        for tp in committed:
            self._replay_until[tp.partition] = max(tp.offset, 0)
        # read from the beginning: what lies below the committed offset rebuilds the open incidents
        # (assign() replaces the assignment: right for the eager assignors librdkafka uses by default)
        consumer.assign([TopicPartition(self.topic, tp.partition, OFFSET_BEGINNING) for tp in committed])
        self._paused = False  # a new assignment starts fetching
        log.info("assigned %s[%s]; committed offsets %s", self.topic, ",".join(map(str, sorted(parts))),
                 {tp.partition: tp.offset for tp in committed})

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        parts = {tp.partition for tp in partitions}
        self._commit(consumer)
        dropped = self.backlog.drop(parts)
        for entry in dropped:
            if entry.step is not None:
                # undelivered: if these partitions come back, their re-read must not look like a repeat
                self.seen.pop(entry.step.verdict.dedupe_key, None)
        self.table.forget_partitions(parts)
        for p in parts:
            self._replay_until.pop(p, None)
        if dropped:
            log.info("partitions %s revoked; %d undelivered verdicts left to their next owner", sorted(parts),
                     len(dropped))

    # --- the loop -----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        consumer = self._consumer()
        consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        try:
            while not stop.is_set():
                self._poll(consumer)
                self._deliver(stop)
                self._repost()
                self._fleet()
                self._commit(consumer)
                self._report()
            self._commit(consumer)
        finally:
            self._report(final=True)  # before close: its revoke forgets the partitions' open incidents
            consumer.close()

    def _poll(self, consumer: Consumer) -> None:
        room = self.backlog.room
        if (room == 0) != self._paused:
            assignment = consumer.assignment()
            if room == 0:
                consumer.pause(assignment)
                self.counters["pauses"] += 1
                log.info("%d verdicts wait for a receiver; consuming paused", len(self.backlog))
            else:
                consumer.resume(assignment)
            self._paused = room == 0
        # waiting on a receiver's backoff is waiting here: the poll timeout is the loop's only sleep
        msgs = consumer.consume(num_messages=max(room, 1), timeout=0.2 if self._idle() else 0.0)
        rewound: set[int] = set()
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    self.kafka_log.error(err)
                continue
            p = msg.partition() or 0
            if p in rewound:
                continue
            if not self._take(msg, p):
                # no room (a fetch that raced the pause): read it again once there is room
                consumer.seek(TopicPartition(self.topic, p, msg.offset() or 0))
                rewound.add(p)

    def _idle(self) -> bool:
        now = time.monotonic()
        return not any(self.backlog.head(r.name) is not None and r.retry_at <= now for r in self.receivers)

    def _take(self, msg: Message, partition: int) -> bool:
        """Adds one message to the backlog (or, below the committed offset, to the table only); False: no room."""
        offset = msg.offset() or 0
        replaying = offset < self._replay_until.get(partition, 0)
        if not replaying and self.backlog.room == 0:
            return False
        self.counters["messages"] += 1
        try:
            v = decode_verdict(msg.value() or b"")
        except SchemaError as exc:
            self.counters["undecodable"] += 1
            log.warning("skipping undecodable message %s[%d]@%d: %s", self.topic, partition, offset, exc)
            if not replaying:
                self.backlog.add(partition, offset, None)
            return True
        self.fleet.observe(v)  # every state, replayed or new, repeats too: the tracker keeps one per incident
        key = v.dedupe_key
        repeat = key in self.seen
        self.seen[key] = None
        self.seen.move_to_end(key)
        while len(self.seen) > DEDUPE_MEMORY:
            self.seen.popitem(last=False)
        if replaying:
            # delivered before this assignment: it only rebuilds the open incidents (applying a verdict
            # the table already has changes nothing, so a repeat is applied too)
            self.counters["replayed"] += 1
            self.table.apply(v, partition, time.time())
            return True
        step = None
        if repeat:
            self.counters["duplicates"] += 1
        else:
            self.counters["verdicts"] += 1
            step = self.table.apply(v, partition, time.time())
            if step is None:
                self.counters["stale"] += 1
                log.info("ignoring %s verdict of incident %s: it already ended", v.state.value, v.incident_id)
        self.backlog.add(partition, offset, step)
        return True

    def _deliver(self, stop: threading.Event) -> None:
        for r in self.receivers:
            for _ in range(ROUND_MAX):
                entry = self.backlog.head(r.name)
                if entry is None or time.monotonic() < r.retry_at or stop.is_set():
                    break
                if not self._send(r, entry):
                    break

    def _send(self, r: Receiver, entry: Entry) -> bool:
        step = entry.step
        if step is None:  # the backlog only queues entries with a step; kept for the type checker
            self.backlog.taken(r.name, entry)
            return True
        v = step.verdict
        try:
            r.target.post(r.body(step, time.time()))
        except DeliveryError as exc:
            if exc.retry:
                self.counters[f"failures_{r.name}"] += 1
                delay = r.failed(time.monotonic(), self.settings.alert_retry_max_s)
                log.warning("%s did not take %s %s of incident %s: %s; retrying in %.1f s (%d waiting)", r.name,
                            v.kind.value, v.state.value, v.incident_id, exc, delay, self.backlog.waiting(r.name))
                return False
            self.counters[f"rejected_{r.name}"] += 1
            log.error("%s refused %s %s of incident %s for good: %s; skipped", r.name, v.kind.value,
                      v.state.value, v.incident_id, exc)
        else:
            self.counters[f"delivered_{r.name}"] += 1
            down = r.succeeded()
            if down is not None:
                log.info("%s takes alerts again after %.0f s", r.name, down)
            if r is self.am and step.fire is not None:
                self.table.posted(v.incident_id, time.time())
        self.backlog.taken(r.name, entry)
        return True

    def _repost(self) -> None:
        am = self.am
        # only a caught-up, reachable Alertmanager: its backlog re-posts what it lacks anyway
        if am is None or self.backlog.waiting(am.name) or time.monotonic() < am.retry_at:
            return
        if time.monotonic() < self._repost_check_at:
            return  # the open table is walked once a second, not on every loop
        self._repost_check_at = time.monotonic() + 1.0
        now = time.time()
        due = self.table.due(now, self.settings.alert_repeat_s)[:REPOST_BATCH]
        if not due:
            return
        try:
            am.target.post(repost_alerts(due, now, TTL_REPEATS * self.settings.alert_repeat_s))
        except DeliveryError as exc:
            self.counters["repost_failures"] += 1
            delay = am.failed(time.monotonic(), self.settings.alert_retry_max_s)
            log.warning("re-posting %d open incidents to alertmanager failed: %s; retrying in %.1f s",
                        len(due), exc, delay)
            return
        am.succeeded()
        self.counters["reposts"] += len(due)
        for inc in due:
            self.table.posted(inc.verdict.incident_id, now)

    def _fleet(self) -> None:
        """Once a second: the hosts' standings; ``CcldHostSuspect`` for new candidates at once, re-posted every
        ``alert_repeat_s``, resolved for hosts that are no longer candidates."""
        now = time.time()
        if now < self._fleet_at:
            return
        self._fleet_at = now + 1.0
        self.hosts = self.fleet.current(now)
        cands = {h.host: h for h in self.hosts if h.candidate}
        self.counters["suspect_hosts"] = len(cands)
        am = self.am
        if am is None or time.monotonic() < am.retry_at:
            return
        ended = [h for h in self._suspects if h not in cands]
        every = self.settings.alert_repeat_s
        due = [h for h in cands if h not in self._suspects or now - self._suspects[h][1] >= every]
        if not ended and not due:
            return
        ttl = TTL_REPEATS * self.settings.alert_repeat_s
        body = [suspect_alert(cands[h], self._suspects.get(h, (now, 0.0))[0], now + ttl) for h in cands]
        body += [suspect_ended_alert(h, self._suspects[h][0], now) for h in ended]
        try:
            am.target.post(body)
        except DeliveryError as exc:
            self.counters["suspect_post_failures"] += 1
            delay = am.failed(time.monotonic(), self.settings.alert_retry_max_s)
            log.warning("posting %d suspect hosts to alertmanager failed: %s; retrying in %.1f s", len(body), exc,
                        delay)
            return
        am.succeeded()
        for h in cands:
            if h not in self._suspects:
                log.warning("host %s is a drain candidate: %s", h, cands[h].by_kind)
            self._suspects[h] = (self._suspects.get(h, (now, 0.0))[0], now)
        for h in ended:
            log.info("host %s is no longer a drain candidate", h)
            del self._suspects[h]
        self.counters["suspect_posts"] += 1

    def _commit(self, consumer: Consumer) -> None:
        offsets = self.backlog.committable()
        if not offsets:
            return
        try:
            consumer.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in sorted(offsets.items())],
                            asynchronous=False)
            self.counters["commits"] += 1
        except KafkaException as exc:  # delivered already; a restart re-sends them (at-least-once)
            self.counters["commit_errors"] += 1
            log.warning("commit of %s failed: %s", offsets, exc)

    def counters_line(self) -> str:
        self.counters["backlog"] = len(self.backlog)
        self.counters["open_incidents"] = len(self.table.open)
        return json.dumps(self.counters, sort_keys=True)

    def _report(self, *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._report_at < COUNTERS_EVERY_S:
            return
        self._report_at = now
        line = self.counters_line()
        if final:
            self.final_line = line
        if final or line != self._reported:
            self._reported = line
            log.info("counters %s", line)
