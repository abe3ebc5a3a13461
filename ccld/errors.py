"""The one root exception of CCL-D and the few subclasses callers branch on."""

from __future__ import annotations


class CcldError(Exception):
    """Root of every error CCL-D raises on purpose."""


class ConfigError(CcldError, ValueError):
    """A setting, flag or environment variable is unknown or has a bad value."""


class SchemaError(CcldError, ValueError):
    """A message cannot be decoded: unknown fingerprint, bad marker, corrupt body.

    Carries a short machine-readable ``reason`` that the dead-letter record keeps.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class RecordError(CcldError, ValueError):
    """A decoded record breaks an invariant (no rank, bad channel count, ...)."""


class BrokerError(CcldError, RuntimeError):
    """The embedded broker cannot start, or a broker cannot be reached."""


class ScenarioError(CcldError, ValueError):
    """A simulator scenario is malformed (unknown fault kind, a link that does not exist, ...)."""
