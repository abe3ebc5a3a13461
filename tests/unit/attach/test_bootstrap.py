"""`ccld run` plumbing: the import hook, the generated sitecustomize (chained), the child env."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ccld.cli import main as ccld_main
from ccld.producers.attach.bootstrap import AfterImportFinder, child_env, write_site_dir
from ccld.settings import Settings


@pytest.fixture
def fake_module(tmp_path: Path) -> Iterator[str]:
    name = f"ccld_fake_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("VALUE = 41\n")
    sys.path.insert(0, str(tmp_path))
    yield name
    sys.path.remove(str(tmp_path))
    sys.modules.pop(name, None)


def test_the_hook_runs_after_the_module_executed(fake_module: str) -> None:
    seen: list[int] = []
    finder = AfterImportFinder(fake_module, lambda: seen.append(sys.modules[fake_module].VALUE))
    sys.meta_path.insert(0, finder)
    try:
        mod = __import__(fake_module)
    finally:
        sys.meta_path.remove(finder)
    assert seen == [41] and mod.VALUE == 41
    loader: Any = mod.__loader__
    assert loader.get_source(fake_module) == "VALUE = 41\n"  # tracebacks keep their source


def test_generated_sitecustomize_chains_to_the_original(tmp_path: Path) -> None:
    site, other = tmp_path / "site", tmp_path / "other"
    site.mkdir()
    other.mkdir()
    write_site_dir(str(site))
    (other / "sitecustomize.py").write_text("print('original sitecustomize ran')\n")
    env = child_env({"PATH": "/usr/bin:/bin", "PYTHONPATH": str(other)}, {}, site_dir=str(site), sink="kafka",
                    heartbeat_ms=150)  # fmt: skip
    assert env["PYTHONPATH"].split(":")[0] == str(site) and env["CCLDRUN_HEARTBEAT_MS"] == "150"
    out = subprocess.run(
        [sys.executable, "-c", "import sys; print('torch' in sys.modules)"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert out.stdout.split() == ["original", "sitecustomize", "ran", "False"], out.stderr
    assert out.stderr == ""  # nothing imported torch, so nothing attached and nothing complained


def test_settings_travel_as_ccld_variables_only_when_not_default() -> None:
    s = Settings.load({}, bootstrap="h:1", job="train-7", analyzer_hang_min_s=3)
    env = s.to_env()
    assert env == {"CCLD_BOOTSTRAP": "h:1", "CCLD_JOB": "train-7", "CCLD_ANALYZER_HANG_MIN_S": "3.0"}
    assert Settings.load(env) == s


def test_ccld_run_runs_the_command_with_the_attachment_env(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code = (
        "import os, sys; print(os.environ['CCLDRUN_ACTIVE'], os.environ['CCLD_JOB'], os.environ['CCLDRUN_SINK'],"
        " 'sitecustomize' in sys.modules); sys.exit(3)"
    )
    rc = ccld_main(["run", "--job", "jj", "--sink", f"jsonl:{tmp_path}", "--", sys.executable, "-c", code])
    assert rc == 3
    assert capfd.readouterr().out.split() == ["1", "jj", f"jsonl:{tmp_path}", "True"]


def test_ccld_run_refuses_kafka_without_a_broker(monkeypatch: pytest.MonkeyPatch,
                                                 capfd: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.delenv("CCLD_BOOTSTRAP", raising=False)
    assert ccld_main(["run", "--", sys.executable, "-c", "pass"]) == 2
    assert "--bootstrap" in capfd.readouterr().err
    assert ccld_main(["run", "--sink", "jsonl:/tmp/x"]) == 2  # no command
