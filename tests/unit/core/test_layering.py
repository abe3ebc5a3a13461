"""The floors of the house: the core below, the stages side by side on it, ``stack/`` above them all.

Every import between the installed packages (at module level, inside functions and under
``TYPE_CHECKING`` alike: an import inside a function is still an import) must run downwards:

- the core (``ccld/`` and ``schemas/``: records, settings, errors, the codec, and what several
  stages share: the bounded record format, topics, communicator identity, the Flight Recorder
  dump model) imports only the core;
- each stage (``probe``, ``producers``, ``streams``, ``sinks``) imports only the core, except that
  ``producers`` may use the ``probe`` as a source;
- ``stack`` (up, demo, bench, broker) may import anything.

And no module imports itself back through others: the import graph has no cycle.
docs/architecture.md draws the same picture.
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

#: floor -> the floors it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "probe": {"core"},
    "producers": {"core", "probe"},
    "streams": {"core"},
    "sinks": {"core"},
    "stack": {"core", "probe", "producers", "streams", "sinks"},
}

#: (importing file, imported module) pairs allowed against the floors, each with its reason
EXCEPTIONS = {
    # the public `ccld.attach()` / `ccld.detach()` facade: a lazy call-through, so `import ccld` stays light
    ("ccld/__init__.py", "ccld.producers.attach"),
}


def _package_dirs() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def _module_name(path: Path, dirs: dict[str, str]) -> str:
    rel = path.relative_to(ROOT)
    for pkg, folder in dirs.items():
        if rel.parts[0] == folder:
            parts = list(rel.with_suffix("").parts[1:])
            if parts and parts[-1] == "__init__":
                parts = parts[:-1]
            return ".".join([pkg, *parts])
    raise AssertionError(f"{rel} is in no mapped package folder")


def floor(module: str) -> str | None:
    """The floor of a ``ccld...`` module name; None for anything outside the project."""
    parts = module.split(".")
    if parts[0] != "ccld":
        return None
    if len(parts) > 1 and parts[1] in ALLOWED and parts[1] != "core":
        return parts[1]
    return "core"


def import_graph() -> dict[tuple[str, str], set[str]]:
    """(module, file) -> the project modules it imports, wherever in the file the import stands."""
    dirs = _package_dirs()
    known: set[str] = set()
    files: dict[str, Path] = {}
    for folder in set(dirs.values()):
        for py in (ROOT / folder).rglob("*.py"):
            name = _module_name(py, dirs)
            files[name] = py
            known.add(name)
    graph: dict[tuple[str, str], set[str]] = defaultdict(set)
    for name, py in files.items():
        key = (name, str(py.relative_to(ROOT)))
        for node in ast.walk(ast.parse(py.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = name.split(".") if py.name == "__init__.py" else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join([*pkg, *([node.module] if node.module else [])])
                # `from pkg import mod` names a module when pkg.mod is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for t in targets:
                # the innermost project module the name lies in
                while t and t not in known and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in known and t != name:
                    graph[key].add(t)
        graph.setdefault(key, set())
    return graph


def test_every_import_runs_down_the_floors() -> None:
    wrong = []
    for (mod, path), targets in import_graph().items():
        src = floor(mod)
        assert src is not None
        for t in sorted(targets):
            dst = floor(t)
            if dst is None or dst == src or dst in ALLOWED[src]:
                continue
            if (path, t) in EXCEPTIONS or any(path == p and t.startswith(m + ".") for p, m in EXCEPTIONS):
                continue
            wrong.append(f"{path} ({src}) imports {t} ({dst})")
    assert not wrong, "imports against the floors:\n" + "\n".join(wrong)


def test_the_import_graph_has_no_cycle() -> None:
    graph = {mod: targets for (mod, _), targets in import_graph().items()}
    # a package's __init__ re-exporting its own modules is not a cycle of design: skip the
    # edges from a package to modules inside it (the module importing its package's
    # __init__ would still count)
    edges = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                cycles.append([*stack[stack.index(t):], t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_rules_catch_a_backward_import() -> None:
    """The floor function itself: a stage importing another stage, or the core importing a stage, is caught."""
    assert floor("ccld.records") == "core" and floor("ccld.schemas.codec") == "core"
    assert floor("ccld.streams.analysis.analyzer") == "streams"
    assert "streams" not in ALLOWED["producers"] and "stack" not in ALLOWED["sinks"]
    assert floor("numpy") is None
