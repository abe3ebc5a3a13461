"""The docs match the code: every setting, both Quick start commands, the verdict de-dup key, the README's map."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from ccld.cli import COMMANDS
from ccld.records import AnomalyKind, Link, Verdict, VerdictState
from ccld.settings import NOT_SETTINGS, known_env_vars
from factories import make_verdict

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
WIRE_FORMAT = (ROOT / "docs" / "wire-format.md").read_text()


def _section(text: str, heading: str) -> str:
    assert f"\n{heading}\n" in text, f"no {heading!r} section"
    return text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def _links(text: str) -> list[str]:
    """Relative Markdown link targets (path, or path#anchor)."""
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t for t in targets if "://" not in t and not t.startswith("#")]


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    headings = re.findall(r"^#{1,6} (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_setting_is_in_the_configuration_table() -> None:
    documented = set(re.findall(r"`(CCLD_[A-Z0-9_]+)`", CONFIGURATION))
    missing = known_env_vars() - documented
    assert not missing, f"docs/configuration.md's table lacks {sorted(missing)}"
    stale = documented - known_env_vars() - NOT_SETTINGS  # those are said to be no settings
    assert not stale, f"docs/configuration.md documents variables the code does not read: {sorted(stale)}"


def test_quick_start_has_the_two_commands_and_ci_runs_the_second() -> None:
    quick = _section(README, "## Quick start")
    blocks = re.findall(r"```\n(.+?)\n```", quick, flags=re.S)
    assert len(blocks) == 2, blocks
    assert blocks[0].endswith("ccld demo")
    ci = (ROOT / ".ci" / "run").read_text()
    assert blocks[1] in ci, "the CI script must run the README's test command verbatim"


def test_readme_mentions_every_command() -> None:
    for name in COMMANDS:
        assert f"ccld {name}" in README, f"README never shows `ccld {name}`"


def test_readme_is_a_front_door() -> None:
    n = len(README.splitlines())
    assert n < 250, f"README.md has {n} lines; move detail into docs/ (the README links each document)"


def test_every_document_the_readme_lists_exists_and_every_doc_is_listed() -> None:
    listed = [t.split("#", 1)[0] for t in _links(_section(README, "## Documentation"))]
    assert "docs/architecture.md" in listed
    missing = [t for t in listed if not (ROOT / t).is_file()]
    assert not missing, f"README's Documentation section links missing files: {missing}"
    unlisted = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} - set(listed)
    assert not unlisted, f"README's Documentation section does not list {sorted(unlisted)}"


def test_relative_links_in_the_readme_and_docs_resolve() -> None:
    pages = [ROOT / "README.md", ROOT / "tests" / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "benchmarks").rglob("*.md"))]
    broken = []
    for page in pages:
        for link in _links(page.read_text()):
            path, _, anchor = link.partition("#")
            target = page.parent / path
            if not target.exists() or (anchor and anchor not in _anchors(target)):
                broken.append(f"{page.relative_to(ROOT)}: {link}")
    assert not broken, f"links to files or headings that do not exist: {broken}"


def test_the_verdict_key_readers_are_told_to_dedupe_on_is_the_code_s() -> None:
    m = re.search(r"de-duplicate on `\(([a-z_, ]+)\)`", WIRE_FORMAT)
    assert m, "docs/wire-format.md no longer says which fields identify a verdict"
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
            f"docs/wire-format.md says {name} {'is' if name in documented else 'is not'} part of a verdict's "
            f"identity; Verdict.dedupe_key {'uses' if changed else 'ignores'} it")


def test_every_file_the_architecture_map_names_exists() -> None:
    """docs/architecture.md is where a newcomer starts: a path it names that is gone sends them nowhere."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`([\w./<>-]+/[\w.<>-]*)`", text))
    # `<kind>-<ranks>` style placeholders stand for a family of paths; check their fixed prefix
    missing = [p for p in sorted(named) if not (ROOT / p.split("<", 1)[0]).exists()]
    assert len(named) > 20, "the map names fewer files than expected: did the pattern stop matching?"
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_runbook_gives_each_class_the_action_the_alerts_carry() -> None:
    """docs/runbook.md and the alert annotation say the same first check (ccld/anomaly.py is the source)."""
    from ccld.anomaly import CLASSES

    runbook = (ROOT / "docs" / "runbook.md").read_text()
    for kind, row in CLASSES.items():
        assert f"| {kind.value} {row.title} | {row.root} | {row.action} |" in runbook, f"runbook row of {kind} is stale"
