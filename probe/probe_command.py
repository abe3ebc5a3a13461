"""``ccld probe``: the frame layout, the CUDA compile check, and a GPU availability check."""

from __future__ import annotations

import argparse
import json

from ccld.probe import layout, sources
from ccld.settings import Settings


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="probe_command", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("layout", help="print the byte layout of the probing frame")
    p.add_argument("--c", dest="c_block", action="store_true", help="print the #define block of ccld_probe.cuh")
    p.add_argument("--json", action="store_true", help="print the layout as JSON")
    p = sub.add_parser("compile-check", help="compile every CUDA source with nvcc (sm_80, sm_90; ptx, cubin)")
    p.add_argument("--arch", action="append", help="architecture (repeatable; default sm_80 and sm_90)")
    p.add_argument("--nvcc", help="nvcc to use (default: the one on PATH)")
    p.add_argument("--jobs", type=int, default=4, help="parallel nvcc runs")
    sub.add_parser("gpu-check", help="say whether CuPy and a CUDA device are usable here")


def _layout(args: argparse.Namespace) -> int:
    if args.c_block:
        print(layout.c_block())
    elif args.json:
        doc = {
            "version": layout.FORMAT_VERSION,
            "frame_size": layout.FRAME_SIZE,
            "header": [{"name": f.name, "offset": f.offset, "type": f.dtype} for f in layout.HEADER_FIELDS],
            "subblock_size": layout.SUBBLOCK_SIZE,
            "subblocks": layout.N_SUBBLOCKS,
            "channels": layout.N_CHANNELS,
            "trace_size": layout.TRACE_SIZE,
            "counter": [{"name": f.name, "offset": f.offset, "type": f.dtype} for f in layout.COUNTER_FIELDS],
            "defines": layout.c_defines(),
        }
        print(json.dumps(doc, indent=2))
    else:
        print(layout.describe())
    return 0


def _compile_check(args: argparse.Namespace) -> int:
    nvcc = args.nvcc or sources.nvcc_path()
    archs = tuple(args.arch) if args.arch else sources.ARCHS
    results: list[sources.CompileResult] = []
    if nvcc is None:
        print("nvcc is not on PATH: CUDA sources not compiled with nvcc (install the CUDA toolkit to check them)")
    else:
        results += sources.compile_all(archs=archs, jobs=args.jobs, nvcc=nvcc)
    if sources.nvrtc_available():  # what RawModule uses at run time
        results += [sources.compile_with_nvrtc(n, a) for n in sources.source_names() for a in archs]
    else:
        print("NVRTC (the [gpu] extra) is not installed: the run-time compile path not checked")
    if not results:
        return 0
    failed = 0
    for r in results:
        print(f"{'ok  ' if r.ok else 'FAIL'} {r.source:<20} {r.arch:<6} {r.fmt:<5} {r.seconds:5.2f}s")
        if not r.ok:
            failed += 1
            print("     " + r.message.replace("\n", "\n     "))
    print(f"{len(results) - failed}/{len(results)} compiled")
    return 1 if failed else 0


def _gpu_check() -> int:
    from ccld.probe.errors import GpuUnavailableError
    from ccld.probe.gpu import require_device

    try:
        cp = require_device()
    except GpuUnavailableError as exc:
        print(f"no GPU for the probe: {exc}")
        return 1
    dev = cp.cuda.Device()
    print(f"CUDA device {dev.id}: compute capability {dev.compute_capability}; CuPy {cp.__version__}")
    return 0


def main(args: argparse.Namespace, settings: Settings) -> int:
    if args.probe_command == "layout":
        return _layout(args)
    if args.probe_command == "compile-check":
        return _compile_check(args)
    return _gpu_check()
