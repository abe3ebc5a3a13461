"""The embedded broker's clear errors (no process is started in these tests)."""

from __future__ import annotations

import socket

import pytest

from ccld.broker import EmbeddedBroker, tansu_binary
from ccld.errors import BrokerError


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
