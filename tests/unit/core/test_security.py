"""TLS/SASL settings become the same librdkafka config and Faust credentials for every client."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest

from ccld.errors import ConfigError
from ccld.security import faust_kwargs, kafka_config, redacted, security_config
from ccld.settings import Settings


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "key.pem"),
                    "-out", str(d / "cert.pem"), "-days", "2", "-subj", "/CN=localhost"],
                   check=True, capture_output=True, timeout=60)
    return d / "cert.pem", d / "key.pem"


def test_plaintext_default_adds_nothing() -> None:
    s = Settings.load({}, bootstrap="h:1")
    assert kafka_config(s, **{"group.id": "g"}) == {"bootstrap.servers": "h:1", "group.id": "g"}
    assert faust_kwargs(s) == {}


def test_sasl_ssl_settings_map_to_librdkafka_keys() -> None:
    env = {"CCLD_SECURITY_PROTOCOL": "sasl_ssl", "CCLD_SASL_MECHANISM": "scram-sha-512",
           "CCLD_SASL_USERNAME": "ccld", "CCLD_SASL_PASSWORD": "s3cret", "CCLD_SSL_CA_LOCATION": "/etc/ca.pem"}
    s = Settings.load(env, bootstrap="h:1")
    assert security_config(s) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "ccld",
        "sasl.password": "s3cret", "ssl.ca.location": "/etc/ca.pem",
    }
    assert "s3cret" not in repr(s) and redacted(kafka_config(s))["sasl.password"] == "***"
    # A child process gets the same settings through the environment.
    assert Settings.load(s.to_env()) == s


def test_a_client_cannot_turn_security_off() -> None:
    s = Settings.load({}, bootstrap="h:1", security_protocol="SSL")
    assert kafka_config(s, **{"security.protocol": "PLAINTEXT"})["security.protocol"] == "SSL"


def test_properties_file_and_settings_merge(tmp_path: Path) -> None:
    props = tmp_path / "kafka.properties"
    props.write_text("# comment\nsecurity.protocol=SASL_SSL\nsasl.mechanisms=PLAIN\nsasl.username=file-user\n"
                     "sasl.password = from-file\nssl.endpoint.identification.algorithm=https\n")
    s = Settings.load({}, bootstrap="h:1", kafka_config_file=str(props), sasl_username="flag-user")
    conf = security_config(s)
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.mechanism"] == "PLAIN"
    assert conf["sasl.username"] == "flag-user", "a given setting overrides the file"
    assert conf["sasl.password"] == "from-file" and conf["ssl.endpoint.identification.algorithm"] == "https"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"security_protocol": "TLS"}, "security_protocol must be one of"),
        ({"security_protocol": "SASL_SSL", "sasl_username": "u"}, "needs sasl_mechanism"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}, "needs sasl_username"),
        ({"sasl_username": "u"}, "SASL settings are given but security_protocol is PLAINTEXT"),
        ({"ssl_certificate_location": "/c.pem"}, "go together"),
    ],
)
def test_inconsistent_security_settings_fail_at_startup(changes: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.load({}, **changes)


def test_bad_properties_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.properties"
    bad.write_text("security.protocol SSL\n")
    with pytest.raises(ConfigError, match="expected key=value"):
        security_config(Settings.load({}, kafka_config_file=str(bad)))
    with pytest.raises(ConfigError, match="cannot read kafka_config_file"):
        security_config(Settings.load({}, kafka_config_file=str(tmp_path / "missing")))


def test_faust_gets_ssl_credentials_with_the_ca_and_client_cert(cert: tuple[Path, Path]) -> None:
    import faust

    crt, key = cert
    s = Settings.load({}, bootstrap="h:1", security_protocol="SSL", ssl_ca_location=str(crt),
                      ssl_certificate_location=str(crt), ssl_key_location=str(key))
    creds = faust_kwargs(s)["broker_credentials"]
    assert isinstance(creds, faust.SSLCredentials)
    ctx = creds.context
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert any("localhost" in str(c.get("subject")) for c in ctx.get_ca_certs())


@pytest.mark.parametrize(("protocol", "wanted"), [("SASL_SSL", "SASL_SSL"), ("SASL_PLAINTEXT", "SASL_PLAINTEXT")])
def test_faust_gets_sasl_credentials(protocol: str, wanted: str) -> None:
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    s = Settings.load({}, bootstrap="h:1", security_protocol=protocol, sasl_mechanism="SCRAM-SHA-256",
                      sasl_username="ccld", sasl_password="pw")
    auth = credentials_to_aiokafka_auth(faust_kwargs(s)["broker_credentials"])
    assert auth["security_protocol"] == wanted and auth["sasl_mechanism"] == "SCRAM-SHA-256"
    assert (auth["sasl_plain_username"], auth["sasl_plain_password"]) == ("ccld", "pw")
    assert (auth["ssl_context"] is not None) is (wanted == "SASL_SSL")
