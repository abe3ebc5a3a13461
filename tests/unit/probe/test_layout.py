"""The frame layout: sizes, the numpy dtype, and the CUDA header's constants agree (no drift)."""

from __future__ import annotations

import re
from importlib import resources

import numpy as np

from ccld.probe import layout, ring_plan

_DEFINE = re.compile(r"^#define\s+(CCLD_\w+)\s+(-?\d+)\s*$", re.MULTILINE)


def _cuda(name: str) -> str:
    return resources.files("ccld.probe").joinpath("cuda", name).read_text(encoding="utf-8")


def test_sizes_match_the_paper() -> None:
    assert layout.FRAME_SIZE == 1184
    assert layout.HEADER_SIZE + layout.N_SUBBLOCKS * layout.SUBBLOCK_SIZE == layout.FRAME_SIZE
    assert layout.TRACE_SIZE + layout.N_CHANNELS * layout.COUNTER_PAIR_SIZE == layout.SUBBLOCK_SIZE
    assert layout.FRAME_DTYPE.itemsize == 1184
    assert layout.subblock_dtype().itemsize == 144
    assert layout.header_dtype().itemsize == 32


def test_header_fields_tile_32_bytes_without_overlap() -> None:
    covered = np.zeros(layout.HEADER_SIZE, dtype=int)
    for f in layout.HEADER_FIELDS:
        covered[f.offset : f.offset + f.size] += 1
        assert f.offset % f.size == 0, f"{f.name} is not naturally aligned"
    assert covered.tolist() == [1] * layout.HEADER_SIZE


def test_dtype_offsets_follow_the_field_table() -> None:
    hdr = layout.header_dtype()
    for f in layout.HEADER_FIELDS:
        assert hdr.fields is not None and hdr.fields[f.name][1] == f.offset
    frame = np.zeros(1, dtype=layout.FRAME_DTYPE)
    raw = frame.view(np.uint8)
    frame["sub"]["counters"]["recv"][0, 3, 5] = 0x0102030405060708
    off = layout.counter_offset(3, 5, "recv")
    assert off == 32 + 3 * 144 + 16 + 5 * 16 + 8
    assert raw[off : off + 8].tobytes() == bytes.fromhex("0807060504030201")
    assert layout.subblock_offset(1) == 32 and layout.subblock_offset(9) == 32
    assert layout.subblock_offset(8) == 32 + 7 * 144


def test_cuda_header_carries_the_generated_block_verbatim() -> None:
    text = _cuda("ccld_probe.cuh")
    assert layout.c_block() in text, "ccld_probe.cuh drifted from probe/layout.py: paste `ccld probe layout --c`"


def test_cuda_header_defines_equal_layout_and_nothing_else_hides() -> None:
    defines = {k: int(v) for k, v in _DEFINE.findall(_cuda("ccld_probe.cuh"))}
    expected = layout.c_defines()
    for name, value in expected.items():
        assert defines.get(name) == value, name
    # every layout-looking define in the header is one the layout knows
    stray = [k for k in defines if k.startswith(("CCLD_HDR_", "CCLD_SUB_", "CCLD_COUNTER_")) and k not in expected]
    assert stray == []
    # the structs are tied to the defines by static_assert, one per header field
    for f in layout.HEADER_FIELDS:
        assert f"CCLD_CHECK_OFFSET(ccld_header, {f.name}, CCLD_HDR_{f.name.upper()});" in _cuda("ccld_probe.cuh")


def test_fault_indices_match_the_ring_kernel() -> None:
    defines = {k: int(v) for k, v in _DEFINE.findall(_cuda("ccld_ring.cu"))}
    assert defines["CCLD_N_FAULTS"] == len(ring_plan.FAULT_FIELDS)
    for i, name in enumerate(ring_plan.FAULT_FIELDS):
        assert defines[f"CCLD_FAULT_{name.upper()}"] == i
    arr = ring_plan.Faults(stop_rank=2, stop_step=7, late_ns=5).as_array()
    assert arr.dtype == np.int64 and arr.tolist() == [-1, 0, 2, 7, -1, -1, 0, -1, 5]


def test_describe_names_every_header_field() -> None:
    text = layout.describe()
    for f in layout.HEADER_FIELDS:
        assert f"header.{f.name}" in text
    assert "1184 bytes" in text
