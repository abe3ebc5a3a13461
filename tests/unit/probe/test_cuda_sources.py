"""The CUDA sources: what RawModule compiles is what nvcc checks, for sm_80 and sm_90, PTX and cubin."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from ccld.probe import sources

PROBE_DIR = Path(sources.__file__).parent


def test_sources_are_shipped_and_expand_without_includes() -> None:
    assert sources.source_names() == ["ccld_markers.cu", "ccld_ring.cu"]
    assert sources.header_names() == ["ccld_probe.cuh"]
    for name in sources.source_names():
        text = sources.module_source(name)
        assert '#include "' not in text
        assert "struct ccld_frame" in text and text.count("struct ccld_frame {") == 1
        assert sources.read_source(name) != text  # the include was expanded


def test_no_module_imports_cupy_at_load() -> None:
    for path in PROBE_DIR.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only; imports inside functions are the rule
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] == "cupy" for n in names), f"{path.name} imports cupy at load"


@pytest.mark.slow  # nvcc, about 5 s
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_every_source_compiles_for_sm80_and_sm90_ptx_and_cubin() -> None:
    results = sources.compile_all(jobs=4)
    assert len(results) == len(sources.source_names()) * 2 * 2
    failed = [f"{r.source} {r.arch} {r.fmt}: {r.message}" for r in results if not r.ok]
    assert failed == []


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_nvcc_rejects_a_layout_drift(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The static_asserts bite: a header whose define disagrees with its struct does not compile."""
    real = sources.read_source

    def drifted(name: str) -> str:
        text = real(name)
        return text.replace("#define CCLD_HDR_T_END_NS 24", "#define CCLD_HDR_T_END_NS 20")

    monkeypatch.setattr(sources, "read_source", drifted)
    r = sources.compile_with_nvcc("ccld_markers.cu", "sm_90", "ptx", tmp_path)
    assert not r.ok and "ccld_header.t_end_ns" in r.message, r.message


@pytest.mark.skipif(not sources.nvrtc_available(), reason="CuPy's NVRTC binding or libnvrtc is not installed")
def test_every_source_compiles_with_nvrtc_as_rawmodule_would() -> None:
    for name in sources.source_names():
        for arch in sources.ARCHS:
            r = sources.compile_with_nvrtc(name, arch)
            assert r.ok, f"{name} {arch}: {r.message}"
