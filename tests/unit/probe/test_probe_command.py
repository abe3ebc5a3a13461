"""`ccld probe layout | compile-check | gpu-check`."""

from __future__ import annotations

import json
import sys

import pytest

from ccld.cli import main
from ccld.probe import layout


def test_layout_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "layout"]) == 0
    out = capsys.readouterr().out
    assert "1184 bytes" in out and "header.kernel_index" in out and "sub[7].trace_id" in out


def test_layout_c_block_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "layout", "--c"]) == 0
    assert capsys.readouterr().out.strip() == layout.c_block()
    assert main(["probe", "layout", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["frame_size"] == 1184 and doc["defines"]["CCLD_HDR_T_END_NS"] == 24


def test_compile_check_without_nvcc(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("ccld.probe.sources.nvcc_path", lambda: None)
    monkeypatch.setattr("ccld.probe.sources.nvrtc_available", lambda: False)
    assert main(["probe", "compile-check"]) == 0
    assert "nvcc is not on PATH" in capsys.readouterr().out


def test_compile_check_reports_failures(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from ccld.probe import sources

    def fake(**kw: object) -> list[sources.CompileResult]:
        return [
            sources.CompileResult("a.cu", "sm_80", "ptx", True, 0.1),
            sources.CompileResult("a.cu", "sm_90", "cubin", False, 0.2, "error: boom"),
        ]

    monkeypatch.setattr(sources, "nvcc_path", lambda: "/usr/bin/nvcc-fake")
    monkeypatch.setattr(sources, "compile_all", fake)
    monkeypatch.setattr(sources, "nvrtc_available", lambda: False)
    assert main(["probe", "compile-check"]) == 1
    out = capsys.readouterr().out
    assert "FAIL a.cu" in out and "error: boom" in out and "1/2 compiled" in out


def test_gpu_check_without_cupy(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert main(["probe", "gpu-check"]) == 1
    assert "CuPy is not installed" in capsys.readouterr().out
