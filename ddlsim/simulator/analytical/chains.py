"""The Gauss–Seidel sweeps of :func:`.maxplus.solve`: one max-plus chain per class window,
re-solved over the steps whose received messages changed (see :mod:`.maxplus`)."""

from __future__ import annotations

import numpy as np

__all__ = ["MAX_SWEEPS", "PREFIXES", "Chain", "sweeps", "reads"]

#: Sweeps of one prefix after which the solver gives up (the scheduler then times every step).
MAX_SWEEPS = 256
#: The prefixes settled one after the other (steps per class) before every step: a short
#: one holds a deep pipeline's warm-up (64: fastest on the 32-stage plan of
#: ``benchmarks/analytical_speed.py`` of 32, 48, 64, 96 and 128, and faster there than
#: prefixes growing ×4 or ×8).
PREFIXES = (64,)


def sweeps(chains: list, post: np.ndarray) -> bool:
    """Gauss–Seidel sweeps over ``chains``, alternately up and down, over each prefix of
    :data:`PREFIXES` and then all their steps, until nothing changes (False: a prefix did
    not settle in :data:`MAX_SWEEPS` sweeps). The prefixes start their sweeps in turn up
    and down (measured on the 206 plans of ``benchmarks/analytical_speed.py``: 9,829 chain
    solves, against 10,715 when each starts upwards and 10,052 when the alternation runs on
    from the previous prefix's last sweep; the deepest plan 191 against 222)."""
    order = (chains, chains[::-1])
    longest = max((ch.n for ch in chains), default=0)
    for k, W in enumerate([w for w in PREFIXES if w < longest] + [longest]):
        for ch in chains:
            ch.grow(W)
        sweep = k
        for _ in range(MAX_SWEEPS):
            changed = False
            for ch in order[sweep & 1]:
                if ch.lo <= ch.hi and ch.run(post):
                    changed = True
            sweep += 1
            if not changed:
                break
        else:
            return False
    return True


class Chain:
    """One class's window (from local step ``a``, its compute stream free at ``f0``) as a
    max-plus chain, and the window (``lo``..``hi``,
    local step indices) of the steps whose received messages changed since its last solve.
    Its arrays are views of the solver's, indexed by the class's step."""

    def __init__(self, nd, c: int, a: int, f0: float, arrays: tuple, scratch: tuple):
        src, ends, rm, post, P, lag, AmE, late, Ee = arrays
        b = int(nd.lim[c])
        self.n = b - a
        self.sc = src[a:b]
        self.endz = ends[a + c:b + c + 1]   # endz[j]: the end of step j - 1 (f0 before the first)
        self.endz[0] = self.f0 = f0
        self.rm, self.post, self.P = rm[a:b], post[a:b], P[a:b]
        self.lag, self.AmE = lag[a:b], AmE[a:b]
        l0, l1 = late.searchsorted((a, b)).tolist()
        self.late, self.Ee = late[l0:l1] - a, Ee[l0:l1]
        self.lo, self.hi, self.L = self.n, -1, 0
        self.readers: list = []
        self.new, self.diff = scratch    # (shared by the chains: one runs at a time)

    def grow(self, W: int) -> None:
        """Extend the solved prefix to the first ``W`` steps (the new ones join the window)."""
        new = min(self.n, W)
        if new > self.L:
            self.lo, self.hi = min(self.lo, self.L), max(self.hi, new - 1)
            self.L = new

    def run(self, post: np.ndarray) -> bool:
        """Re-solve the window (and the steps after it whose running maximum it raises);
        widen the windows of the classes reading the messages that changed. Whether any
        did. ``post``: when every node posts its message (``post[-1]``: never)."""
        lo, L, rm = self.lo, self.L, self.rm
        hi = min(self.hi, L - 1)
        self.lo, self.hi = self.n, -1
        if lo > hi:
            return False
        prev = rm[lo - 1] if lo > 0 else self.f0
        last = rm[hi]                    # the running maximum before this solve
        while True:
            x = rm[lo:hi + 1]            # solved in place
            post.take(self.sc[lo:hi + 1], out=x, mode="clip")
            x += self.lag[lo:hi + 1]     # message arrival + what follows it, - P
            if x[0] < prev:              # max(stream free, running max): a full sweep's value
                x[0] = prev
            np.maximum.accumulate(x, out=x)
            v, k = x[-1], hi + 1
            if k == L or v == last:
                break
            if v > last:                 # later steps whose running maximum was below v take v
                k += int(rm[k:L].searchsorted(v))
                rm[hi + 1:k] = v
                break
            hi = L - 1                   # lower (never, from lower bounds): redo to the end
        K = min(k + 1, L)            # a send posted early reads the previous step's end
        e = self.endz[lo + 1:K + 1]
        np.add(rm[lo:K], self.P[lo:K], out=e)
        new = np.subtract(e, self.AmE[lo:K], out=self.new[:K - lo])
        if len(self.late):           # posted before the wait: previous end + E
            l0, l1 = self.late.searchsorted((lo, K)).tolist()
            li = self.late[l0:l1]
            new[li - lo] = self.endz[li] + self.Ee[l0:l1]
        old = self.post[lo:K]
        diff = np.not_equal(new, old, out=self.diff[:K - lo])
        first = int(diff.argmax())
        if not diff[first]:
            return False
        old[:] = new
        g0 = lo + first              # the changed posts: g0..g1
        g1 = K - 1 if diff[-1] else K - 1 - int(diff[::-1].argmax())
        for r, ri, M, m in self.readers:   # (positions are integers: <= g1 is < g1 + 1)
            if M is m:
                i, j = M.searchsorted((g0, g1 + 1)).tolist()
            else:
                i, j = int(M.searchsorted(g0)), int(m.searchsorted(g1 + 1))
            if i < j:
                r.lo, r.hi = min(r.lo, int(ri[i])), max(r.hi, int(ri[j - 1]))
        return True


def reads(nd, src: np.ndarray, start: np.ndarray) -> list[tuple]:
    """Which class reads which: per reader class and each class it reads from inside that
    class's window (``src``: the node each node reads, ``N`` for none), ``(reader, sender,
    *window_map(...))`` of the reader's window steps that receive the sender's messages
    (a message posted before the windows is read, not solved)."""
    C = len(nd.off) - 1
    live = np.append(nd.live, False).take(src, mode="clip")
    sender = np.where(live, np.append(nd.cls, C).take(src, mode="clip"), C)
    out = []
    for c, (a, b) in enumerate(zip(start.tolist(), nd.lim.tolist())):
        of = sender[a:b]
        for s in np.bincount(of, minlength=C + 1)[:C].nonzero()[0].tolist():
            ri = np.flatnonzero(of == s)
            out.append((c, s, *window_map(ri, src[a:b][ri] - int(start[s]))))
    return out


def window_map(ri: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, ...]:
    """For a reader's steps ``ri`` that read a sender's steps ``pos``: (``ri``, the running
    maximum and the suffix minimum of ``pos``), so that the reader's steps reading sender
    steps ``g0``..``g1`` lie between ``ri[searchsorted(M, g0)]`` and
    ``ri[searchsorted(m, g1, 'right') - 1]``."""
    if (pos[1:] >= pos[:-1]).all():   # read in the sender's order (as pipelines do)
        return ri, pos, pos
    return ri, np.maximum.accumulate(pos), np.minimum.accumulate(pos[::-1])[::-1]
