"""A broker that refuses the topics' retention configs: the topics are made without them, one line each says so.

The embedded broker accepts every config, so the refusals come from a stand-in admin client that answers as a
broker with a topic policy does (INVALID_CONFIG / POLICY_VIOLATION on create, on alter)."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from ccld import topics as topics_mod
from ccld.errors import BrokerError
from ccld.settings import Settings


def _done(exc: BaseException | None = None, value: Any = None) -> Future[Any]:
    f: Future[Any] = Future()
    if exc is None:
        f.set_result(value)
    else:
        f.set_exception(exc)
    return f


class Topic:
    def __init__(self, n: int) -> None:
        self.partitions = dict.fromkeys(range(n))


class Entry:
    def __init__(self, value: str) -> None:
        self.value = value


class RefusingAdmin:
    """Refuses any topic created with configs (``create_error``), and every config change."""

    def __init__(self, existing: dict[str, int], create_error: int = KafkaError.POLICY_VIOLATION,
                 reason: str = "refused by the topic policy") -> None:
        self.topics = dict(existing)
        self.create_error = create_error
        self.reason = reason
        self.created: dict[str, dict[str, str]] = {}

    def list_topics(self, timeout: float) -> Any:
        return type("Md", (), {"topics": {n: Topic(p) for n, p in self.topics.items()}})()

    def create_topics(self, new: list[Any], operation_timeout: float) -> dict[str, Future[Any]]:
        out = {}
        for t in new:
            if t.config:
                out[t.topic] = _done(KafkaException(KafkaError(self.create_error, f"{t.topic}: {self.reason}")))
            else:
                self.topics[t.topic] = t.num_partitions
                self.created[t.topic] = dict(t.config)
                out[t.topic] = _done()
        return out

    def describe_configs(self, resources: list[Any]) -> dict[Any, Future[Any]]:
        return {r: _done(value={"retention.ms": Entry("1")}) for r in resources}

    def incremental_alter_configs(self, changes: list[Any]) -> dict[Any, Future[Any]]:
        return {c: _done(KafkaException(KafkaError(KafkaError.POLICY_VIOLATION, "alter refused"))) for c in changes}

    def poll(self, timeout: float) -> int:
        return 0


@pytest.fixture
def settings() -> Settings:
    return Settings.load({}, bootstrap="127.0.0.1:1", topic_prefix="t.")


def _use(monkeypatch: pytest.MonkeyPatch, admin: RefusingAdmin) -> None:
    monkeypatch.setattr(topics_mod, "AdminClient", lambda conf: admin)


@pytest.mark.parametrize("code", [KafkaError.POLICY_VIOLATION, KafkaError.INVALID_CONFIG])
def test_topics_refused_with_their_configs_are_created_without_and_each_said_once(
        settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int) -> None:
    admin = RefusingAdmin({}, code)
    _use(monkeypatch, admin)
    with caplog.at_level(logging.WARNING, logger="ccld.topics"):
        got = topics_mod.ensure_topics(settings, timeout_s=1.0)
    want = topics_mod.topic_specs(settings)
    assert got == want and set(admin.created) == set(want)
    assert all(c == {} for c in admin.created.values())
    refused = [r.getMessage() for r in caplog.records if "refused the retention" in r.getMessage()]
    assert len(refused) == len(topics_mod.topic_configs(settings)), refused
    assert all("\n" not in line for line in refused)


def test_a_refused_config_change_on_existing_topics_is_one_line_each_and_no_error(
        settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    admin = RefusingAdmin(topics_mod.topic_specs(settings))
    _use(monkeypatch, admin)
    with caplog.at_level(logging.WARNING, logger="ccld.topics"):
        topics_mod.ensure_topics(settings, timeout_s=1.0, grow=True)
    lines = [r.getMessage() for r in caplog.records if "left as it is" in r.getMessage()]
    assert len(lines) == len(topics_mod.topic_configs(settings)), lines


def test_any_other_create_failure_is_an_error(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    admin = RefusingAdmin({}, KafkaError.TOPIC_AUTHORIZATION_FAILED, "not allowed")
    _use(monkeypatch, admin)
    with pytest.raises(BrokerError, match="cannot create topic"):
        topics_mod.ensure_topics(settings, timeout_s=1.0)
