"""Each communicator's cadence: the periodic pattern of op sequence -> signature it repeats.

Training calls the same collectives in the same order every step, so a communicator's
signatures repeat with a period (1 for a tensor-parallel all-reduce, 2 for a data-parallel
reduce-scatter + all-gather, more with gradient buckets). The expected signature at op sequence
``n`` is the one seen at any ``n - k x period``. When the ranks of a stalled op disagree and there is no
majority (a 2-rank data-parallel group), the rank that deviates from the cadence is the one that
called its ops in the wrong order.

State per communicator is one ring buffer of the last ``cadence_ops`` completed ops (signature
and op sequence), updated with one vectorised pass per tick; the period is only searched when a
communicator is diagnosed (a stall), over that short window.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]

# a period must be confirmed by this many op pairs beyond one full period (one repetition is a coincidence)
MIN_EXTRA_PAIRS = 2
CHUNK = 1024  # communicators per vectorised period search
SPREAD_MIN = 64  # communicators items_spread searches per call at least (small jobs: all of them every time)


class Cadence:
    """Recent signatures of every communicator of one job, by op sequence (bounded ring buffers)."""

    def __init__(self, window: int) -> None:
        self.w = max(2, int(window))  # a window under 4 ops never confirms a period: cadence off
        self.sig = np.zeros((0, self.w), dtype=np.int64)
        self.seq = np.full((0, self.w), -1, dtype=np.int64)
        # patterns restored from a saved state (communicator hex -> signatures by seq % period)
        self.restored: dict[str, tuple[int, ...]] = {}
        self._found: dict[int, tuple[str, list[int]] | None] = {}  # items_spread's results by communicator
        self._next = 0  # the communicator items_spread searches next

    def _ensure(self, n_comms: int) -> None:
        extra = n_comms - self.sig.shape[0]
        if extra > 0:
            self.sig = np.pad(self.sig, [(0, extra), (0, 0)])
            self.seq = np.pad(self.seq, [(0, extra), (0, 0)], constant_values=-1)

    def update(self, cid: I64, seq: I64, sig: I64, n_comms: int) -> None:
        """Record completed ops (any order, any communicators); a newer op wins its slot."""
        self._ensure(n_comms)
        if cid.size == 0:
            return
        ok = seq >= 0
        cid, seq, sig = cid[ok], seq[ok], sig[ok]
        slot = seq % self.w
        # newest op per (communicator, slot) first, then one write per slot
        order = np.lexsort((-seq, slot, cid))
        key = cid[order] * self.w + slot[order]
        first = np.concatenate([[True], key[1:] != key[:-1]]) if key.size else np.zeros(0, dtype=bool)
        pick = order[first]
        c, s = cid[pick], slot[pick]
        newer = seq[pick] > self.seq[c, s]
        self.seq[c[newer], s[newer]] = seq[pick][newer]
        self.sig[c[newer], s[newer]] = sig[pick][newer]

    def periods(self, cids: I64) -> I64:
        """The shortest period each communicator's recent ops follow (0: none), all at once.

        Period ``p`` holds when every two recorded ops whose sequence numbers are equal modulo
        ``p`` have the same signature, and at least ``p + MIN_EXTRA_PAIRS`` recorded ops repeat a
        phase already seen. The ops need not be consecutive: a source that details only a sample
        of its ops (the bounded record format) still shows its step's pattern.
        """
        out = np.zeros(cids.shape[0], dtype=np.int64)
        keep = np.flatnonzero((cids >= 0) & (cids < self.sig.shape[0]))
        for a in range(0, keep.size, CHUNK // 8):  # bounded temporaries: (chunk, P, w, w)
            part = keep[a : a + CHUNK // 8]
            out[part] = self._periods(cids[part])
        return out

    def _periods(self, cids: I64) -> I64:
        w = self.w
        seq, sig = self.seq[cids], self.sig[cids]  # (c, w)
        ps = np.arange(1, w // 2 + 1)  # (P,)
        have = seq >= 0
        res = np.where(have[:, None, :], seq[:, None, :] % ps[None, :, None], -1)  # (c, P, w) phase of each op
        both = have[:, None, :, None] & have[:, None, None, :]  # (c, 1, w, w)
        same = both & (res[:, :, :, None] == res[:, :, None, :])  # (c, P, w, w) same phase
        clash = (same & (sig[:, None, :, None] != sig[:, None, None, :])).any(axis=(2, 3))
        n_ops = have.sum(axis=1)[:, None]  # (c, 1)
        distinct = np.zeros((cids.shape[0], ps.shape[0]), dtype=np.int64)
        for j, p in enumerate(ps.tolist()):  # phases seen per period: a bincount per communicator
            r = res[:, j, :]
            seen = np.zeros((cids.shape[0], p), dtype=bool)
            rows, cols = np.nonzero(r >= 0)
            seen[rows, r[rows, cols]] = True
            distinct[:, j] = seen.sum(axis=1)
        good = ~clash & (n_ops - distinct >= ps[None, :] + MIN_EXTRA_PAIRS)
        return np.where(good.any(axis=1), ps[np.argmax(good, axis=1)], 0)

    def pattern(self, cid: int, period: int | None = None) -> tuple[int, ...] | None:
        """Signatures by ``seq % period`` of the shortest period the recent ops follow, or None."""
        p = int(self.periods(np.asarray([cid], dtype=np.int64))[0]) if period is None else period
        if p <= 0:
            return None
        seqs, sigs = self.seq[cid], self.sig[cid]
        have = np.flatnonzero(seqs >= 0)
        pat: dict[int, int] = {}
        for i in have[np.argsort(-seqs[have])].tolist():  # newest first
            pat.setdefault(int(seqs[i]) % p, int(sigs[i]))
        if len(pat) < p:
            return None  # a phase of the period never seen: no full pattern
        return tuple(pat[i] for i in range(p))

    def expected(self, cid: int, seq: int, comm_hex: str) -> int | None:
        """The signature the cadence predicts at op ``seq`` of ``cid`` (learned, else restored)."""
        pat = self.pattern(cid) or self.restored.get(comm_hex)
        if not pat:
            return None
        return pat[seq % len(pat)]

    def items(self, n_comms: int, comm_hex: Sequence[str]) -> list[tuple[str, list[int]]]:
        """Learned patterns worth keeping across a restart (more than one signature)."""
        out: list[tuple[str, list[int]]] = []
        cids = np.arange(min(n_comms, self.sig.shape[0]), dtype=np.int64)
        per = self.periods(cids)
        for cid in np.flatnonzero(per > 1).tolist():
            pat = self.pattern(cid, int(per[cid]))
            if pat is not None and len(set(pat)) > 1:
                out.append((comm_hex[cid], list(pat)))
        return out

    def items_spread(self, n_comms: int, comm_hex: Callable[[int], str], calls: int, *,
                     search: bool = True) -> list[tuple[str, list[int]]]:
        """``items()`` with the search spread over ``calls`` calls: each searches the next share of the
        communicators (round robin, at least ``SPREAD_MIN`` of them) and the rest come from earlier calls.

        The worker saves its state every second; searching every communicator of a thousand-rank job
        each time was a third of its CPU, and all of them at once blocks its event loop for 0.3 s.
        ``search=False`` returns what earlier calls found (a save between the regular ones).
        """
        n = min(n_comms, self.sig.shape[0])
        if n == 0:
            return []
        if not search:
            return [v for k, v in sorted(self._found.items()) if v is not None and k < n]
        step = min(n, max(SPREAD_MIN, -(-n // max(1, calls))))
        cids = (self._next + np.arange(step, dtype=np.int64)) % n
        self._next = int((self._next + step) % n)
        for cid, p in zip(cids.tolist(), self.periods(cids).tolist(), strict=True):
            pat = self.pattern(cid, p) if p > 1 else None
            self._found[cid] = (comm_hex(cid), list(pat)) if pat is not None and len(set(pat)) > 1 else None
        return [v for k, v in sorted(self._found.items()) if v is not None and k < n]

    def restore(self, patterns: Mapping[str, Sequence[int]]) -> None:
        self.restored = {k: tuple(int(x) for x in v) for k, v in patterns.items() if v}
