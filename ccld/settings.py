"""One frozen settings object per process, built from defaults, ``CCLD_*`` variables and flags.

Every field of ``Settings`` is read from ``CCLD_<FIELD>`` and every field of the nested
``AnalyzerSettings`` from ``CCLD_ANALYZER_<FIELD>``. Unknown ``CCLD_*`` variables and unknown
keys are rejected with a clear message, so a typo never silently leaves a default in force.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ccld.errors import ConfigError
from ccld.streams.analysis.settings import AnalyzerSettings

ENV_PREFIX = "CCLD_"
ANALYZER_PREFIX = "ANALYZER_"
#: CCLD_* variables that are not settings (read by the test suite only).
NOT_SETTINGS = frozenset({"CCLD_TEST_BOOTSTRAP"})


@dataclass(frozen=True)
class Settings:
    """Everything a CCL-D process can be told. Units are in the names."""

    bootstrap: str = ""  # Kafka bootstrap servers; empty: start the embedded broker
    topic_prefix: str = "ccl-d."  # topics are <prefix>metrics, <prefix>verdicts, <prefix>deadletter
    metrics_partitions: int = 4  # partitions of the metrics topic (the most workers that share the load)
    verdicts_partitions: int = 1  # partitions of the verdicts topic
    deadletter_partitions: int = 1  # partitions of the dead-letter topic
    replication_factor: int = 1  # replication of topics CCL-D creates
    job: str = "default"  # job id producers stamp on their records
    archive_dir: str = "ccld-archive"  # root folder of the Parquet archive
    sink_group: str = "ccld-sink"  # consumer group of the Parquet sink
    sink_max_rows: int = 100_000  # rows per Parquet file (and row group) at most
    sink_max_age_s: float = 10.0  # flush a partial file after this long
    worker_app_id: str = "ccld-worker"  # Faust app id (consumer group and changelog names)
    worker_web_port: int = 0  # 0: no web server
    worker_tick_s: float = 1.0  # how often the worker re-evaluates open operations
    worker_commit_interval_s: float = 2.8  # how often the worker commits consumed offsets
    worker_shutdown_grace_s: float = 30.0  # after SIGTERM/SIGINT the worker exits anyway after this long
    producer_queue_max: int = 200_000  # kernel records waiting in a producer, at most
    producer_batch_max: int = 2_000  # kernel records per batch message, at most
    producer_linger_ms: int = 500  # a batch waits at most this long for more records (fewer, larger messages)
    session_timeout_ms: int = 6_000  # consumer group session timeout (short: fast joins and failover)
    heartbeat_ms: int = 2_000  # consumer group heartbeat interval
    log_level: str = "INFO"  # DEBUG, INFO, WARNING, ERROR
    analyzer: AnalyzerSettings = field(default_factory=AnalyzerSettings)

    def topic(self, kind: str) -> str:
        """Full topic name of ``metrics``, ``verdicts``, ``deadletter`` or ``findings``."""
        return f"{self.topic_prefix}{kind}"

    @property
    def metrics_topic(self) -> str:
        return self.topic("metrics")

    @property
    def verdicts_topic(self) -> str:
        return self.topic("verdicts")

    @property
    def deadletter_topic(self) -> str:
        return self.topic("deadletter")

    def replace(self, **changes: Any) -> Settings:
        """A copy with some fields changed (``analyzer_<name>`` keys change analyzer fields)."""
        return _build(self, changes, source="argument")

    def to_env(self) -> dict[str, str]:
        """``CCLD_*`` variables that rebuild these settings in a child process (non-default fields)."""
        out: dict[str, str] = {}
        default = Settings()
        for f in dataclasses.fields(Settings):
            if f.name != "analyzer" and getattr(self, f.name) != getattr(default, f.name):
                out[f"{ENV_PREFIX}{f.name.upper()}"] = str(getattr(self, f.name))
        for f in dataclasses.fields(AnalyzerSettings):
            if getattr(self.analyzer, f.name) != getattr(default.analyzer, f.name):
                out[f"{ENV_PREFIX}{ANALYZER_PREFIX}{f.name.upper()}"] = str(getattr(self.analyzer, f.name))
        return out

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then ``CCLD_*`` variables of ``env`` (default: the process environment), then overrides.

        Overrides whose value is None are ignored, so CLI flags that were not given leave
        the environment's value in force.
        """
        env = os.environ if env is None else env
        from_env: dict[str, Any] = {}
        for key, value in env.items():
            if not key.startswith(ENV_PREFIX) or key in NOT_SETTINGS:
                continue
            from_env[key[len(ENV_PREFIX) :].lower()] = value
        base = _build(cls(), from_env, source="environment variable")
        return _build(base, {k: v for k, v in overrides.items() if v is not None}, source="argument")


def known_env_vars() -> set[str]:
    """Every ``CCLD_*`` variable the settings object reads."""
    names = {f"{ENV_PREFIX}{f.name.upper()}" for f in dataclasses.fields(Settings) if f.name != "analyzer"}
    names |= {f"{ENV_PREFIX}{ANALYZER_PREFIX}{f.name.upper()}" for f in dataclasses.fields(AnalyzerSettings)}
    return names


def _build(base: Settings, changes: Mapping[str, Any], *, source: str) -> Settings:
    top = {f.name: f for f in dataclasses.fields(Settings) if f.name != "analyzer"}
    ana = {f.name: f for f in dataclasses.fields(AnalyzerSettings)}
    top_changes: dict[str, Any] = {}
    ana_changes: dict[str, Any] = {}
    for key, value in changes.items():
        if key in top:
            top_changes[key] = _coerce(key, top[key], value, source)
        elif key.startswith(ANALYZER_PREFIX.lower()) and key[len(ANALYZER_PREFIX) :] in ana:
            name = key[len(ANALYZER_PREFIX) :]
            ana_changes[name] = _coerce(key, ana[name], value, source)
        elif key == "analyzer" and isinstance(value, AnalyzerSettings):
            top_changes["analyzer"] = value
        else:
            env = source.startswith("environment")
            shown = f"{ENV_PREFIX}{key.upper()}" if env else key
            names = sorted(known_env_vars()) if env else sorted([*top, *(f"analyzer_{n}" for n in ana)])
            close = difflib.get_close_matches(shown, names, n=3)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise ConfigError(f"unknown {source} {shown!r}{hint}; every setting is listed in the README's "
                              "Configuration table")
    analyzer = top_changes.pop("analyzer", base.analyzer)
    if ana_changes:
        analyzer = dataclasses.replace(analyzer, **ana_changes)
    out = dataclasses.replace(base, analyzer=analyzer, **top_changes)
    _validate(out)
    return out


_HINTS: dict[type, dict[str, Any]] = {}


def _coerce(key: str, f: dataclasses.Field[Any], value: Any, source: str) -> Any:
    owner = Settings if f.name in {x.name for x in dataclasses.fields(Settings)} else AnalyzerSettings
    hints = _HINTS.setdefault(owner, typing.get_type_hints(owner))
    kind = hints[f.name]
    if isinstance(kind, types.UnionType):
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    try:
        if kind is bool and isinstance(value, str):
            low = value.strip().lower()
            if low not in {"1", "0", "true", "false", "yes", "no", "on", "off"}:
                raise ValueError(value)
            return low in {"1", "true", "yes", "on"}
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source} {key!r}: {value!r} is not a valid {kind.__name__}") from exc


def _validate(s: Settings) -> None:
    for name in ("metrics_partitions", "verdicts_partitions", "deadletter_partitions", "replication_factor"):
        if getattr(s, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(s, name)}")
    if s.producer_batch_max < 1 or s.producer_queue_max < s.producer_batch_max:
        raise ConfigError("producer_queue_max must be at least producer_batch_max, which must be >= 1")
    a = s.analyzer
    if not 0.0 <= a.alpha <= a.beta <= 1.0:
        raise ConfigError(f"analyzer thresholds need 0 <= alpha <= beta <= 1, got {a.alpha}, {a.beta}")
