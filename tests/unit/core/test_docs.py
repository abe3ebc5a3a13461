"""The README matches the code: every setting documented, both Quick start commands present, the verdict de-dup key."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from ccld.cli import COMMANDS
from ccld.records import AnomalyKind, Link, Verdict, VerdictState
from ccld.settings import known_env_vars
from factories import make_verdict

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


def test_the_verdict_key_readers_are_told_to_dedupe_on_is_the_code_s() -> None:
    m = re.search(r"de-duplicate on `\(([a-z_, ]+)\)`", README)
    assert m, "the README no longer says which fields identify a verdict"
    documented = {f.strip() for f in m.group(1).split(",")}
    other: dict[str, Any] = {  # a different value for every field of a verdict
        "incident_id": "b", "state": VerdictState.RESOLVED, "kind": AnomalyKind.S1, "job": "k",
        "communicator": "1", "op_seq": 8, "op_type": "all_reduce", "root_cause_ranks": (4,),
        "affected_ranks": (0, 2), "confidence": 0.5, "evidence": "e", "onset_time": 1.0,
        "detected_time": 2.0, "root_cause_hosts": ("h",), "link": Link(1, 2), "channel": 3, "p": 0.9,
        "mismatch_field": "op_type", "details": {"x": 1},
    }
    assert set(other) == {f.name for f in dataclasses.fields(Verdict)}, "a new Verdict field: add it here"
    base = make_verdict(state=VerdictState.UPDATE, op_seq=7, root_cause_ranks=(3,))
    for name, value in other.items():
        changed = dataclasses.replace(base, **{name: value}).dedupe_key != base.dedupe_key
        assert changed == (name in documented), (
            f"README says {name} {'is' if name in documented else 'is not'} part of a verdict's identity; "
            f"Verdict.dedupe_key {'uses' if changed else 'ignores'} it")
