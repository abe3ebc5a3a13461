"""The worker's consumer: Faust's aiokafka consumer with our fetch wait (streams/transport.py), the rest as Faust's."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from ccld.errors import ConfigError
from ccld.settings import Settings
from ccld.streams.app import faust_app


def _worker_consumer(settings: Settings) -> Any:
    async def build() -> Any:  # aiokafka wants a running loop to build a consumer (nothing connects here)
        app = faust_app(settings, f"t-transport-{uuid.uuid4().hex[:8]}")
        return app.consumer._thread._create_worker_consumer(app.transport)

    return asyncio.run(build())


def test_the_worker_consumer_waits_as_long_as_the_setting_says() -> None:
    consumer = _worker_consumer(Settings.load({}, bootstrap="127.0.0.1:1", worker_fetch_wait_ms=123))
    assert consumer._fetch_max_wait_ms == 123
    # what Faust sets from the app's configuration is still there
    assert consumer._max_partition_fetch_bytes == 16 * 1024 * 1024
    assert consumer._enable_auto_commit is False


def test_the_default_wait_is_short() -> None:
    # Faust's own 1,500 ms kept a busy partition from being fetched for that long behind a fetch of quiet ones
    assert _worker_consumer(Settings.load({}, bootstrap="127.0.0.1:1"))._fetch_max_wait_ms == 100


@pytest.mark.parametrize("bad", [0, -5, 60_001])
def test_a_wait_out_of_range_is_refused(bad: int) -> None:
    with pytest.raises(ConfigError, match="worker_fetch_wait_ms"):
        Settings.load({}, bootstrap="127.0.0.1:1", worker_fetch_wait_ms=bad)
