"""Building the NCCL profiler plugin: gcc on the shipped C source, cached by content; and the ABI check.

``build()`` compiles ``probe/nccl/ccld_nccl_profiler.c`` into ``libnccl-profiler-ccld.so`` (the name NCCL
looks for with ``NCCL_PROFILER_PLUGIN=ccld``) under ``<cache>/ccld/nccl/<digest>/``, where the digest covers
the sources and the compiler's version: a changed source or compiler builds anew, an unchanged one reuses
the library (a prebuilt .so is never shipped). ``abi_offsets()`` compiles ``abi_offsets.c`` against this
project's header (or NCCL's own, with ``nccl_include``) and returns the offsets the plugin relies on.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from ccld.errors import ConfigError

LIBRARY = "libnccl-profiler-ccld.so"
SOURCES = ("ccld_nccl_profiler.c", "ccld_nccl_abi.h")

CFLAGS = ("-std=c11", "-O2", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror")


def source_dir() -> Path:
    return Path(str(resources.files("ccld.probe") / "nccl"))


def compiler(cc: str | None = None) -> str:
    """The C compiler: ``cc``, else ``$CC``, else gcc or cc on PATH; ConfigError when there is none."""
    for name in (cc, os.environ.get("CC"), "gcc", "cc"):
        if name and (path := shutil.which(name)):
            return path
    raise ConfigError("no C compiler (gcc or cc) on PATH: the NCCL profiler plugin is built from source "
                      "(apt-get install gcc)")  # fmt: skip


def _digest(cc: str) -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((source_dir() / name).read_bytes())
    h.update(" ".join(CFLAGS).encode())
    h.update(subprocess.run([cc, "--version"], capture_output=True, check=False).stdout)
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ccld" / "nccl"


def build(out_dir: str | os.PathLike[str] | None = None, *, cc: str | None = None, force: bool = False) -> Path:
    """The plugin library's path, compiled now unless an identical build exists; ConfigError when gcc fails."""
    cc_path = compiler(cc)
    target_dir = Path(out_dir) if out_dir is not None else cache_dir() / _digest(cc_path)
    lib = target_dir / LIBRARY
    if lib.exists() and not force:
        return lib
    target_dir.mkdir(parents=True, exist_ok=True)
    # compile to a temporary name and rename: a concurrent build never leaves a half-written library
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target_dir)
    os.close(fd)
    cmd = [cc_path, *CFLAGS, "-I", str(source_dir()), "-o", tmp, str(source_dir() / "ccld_nccl_profiler.c")]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        os.unlink(tmp)
        raise ConfigError(f"building the NCCL profiler plugin failed ({' '.join(cmd)}):\n{done.stderr.strip()}")
    os.replace(tmp, lib)
    return lib


def abi_offsets(*, nccl_include: str | os.PathLike[str] | None = None, cc: str | None = None) -> dict[str, int]:
    """The interface offsets as this project's header has them, or NCCL's own headers (``nccl_include``:
    the folder holding NCCL's ``profiler.h``, e.g. ``<nccl>/plugins/profiler/example/nccl``)."""
    cc_path = compiler(cc)
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "abi")
        side = ["-DNCCL_SIDE", "-I", str(nccl_include)] if nccl_include else ["-DCCLD_SIDE", "-I", str(source_dir())]
        cmd = [cc_path, "-std=gnu11", *side, "-o", exe, str(source_dir() / "abi_offsets.c")]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ConfigError(f"compiling the ABI check failed ({' '.join(cmd)}):\n{done.stderr.strip()}")
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in json.loads(out).items()}


def recorded_offsets() -> dict[str, int]:
    """The offsets measured from NCCL's headers (``nccl/nccl_abi_offsets.json``), without its provenance note."""
    doc = json.loads((source_dir() / "nccl_abi_offsets.json").read_text())
    return {k: int(v) for k, v in doc.items() if not k.startswith("_")}
