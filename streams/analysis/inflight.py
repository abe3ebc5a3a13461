"""Stalled communicators' newest rows in a snapshot, and back: a restart keeps a hang it has not reported.

A worker commits its input once a snapshot covering it is on the broker. A job that hangs and then
goes silent (its hosts died, its network to the broker is cut) sends nothing more, so a worker
restarted from such a snapshot re-reads nothing: the hang can only be found again from what the
snapshot kept. It keeps, per stalled communicator, the newest row of each member (who is in which
op, signature, own-clock times, counters) and the communicator's own fields (the analyzer time of
its last progress, which is the verdict's onset, and what its hang threshold depends on), so the
restored analyzer diagnoses the same op, names the same ranks and dates the same onset: the
incident id comes out the same and consumers drop the copy.

Which communicators: those the analyzer calls stalled (a member inside an op and no progress for
``wait_edge_min_s``, the ones it diagnoses and reports), and those with a member inside its op for
``INFLIGHT_MIN_S`` of its own clock. The second is what a job that goes silent right after its hang
needs: the worker may commit its last records with a snapshot taken a fraction of a second after
they arrived (and the broker, or the worker, may die right then), before the analyzer's clock has
run ``wait_edge_min_s`` past the last progress; the waiting ranks' own records already show them
inside the op for as long as it has hung. A healthy job's collectives last far less than either
bound, so it adds nothing. A job that goes silent less than ``INFLIGHT_MIN_S`` after its hang began
(and whose worker dies within ``wait_edge_min_s`` of that) is still lost.

Columns are compact: a column whose members all hold one value is saved as that value; entry and
change times are saved as differences from the sample time (small numbers); counters only as wide
as the channels in use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ccld.records import MAX_CHANNELS
from ccld.streams.analysis.state import JobState

#: A communicator with a member inside its op this long (own clock, s) is saved even before the analyzer
#: calls it stalled: far above a healthy collective (microseconds to a few hundred ms), far below the
#: smallest hang threshold (``h2_min_s``, 8 s), and one flush interval of the producers, so the
#: first records that show a rank waiting that long are enough (see the module docstring).
INFLIGHT_MIN_S = 1.0
#: Member fields saved per row (``m_cid`` and ``m_crank`` follow from the slice).
ROW_FIELDS = ("m_grank", "m_seq", "m_done", "m_op", "m_dtype", "m_count", "m_peer", "m_t_sample",
              "m_seen_now", "m_last_done")
#: Saved as ``m_t_sample - value`` (an own-clock duration: small).
ROW_DELTAS = ("m_t_enter", "m_t_change")
#: Communicator fields saved (``c_off`` follows from the restore, ``c_size`` is saved apart).
COMM_FIELDS = ("c_progress_now", "c_inside", "c_maxop_s", "c_longop_s", "c_counters", "c_first_now", "c_pk_level",
               "c_pk_rows")
#: Communicator fields a snapshot of an older version lacks, and the value they take then.
COMM_DEFAULTS = {"c_longop_s": 0.0}


def stalled_comms(js: JobState, now: float, min_stall_s: float) -> list[tuple[float, int]]:
    """``(onset, cid)`` of the communicators worth saving: some member inside an op, and either no progress
    for ``min_stall_s`` (analyzer time) or a member inside the op for ``INFLIGHT_MIN_S`` of its own clock."""
    n = js.c_size.shape[0]
    prog = js.c_progress_now[:n]
    cand = (js.c_inside[:n] > 0) & (prog >= 0)
    if not cand.any():
        return []
    m = js.n_members
    cid = js.m_cid[:m]
    inside = (cid >= 0) & (js.m_seq[:m] >= 0) & ~js.m_done[:m] & (js.m_t_enter[:m] >= 0)
    t_in = np.zeros(n, dtype=np.int64)
    np.maximum.at(t_in, cid[inside], js.m_t_sample[:m][inside] - js.m_t_enter[:m][inside])
    sel = np.flatnonzero(cand & ((now - prog >= min_stall_s) | (t_in >= int(INFLIGHT_MIN_S * 1e9))))
    return [(float(prog[c]), int(c)) for c in sel.tolist()]


def _col(a: np.ndarray[Any, Any]) -> Any:
    """One column: a scalar when every member holds the same value, else the list."""
    if a.shape[0] and bool((a == a[0]).all()):
        return a[0].item()
    return a.tolist()


def _uncol(v: Any, n: int, dtype: Any) -> np.ndarray[Any, Any]:
    if isinstance(v, list):
        if len(v) != n:
            raise ValueError(f"a saved column holds {len(v)} values for {n} members")
        return np.asarray(v, dtype=dtype)
    return np.full(n, v, dtype=dtype)


def save_comm(js: JobState, cid: int, hosts: dict[int, int]) -> dict[str, Any]:
    """One communicator's rows; ``hosts`` maps the job's host ids to indexes of the saved host list
    (filled in here)."""
    sl = js.members_of(cid)
    out: dict[str, Any] = {"hash": int(js.comm_hashes[cid]), "size": int(js.c_size[cid])}
    for name in COMM_FIELDS:
        out[name] = getattr(js, name)[cid].item()
    for name in ROW_FIELDS:
        out[name] = _col(getattr(js, name)[sl])
    ts = js.m_t_sample[sl]
    for name in ROW_DELTAS:
        out[name] = _col(ts - getattr(js, name)[sl])
    h = js.m_host[sl]
    out["m_host"] = _col(np.asarray([hosts.setdefault(int(x), len(hosts)) if x >= 0 else -1 for x in h.tolist()],
                                    dtype=np.int64))
    send, recv = js.m_send[sl], js.m_recv[sl]
    used = np.flatnonzero((send != 0).any(axis=0) | (recv != 0).any(axis=0))
    w = int(used[-1]) + 1 if used.size else 0
    if w:
        out["send"] = send[:, :w].ravel().tolist()
        out["recv"] = recv[:, :w].ravel().tolist()
    return out


def load_comm(js: JobState, d: Mapping[str, Any], host_names: list[str]) -> None:
    """Register one saved communicator in a fresh ``js`` and write its rows (the inverse of ``save_comm``).

    A bad entry raises KeyError, TypeError or ValueError.
    """
    size = int(d["size"])
    cid = js.restore_comm(int(d["hash"]), size)
    sl = js.members_of(cid)
    for name in COMM_FIELDS:
        arr = getattr(js, name)
        arr[cid] = arr.dtype.type(d[name] if name in d or name not in COMM_DEFAULTS else COMM_DEFAULTS[name])
    for name in ROW_FIELDS:
        arr = getattr(js, name)
        arr[sl] = _uncol(d[name], size, arr.dtype)
    for name in ROW_DELTAS:
        getattr(js, name)[sl] = js.m_t_sample[sl] - _uncol(d[name], size, np.int64)
    idx = _uncol(d["m_host"], size, np.int64)
    ids = js.host_ids_of(tuple(host_names))
    if idx.size and int(idx.max()) >= len(host_names):
        raise ValueError("a saved row names a host that was not saved")
    js.m_host[sl] = np.where(idx >= 0, ids[np.maximum(idx, 0)] if ids.size else -1, -1)
    if "send" in d:
        w = len(d["send"]) // size
        if not 0 < w <= MAX_CHANNELS or len(d["send"]) != size * w or len(d["recv"]) != size * w:
            raise ValueError("saved counters do not fit the communicator")
        js.m_send[sl, :w] = np.asarray(d["send"], dtype=np.int64).reshape(size, w)
        js.m_recv[sl, :w] = np.asarray(d["recv"], dtype=np.int64).reshape(size, w)
