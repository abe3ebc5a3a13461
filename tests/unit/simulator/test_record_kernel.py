"""The simulator's compiled recording rules (``record_kernel.play``) on logs small enough to check by hand:
state samples before an op enters, one in-flight look per member and window, DONE only when picked and
inside the run, fault marks written or kept, and an op that never enters leaves its members alone."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pytest

from ccld.producers.simulator import record_kernel as rk

DT, POLL, DURATION = 1.0, 0.1, 30.0


@dataclass
class Members:
    """The kernel's per-member state for ``n`` members, none with an op yet."""

    n: int
    mf: npt.NDArray[np.float64] = field(init=False)
    mi: npt.NDArray[np.int64] = field(init=False)

    def __post_init__(self) -> None:
        self.mf = np.full((self.n, 5), math.inf)
        self.mf[:, rk.F_EXIT] = -math.inf
        self.mi = np.full((self.n, 2), -1, dtype=np.int64)
        self.sl = np.zeros(self.n, dtype=np.int64)
        self.rl = np.zeros(self.n, dtype=np.int64)
        self.pl = np.zeros(self.n, dtype=np.int64)
        self.fr = np.ones(self.n)
        self.probewin = np.full(self.n, -1, dtype=np.int64)
        self.next_inst = np.zeros(self.n, dtype=np.int64)

    def play(self, ops: list[dict], n_inst: int = 31) -> tuple[list[tuple], list[tuple]]:
        """Play ``ops`` (each: members, enter, exit, seq, tmpl, sampled; optional size, marks); the rows
        out as (member, time, seq) for state samples and looks, and for DONE records."""
        gi, fl, tm, samp, e_off, e_n, e_size, e_seq, e_goff, e_moff = [], [], [], [], [], [], [], [], [], []
        mk_i, mk_f = [], []
        for op in ops:
            g = list(op["members"])
            size = op.get("size", len(g))
            e_off.append(len(gi))
            e_goff.append(len(samp))
            e_n.append(len(g))
            e_size.append(size)
            e_seq.append(op["seq"])
            gi += g
            for i in range(len(g)):
                enter, ex = op["enter"][i], op["exit"][i]
                start = max(op["enter"][(i // size) * size : (i // size + 1) * size])
                fl.append((enter, ex, start, ex - start if math.isfinite(ex) else 1.0, -1.0))
                tm.append(op["tmpl"])
            samp += [op["sampled"]] * (len(g) // size)
            if "marks" in op:
                e_moff.append(len(mk_f))
                for _ in g:
                    mk_i.append(op["marks"][:3])
                    mk_f.append(op["marks"][3])
            else:
                e_moff.append(-1)
        big = len(gi) + self.n * n_inst
        oi, of = np.zeros((big, rk.N_OI), dtype=np.int64), np.zeros((big, rk.N_OF))
        di, df = np.zeros((len(gi), rk.N_OI), dtype=np.int64), np.zeros((len(gi), rk.N_OF))

        def i64(x: list) -> npt.NDArray[np.int64]:
            return np.asarray(x, dtype=np.int64)

        no, nd = rk.play(
            self.mf, self.mi, self.sl, self.rl, self.pl, self.fr, self.probewin, self.next_inst,
            i64(e_off), i64(e_n), i64(e_size), i64(e_seq), i64(e_goff), i64(e_moff), i64(e_off),
            i64(gi), np.asarray(fl, dtype=np.float64).reshape(-1, 5), i64(tm), np.asarray(samp, dtype=np.bool_),
            np.asarray(mk_i, dtype=np.int64).reshape(-1, 3), np.asarray(mk_f, dtype=np.float64),
            DURATION, DT, n_inst, POLL, oi, of, di, df)

        def rows(i: npt.NDArray[np.int64], f: npt.NDArray[np.float64], n: int) -> list[tuple]:
            return [(int(i[r, rk.O_G]), round(float(f[r, rk.O_T]), 9), int(i[r, rk.O_SEQ])) for r in range(n)]

        return rows(oi, of, no), rows(di, df, nd)


def op(members: list[int], enter: list[float], exit_: list[float], seq: int, *, sampled: bool = False,
       **kw: object) -> dict:
    return {"members": members, "enter": enter, "exit": exit_, "seq": seq, "tmpl": 0, "sampled": sampled, **kw}


def test_state_samples_show_the_previous_op_until_the_next_enters() -> None:
    m = Members(2)
    m.play([op([0, 1], [0.02, 0.03], [0.05, 0.06], 0)])
    # the next op enters at 2.5: instants 1 and 2 passed since; both members show op 0, instant by instant
    states, done = m.play([op([0, 1], [2.5, 2.5], [2.51, 2.51], 1)])
    assert states == [(0, 1.0, 0), (1, 1.0, 0), (0, 2.0, 0), (1, 2.0, 0)]
    assert done == []
    assert m.next_inst.tolist() == [3, 3] and m.mi[:, 0].tolist() == [1, 1]


def test_a_member_without_an_op_sends_no_state_sample() -> None:
    m = Members(1)
    states, _ = m.play([op([0], [3.5], [3.51], 0)])
    assert states == [] and m.next_inst.tolist() == [4]


def test_one_in_flight_look_per_member_and_window() -> None:
    m = Members(1)
    # an op from 1.03 to 1.6: the poll at 1.1 catches it running; the next op in the same window is
    # not looked at again, one in the next window is
    states, _ = m.play([op([0], [1.03], [1.6], 0), op([0], [1.62], [1.95], 1), op([0], [2.03], [2.5], 2)])
    looks = [r for r in states if r[1] not in (1.0, 2.0)]
    assert looks == [(0, 1.1, 0), (0, 2.1, 2)]
    # a short op between two polls is never caught in flight
    m2 = Members(1)
    states2, _ = m2.play([op([0], [1.11], [1.15], 0)])
    assert [r for r in states2 if r[1] != 1.0] == []


def test_done_only_when_picked_and_inside_the_run() -> None:
    m = Members(2)
    _, done = m.play([
        op([0, 1], [0.2, 0.2], [0.25, 0.25], 0, sampled=True),
        op([0, 1], [0.3, 0.3], [0.35, 0.35], 1, sampled=False),
        op([0, 1], [29.9, 29.9], [30.5, 30.5], 2, sampled=True),  # ends after the run
    ], n_inst=31)
    assert done == [(0, 0.25, 0), (1, 0.25, 0)]


def test_an_op_that_never_enters_leaves_its_members_alone() -> None:
    m = Members(2)
    m.play([op([0, 1], [0.2, 0.2], [0.25, 0.25], 0)])
    _, done = m.play([op([0, 1], [math.inf, 0.5], [math.inf, 0.6], 1, sampled=True, size=1)])
    assert m.mi[:, 0].tolist() == [0, 1]  # member 0 still shows op 0
    assert done == [(1, 0.6, 1)]


def test_fault_marks_are_written_with_the_op_or_kept() -> None:
    m = Members(1)
    m.play([op([0], [0.2], [0.25], 0, marks=(2, 3, 4, 0.5))])
    assert (m.sl[0], m.rl[0], m.pl[0], m.fr[0]) == (2, 3, 4, 0.5)
    m.play([op([0], [0.3], [0.35], 1)])  # an op without marks: the member keeps them
    assert (m.sl[0], m.fr[0]) == (2, 0.5)
    m.play([op([0], [0.4], [0.45], 2, marks=(0, 0, 0, 1.0))])  # written back to "no fault"
    assert (m.sl[0], m.rl[0], m.pl[0], m.fr[0]) == (0, 0, 0, 1.0)


def test_chain_times_match_the_op_by_op_arithmetic() -> None:
    rng = np.random.default_rng(5)
    k, groups, size = 3, 2, 4
    nn = groups * size
    jit, nominal_s, base_s, factor = 0.05, 0.0025, 0.0015, 1.1
    begin = rng.uniform(0, 0.01, nn)
    tb = rng.standard_t(4, (k, nn + groups))  # per op: the members' compute noise, then the groups' duration noise
    u = rng.random((k, nn))
    fop = np.empty((k, nn, 5))
    ranks = np.arange(nn, dtype=np.int64)[::-1].copy()  # rank r's last exit is last_exit[r], wherever it sits
    last_exit, m_exit = np.full(nn, -1.0), np.full(nn + 2, -np.inf)
    members = np.arange(2, nn + 2, dtype=np.int64)
    duration = 0.01 + 2 * nominal_s  # the third op enters after the run: it is not the members' newest
    entered = rk.chain_times(begin, tb, nn, u, jit, nominal_s, base_s, factor, size, ranks, last_exit, members,
                             m_exit, duration, fop)
    t, last = begin.copy(), np.full(nn, -1.0)
    for j in range(k):  # as _compute then coll: numpy, op by op
        t = t + np.maximum(base_s * factor * (1.0 + jit / 4 * tb[j, :nn]), 0.2 * base_s)
        assert np.array_equal(fop[j, :, rk.F_ENTER], t)
        sg = t.reshape(groups, size).max(axis=1)
        dur = nominal_s * (1.0 + jit / 2 * np.abs(tb[j, nn:]))
        ex = np.repeat(sg, size) + np.repeat(dur, size) * (1.0 + 0.01 * u[j])
        assert np.array_equal(fop[j, :, rk.F_EXIT], ex)
        assert np.array_equal(fop[j, :, rk.F_START], np.repeat(sg, size))
        assert np.array_equal(fop[j, :, rk.F_DUR], np.repeat(dur, size))
        assert np.array_equal(fop[j, :, rk.F_PREV], last)
        t, last = ex, ex
    assert entered and np.array_equal(last_exit[ranks], last)
    newest = np.where(fop[:, :, rk.F_ENTER] <= duration, fop[:, :, rk.F_EXIT], -np.inf).max(axis=0)
    assert np.array_equal(m_exit[members], newest) and np.isinf(m_exit[:2]).all()
    assert (fop[-1, :, rk.F_ENTER] > duration).any() and (fop[0, :, rk.F_ENTER] <= duration).all()


def test_p2p_times_match_the_op_by_op_arithmetic() -> None:
    rng = np.random.default_rng(9)
    m, jit, nominal_s = 4, 0.05, 0.002
    enter_src, enter_dst = rng.uniform(0, 0.01, m), rng.uniform(0, 0.01, m)
    enter_dst[3] = np.inf  # a receiver that never comes: its sender waits forever
    dn, us, ud = rng.standard_t(4, m), rng.random(m), rng.random(m)
    ranks = np.arange(2 * m, dtype=np.int64)
    last_exit = rng.uniform(-0.01, 0.0, 2 * m)
    before = last_exit.copy()
    members = np.arange(2 * m, dtype=np.int64)
    m_exit = np.full(2 * m, -np.inf)
    m_exit[1] = 0.02  # the sender's previous op on the communicator ends late: it waits for it
    fop = np.empty((2 * m, 5))
    assert rk.p2p_times(enter_src, enter_dst, dn, us, ud, jit, nominal_s, ranks, last_exit, members, m_exit, 30.0,
                        fop)
    es = np.maximum(enter_src, [-np.inf, 0.02, -np.inf, -np.inf])
    start = np.maximum(es, enter_dst)
    dur = nominal_s * (1.0 + jit / 2 * np.abs(dn))
    xs, xd = start + dur * (1.0 + 0.01 * us), start + dur * (1.0 + 0.01 * ud)
    assert np.array_equal(fop[:, rk.F_ENTER], np.concatenate([es, enter_dst]))
    assert np.array_equal(fop[:, rk.F_EXIT], np.concatenate([xs, xd]))
    assert np.array_equal(fop[:, rk.F_PREV], before)
    assert np.array_equal(last_exit[:m], before[:m])  # a sender does not wait: its last exit stays
    assert np.array_equal(last_exit[m:], np.where(np.isfinite(xd), xd, before[m:]))
    assert np.array_equal(m_exit, np.where(np.concatenate([es, enter_dst]) <= 30.0, fop[:, rk.F_EXIT], -np.inf))


def test_format_rows_counts_the_share_done_on_the_host_clock() -> None:
    # one member (comm 0, rank 3, comm rank 1 of 2, host slot 0), an op of 100 slots from 1.0 to 2.0
    tmpl_tab = np.asarray([[2, 7, 4096, -1, 100, 100, 100]], dtype=np.int64)
    m_static = np.asarray([[0], [3], [1], [2], [0]], dtype=np.int64)
    hash_arr = np.asarray([-77], dtype=np.int64)
    scale, skew = np.asarray([1.0 + 50e-6]), np.asarray([0.25])
    oi = np.zeros((3, rk.N_OI), dtype=np.int64)
    of = np.zeros((3, rk.N_OF))
    oi[:, rk.O_SEQ], oi[:, rk.O_SL] = 9, 2
    of[:, rk.O_F0 : rk.O_F0 + 5] = (0.9, 2.0, 1.0, 1.0, 0.5)  # entered 0.9, data from 1.0 for 1.0 s
    of[:, rk.O_FR] = 1.0
    of[:, rk.O_T] = (1.25, 2.5, 2.0)
    of[2, rk.O_FR] = 0.1  # frozen at a tenth
    blk = np.zeros((rk.N_ROWS, 3), dtype=np.int64)
    rk.format_rows(oi, of, tmpl_tab, m_static, hash_arr, scale, skew, 4, False, 10**18, 1, 2, 3, blk)
    assert blk[rk.R_STATUS].tolist() == [1, 3, 3]  # inside (PROGRESS), then after it (IDLE)
    assert blk[rk.R_SEND].tolist() == [27, 100, 12]  # a quarter of 100 slots + a lead of 2, capped; the freeze
    assert blk[rk.R_RECV].tolist() == [25, 100, 10]
    assert blk[rk.R_EXIT, 0] == -1 and blk[rk.R_EXIT, 1] == 10**18 + round((2.0 * scale[0] + 0.25) * 1e9)
    assert blk[rk.R_SAMPLE, 0] == 10**18 + round((1.25 * scale[0] + 0.25) * 1e9)
    assert (blk[rk.R_HASH] == -77).all() and (blk[rk.R_INC] == 4).all() and (blk[rk.R_SEQ] == 9).all()
    assert blk[rk.R_OP : rk.R_PEER + 1, 0].tolist() == [2, 7, 4096, -1]
    assert blk[rk.R_RANK : rk.R_LHOST + 1, 0].tolist() == [3, 1, 2, 0]
    done = np.zeros((rk.N_ROWS, 3), dtype=np.int64)
    rk.format_rows(oi, of, tmpl_tab, m_static, hash_arr, scale, skew, 4, True, 10**18, 1, 2, 3, done)
    assert done[rk.R_STATUS].tolist() == [2, 2, 2]  # DONE rows are never inside


def test_kernels_compile_uncached_where_numba_cannot_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only install without a writable home: numba refuses ``cache=True`` at decoration; the
    kernels are then compiled in each process instead of failing the simulator's import."""
    real = rk.njit
    asked: list[bool] = []

    def njit(**opts: object) -> object:
        asked.append(bool(opts["cache"]))
        if opts["cache"]:
            raise RuntimeError("cannot cache function 'f': no locator available for file 'x.py'")
        return real(**opts)

    monkeypatch.setattr(rk, "njit", njit)

    @rk.compiled(nogil=True)
    def twice(x):  # type: ignore[no-untyped-def]
        return 2 * x

    assert asked == [True, False] and twice(21) == 42
