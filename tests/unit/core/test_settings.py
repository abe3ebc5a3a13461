"""Settings: environment, flags, unknown keys, validation, and the compose file's variables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ccld.errors import ConfigError
from ccld.settings import Settings, known_env_vars

ROOT = Path(__file__).resolve().parents[3]


def test_defaults_env_and_overrides_layer_in_order() -> None:
    env = {"CCLD_METRICS_PARTITIONS": "8", "CCLD_JOB": "from-env", "CCLD_ANALYZER_ALPHA": "0.3", "PATH": "/x"}
    s = Settings.load(env, job="from-flag", bootstrap=None)
    assert (s.metrics_partitions, s.job, s.analyzer.alpha, s.bootstrap) == (8, "from-flag", 0.3, "")
    assert s.metrics_topic == "ccl-d.metrics"
    assert s.replace(topic_prefix="x.").verdicts_topic == "x.verdicts"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CCLD_METRIC_PARTITIONS": "8"}, "unknown environment variable 'CCLD_METRIC_PARTITIONS'"),
        ({"CCLD_METRICS_PARTITIONS": "many"}, "not a valid int"),
        ({"CCLD_METRICS_PARTITIONS": "0"}, "at least 1"),
        ({"CCLD_ANALYZER_ALPHA": "0.9"}, "alpha <= beta"),
    ],
)
def test_bad_environment_is_rejected_clearly(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Settings.load(env)


def test_unknown_override_is_rejected() -> None:
    with pytest.raises(ConfigError, match="unknown argument 'partitions'"):
        Settings.load({}, partitions=3)


def test_settings_are_frozen() -> None:
    s = Settings.load({})
    with pytest.raises(AttributeError):
        s.job = "x"  # type: ignore[misc]


def test_every_compose_ccld_variable_is_a_setting() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    used = set(re.findall(r"\b(CCLD_[A-Z0-9_]+)\b", text))
    assert used, "docker-compose.yml sets no CCLD_* variable"
    unknown = used - known_env_vars()
    assert not unknown, f"docker-compose.yml sets variables the settings object does not know: {sorted(unknown)}"
    realistic = {"CCLD_ANALYZER_ALPHA": "0.4", "CCLD_ANALYZER_BETA": "0.6", "CCLD_LOG_LEVEL": "INFO",
                 "CCLD_SECURITY_PROTOCOL": "SASL_SSL", "CCLD_SASL_MECHANISM": "SCRAM-SHA-512",
                 "CCLD_SSL_CERTIFICATE_LOCATION": "", "CCLD_SSL_KEY_LOCATION": ""}
    strings = {"CCLD_BOOTSTRAP", "CCLD_JOB", "CCLD_TOPIC_PREFIX", "CCLD_ARCHIVE_DIR", "CCLD_WORKER_APP_ID",
               "CCLD_SINK_GROUP", "CCLD_SASL_USERNAME", "CCLD_SASL_PASSWORD", "CCLD_SSL_CA_LOCATION",
               "CCLD_KAFKA_CONFIG_FILE", "CCLD_SPOOL_DIR"}
    Settings.load(dict.fromkeys(used, "1") | {k: "x" for k in used if k in strings}
                  | {k: v for k, v in realistic.items() if k in used})


def test_a_rank_started_by_ccld_run_loads_its_settings() -> None:
    """What ``ccld run`` puts in its ranks' environment (the launch's job name without ``--job``, the NCCL
    plugin's variables) and what a user may add there (the attachment's cost counters) is no setting and must
    not make the rank's ``Settings.load()`` fail: the attachment would silently stay off in every rank."""
    from ccld.producers.attach.bootstrap import child_env
    from ccld.producers.attach.run_command import launch_env

    base = launch_env(Settings.load({}), {"PATH": "/usr/bin"})  # no --job: CCLD_JOB_LAUNCH
    assert "CCLD_JOB_LAUNCH" in base
    base.update({"CCLD_ATTACH_COST": "1", "CCLD_NCCL_DIR": "/tmp/x", "CCLD_NCCL_PLUGIN": "1",
                 "CCLD_NCCL_SLOTS": "64", "CCLD_NCCL_QUIET": "1", "CCLD_SUPERVISOR": "1:3"})  # fmt: skip
    env = child_env(base, Settings.load({}, bootstrap="b:1").to_env(), site_dir="/s", sink="kafka", heartbeat_ms=None)
    assert Settings.load(env).bootstrap == "b:1"


def test_every_variable_the_plugin_reads_is_named_as_no_setting() -> None:
    from ccld.probe import nccl_build
    from ccld.settings import NOT_SETTINGS

    src = (nccl_build.source_dir() / "ccld_nccl_profiler.c").read_text()
    read = set(re.findall(r'getenv\("(CCLD_[A-Z0-9_]+)"\)', src))
    assert read and read <= NOT_SETTINGS, read - NOT_SETTINGS
