"""What a running ``ccld up`` tells the other commands on its machine: its broker, topics and workers' addresses.

``ccld up`` writes ``up-<pid>.json`` into a folder of the user's (``$XDG_RUNTIME_DIR/ccld``, else
``<tmp>/ccld-<uid>``) once its workers run and removes it when it stops; ``ccld status`` without
``--worker`` reads the files of the ``ccld up`` processes still alive that serve its topic prefix (and its
broker, when one is given), so it finds their workers on its own. A file left by a ``ccld up`` that was
killed names a dead process: it is skipped and removed.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class UpState:
    pid: int
    bootstrap: str
    topic_prefix: str
    workers: tuple[str, ...]  # each worker's web address (``/status/`` and ``/metrics`` beside it)


def state_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "ccld" if runtime else Path(tempfile.gettempdir()) / f"ccld-{os.getuid()}"


def write(state: UpState) -> Path:
    """Write ``state`` for the process ``state.pid``, atomically; returns its path (``remove`` it at the end)."""
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = d / f"up-{state.pid}.json"
    tmp = d / f".up-{state.pid}.json.tmp"
    tmp.write_text(json.dumps(asdict(state)))
    os.replace(tmp, path)
    return path


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or someone else's process has that pid now
        return False
    return True


def running(topic_prefix: str, bootstrap: str = "") -> list[UpState]:
    """The live ``ccld up`` processes serving ``topic_prefix`` (and ``bootstrap``, when given), by pid."""
    d = state_dir()
    out: list[UpState] = []
    if not d.is_dir():
        return out
    for path in sorted(d.glob("up-*.json")):
        try:
            raw = json.loads(path.read_text())
            st = UpState(int(raw["pid"]), str(raw["bootstrap"]), str(raw["topic_prefix"]),
                         tuple(str(w) for w in raw["workers"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # half-written by another user's tool, or not ours: not a ccld up we can use
        if not _alive(st.pid):
            remove(path)
            continue
        if st.topic_prefix == topic_prefix and (not bootstrap or st.bootstrap == bootstrap):
            out.append(st)
    return out
