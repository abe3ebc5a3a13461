"""The simulator's recording rules, compiled: which records the probes send about a step's ops.

The Megatron-style model (``megatron.py``) times each op for many ranks at once with numpy, and
logs it; at the end of a step this kernel plays the step's log member by member, in op order, as
the probe and its poller would see it:

1. **state samples**: every sampling instant ``k x dt`` a member passed before this op entered
   shows its previous op (PROGRESS while inside it, IDLE after); rows go out instant by instant;
2. the op becomes the member's newest (its times, sequence number, template and, when the op
   carries them, the fault marks a link fault or a freeze left on it);
3. **in flight**: the poller looks every ``poll`` seconds; the first look after the group's data
   starts moving, if the op is still running then, is shipped once per member and delivery window;
4. **DONE**: when the communicator's stride picks the op (``samp``, decided by the model from the
   Trace ID) and it ended inside the run.

It is the loop numpy could only do with a few dozen array operations per op (the op-by-op cost was
three quarters of the simulator's time); the rows are the same, in the same order. Nothing here
draws random numbers: the rows go back as members and times, the model draws the DONE records'
kernel peaks, and ``format_rows`` makes the records (the int block ``R_*``). The rules keep two quirks of the op-by-op
code they replaced, so every record stays byte for byte what it was: the poll test of a member
reads its group's first member's start and duration (``size`` consecutive members make a group),
and every member's sequence number is the entry's (the groups of a layout run in lockstep).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

log = logging.getLogger(__name__)


def compiled(**opts: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(**opts)``, its machine code cached on disk (beside this file, else in the user's
    cache directory) so a process loads it instead of compiling it again (about 2 s); where neither
    can be written (a read-only install without a home) numba refuses to cache at all, so each
    process compiles it once instead."""

    def wrap(fn: Callable[..., Any]) -> Any:
        try:
            return njit(cache=True, **opts)(fn)
        except RuntimeError as e:  # "cannot cache function ...: no locator available"
            log.info("simulator kernels compiled in every process: %s", e)
            return njit(cache=False, **opts)(fn)

    return wrap

# the columns of the float block of an op (one row per member and op, as MegatronSim.mf)
F_ENTER, F_EXIT, F_START, F_DUR, F_PREV = range(5)
# a row out: its member, sequence number, template, send lead, recv lead, peak lead and entry (ints);
# its time, the op's five floats and the freeze fraction (floats)
O_G, O_SEQ, O_TMPL, O_SL, O_RL, O_PL, O_ENTRY = range(7)
N_OI = 7
O_T, O_F0, O_FR = 0, 1, 6
N_OF = 7
# a queued record is one column of an int block, these rows in this order (MegatronSim sorts and slices
# them into batches): the kernel formats them (``format_rows``)
(R_CID, R_HASH, R_INC, R_SEQ, R_OP, R_DTYPE, R_COUNT, R_PEER, R_RANK, R_CRANK, R_CSIZE, R_LHOST,
 R_STATUS, R_ENTER, R_EXIT, R_SAMPLE, R_PREV, R_SEND, R_RECV, R_ZERO) = range(20)
N_ROWS = 20


@compiled(nogil=True)
def _emit(oi, of, n, m, t, mf, mi, m_sl, m_rl, m_pl, m_fr, entry):  # type: ignore[no-untyped-def]
    oi[n, O_G] = m
    oi[n, O_SEQ] = mi[m, 0]
    oi[n, O_TMPL] = mi[m, 1]
    oi[n, O_SL] = m_sl[m]
    oi[n, O_RL] = m_rl[m]
    oi[n, O_PL] = m_pl[m]
    oi[n, O_ENTRY] = entry
    of[n, O_T] = t
    for c in range(5):
        of[n, O_F0 + c] = mf[m, c]
    of[n, O_FR] = m_fr[m]


@compiled(nogil=True)
def play(  # type: ignore[no-untyped-def]
    mf, mi, m_sl, m_rl, m_pl, m_fr, probewin, next_inst,
    e_off, e_n, e_size, e_seq, e_goff, e_moff, e_gio,
    gi, fop, tmpl, samp, mk_i, mk_f,
    duration, dt, n_inst, poll,
    oi, of, di, df,
):
    """Play the log's entries (ops) in order; returns how many rows went to ``oi``/``of`` (state
    samples and in-flight looks, in the order they are sent) and to ``di``/``df`` (DONE records).

    State (one row per member, updated in place): ``mf``/``mi`` each member's newest op (floats as
    ``F_*``; sequence number, template), ``m_sl``/``m_rl``/``m_pl``/``m_fr`` its fault marks,
    ``probewin`` the delivery window of its last in-flight look, ``next_inst`` its next sampling
    instant. Entry ``e``: members ``gi[e_gio[e] : e_gio[e] + e_n[e]]`` (the ops of a chain share
    them), with the op's floats ``fop`` and templates ``tmpl`` at rows ``e_off[e]`` on, groups of
    ``e_size[e]`` members, sequence number ``e_seq[e]``, per group whether the stride picks it at
    ``samp[e_goff[e]:]``, and fault marks to write at rows ``e_moff[e]`` of ``mk_i`` (send, recv,
    peak lead) and ``mk_f`` (freeze), or -1 to keep the members' marks. A member whose op does not
    enter inside the run is left alone.
    """
    no = 0
    nd = 0
    big = 0
    for e in range(e_n.shape[0]):
        big = max(big, e_n[e])
    cnt = np.empty(big, dtype=np.int64)
    k0s = np.empty(big, dtype=np.int64)
    for e in range(e_n.shape[0]):
        a = e_off[e]
        ga = e_gio[e]
        n = e_n[e]
        size = e_size[e]
        seq = e_seq[e]
        go = e_goff[e]
        mo = e_moff[e]
        # 1. the previous op is the newest state until this one enters
        most = 0
        for j in range(n):
            cnt[j] = 0
            en = fop[a + j, F_ENTER]
            if en <= duration:
                m = gi[ga + j]
                k0 = next_inst[m]
                k1 = min(int(math.ceil(min(en, 1e15) / dt - 1e-9)), n_inst)
                k0s[j] = k0
                if mi[m, 0] >= 0 and k1 > k0:
                    cnt[j] = k1 - k0
                    most = max(most, k1 - k0)
                if k1 > k0:
                    next_inst[m] = k1
        for s in range(most):
            for j in range(n):
                if cnt[j] > s:
                    _emit(oi, of, no, gi[ga + j], float(k0s[j] + s) * dt, mf, mi, m_sl, m_rl, m_pl, m_fr, e)
                    no += 1
        # 2. the op becomes each member's newest
        for j in range(n):
            if fop[a + j, F_ENTER] <= duration:
                m = gi[ga + j]
                for c in range(5):
                    mf[m, c] = fop[a + j, c]
                mi[m, 0] = seq
                mi[m, 1] = tmpl[a + j]
                if mo >= 0:
                    m_sl[m] = mk_i[mo + j, 0]
                    m_rl[m] = mk_i[mo + j, 1]
                    m_pl[m] = mk_i[mo + j, 2]
                    m_fr[m] = mk_f[mo + j]
        # 3. the first poll after the group's data starts moving catches it in flight, if it still runs
        for g in range(n // size):
            g0 = a + g * size
            sg = fop[g0, F_START]
            if not math.isfinite(sg):
                continue
            first = math.ceil(sg / poll + 1e-9) * poll
            if not (first < sg + fop[g0, F_DUR] * 1.02 and first <= duration):
                continue
            win = int(math.floor(first / dt + 1e-9))
            for j in range(g * size, (g + 1) * size):
                if not (fop[a + j, F_ENTER] <= duration and first < fop[a + j, F_EXIT]):
                    continue
                m = gi[ga + j]
                if win != probewin[m]:
                    probewin[m] = win
                    _emit(oi, of, no, m, first, mf, mi, m_sl, m_rl, m_pl, m_fr, e)
                    no += 1
        # 4. DONE, when the stride picks the op and it ended inside the run
        for j in range(n):
            if not samp[go + j // size]:
                continue
            ex = fop[a + j, F_EXIT]
            if fop[a + j, F_ENTER] <= duration and math.isfinite(ex) and ex <= duration:
                _emit(di, df, nd, gi[ga + j], ex, mf, mi, m_sl, m_rl, m_pl, m_fr, e)
                nd += 1
    return no, nd


@compiled(nogil=True)
def chain_times(begin, tb, c_cols, u, jit, nominal_s, base_s, step_factor, size,  # type: ignore[no-untyped-def]
                ranks, last_exit, gi, m_exit, duration, fop):
    """The times of ``k`` successive blocking ring collectives of one layout (``MegatronSim._chain``)
    into ``fop`` (``(k, members, 5)``, ``F_*``), as ``_compute`` then ``coll`` compute them op by op,
    float for float. Op ``j``'s noise: ``tb[j]`` holds the members' compute noise in its first
    ``c_cols`` columns (none: no compute before the ops) and the groups' duration noise after them
    (Student t), ``u[j]`` the members' spread (uniform). Each member computes ``base_s x step_factor``
    with its noise (at least a fifth of ``base_s``), each op starts when its group's last member
    entered, lasts ``nominal_s`` with the group's noise, and a member leaves after that times its
    spread; the next op enters at that exit.

    As the op-by-op model does, in place: ``last_exit[ranks]`` (each rank's last exit: a rank that
    never leaves an op keeps the one before) and ``m_exit[gi]`` (each member's newest op's exit, for
    ops that enter inside the run, ``duration``). Returns whether any op entered inside the run."""
    k, nn = fop.shape[0], fop.shape[1]
    groups = nn // size
    t = begin.copy()
    bs = base_s * step_factor
    floor_s = 0.2 * base_s
    entered = False
    for j in range(k):
        for r in range(c_cols):
            t[r] = t[r] + max(bs * (1.0 + jit / 4 * tb[j, r]), floor_s)
        for g in range(groups):
            sg = t[g * size]
            for i in range(1, size):
                sg = max(sg, t[g * size + i])
            d = nominal_s * (1.0 + jit / 2 * abs(tb[j, c_cols + g]))
            for i in range(size):
                r = g * size + i
                fop[j, r, F_ENTER] = t[r]
                fop[j, r, F_EXIT] = d * (1.0 + 0.01 * u[j, r]) + sg
                fop[j, r, F_START] = sg
                fop[j, r, F_DUR] = d
                fop[j, r, F_PREV] = last_exit[ranks[r]]
        for r in range(nn):
            ex = fop[j, r, F_EXIT]
            if math.isfinite(ex):
                last_exit[ranks[r]] = ex
            if fop[j, r, F_ENTER] <= duration:
                m_exit[gi[r]] = ex
                entered = True
            t[r] = ex
    return entered


@compiled(nogil=True)
def p2p_times(enter_src, enter_dst, dn, us, ud, jit, nominal_s,  # type: ignore[no-untyped-def]
              ranks, last_exit, gi, m_exit, duration, fop):
    """One send/recv of each pair (``MegatronSim.p2p`` where no fault can act): ``fop`` rows ``i``
    (the sender, member ``gi[i]``) and ``m + i`` (the receiver). The sender's op waits for its
    previous op on the communicator (``m_exit``); the transfer starts when both are there, lasts
    ``nominal_s`` with noise ``dn``, and each end leaves after that times its spread (``us``, ``ud``).
    As ``_record`` and ``p2p`` do, in place: ``m_exit`` of the members whose op entered inside the
    run, the receivers' ``last_exit`` (a sender does not wait). Returns whether any entered."""
    m = enter_src.shape[0]
    for i in range(m):
        es = max(enter_src[i], m_exit[gi[i]])
        ed = enter_dst[i]
        st = max(es, ed)
        d = nominal_s * (1.0 + jit / 2 * abs(dn[i]))
        fop[i, F_ENTER] = es
        fop[i, F_EXIT] = st + d * (1.0 + 0.01 * us[i])
        fop[m + i, F_ENTER] = ed
        fop[m + i, F_EXIT] = st + d * (1.0 + 0.01 * ud[i])
        for r in (i, m + i):
            fop[r, F_START] = st
            fop[r, F_DUR] = d
            fop[r, F_PREV] = last_exit[ranks[r]]
    entered = False
    for r in range(2 * m):
        if fop[r, F_ENTER] <= duration:
            m_exit[gi[r]] = fop[r, F_EXIT]
            entered = True
    for i in range(m, 2 * m):
        if math.isfinite(fop[i, F_EXIT]):
            last_exit[ranks[i]] = fop[i, F_EXIT]
    return entered


@compiled(nogil=True, error_model="numpy")
def format_rows(oi, of, tmpl_tab, m_static, hash_arr, m_scale, m_skew, inc, final, epoch_ns,  # type: ignore[no-untyped-def]
                progress, done, idle, blk):
    """The records of ``play``'s rows (``oi``/``of``) into ``blk`` (``(N_ROWS, rows)``, ``R_*``): what
    ``MegatronSim`` sends about a member's op at the row's time. Counters: the share of the op's
    slots done by then (``tmpl_tab``'s slots, capped by the member's freeze), plus its send and recv
    lead; ``final`` rows are DONE, the others PROGRESS while inside the op and IDLE after. Times on
    the member's host clock (``m_scale``, ``m_skew``), in ns from ``epoch_ns``; an exit not reached
    yet and a previous exit not known are -1. Float for float what numpy computed before."""
    n = blk.shape[1]
    for r in range(n):
        m = oi[r, O_G]
        tp = oi[r, O_TMPL]
        t = of[r, O_T]
        enter = of[r, O_F0 + F_ENTER]
        ex = of[r, O_F0 + F_EXIT]
        start = of[r, O_F0 + F_START]
        prev = of[r, O_F0 + F_PREV]
        inside = (not final) and t < ex
        frac = (t - start) / of[r, O_F0 + F_DUR]
        frac = 0.0 if math.isnan(frac) else min(max(frac, 0.0), 1.0)  # np.clip, then NaN (0/0, inf/inf) as 0
        frac = min(frac, of[r, O_FR])
        level = np.int64(math.floor(frac * tmpl_tab[tp, 4]))
        started = t > start
        blk[R_SEND, r] = min(tmpl_tab[tp, 5], level + oi[r, O_SL]) if started else 0
        blk[R_RECV, r] = min(tmpl_tab[tp, 6], level + oi[r, O_RL]) if started else 0
        cid = m_static[0, m]
        blk[R_CID, r] = cid
        blk[R_HASH, r] = hash_arr[cid]
        blk[R_INC, r] = inc
        blk[R_SEQ, r] = oi[r, O_SEQ]
        for c in range(4):
            blk[R_OP + c, r] = tmpl_tab[tp, c]
        for c in range(4):
            blk[R_RANK + c, r] = m_static[1 + c, m]
        blk[R_STATUS, r] = progress if inside else (done if final else idle)
        sc, sk = m_scale[m], m_skew[m]
        blk[R_ENTER, r] = epoch_ns + np.int64(np.rint((enter * sc + sk) * 1e9))
        blk[R_EXIT, r] = -1 if inside else epoch_ns + np.int64(np.rint((ex * sc + sk) * 1e9))
        blk[R_SAMPLE, r] = epoch_ns + np.int64(np.rint((t * sc + sk) * 1e9))
        blk[R_PREV, r] = epoch_ns + np.int64(np.rint((max(prev, 0.0) * sc + sk) * 1e9)) if prev >= 0 else -1
        blk[R_ZERO, r] = 0
