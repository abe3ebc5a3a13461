"""TLS and SASL for every Kafka client: one librdkafka config dict and one set of Faust/aiokafka kwargs.

Both come from the same settings (``security_protocol``, ``sasl_*``, ``ssl_*`` and an optional
librdkafka properties file, ``kafka_config_file``), so the producers, the consumers, the admin
client and the Faust worker can never disagree about how to reach the broker.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from ccld.errors import ConfigError
from ccld.settings import SASL_MECHANISMS, SECURITY_PROTOCOLS, Settings

#: librdkafka keys that carry secrets: never logged.
SECRET_KEYS = frozenset({"sasl.password", "ssl.key.password", "ssl.keystore.password", "ssl.key.pem"})

# settings field -> librdkafka key
_FIELD_KEYS = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_username": "sasl.username",
    "sasl_password": "sasl.password",
    "ssl_ca_location": "ssl.ca.location",
    "ssl_certificate_location": "ssl.certificate.location",
    "ssl_key_location": "ssl.key.location",
}


def read_properties(path: str | Path) -> dict[str, str]:
    """A librdkafka/Java-style properties file: ``key=value`` lines, ``#`` or ``!`` comments."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read kafka_config_file {path}: {exc}") from exc
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"{path}:{n}: expected key=value, got {line!r}")
        out[key.strip()] = value.strip()
    return out


def security_config(settings: Settings) -> dict[str, str]:
    """The librdkafka keys for TLS/SASL (and whatever the properties file sets), without bootstrap."""
    conf: dict[str, str] = read_properties(settings.kafka_config_file) if settings.kafka_config_file else {}
    if "sasl.mechanisms" in conf:  # librdkafka's older spelling: one key, so a later override wins cleanly
        conf.setdefault("sasl.mechanism", conf.pop("sasl.mechanisms"))
    default = Settings()
    for name, key in _FIELD_KEYS.items():
        value = getattr(settings, name)
        # Settings override the file only where they were actually given (differ from the default).
        if value != getattr(default, name) or key not in conf:
            if value:
                conf[key] = value.upper() if name in ("security_protocol", "sasl_mechanism") else value
    protocol = conf.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise ConfigError(f"security.protocol {protocol!r} is not one of {', '.join(SECURITY_PROTOCOLS)}")
    if protocol.startswith("SASL_") and not (conf.get("sasl.mechanism") and conf.get("sasl.username")):
        raise ConfigError(f"security.protocol {protocol} needs sasl.mechanism and sasl.username "
                          "(settings sasl_mechanism/sasl_username or the kafka_config_file)")
    if protocol == "PLAINTEXT" and conf.keys() == {"security.protocol"}:
        return {}  # the librdkafka default: keep plain configs byte-for-byte what they were
    return conf


def kafka_config(settings: Settings, **extra: Any) -> dict[str, Any]:
    """The whole config of a confluent-kafka Producer, Consumer or AdminClient for ``settings``.

    ``extra`` (client-specific keys such as ``group.id``) wins over nothing security-related:
    a caller cannot silently turn TLS off for one client.
    """
    conf: dict[str, Any] = {"bootstrap.servers": settings.bootstrap, **extra}
    conf.update(security_config(settings))
    return conf


def redacted(conf: dict[str, Any]) -> dict[str, Any]:
    """``conf`` with secrets replaced, for logs and error messages."""
    return {k: ("***" if k in SECRET_KEYS else v) for k, v in conf.items()}


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context the Faust/aiokafka worker uses, or None for a plaintext protocol."""
    conf = security_config(settings)
    protocol = conf.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in ("SSL", "SASL_SSL"):
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=conf.get("ssl.ca.location") or None)
    cert, key = conf.get("ssl.certificate.location"), conf.get("ssl.key.location")
    if cert and key:
        ctx.load_cert_chain(cert, key, password=conf.get("ssl.key.password") or None)
    if conf.get("enable.ssl.certificate.verification", "true").lower() == "false":
        ctx.check_hostname = False  # only where the properties file asks, as librdkafka would
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def faust_kwargs(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``faust.App(...)``: ``broker_credentials`` (None for PLAINTEXT).

    aiokafka under Faust reads ``security_protocol``, ``sasl_*`` and ``ssl_context`` from these
    credentials; with PLAINTEXT the result is ``{}`` so the app is built exactly as before.
    """
    conf = security_config(settings)
    protocol = conf.get("security.protocol", "PLAINTEXT").upper()
    if protocol == "PLAINTEXT":
        return {}
    import faust  # only the worker pays for importing Faust

    ctx = ssl_context(settings)
    if protocol == "SSL":
        return {"broker_credentials": faust.SSLCredentials(ctx)}
    mechanism = conf.get("sasl.mechanism", "").upper()
    if mechanism not in SASL_MECHANISMS:
        raise ConfigError(f"{protocol} needs sasl.mechanism, one of {', '.join(SASL_MECHANISMS)}")
    # SASLCredentials means SASL_SSL when it has a context and SASL_PLAINTEXT when it has none.
    creds = faust.SASLCredentials(username=conf.get("sasl.username", ""), password=conf.get("sasl.password", ""),
                                  ssl_context=ctx, mechanism=mechanism)
    return {"broker_credentials": creds}
