"""The worker's Kafka transport: Faust's aiokafka driver, with how long an empty fetch may wait set by us.

Faust builds its consumer with ``fetch_max_wait_ms=1500`` and no way to change it. aiokafka keeps one fetch in
flight per broker, and leaves a partition whose fetched messages the agent has not taken yet out of the next
fetch (after a 100-ms grace). So while the agent works through a burst of a busy metrics partition, a fetch
goes out for the worker's other, quiet partitions; the broker holds it for the full wait, since nothing
arrives there, and the busy partition cannot be fetched again until it returns. With one job on one partition
that was 1.5 s lost every few seconds: an 8,192-rank job (1,024 messages a second) read at about 1,000 a second
by a worker using 60 % of its core, behind by 20-40 s. A short wait bounds the loss to ``worker_fetch_wait_ms``;
the price is a fetch request that many times a second from an idle worker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import faust
from faust.transport.drivers import aiokafka as driver
from faust.types import TransportT


class _ConsumerThread(driver.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka reads the attribute when the consumer starts (its fetcher is built then); no public setter.
        consumer._fetch_max_wait_ms = self.app.conf.ccld_fetch_wait_ms
        return consumer


class _Consumer(driver.Consumer):
    def _new_consumer_thread(self) -> driver.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(driver.Transport):
    """Faust's aiokafka transport whose worker consumer waits at most ``ccld_fetch_wait_ms`` for an empty fetch."""

    Consumer = _Consumer


class WorkerFaustApp(faust.App):
    """A Faust app on ``Transport`` (the URL's scheme stays ``kafka://``: Faust's producer and admin use it);
    ``fetch_wait_ms`` from the settings (``worker_fetch_wait_ms``), their one default.

    ``early_tasks`` start with the app, before its table recovery: Faust starts its own tasks and timers
    only once the first recovery has completed, so nothing of theirs can watch that one."""

    def __init__(self, *args: Any, fetch_wait_ms: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conf.ccld_fetch_wait_ms = fetch_wait_ms
        self.early_tasks: list[Callable[[], Awaitable[None]]] = []

    async def on_start(self) -> None:
        await super().on_start()
        for task in self.early_tasks:
            self.add_future(task())

    def _new_transport(self) -> TransportT:
        return Transport(self.conf.broker_consumer, self)
