"""docker-compose.yml is valid for the real Compose binary (no Docker engine needed) and publishes on loopback only."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import compose
import pytest

ROOT = Path(__file__).resolve().parents[3]
BINARY = Path(compose.__file__).parent / "docker-compose"


def run_config(path: Path) -> subprocess.CompletedProcess[str]:
    # The pip wrapper script always exits 0: call the inner binary.
    return subprocess.run([str(BINARY), "-f", str(path), "config", "-q"], capture_output=True, text=True,
                          timeout=60)


def config_json(path: Path) -> dict[str, Any]:
    res = subprocess.run([str(BINARY), "-f", str(path), "config", "--format", "json"],
                         capture_output=True, text=True, timeout=60, check=True)
    spec: dict[str, Any] = json.loads(res.stdout)
    return spec


def wide_binds(path: Path) -> list[str]:
    """Every way the file exposes a port beyond loopback: a published port without 127.0.0.1, or host networking."""
    bad = []
    for name, svc in config_json(path)["services"].items():
        if svc.get("network_mode") == "host":
            bad.append(f"{name}: network_mode host")
        for port in svc.get("ports") or ():
            # Compose normalises "9094:9094" to no host_ip (every interface) and "0.0.0.0:..." to 0.0.0.0.
            if port.get("host_ip") != "127.0.0.1":
                bad.append(f"{name}: {port.get('host_ip') or '*'}:{port.get('published')}->{port['target']}")
    return bad


def test_compose_file_validates() -> None:
    res = run_config(ROOT / "docker-compose.yml")
    assert res.returncode == 0, res.stderr


def test_compose_validation_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("services: {a: {image: x, depends_on: {b: {condition: sometimes}}}}\n")
    assert run_config(bad).returncode != 0


def test_services_and_conditions() -> None:
    svc = config_json(ROOT / "docker-compose.yml")["services"]
    assert svc["kafka"]["image"].startswith("apache/kafka:")
    assert svc["worker"]["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    assert svc["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert all("healthcheck" in svc[n] for n in ("kafka", "worker", "sink"))


def test_every_published_port_binds_to_loopback_only() -> None:
    # The broker's published listener is PLAINTEXT without authentication: reachable from other
    # hosts only through the secured listener the compose file describes, never by a wider bind.
    spec = config_json(ROOT / "docker-compose.yml")
    assert spec["services"]["kafka"]["ports"], "the broker publishes no port: nothing left to check"
    assert wide_binds(ROOT / "docker-compose.yml") == []


@pytest.mark.parametrize(("ports", "extra"), [('["9094:9094"]', ""), ('["0.0.0.0:9094:9094"]', ""),
                                              ("[]", "network_mode: host")])
def test_a_wider_bind_is_caught(tmp_path: Path, ports: str, extra: str) -> None:
    wide = tmp_path / "docker-compose.yml"
    wide.write_text((ROOT / "docker-compose.yml").read_text().replace('- "127.0.0.1:9094:9094"', "")
                    .replace("    ports:\n", f"    ports: {ports}\n" + (f"    {extra}\n" if extra else ""), 1))
    assert wide_binds(wide), wide.read_text()
