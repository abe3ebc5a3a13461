"""The orchestration wing: the embedded broker, topic creation and the supervised `ccld up` pipeline."""

from __future__ import annotations

from ccld.stack.broker import EmbeddedBroker, wait_until_answers
from ccld.stack.signals import stop_on_sigterm
from ccld.stack.topics import ensure_topics
from ccld.stack.up import Pipeline

__all__ = ["EmbeddedBroker", "Pipeline", "ensure_topics", "stop_on_sigterm", "wait_until_answers"]
