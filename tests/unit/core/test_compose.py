"""docker-compose.yml is valid for the real Compose binary (no Docker engine needed)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import compose

ROOT = Path(__file__).resolve().parents[3]
BINARY = Path(compose.__file__).parent / "docker-compose"


def run_config(path: Path) -> subprocess.CompletedProcess[str]:
    # The pip wrapper script always exits 0: call the inner binary.
    return subprocess.run([str(BINARY), "-f", str(path), "config", "-q"], capture_output=True, text=True,
                          timeout=60)


def test_compose_file_validates() -> None:
    res = run_config(ROOT / "docker-compose.yml")
    assert res.returncode == 0, res.stderr


def test_compose_validation_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("services: {a: {image: x, depends_on: {b: {condition: sometimes}}}}\n")
    assert run_config(bad).returncode != 0


def test_services_and_conditions() -> None:
    res = subprocess.run([str(BINARY), "-f", str(ROOT / "docker-compose.yml"), "config", "--format", "json"],
                         capture_output=True, text=True, timeout=60, check=True)
    spec = json.loads(res.stdout)
    svc = spec["services"]
    assert svc["kafka"]["image"].startswith("apache/kafka:")
    assert svc["worker"]["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    assert svc["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert all("healthcheck" in svc[n] for n in ("kafka", "worker", "sink"))
