"""`ccld status`: which op every rank of a job is on now, who waits for whom, and the open incidents.

The question NCCL users ask first when a job stalls. Answered from the analyzer's live state (pure:
``job_status`` reads an ``Analyzer``; the worker serves it as JSON on ``/status``, and ``ccld status``
merges the answers of every worker of a split job and prints them). Ranks are grouped, never listed
one per line: "ranks 0-1023 inside all_reduce #48211 of 9f3c... for 12.4 s" fits a screen at 4,096
ranks as it does at 4.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ccld.ranks import rank_ranges
from ccld.records import op_name
from ccld.streams.analysis.analyzer import Analyzer

#: groups of ranks shown per communicator (the rest are counted)
GROUPS_MAX = 6
#: communicators listed (stalled ones, longest stall first; the moving ones are counted)
COMMS_MAX = 50
#: ranks spelled out in one group of a communicator (a strided data-parallel group would be 128 numbers)
GROUP_RANKS_MAX = 16


def ranges(ranks: Iterable[int]) -> str:
    """``0-3,8,10-11``: a rank list as ranges, sorted (``ccld.ranks``)."""
    return rank_ranges(ranks)


def short_ranges(ranks: Sequence[int], limit: int = GROUP_RANKS_MAX) -> str:
    """``ranges`` when that is short, else the first ``limit`` ranks and a count: a strided group of a
    4,096-rank job (13,45,77,...) does not fill the screen."""
    text = ranges(ranks)
    if text.count(",") < limit:
        return text
    rs = sorted(set(ranks))
    return f"{ranges(rs[:limit])},... ({len(rs)} ranks)"


def job_status(analyzer: Analyzer, job: str, now: float) -> dict[str, Any]:
    """The status of ``job`` (its newest incarnation this analyzer holds) as JSON-ready data; empty ``comms``
    when the analyzer has none of it. Applies nothing: what the last evaluation saw."""
    keys = [k for k in analyzer.jobs if k[0] == job]
    if not keys:
        return {"job": job, "incarnation": None, "now": now, "comms": [], "waits": [], "incidents": []}
    key = max(keys, key=lambda k: k[1])
    ja = analyzer.jobs[key]
    js = ja.js
    # only the stalled communicators are listed (a 4,096-rank job has thousands; the moving ones are
    # counted): the analyzer's own per-communicator arrays say which, without a pass over the members
    inside, progress = js.c_inside[: js.n_comms], js.c_progress_now[: js.n_comms]
    stalled = np.flatnonzero((inside > 0) & (progress >= 0) & (now - progress >= analyzer.settings.wait_edge_min_s))
    stalled = stalled[np.argsort(progress[stalled], kind="stable")][:COMMS_MAX]
    comms: list[dict[str, Any]] = []
    for cid in stalled.tolist():
        off, size = int(js.c_off[cid]), int(js.c_size[cid])
        sl = slice(off, off + size)
        groups: dict[tuple[int, int, bool], list[int]] = defaultdict(list)
        for g, seq, op, done in zip(js.m_grank[sl].tolist(), js.m_seq[sl].tolist(), js.m_op[sl].tolist(),
                                    js.m_done[sl].tolist(), strict=True):
            if g >= 0:
                groups[(seq, op, bool(done))].append(g)
        rows = [{"ranks": short_ranges(rs), "n": len(rs), "op_seq": seq, "op": op_name(op),
                 "state": "done" if done else "inside"}
                for (seq, op, done), rs in sorted(groups.items(), key=lambda kv: (-kv[0][0], kv[0][2]))]
        comms.append({
            "communicator": js.comm_hex(cid), "size": size, "newest_op_seq": max((r["op_seq"] for r in rows),
                                                                                  default=-1),
            "inside": int(js.c_inside[cid]), "stalled_s": round(now - float(progress[cid]), 1),
            "groups": rows[:GROUPS_MAX], "more_groups": max(0, len(rows) - GROUPS_MAX),
        })
    comms.sort(key=lambda c: (-c["stalled_s"], c["communicator"]))
    view = analyzer.stage.views.get(key)
    waits = []
    for root, st in (view.roots if view is not None else []):
        waits.append({"kind": root.kind.value, "roots": ranges(root.roots), "waiting": ranges(root.affected),
                      "n_waiting": len(root.affected), "communicator": st.comm, "op_seq": root.diag.seq,
                      "op": root.diag.op_name, "stalled_s": round(now - st.onset, 1)})
    incidents = [{"incident_id": inc.incident_id, "kind": inc.last.kind.value,
                  "roots": ranges(inc.last.root_cause_ranks), "hosts": list(inc.last.root_cause_hosts),
                  "since": inc.first.onset_time, "quiet": inc.quiet_since is not None, "evidence": inc.last.evidence}
                 for inc in analyzer.book.open.values() if (inc.first.job, inc.first.incarnation) == key]
    n_comms = int((js.c_size[: js.n_comms] > 0).sum())
    return {"job": job, "incarnation": key[1], "now": now, "ranks": int(np.unique(js.m_grank[js.m_grank >= 0]).size),
            "communicators": n_comms, "moving": n_comms - int(stalled.size), "doing": _doing(analyzer, key, now),
            "comms": comms, "waits": waits, "incidents": incidents}


def _doing(analyzer: Analyzer, key: tuple[str, int], now: float) -> list[dict[str, Any]]:
    """Every rank by what it does now: waiting in a stalled op, inside a moving one, or in no collective.

    One numpy pass over the members (a 4,096-rank job has tens of thousands): each rank takes its most
    telling state over its communicators (waiting over moving over none), and the op it is in there."""
    js = analyzer.jobs[key].js
    m = js.n_members
    grank, cid, op = js.m_grank[:m], js.m_cid[:m], js.m_op[:m]
    known = grank >= 0
    inside = known & ~js.m_done[:m] & (cid >= 0)
    stalled_c = (js.c_inside > 0) & (now - js.c_progress_now >= analyzer.settings.wait_edge_min_s)
    # state code per member: 0 in no collective, 1 inside a moving op, 2 waiting in a stalled one
    code = np.where(inside, np.where(stalled_c[np.where(cid >= 0, cid, 0)], 2, 1), 0)
    n = int(grank[known].max(initial=-1)) + 1
    best = np.full(n, -1, dtype=np.int64)
    np.maximum.at(best, grank[known], code[known] * 256 + np.where(inside[known], op[known] & 0xFF, 0))
    names = {0: "in no collective", 1: "inside a moving op", 2: "waiting in a stalled op"}
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    present = np.flatnonzero(best >= 0)
    for g, v in zip(present.tolist(), best[present].tolist(), strict=True):
        c = v >> 8
        groups[(names[c], op_name(v & 0xFF) if c else "")].append(g)
    order = {"in no collective": 0, "waiting in a stalled op": 1, "inside a moving op": 2}
    return [{"state": st, "op": o, "ranks": ranges(rs), "n": len(rs)}
            for (st, o), rs in sorted(groups.items(), key=lambda kv: (order[kv[0][0]], -len(kv[1]), kv[0][1]))]


def merge(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One status from the answers of several workers (a job spread over partitions): the newest
    incarnation's communicators, waits and incidents of every part, each once."""
    known = [p for p in parts if p.get("incarnation") is not None]
    if not known:
        return dict(parts[0]) if parts else {}
    inc = max(int(p["incarnation"]) for p in known)
    mine = [p for p in known if int(p["incarnation"]) == inc]
    seen: set[str] = set()
    comms = []
    for p in mine:
        for c in p["comms"]:
            if c["communicator"] not in seen:
                seen.add(c["communicator"])
                comms.append(c)
    comms.sort(key=lambda c: (-c["stalled_s"], c["communicator"]))
    waits = list({(w["roots"], w["communicator"], w["op_seq"]): w for p in mine for w in p["waits"]}.values())
    incidents = list({i["incident_id"]: i for p in mine for i in p["incidents"]}.values())
    return {"job": mine[0]["job"], "incarnation": inc, "now": max(float(p["now"]) for p in mine),
            "ranks": max(int(p.get("ranks", 0)) for p in mine), "communicators": sum(int(p.get("communicators", 0))
                                                                                     for p in mine),
            "moving": sum(int(p.get("moving", 0)) for p in mine), "doing": _merge_doing(mine), "comms": comms,
            "waits": waits, "incidents": incidents}


def _merge_doing(parts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A rank seen by several workers is what its most telling part says (waiting over moving over idle)."""
    order = {"in no collective": 2, "inside a moving op": 1, "waiting in a stalled op": 0}
    best: dict[int, tuple[str, str]] = {}
    for p in parts:
        for d in p.get("doing", []):
            for r in _expand(d["ranks"]):
                cur = best.get(r)
                if cur is None or order[d["state"]] < order[cur[0]]:
                    best[r] = (d["state"], d["op"])
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for r, k in best.items():
        groups[k].append(r)
    back = {"in no collective": 0, "waiting in a stalled op": 1, "inside a moving op": 2}
    return [{"state": st, "op": op, "ranks": ranges(rs), "n": len(rs)}
            for (st, op), rs in sorted(groups.items(), key=lambda kv: (back[kv[0][0]], -len(kv[1]), kv[0][1]))]


def _expand(text: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def render(status: Mapping[str, Any], comms_max: int = 12) -> str:
    """The status as lines a person reads on one screen."""
    if status.get("incarnation") is None:
        return f"job {status.get('job')}: no worker holds it (not started, finished, or another --job name)"
    lines = [f"job {status['job']} (incarnation {status['incarnation']}): {status.get('ranks', '?')} ranks, "
             f"{status.get('communicators', len(status['comms']))} communicators, {status.get('moving', 0)} moving"]
    lines.append("ranks now:")
    for d in status.get("doing", []):
        shown = short_ranges(_expand(d["ranks"]), 24) if d["ranks"].count(",") >= 24 else d["ranks"]
        lines.append(f"  {d['n']} ranks ({shown}): {d['state']}" + (f" ({d['op']})" if d["op"] else ""))
    if status["incidents"]:
        lines.append("open incidents:")
        for i in status["incidents"]:
            hosts = f" on {','.join(i['hosts'])}" if i["hosts"] else ""
            quiet = " (its fault is away; resolves if it stays away)" if i["quiet"] else ""
            lines.append(f"  {i['kind']} ranks {i['roots']}{hosts} [{i['incident_id']}]{quiet}: {i['evidence']}")
    if status["waits"]:
        lines.append("who waits for whom:")
        for w in status["waits"]:
            lines.append(f"  {w['n_waiting']} ranks ({w['waiting']}) wait for ranks {w['roots']} ({w['kind']}): "
                         f"{w['op']} #{w['op_seq']} of {w['communicator']}, stalled {w['stalled_s']} s")
    lines.append("stalled communicators (longest first):" if status["comms"] else "no communicator is stalled")
    for c in status["comms"][:comms_max]:
        head = f"  {c['communicator']} ({c['size']} ranks)"
        head += f": stalled {c['stalled_s']} s" if c["stalled_s"] > 0 else ": moving"
        lines.append(head)
        for g in c["groups"]:
            lines.append(f"    ranks {g['ranks']}: {g['state']} {g['op']} #{g['op_seq']}")
        if c["more_groups"]:
            lines.append(f"    ... and {c['more_groups']} more groups")
    if len(status["comms"]) > comms_max:
        lines.append(f"  ... and {len(status['comms']) - comms_max} more stalled communicators")
    return "\n".join(lines)
