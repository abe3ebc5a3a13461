"""The README matches the code: every setting documented, both Quick start commands present."""

from __future__ import annotations

import re
from pathlib import Path

from ccld.cli import COMMANDS
from ccld.settings import known_env_vars

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()


def test_every_setting_is_in_the_configuration_table() -> None:
    documented = set(re.findall(r"`(CCLD_[A-Z0-9_]+)`", README))
    missing = known_env_vars() - documented
    assert not missing, f"README's configuration table lacks {sorted(missing)}"
    stale = {v for v in documented - known_env_vars() if v != "CCLD_TEST_BOOTSTRAP"}
    assert not stale, f"README documents variables the code does not read: {sorted(stale)}"


def test_quick_start_has_the_two_commands_and_ci_runs_the_second() -> None:
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```\n(.+?)\n```", quick, flags=re.S)
    assert len(blocks) == 2, blocks
    assert blocks[0].endswith("ccld demo")
    ci = (ROOT / ".ci" / "run").read_text()
    assert blocks[1] in ci, "the CI script must run the README's test command verbatim"


def test_readme_mentions_every_command() -> None:
    for name in COMMANDS:
        assert f"ccld {name}" in README, f"README never shows `ccld {name}`"
