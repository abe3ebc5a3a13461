"""The probe's CUDA sources (package data) and the nvcc compile check.

``module_source(name)`` is the one text every compiler sees: the ``.cu`` file with its local
``#include "x.cuh"`` lines expanded, which is what CuPy's ``RawModule`` compiles at run time
(NVRTC then needs no include path, even from a zipped install) and what ``compile_with_nvcc``
hands to nvcc, so the compile check covers exactly the code a GPU run builds.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ccld.probe.errors import CudaCompileError

log = logging.getLogger(__name__)

ARCHS: tuple[str, ...] = ("sm_80", "sm_90")
FORMATS: tuple[str, ...] = ("ptx", "cubin")
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_.]+)"\s*$', re.MULTILINE)


def _cuda_dir() -> resources.abc.Traversable:
    return resources.files("ccld.probe").joinpath("cuda")


def source_names() -> list[str]:
    """Every ``.cu`` file shipped with the probe, sorted."""
    return sorted(p.name for p in _cuda_dir().iterdir() if p.name.endswith(".cu"))


def header_names() -> list[str]:
    return sorted(p.name for p in _cuda_dir().iterdir() if p.name.endswith(".cuh"))


def read_source(name: str) -> str:
    """The raw text of one file of ``probe/cuda``."""
    try:
        return _cuda_dir().joinpath(name).read_text(encoding="utf-8")
    except (FileNotFoundError, OSError) as exc:
        raise CudaCompileError(f"no CUDA source {name!r} in the probe package: {exc}") from exc


def module_source(name: str) -> str:
    """``name`` with every local include expanded once (header guards keep repeats harmless)."""
    seen: set[str] = set()

    def expand(text: str) -> str:
        def sub(m: re.Match[str]) -> str:
            inc = m.group(1)
            if inc in seen:
                return f"// (already included: {inc})"
            seen.add(inc)
            return f"// ---- begin {inc}\n{expand(read_source(inc))}\n// ---- end {inc}"

        return _INCLUDE.sub(sub, text)

    return expand(read_source(name))


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


@dataclass(frozen=True, slots=True)
class CompileResult:
    """Outcome of one nvcc run: source, architecture, output format, success, seconds, message."""

    source: str
    arch: str
    fmt: str
    ok: bool
    seconds: float
    message: str = ""


def compile_with_nvcc(name: str, arch: str, fmt: str, out_dir: Path, nvcc: str | None = None) -> CompileResult:
    """Compile the expanded ``name`` with nvcc to ``fmt`` (ptx or cubin) for ``arch``."""
    import time

    nvcc = nvcc or nvcc_path()
    if nvcc is None:
        raise CudaCompileError("nvcc is not on PATH")
    if fmt not in FORMATS:
        raise CudaCompileError(f"format must be one of {FORMATS}, got {fmt!r}")
    src = out_dir / f"{arch}-{fmt}-{name}"
    src.write_text(module_source(name), encoding="utf-8")
    out = src.with_suffix(f".{fmt}")
    cmd = [nvcc, f"-arch={arch}", f"-{fmt}", "-std=c++17", "-Werror", "all-warnings", "-o", str(out), str(src)]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CudaCompileError(f"could not run {' '.join(cmd)}: {exc}") from exc
    seconds = time.monotonic() - t0
    ok = proc.returncode == 0 and out.exists() and out.stat().st_size > 0
    message = (proc.stderr or proc.stdout).strip()
    return CompileResult(name, arch, fmt, ok, seconds, message)


def nvrtc_available() -> bool:
    """True when CuPy's NVRTC binding and libnvrtc load (no GPU or driver needed)."""
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception:  # noqa: BLE001 - ImportError, or libnvrtc missing
        return False
    return True


def compile_with_nvrtc(name: str, arch: str) -> CompileResult:
    """Compile the expanded ``name`` to PTX with NVRTC, as ``RawModule`` would (needs no device)."""
    import time

    from cupy_backends.cuda.libs import nvrtc

    number = arch.removeprefix("sm_").removeprefix("compute_")
    t0 = time.monotonic()
    prog = nvrtc.createProgram(module_source(name), name, [], [])
    try:
        nvrtc.compileProgram(prog, ["-std=c++17", f"--gpu-architecture=compute_{number}"])
        ok = len(nvrtc.getPTX(prog)) > 0
        message = nvrtc.getProgramLog(prog)
    except Exception as exc:  # noqa: BLE001 - NVRTCError: the log says why
        ok = False
        message = f"{exc}: {nvrtc.getProgramLog(prog)}"
    finally:
        nvrtc.destroyProgram(prog)
    return CompileResult(name, arch, "nvrtc-ptx", ok, time.monotonic() - t0, message.strip())


def compile_all(
    archs: tuple[str, ...] = ARCHS,
    fmts: tuple[str, ...] = FORMATS,
    names: list[str] | None = None,
    jobs: int = 4,
    nvcc: str | None = None,
) -> list[CompileResult]:
    """Compile every source for every architecture and format (in parallel) into a temp dir."""
    names = source_names() if names is None else names
    with tempfile.TemporaryDirectory(prefix="ccld-nvcc-") as tmp:
        work = [(n, a, f) for n in names for a in archs for f in fmts]
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = [pool.submit(compile_with_nvcc, n, a, f, Path(tmp), nvcc) for n, a, f in work]
            results = [fut.result() for fut in futures]
    for r in results:
        log.debug("nvcc %s %s %s: %s in %.2fs", r.source, r.arch, r.fmt, "ok" if r.ok else "FAILED", r.seconds)
    return results
