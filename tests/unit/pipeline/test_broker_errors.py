"""The embedded broker's clear errors (no process is started in these tests)."""

from __future__ import annotations

import socket

import pytest

from ccld.errors import BrokerError
from ccld.stack.broker import EmbeddedBroker, tansu_binary


def test_missing_binary_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALF_TANSU_BIN", "/nonexistent/tansu")
    with pytest.raises(BrokerError, match="cannot find the Tansu broker binary"):
        tansu_binary()


def test_busy_port_is_refused_before_starting_anything() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(BrokerError, match=f"port {port} on 127.0.0.1 is busy"):
            EmbeddedBroker(port).start()


def test_entering_a_started_pipeline_does_not_start_it_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from ccld.settings import Settings
    from ccld.stack.up import Pipeline

    starts = []
    p = Pipeline(Settings.load({}, bootstrap="127.0.0.1:1"))
    monkeypatch.setattr(Pipeline, "start", lambda self, **kw: (starts.append(kw), setattr(self, "started", True),
                                                               self)[-1])
    monkeypatch.setattr(Pipeline, "stop", lambda self, timeout_s=0: setattr(self, "started", False))
    with p.start(sink=False) as entered:
        assert entered is p
    assert starts == [{"sink": False}], "the pipeline was started twice (the first worker would leak)"
