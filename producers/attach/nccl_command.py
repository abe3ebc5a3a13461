"""``ccld nccl``: CCL-D's NCCL profiler plugin: build it, check its interface, run a host aggregator for it.

- ``build``: compile the plugin (gcc) and print the library's path, the value of ``NCCL_PROFILER_PLUGIN``;
- ``aggregate --dir DIR``: a host aggregator that polls the tables of every process on this host whose
  NCCL loaded the plugin with ``CCLD_NCCL_DIR=DIR`` (for launchers that do not go through ``ccld run``:
  mpirun, srun, a JAX or C++ trainer); it prints the two lines to put in the ranks' environment;
- ``tables DIR``: what the plugin tables in DIR hold (slots, counters), for a look at a live job;
- ``layout [--c]``: the table's byte layout (the ``#define`` block of the C source);
- ``abi [--nccl-include DIR]``: the interface offsets the plugin relies on, checked against those measured
  from NCCL's headers (``probe/nccl/nccl_abi_offsets.json``, or NCCL's own headers in DIR).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ccld.errors import ConfigError
from ccld.probe import nccl_build, nccl_table
from ccld.settings import Settings


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="nccl_command", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("build", help="compile the plugin and print its path (NCCL_PROFILER_PLUGIN)")
    p.add_argument("--out", help="folder for the library (default: a cache folder keyed by the sources)")
    p.add_argument("--force", action="store_true", help="compile even when an identical build exists")
    p = sub.add_parser("aggregate", help="a host aggregator polling the plugin's tables in DIR (until stopped)")
    p.add_argument("--dir", required=True, help="the plugin's directory: CCLD_NCCL_DIR of the ranks")
    p = sub.add_parser("tables", help="what the plugin tables in DIR hold")
    p.add_argument("dir")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("layout", help="the byte layout of a plugin table")
    p.add_argument("--c", dest="c_block", action="store_true", help="the #define block of the C source")
    p = sub.add_parser("abi", help="check the interface offsets the plugin relies on")
    p.add_argument("--nccl-include", help="NCCL's profiler headers (<nccl>/plugins/profiler/example/nccl)")


def _abi(args: argparse.Namespace) -> int:
    ours = nccl_build.abi_offsets()
    theirs = nccl_build.abi_offsets(nccl_include=args.nccl_include) if args.nccl_include else \
        nccl_build.recorded_offsets()
    what = args.nccl_include or "probe/nccl/nccl_abi_offsets.json"
    bad = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
    for k in bad:
        print(f"MISMATCH {k}: plugin {ours.get(k)}, NCCL {theirs.get(k)}")
    print(f"{len(ours) - len(bad)}/{len(ours)} interface offsets agree with {what}")
    return 1 if bad else 0


def _tables(args: argparse.Namespace) -> int:
    docs: list[dict[str, Any]] = []
    for path in sorted(Path(args.dir).glob("nccl-*.table")):
        try:
            t = nccl_table.NcclTable(path)
        except Exception as exc:  # noqa: BLE001 - say which file and why, go on
            print(f"{path.name}: unreadable ({exc})", file=sys.stderr)
            continue
        slots = list(t.slots())
        rank, world = nccl_table.rank_of(t.env, slots)
        docs.append({"file": path.name, "pid": t.pid, "host": t.host, "rank": rank, "world_size": world,
                     "stats": t.stats(), "slots": [dataclasses.asdict(s) for s in slots]})  # fmt: skip
        t.close()
    if args.json:
        print(json.dumps(docs, indent=2))
        return 0
    if not docs:
        print(f"no plugin tables in {args.dir}")
    for d in docs:
        st = d["stats"]
        print(f"{d['file']}: pid {d['pid']} on {d['host']}, rank {d['rank']} of {d['world_size']}, "
              f"profiler v{st['abi']}; "
              f"{st['events']} events ({st['dropped_events']} dropped, {st['unknown_events']} of unknown types), "
              f"{st['slots_used']} slots ({st['slots_refused']} refused)")  # fmt: skip
        for s in d["slots"]:
            kind = {0: "communicator", 1: "send channel", 2: "recv channel"}.get(s["kind"], str(s["kind"]))
            state = {1: "live", 2: "closed"}.get(s["state"], str(s["state"]))
            print(f"  slot {s['index']}: {kind} {s['trace_hash']:016x} rank {s['comm_rank']}/{s['comm_size']} "
                  f"(NCCL comm {s['nccl_hash']:016x} rank {s['nccl_rank']}/{s['nccl_size']}) {state}")
    return 0


def _aggregate(args: argparse.Namespace, settings: Settings) -> int:
    from ccld.producers.attach.run_command import serve_aggregator_metrics, start_aggregator

    if not settings.bootstrap:
        print("ccld nccl aggregate: needs --bootstrap (or CCLD_BOOTSTRAP)", file=sys.stderr)
        return 2
    lib = nccl_build.build()
    agg = start_aggregator(settings, nccl_dir=args.dir)
    if agg is None:
        return 1
    server = serve_aggregator_metrics(agg, settings)
    print(f"ccld nccl aggregate: polling the plugin's tables in {args.dir}; in each rank's environment:\n"
          f"  NCCL_PROFILER_PLUGIN={lib}\n  CCLD_NCCL_DIR={args.dir}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    agg.close()
    if server is not None:
        server.close()
    return 0


def main(args: argparse.Namespace, settings: Settings) -> int:
    cmd: Any = args.nccl_command
    try:
        if cmd == "build":
            print(nccl_build.build(args.out, force=args.force))
            return 0
        if cmd == "layout":
            if args.c_block:
                print(nccl_table.c_block())
            else:
                for k, v in nccl_table.c_defines().items():
                    print(f"{k:<28} {v}")
            return 0
        if cmd == "abi":
            return _abi(args)
        if cmd == "tables":
            return _tables(args)
        return _aggregate(args, settings)
    except ConfigError as exc:
        print(f"ccld nccl: {exc}", file=sys.stderr)
        return 2
