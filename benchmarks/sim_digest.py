"""Digests of every batch the simulator yields for a fixed list of scenarios: proof a speed-up left the records alone.

Usage: python benchmarks/sim_digest.py [--write | --check] [--file benchmarks/results/sim-digests.json] [--only ID ...]

The list: every ``tests/golden`` scenario; per fault signature (the faults' kinds, mismatches, families
and whether a NIC is named) of ``benchmarks/scenarios/standard.jsonl`` and ``network.jsonl``, its smallest
scenario (of at most 32 ranks where there is one); and ``sim_speed.py``'s Megatron-style job at 128 and
1,024 ranks (30 simulated seconds). A scenario's digest is a SHA-256 over its whole stream, batch by
batch: the delivery time, the batch's header (job, incarnation, communicator, world size, hosts,
producer, sequence, lost records), every column, the counters and the peaks; its records digest is a
SHA-256 over the same records as a set (sorted, hosts by name), blind to which batch carries a record.
``--write`` records the digests of this checkout; ``--check`` recomputes them and names every scenario
whose stream changed (exit 1): CHANGED when its records did, REBATCHED when only their batches did.
Record on the commit before a change, check after it: a record that moved by one byte shows.
``tests/unit/simulator/test_sim_digest.py`` checks a few small ones of the same file on every run.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import struct
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import KernelBatch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_FILE = HERE / "results" / "sim-digests.json"
SUITES = ("standard", "network")
JOB_RANKS = (128, 1024)
JOB_DURATION_S = 30.0


def _array(h: Any, name: str, a: npt.NDArray[Any]) -> None:
    h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())


def stream_digest(stream: Iterable[tuple[float, KernelBatch]]) -> tuple[str, int, int, str]:
    """SHA-256 of a whole ``simulate()`` stream, its batch count, its record count, and the SHA-256 of
    its records alone (``record_digest``)."""
    h = hashlib.sha256()
    batches = records = 0
    rows: list[npt.NDArray[np.int64]] = []
    hosts: dict[str, int] = {}
    for t, b in stream:
        h.update(struct.pack("<d", t))
        head = (b.job, b.incarnation, b.comm_hash, b.world_size, b.hosts, b.producer, b.batch_seq,
                b.lost_records, b.lost_ranks)
        h.update(repr(head).encode())
        for name in sorted(b.columns):
            _array(h, name, b.columns[name])
        _array(h, "send", b.send)
        _array(h, "recv", b.recv)
        _array(h, "peak_lag", b.peaks)
        batches += 1
        records += b.n
        rows.append(_record_rows(t, b, hosts))
    return h.hexdigest(), batches, records, record_digest(rows, hosts)


def _record_rows(t: float, b: KernelBatch, hosts: dict[str, int]) -> npt.NDArray[np.int64]:
    """One row per record of ``b``: everything the record says, whichever batch carries it (its
    delivery time, job incarnation, communicator, host by name, columns, counters and peaks)."""
    ids = np.asarray([hosts.setdefault(name, len(hosts)) for name in b.hosts], dtype=np.int64)
    cols = [np.full(b.n, np.float64(t).view(np.int64)), np.full(b.n, b.incarnation), np.full(b.n, b.world_size),
            ids[b.columns["host_idx"]] if b.n else np.zeros(0, dtype=np.int64)]
    cols += [b.columns[name] for name in sorted(b.columns) if name != "host_idx"]
    return np.concatenate([np.stack(cols, axis=1), b.send, b.recv, b.peaks], axis=1).astype(np.int64)


def record_digest(rows: list[npt.NDArray[np.int64]], hosts: dict[str, int]) -> str:
    """SHA-256 of a stream's records as a set: the same whether they come one communicator or one host
    to a batch, in whatever order (host ids are renumbered by name, rows sorted on every column)."""
    h = hashlib.sha256()
    if not rows:
        return h.hexdigest()
    a = np.concatenate(rows)
    names = sorted(hosts)
    rename = np.empty(len(hosts), dtype=np.int64)
    rename[[hosts[n] for n in names]] = np.arange(len(names))
    a[:, 3] = rename[a[:, 3]]
    a = a[np.lexsort(a.T[::-1])]
    h.update(repr(names).encode())
    h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _signature(d: dict[str, Any]) -> tuple[Any, ...]:
    faults = sorted((f["kind"], f.get("mismatch") or "", f.get("comm") or "", f.get("family") or "",
                     "nic" if "nic" in f else "") for f in d.get("faults", []))
    return (d.get("workload") is not None, *faults)


def scenarios() -> list[Scenario]:
    """The fixed list, in a fixed order (ids are unique)."""
    out = []
    for p in sorted((ROOT / "tests" / "golden").iterdir()):
        if (p / "scenario.json").is_file():
            out.append(Scenario.from_dict(json.loads((p / "scenario.json").read_text())))
    for suite in SUITES:
        best: dict[tuple[Any, ...], dict[str, Any]] = {}
        for line in (HERE / "scenarios" / f"{suite}.jsonl").read_text().splitlines():
            d = json.loads(line)
            sig = _signature(d)
            cur = best.get(sig)
            # of at most 32 ranks where the signature has one, else its smallest; the first of equals
            if cur is None or (d["ranks"] < cur["ranks"] and cur["ranks"] > 32):
                best[sig] = d
        seen = {sc.id for sc in out}  # standard.jsonl holds network.jsonl's scenarios too
        out += [Scenario.from_dict(d) for d in best.values() if d["id"] not in seen]
    speed = _speed_module()
    out += [speed.job_scenario(r, JOB_DURATION_S) for r in JOB_RANKS]
    return out


def _speed_module() -> Any:
    spec = importlib.util.spec_from_file_location("sim_speed_bench", HERE / "sim_speed.py")
    if spec is None or spec.loader is None:  # pragma: no cover - the file is beside this one
        raise ImportError("benchmarks/sim_speed.py not found")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def digests(only: set[str] | None = None, *, verbose: bool = False) -> dict[str, dict[str, Any]]:
    out = {}
    for sc in scenarios():
        if only and sc.id not in only:
            continue
        t0 = time.perf_counter()
        dig, batches, records, rec = stream_digest(simulate(sc))
        out[sc.id] = {"sha256": dig, "batches": batches, "records": records, "records_sha256": rec}
        if verbose:
            print(f"{sc.id:<32} {batches:>7} batches {records:>9} records {time.perf_counter() - t0:6.2f} s "
                  f"{dig[:16]}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="record this checkout's digests in --file")
    mode.add_argument("--check", action="store_true", help="compare this checkout's digests with --file")
    ap.add_argument("--file", type=Path, default=DEFAULT_FILE)
    ap.add_argument("--only", nargs="+", help="these scenario ids only")
    args = ap.parse_args(argv)
    got = digests(set(args.only) if args.only else None, verbose=True)
    if args.write:
        args.file.parent.mkdir(parents=True, exist_ok=True)
        args.file.write_text(json.dumps({"scenarios": got}, indent=1, sort_keys=True) + "\n")
        print(f"{len(got)} digests written to {args.file}")
    elif args.check:
        want = json.loads(args.file.read_text())["scenarios"]
        bad = [k for k in got if want.get(k) != got[k]]
        missing = [k for k in want if k not in got and not args.only]
        for k in bad:
            same = {"records", "records_sha256"}
            what = "REBATCHED" if all(want.get(k, {}).get(f) == got[k][f] for f in same) else "CHANGED"
            print(f"{what} {k}: {want.get(k)} -> {got[k]}")
        for k in missing:
            print(f"MISSING {k}")
        tail = f", {len(missing)} missing" if missing else ""
        print(f"{len(got) - len(bad)}/{len(got)} scenarios identical{tail}")
        return 1 if bad or missing else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
