"""Read PyTorch Flight Recorder dumps safely: a restricted unpickler or JSON, version 2.x, optionally gzip.

A dump is untrusted data: the unpickler admits only the opcodes of plain containers and
scalars (dict, list, tuple, str, bytes, int, float, bool, None) and refuses every class or
persistent id, so a crafted file cannot run code. Each file is one rank; the rank is the
number at the end of the file name (``nccl_trace_rank_3``, ``host-a_trace_rank_3.json``,
``rank3.json.gz``) and the host name, when present, is the part of the name that differs
between files of the set. A file that cannot be used yields a ``DumpError`` naming it; a file
whose name carries no rank number (a README, ``truth.json``) is listed as skipped; the caller
analyses the rest.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ccld.errors import CcldError

__all__ = ["DumpError", "LoadResult", "RankDump", "decode", "load_dir", "plain_unpickle", "rank_of", "validate"]


class DumpError(CcldError, ValueError):
    """One dump file is unreadable or not a Flight Recorder dump (the message names the file)."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load class {module}.{name}: only plain data is allowed")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refusing persistent ids: only plain data is allowed")


def plain_unpickle(data: bytes) -> Any:
    """Unpickle containers and scalars only; anything else raises ``pickle.UnpicklingError``."""
    return _PlainUnpickler(io.BytesIO(data)).load()


@dataclass(frozen=True)
class RankDump:
    """One rank's Flight Recorder dump, as read."""

    path: Path
    rank: int
    host: str
    version: str
    entries: list[dict[str, Any]]
    pg_config: Mapping[str, Any]
    pg_status: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class LoadResult:
    """Every usable dump (sorted by rank), an error per unusable file, and the files skipped by name."""

    dumps: list[RankDump]
    errors: list[DumpError]
    skipped: list[str]


_SUFFIXES = (".pkl", ".pickle", ".json", ".bin", ".txt")
_TRAIL = re.compile(r"^(.*?)(\d+)$")
_SEP = re.compile(r"[_.\-]+")
# at most this many bytes after decompression: a dump of 20,000 entries is about 20 MB
_MAX_BYTES = 512 * 1024 * 1024


def _stem(path: Path) -> str:
    name = path.name.removesuffix(".gz")
    for suf in _SUFFIXES:
        if name.endswith(suf):
            return name[: -len(suf)]
    return name


def rank_of(path: Path) -> tuple[int, str]:
    """(rank, name prefix) from a file name ending in the rank number."""
    m = _TRAIL.match(_stem(path))
    if m is None:
        raise DumpError(f"{path}: the file name does not end in a rank number")
    return int(m.group(2)), m.group(1)


def decode(path: Path, data: bytes) -> dict[str, Any]:
    """The dump dict of one file's bytes (pickle or JSON, gzip or not, detected from the content)."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.GzipFile(fileobj=io.BytesIO(data)).read(_MAX_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise DumpError(f"{path}: cannot decompress: {exc}") from exc
        if len(data) > _MAX_BYTES:
            raise DumpError(f"{path}: more than {_MAX_BYTES} bytes after decompression")
    head = data.lstrip()[:1]
    try:
        if head in (b"{", b"["):
            obj = json.loads(data.decode("utf-8"))
        elif data[:1] == b"\x80":
            obj = plain_unpickle(data)
        else:
            raise DumpError(f"{path}: neither a pickle nor a JSON document")
    except (pickle.UnpicklingError, EOFError, ValueError, UnicodeDecodeError, IndexError, TypeError) as exc:
        if isinstance(exc, DumpError):
            raise
        raise DumpError(f"{path}: cannot decode: {exc}") from exc
    if not isinstance(obj, dict):
        raise DumpError(f"{path}: a dump is a dict, got {type(obj).__name__}")
    return obj


_Parts = tuple[str, list[dict[str, Any]], Mapping[str, Any], Mapping[str, Any]]


def validate(path: Path, obj: Mapping[str, Any]) -> _Parts:
    """(version, entries, pg_config, pg_status) of a decoded dump, or DumpError naming the file.

    ``entries`` may be absent: a dump taken with only active entries from a rank that finished
    everything it enqueued has none (its ``pg_status`` still says how far it got).
    """
    version = str(obj.get("version", ""))
    if not version.startswith("2."):
        raise DumpError(f"{path}: unsupported Flight Recorder format version {version or '(none)'!r}; need 2.x")
    entries = obj.get("entries", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise DumpError(f"{path}: 'entries' must be a list of dicts")
    for i, e in enumerate(entries):
        missing = [k for k in ("process_group", "profiling_name") if k not in e]
        if "collective_seq_id" not in e and "p2p_seq_id" not in e:
            missing.append("collective_seq_id")
        if missing:
            raise DumpError(f"{path}: entry {i} lacks {', '.join(missing)}")
    pg_config = obj.get("pg_config") or {}
    pg_status = obj.get("pg_status") or {}
    if not isinstance(pg_config, dict) or not isinstance(pg_status, dict):
        raise DumpError(f"{path}: 'pg_config' and 'pg_status' must be dicts")
    return version, entries, pg_config, pg_status


def _hosts(prefixes: dict[Path, str]) -> dict[Path, str]:
    """The name tokens that differ between files are the host name (empty when none differ)."""
    tokens = {p: [t for t in _SEP.split(pre) if t] for p, pre in prefixes.items()}
    if len(tokens) < 2:
        return {p: "" for p in tokens}
    common = set.intersection(*(set(t) for t in tokens.values()))
    return {p: "-".join(t for t in toks if t not in common) for p, toks in tokens.items()}


def load_dir(directory: Path) -> LoadResult:
    """Every usable dump in ``directory``; unusable files become errors, files without a rank number are skipped."""
    if not directory.is_dir():
        raise CcldError(f"{directory} is not a directory")
    errors: list[DumpError] = []
    skipped: list[str] = []
    named: dict[Path, tuple[int, str]] = {}
    for path in sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith(".")):
        try:
            named[path] = rank_of(path)
        except DumpError:
            skipped.append(path.name)
    hosts = _hosts({p: pre for p, (_r, pre) in named.items()})
    dumps: list[RankDump] = []
    seen: dict[int, Path] = {}
    for path, (rank, _pre) in named.items():
        try:
            obj = decode(path, path.read_bytes())
            version, entries, pg_config, pg_status = validate(path, obj)
        except DumpError as exc:
            errors.append(exc)
            continue
        except OSError as exc:
            errors.append(DumpError(f"{path}: cannot read: {exc}"))
            continue
        if rank in seen:
            errors.append(DumpError(f"{path}: rank {rank} already read from {seen[rank].name}; ignored"))
            continue
        seen[rank] = path
        host = str(obj.get("hostname") or obj.get("host") or hosts.get(path, ""))
        dumps.append(RankDump(path, rank, host, version, entries, pg_config, pg_status))
    dumps.sort(key=lambda d: d.rank)
    return LoadResult(dumps, errors, skipped)
