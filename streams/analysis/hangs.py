"""Hangs inside one communicator: who entered the op, who has not, signatures, counter chain.

``diagnose`` looks at one stalled communicator (someone is inside an op and nothing moved for a
while) and says what kind of stall it is: ranks missing (H1 candidates, or victims waiting
elsewhere: the wait-for step decides), signatures that differ at one op sequence (H2), or
everyone inside a consistent op with frozen counters (H3, with the link where the send/recv
counter chain breaks), or two members left inside an all_to_all the others finished (H3: the
link between them). All comparisons across ranks use op sequences, signatures and counter
values, never timestamps of different hosts. Cost is linear in the communicator size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from ccld.records import AnomalyKind, DType, OpType, op_name
from ccld.streams.analysis.state import JobState, sig_code

I64 = npt.NDArray[np.int64]

RING_OPS = frozenset({int(OpType.ALL_REDUCE), int(OpType.ALL_GATHER), int(OpType.REDUCE_SCATTER)})
SEND, RECV = int(OpType.SEND), int(OpType.RECV)
ALL_TO_ALL = int(OpType.ALL_TO_ALL)
#: two members left inside an all_to_all are a dead link only once they reported frozen counters this
#: long on their own clocks (a state sample after the freeze): until then they may just be leaving late
LEFT_FROZEN_NS = 1_000_000_000


@dataclass(frozen=True)
class CommDiag:
    """What one stalled communicator shows; ``kind`` is H1 when ranks are missing."""

    cid: int
    seq: int
    op_type: int
    kind: AnomalyKind
    waiting: I64  # global ranks inside the op
    missing: I64  # global ranks that have not entered it (-1: never seen)
    culprits: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # H2 minority / H3 link ends
    link: tuple[int, int] | None = None
    channel: int | None = None
    mismatch_field: str | None = None
    wait_own_s: float = 0.0  # longest time a waiting rank has been inside, on its own clock
    frozen_own_s: float = 0.0  # shortest time the inside ranks' counters have not moved (own clocks)
    note: str = ""
    #: the diagnosis may change with the next state samples alone (two ranks left inside an all_to_all
    #: that have not reported frozen counters long enough yet): the worker diagnoses it again each tick
    provisional: bool = False

    @property
    def op_name(self) -> str:
        return op_name(self.op_type)


def _dtype_name(dt: int) -> str:
    try:
        return DType(dt).name.lower()
    except ValueError:
        return f"dtype{dt}"


def diagnose(
    js: JobState, cid: int, known_sigs: frozenset[int], expected: Callable[[int], int | None] | None = None
) -> CommDiag | None:
    """Classify the stall of communicator ``cid``; None when nobody is inside an op.

    ``expected(seq)`` is the signature the communicator's learned cadence predicts at ``seq``
    (None: no cadence); it names the culprit of a mismatch that has no majority.
    """
    sl = js.members_of(cid)
    seq = js.m_seq[sl]
    done = js.m_done[sl]
    inside = (seq >= 0) & ~done
    if not inside.any():
        return None
    granks = js.m_grank[sl]
    ops = js.m_op[sl]
    t_in = np.where(inside, js.m_t_sample[sl] - js.m_t_enter[sl], 0)
    frozen = np.where(inside, js.m_t_sample[sl] - js.m_t_change[sl], 0)
    wait_own = float(t_in.max()) * 1e-9
    frozen_own = float(frozen[inside].min()) * 1e-9
    if int(ops[inside][0]) in (SEND, RECV):
        return _diagnose_p2p(js, cid, sl, inside, wait_own, frozen_own)
    k = int(seq[inside].max())
    at_k = seq == k
    waiting = granks[inside & at_k]
    missing = granks[seq < k]
    if (missing < 0).any():
        missing = _infer_ranks(granks)[seq < k]
    note = ""
    if (missing < 0).any():
        missing, note = _unseen_ranks(js, missing)
    op_k = int(ops[at_k][0])
    if missing.size:
        h1 = CommDiag(cid, k, op_k, AnomalyKind.H1, waiting, missing, wait_own_s=wait_own, frozen_own_s=frozen_own,
                      note=note)
        return _left_in_all_to_all(js, sl, inside, h1) or h1
    sigs = sig_code(ops, js.m_dtype[sl], js.m_count[sl], js.m_peer[sl])
    u, inv, cnt = np.unique(sigs, return_inverse=True, return_counts=True)
    if u.size > 1:
        exp = expected(k) if expected is not None else None
        return _mismatch(js, cid, sl, k, u, inv, cnt, known_sigs, exp, waiting, wait_own, frozen_own)
    return _frozen_ring(js, cid, sl, k, op_k, waiting, wait_own, frozen_own)


def _left_in_all_to_all(js: JobState, sl: slice, inside: npt.NDArray[np.bool_], h1: CommDiag) -> CommDiag | None:
    """H3: two members are still inside an all_to_all that every other member finished (the others
    went on and wait for them in the communicator's next op), their counters frozen.

    An all_to_all is pairwise exchanges: a member leaves once its own exchanges are done, so a dead
    link holds exactly its two ends inside while everyone else leaves (a ring collective holds the
    whole ring; a rank that stopped holds every member it exchanges with). The sender behind the
    dead link has taken in data it cannot pass on (RecvCount ahead of SendCount), the receiver's
    RecvCount is behind: the larger backlog is the link's source. ``h1`` is the stall read as ranks
    missing from op ``h1.seq``; None when it is not two left behind."""
    k = h1.seq
    seq, granks = js.m_seq[sl], js.m_grank[sl]
    behind = inside & (seq < k)
    if int(behind.sum()) != 2 or bool(((seq < k) & ~behind).any()):
        return None  # anyone else missing has not entered at all: H1
    at = seq[behind]
    ops = js.m_op[sl][behind]
    if int(at[0]) != int(at[1]) or int(ops[0]) != ALL_TO_ALL:
        return None
    frozen = (js.m_t_sample[sl] - js.m_t_change[sl])[behind]
    if int(frozen.min()) < LEFT_FROZEN_NS:
        # not reported frozen long enough yet (a rank may just be late leaving; stopped ones never will):
        # H1 for now, a provisional diagnosis that the next samples may turn into this H3
        return replace(h1, provisional=True)
    ends = np.flatnonzero(behind)
    back = (js.m_recv[sl] - js.m_send[sl])[ends].sum(axis=1)
    src, dst = (ends[0], ends[1]) if back[0] >= back[1] else (ends[1], ends[0])
    link = (int(granks[src]), int(granks[dst]))
    n_done = int(granks.shape[0]) - 2
    note = (
        f"ranks {link[0]} and {link[1]} are left inside all_to_all #{int(at[0])}, which the other {n_done} "
        f"members finished (they wait in #{k}); rank {link[0]} RecvCount runs {int(max(back.max(), 0))} slots "
        f"ahead of its SendCount: the link {link[0]} -> {link[1]} stopped"
    )
    return replace(h1, seq=int(at[0]), op_type=ALL_TO_ALL, kind=AnomalyKind.H3, waiting=granks[inside],
                   missing=np.zeros(0, dtype=np.int64), culprits=np.asarray(link, dtype=np.int64), link=link, note=note)


def _infer_ranks(granks: I64) -> I64:
    """Global ranks of members never seen, when the seen ones follow ``a + b * comm_rank``.

    A rank that has never reported in a communicator (it hangs before its first op there) is
    still named when the layout is regular (world, tensor and data-parallel groups are).
    """
    known = np.flatnonzero(granks >= 0)
    if known.size < 2:
        return granks
    i0, i1 = int(known[0]), int(known[1])
    b, rem = divmod(int(granks[i1] - granks[i0]), i1 - i0)
    a = int(granks[i0]) - b * i0
    idx = np.arange(granks.shape[0])
    if rem or b <= 0 or not np.array_equal(granks[known], a + b * known):
        return granks
    return np.where(granks >= 0, granks, a + b * idx)


def _unseen_ranks(js: JobState, missing: I64) -> tuple[I64, str]:
    """Members never seen named by elimination: when exactly as many of the job's ranks have never reported on
    any communicator as this op has unknown members missing, those are they (a rank that hangs before its
    first op, in groups too small or irregular for ``_infer_ranks``: a 2-rank tensor or data-parallel group)."""
    unknown = missing < 0
    unseen = js.never_seen()
    if unseen.size != int(unknown.sum()):
        return missing, ""
    out = missing.copy()
    out[unknown] = unseen  # several: in rank order, as comm ranks follow global ranks in every group we know
    who = ", ".join(map(str, unseen.tolist()))
    one = unseen.size == 1
    return out, (f"no record has come from rank{'' if one else 's'} {who} on any communicator: of the job's "
                 f"{js.world} ranks, {'the only one' if one else 'the only ones'} never heard from")


def _mismatch(
    js: JobState, cid: int, sl: slice, k: int, u: I64, inv: I64, cnt: I64, known: frozenset[int],
    expected: int | None, waiting: I64, wait_own: float, frozen_own: float,
) -> CommDiag:
    """H2: the majority signature is the reference; ties go to the signature the communicator's
    cadence expects at this op sequence, then to one it used before.

    Without a majority (a 2-rank group where one rank called the step's ops in the wrong order,
    both signatures are normal for the communicator) only the cadence tells which rank deviates.
    """
    codes = u.tolist()
    score = (
        cnt * 4
        + 2 * np.asarray([c == expected for c in codes], dtype=np.int64)
        + np.asarray([c in known for c in codes], dtype=np.int64)
    )
    ref = int(np.argmax(score))
    odd = inv != ref
    granks = js.m_grank[sl]
    culprits = granks[odd]
    i_ref = int(np.flatnonzero(~odd)[0])
    i_odd = int(np.flatnonzero(odd)[0])
    fields = (
        ("op_type", js.m_op[sl]),
        ("dtype", js.m_dtype[sl]),
        ("count", js.m_count[sl]),
        ("peer", js.m_peer[sl]),
    )
    field_name = next((name for name, a in fields if a[i_odd] != a[i_ref]), "op_type")
    if int(u[inv[i_odd]]) in known:
        field_name = "order"  # a signature this communicator uses elsewhere in its step: wrong order
    ops, dts, counts = js.m_op[sl], js.m_dtype[sl], js.m_count[sl]
    note = (
        f"rank {int(granks[i_odd])} entered {op_name(int(ops[i_odd]))} #{k} "
        f"({_dtype_name(int(dts[i_odd]))}, {int(counts[i_odd])} elements) while "
        f"{int((~odd).sum())} ranks entered {op_name(int(ops[i_ref]))} #{k} "
        f"({_dtype_name(int(dts[i_ref]))}, {int(counts[i_ref])} elements)"
    )
    if int(u[ref]) == expected and int((cnt == cnt[ref]).sum()) > 1:
        note += f" (no majority: the communicator's learned cadence expects {op_name(int(ops[i_ref]))} at #{k})"
    elif int((score == score[ref]).sum()) > 1:
        # no majority, no cadence, no earlier use (a 2-rank group at its first ops): either side may be
        # the one that called the wrong op; naming one would be a coin toss, so both are named
        culprits = granks[score[inv] == score[ref]]
        note += " (no majority, and no learned cadence or earlier op of this communicator tells which is the odd one)"
    return CommDiag(
        cid, k, int(ops[i_ref]), AnomalyKind.H2, waiting, np.zeros(0, dtype=np.int64), culprits,
        mismatch_field=field_name, wait_own_s=wait_own, frozen_own_s=frozen_own, note=note,
    )


def _frozen_ring(
    js: JobState, cid: int, sl: slice, k: int, op_k: int, waiting: I64, wait_own: float, frozen_own: float
) -> CommDiag:
    """H3: everyone is in one consistent op; find where the send/recv counter chain breaks.

    Behind a dead link r -> r+1 the sender's RecvCount runs ahead of its SendCount (data came in
    but cannot leave) and the receiver's RecvCount lags its SendCount, so the link maximising
    backlog(r) - backlog(r+1) is the break; the channel is where that difference is largest.
    """
    granks = js.m_grank[sl]
    size = granks.shape[0]
    back = js.m_recv[sl] - js.m_send[sl]  # (size, channels)
    if size < 2:
        return CommDiag(cid, k, op_k, AnomalyKind.H3, waiting, np.zeros(0, dtype=np.int64), granks.copy(),
                        wait_own_s=wait_own, frozen_own_s=frozen_own)
    if op_k == ALL_TO_ALL and (nic := _dead_nic(js, sl, back)) is not None:
        roots, note = nic
        return CommDiag(cid, k, op_k, AnomalyKind.H3, waiting, np.zeros(0, dtype=np.int64), roots,
                        wait_own_s=wait_own, frozen_own_s=frozen_own, note=note)
    nxt = (np.arange(size) + 1) % size
    diff = back - back[nxt]
    score = diff.sum(axis=1)
    if score.max() <= 0:
        # no backlog pattern: the rank that received least is right after the break
        tot = js.m_recv[sl].sum(axis=1)
        dst = int(np.argmin(tot))
        src = (dst - 1) % size
    else:
        src = int(np.argmax(score))
        dst = int(nxt[src])
    ch = int(np.argmax(diff[src])) if diff[src].max() > 0 else None
    link = (int(granks[src]), int(granks[dst]))
    note = (
        f"all {size} ranks entered {op_name(op_k)} #{k}; "
        f"rank {link[0]} RecvCount runs {int(back[src].sum())} slots ahead of its SendCount, rank {link[1]} "
        f"RecvCount {int(-back[dst].sum())} behind"
    )
    return CommDiag(
        cid, k, op_k, AnomalyKind.H3, waiting, np.zeros(0, dtype=np.int64), np.asarray(link, dtype=np.int64),
        link=link, channel=ch, wait_own_s=wait_own, frozen_own_s=frozen_own, note=note,
    )


def _dead_nic(js: JobState, sl: slice, back: npt.NDArray[np.int64]) -> tuple[I64, str] | None:
    """The ranks of one host that took in data they cannot pass on, when every member that did is on that
    host, there are two or more, and the members behind are all elsewhere: an all_to_all frozen by a dead
    network interface, every link leaving the host stopped at once; None otherwise.

    An all_to_all is pairwise exchanges, not a ring: the break is not between ring neighbours, and
    ``_frozen_ring``'s largest backlog step named one of the NIC's links (11 -> 8) where the host's two
    ranks 10 and 11 had both stopped sending (heldout-any-6's any-moe-H3-16-100, a NIC dead from the first
    op of a 16-rank MoE job on 2-GPU nodes)."""
    per = back.sum(axis=1)
    ahead, behind = per > 0, per < 0
    hosts = js.m_host[sl]
    if int(ahead.sum()) < 2 or not behind.any() or (hosts[ahead | behind] < 0).any():
        return None
    host = int(hosts[ahead][0])
    if (hosts[ahead] != host).any() or (hosts[behind] == host).any():
        return None
    granks = js.m_grank[sl]
    name = js.host_names[host] if 0 <= host < len(js.host_names) else f"host {host}"
    roots = granks[ahead].copy()
    note = (f"ranks {', '.join(map(str, roots.tolist()))}, all on {name}, took in data they cannot pass on "
            f"(RecvCount ahead of SendCount by {int(per[ahead].sum())} slots), ranks "
            f"{', '.join(map(str, granks[behind].tolist()))} on other hosts are behind: every link that leaves "
            f"{name} stopped at once (its network interface)")
    return roots, note


def _diagnose_p2p(
    js: JobState, cid: int, sl: slice, inside: npt.NDArray[np.bool_], wait_own: float, frozen_own: float
) -> CommDiag:
    """Send/recv: each inside rank waits for its peer; pairs are matched by type, peer and size."""
    granks = js.m_grank[sl]
    ops, peer, dts, counts = js.m_op[sl], js.m_peer[sl], js.m_dtype[sl], js.m_count[sl]
    size = granks.shape[0]
    missing: list[int] = []
    culprits: list[int] = []
    kind = AnomalyKind.H3
    field_name = None
    link = None
    note = ""
    idx = np.flatnonzero(inside)
    for i in idx.tolist():
        p = int(peer[i])
        if not 0 <= p < size:
            continue
        if not inside[p]:
            missing.append(int(granks[p]))
            continue
        if int(peer[p]) != i:
            continue  # the peer waits for someone else: it is waiting too
        if int(ops[p]) == int(ops[i]):
            kind, field_name = AnomalyKind.H2, "send_recv"
            culprits.append(int(granks[i]))
            note = f"ranks {int(granks[i])} and {int(granks[p])} both posted {op_name(int(ops[i]))}: unmatched"
        elif int(dts[p]) != int(dts[i]) or int(counts[p]) != int(counts[i]):
            kind = AnomalyKind.H2
            field_name = "dtype" if int(dts[p]) != int(dts[i]) else "count"
            culprits.append(int(granks[i]))
        elif int(ops[i]) == SEND and link is None:
            link = (int(granks[i]), int(granks[p]))
    seq = int(js.m_seq[sl][idx].max())
    op = int(ops[idx[0]])
    waiting = granks[inside]
    if missing:
        miss = np.unique(np.asarray(missing, dtype=np.int64))
        note = ""
        if (miss < 0).any():
            # a peer that never reported on this pair (a pipeline stage hung before its first op: the
            # next stage waits in its first recv) is named by elimination, as a group's are
            miss, note = _unseen_ranks(js, miss)
        return CommDiag(cid, seq, op, AnomalyKind.H1, waiting, miss, wait_own_s=wait_own, frozen_own_s=frozen_own,
                        note=note)
    if kind == AnomalyKind.H2:
        return CommDiag(cid, seq, op, kind, waiting, np.zeros(0, dtype=np.int64),
                        np.unique(np.asarray(culprits, dtype=np.int64)), mismatch_field=field_name,
                        wait_own_s=wait_own, frozen_own_s=frozen_own, note=note)
    c = np.asarray(link if link else [], dtype=np.int64)
    return CommDiag(cid, seq, op, AnomalyKind.H3, waiting, np.zeros(0, dtype=np.int64), c, link=link,
                    wait_own_s=wait_own, frozen_own_s=frozen_own,
                    note="send/recv pair matched")
