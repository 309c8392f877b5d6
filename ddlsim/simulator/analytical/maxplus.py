"""The max-plus recurrence of a step, solved for every step of every class at once with numpy.

Most steps of a training iteration are *scalar*: the compute stream's timing depends only on
when the stream was free (``f``) and when the step's one received message was posted (``a``),
not on any other stream. Such a step is a max-plus affine map of the timing rule
(:mod:`ddlsim.simulator.timing`): with ``A`` the seconds of its compute-stream instructions
and ``F`` those before the first one that uses the message (transfer ``t``)::

    f' = max(f + A,  a + t + (A - F))

Over one class's steps ``f_j = max(f_{j-1} + A_j, c_j)`` unrolls to ``f_j = P_j + max(0,
max_{i<=j} (c_i - P_i))`` with ``P`` the prefix sums of ``A``: a cumulative sum and a running
maximum, vectorised over the steps. Messages couple the classes; the solver iterates
Gauss–Seidel sweeps over the classes, alternately upwards and downwards, from lower bounds
(an unknown message counts as never arriving) until no value changes: the least fixed point,
which for a deadlock-free program is the schedule the list scheduler computes (each value is
the longest path to its node). Every node's duration is positive, so a cyclic (deadlocked)
program never settles and is left to the scheduler, as is any step that is not scalar.

Two things keep the sweeps short; neither changes a value (a deadlock-free program has one
fixed point, whatever the order of the sweeps). A class is re-solved only from the first to
the last of its steps whose received message changed since its last solve; the steps after
them keep their values, except those whose running maximum was below the window's last one,
which take it (found by a binary search: the running maximum never decreases). And the sweeps
settle the first ``PREFIXES[0]`` steps of every class, then the first ``PREFIXES[1]``, …,
then all: the pipeline's warm-up settles on short arrays, and the steady state that follows,
whose steps the compute stream binds, settles in a few sweeps of windows.

Which steps are scalar, and their summaries: :mod:`.summaries`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .summaries import Summary, closed_streams, shape_summary, summarise

__all__ = ["Summary", "summarise", "closed_streams", "Nodes", "nodes", "solve", "MAX_SWEEPS"]

#: Sweeps of one prefix after which the solver gives up (the scheduler then times every step).
MAX_SWEEPS = 256
#: The prefixes settled one after the other (steps per class) before every step: a short
#: one holds a deep pipeline's warm-up (64: fastest on the 32-stage plan of
#: ``benchmarks/analytical_speed.py`` of 32, 48, 64, 96 and 128, and faster there than
#: prefixes growing ×4 or ×8).
PREFIXES = (64,)


class Nodes(NamedTuple):
    """Every step of every class as one flat array (class-major), up to each class's
    solvable prefix: ``lim[c]`` (absolute index) ends class ``c``'s, ``live`` marks the
    nodes of the prefixes."""

    off: np.ndarray
    lim: np.ndarray
    cls: np.ndarray
    key: np.ndarray          # class · NB + block index
    src: np.ndarray          # node whose send a node receives, or -1
    summaries: list          # by key
    A: np.ndarray
    F: np.ndarray
    waits: np.ndarray
    E: np.ndarray
    after: np.ndarray
    t: np.ndarray            # transfer seconds of the received message
    blocking: np.ndarray     # the receive is posted when the compute stream is free
    F0: np.ndarray           # F before the blocking shift (the gap accounting's)
    live: np.ndarray         # the node lies in its class's solvable prefix
    flags: np.ndarray        # its block's bits (WAITS, AFTER, BLOCKING, NONE, SIDE, SENDS,
                             # RECEIVES)


def nodes(programs: list) -> Nodes | None:
    """The nodes of every class's solvable prefix, or None when there is nothing to solve."""
    C = len(programs)
    NB = max((len(p.blocks) for p in programs), default=0)
    summaries, sent_k, got_k, n_msgs = _block_summaries(programs, NB)
    lens = np.fromiter((len(p.block) for p in programs), np.int64, C)
    off = np.zeros(C + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    N = int(off[-1])
    if N == 0:
        return None
    cls = np.repeat(np.arange(C), lens)
    key = cls * NB
    key += np.concatenate([p.block for p in programs])
    mb = np.concatenate([p.microbatch for p in programs], dtype=np.int64)
    lowest = int(mb.min())       # message slots: (message, micro-batch) → node
    if lowest:
        mb -= lowest
    M = int(mb.max()) + 1
    # the per-key columns gathered per node, one column at a time (contiguous, no transpose);
    # every gather's indices lie in range, so ``mode="clip"`` (no bounds check, a third
    # faster on these arrays) clips nothing, and ``"wrap"`` reads index -1 as the last
    floats, slots, flags_k = _table(summaries, sent_k, got_k, n_msgs, M)
    A, F, E, sends = (col.take(key, mode="clip") for col in floats)
    flags = flags_k.take(key, mode="clip")
    # each message's slot holds its sender; a node that sends nothing writes to slot block
    # n_msgs, one that receives nothing reads block n_msgs + 1 (never written: -1)
    where = np.full((n_msgs + 2) * M, -1, dtype=np.int64)
    slot = slots[0].take(key, mode="clip")
    slot += mb
    where[slot] = np.arange(N)
    if np.count_nonzero(where[:n_msgs * M] >= 0) != np.count_nonzero(flags & SENDS):
        return None              # a message posted twice: not solved
    slot = slots[1].take(key, out=slot, mode="clip")
    slot += mb
    src = where.take(slot, mode="clip")
    lim, live = _limits(off, flags, src)
    waits, after, blocking = (flags & bit > 0 for bit in (WAITS, AFTER, BLOCKING))
    # the received message's transfer (src -1: none, 0)
    t = np.append(sends, 0.0).take(src, mode="wrap")
    F0 = F
    if blocking.any():
        # a blocking receive's transfer starts at max(f, posted): the step is the scalar map
        # of A' = A + max(0, t − F), F' = max(F, t) (the sends after the message shift alike)
        blocking &= src >= 0
        extra = np.where(blocking, np.maximum(0.0, t - F), 0.0)
        E = np.where(blocking & after, E + extra, E)
        A, F = A + extra, np.where(blocking, np.maximum(F, t), F)
    return Nodes(off, lim, cls, key, src, summaries, A, F, waits, E, after, t, blocking, F0,
                 live, flags)


def _block_summaries(programs: list, NB: int) -> tuple[list, np.ndarray, np.ndarray, int]:
    """Per key (class · NB + block): the block's :class:`Summary` (None: not solvable, as a
    block receiving from its own class), the number of the message it sends and of the one
    it receives (-1: none); and how many messages there are."""
    C = len(programs)
    summaries: list[Summary | None] = [None] * (C * NB)
    msgs: dict[tuple, int] = {}
    sent_k = [-1] * (C * NB)
    got_k = [-1] * (C * NB)
    cache: dict[tuple, Summary | None] = {}
    closed = closed_streams(programs)
    for c, p in enumerate(programs):
        for k, (instrs, shape) in enumerate(zip(p.blocks, p.shapes), c * NB):
            s = shape_summary(instrs, shape, cache, closed)
            if s is None:
                continue
            recv, send = s[3], s[4]
            if recv is not None and recv.peer[0] == c:
                continue
            summaries[k] = s
            if send is not None:
                sent_k[k] = msgs.setdefault((c, *send.peer), len(msgs))
            if recv is not None:
                got_k[k] = msgs.setdefault((recv.peer[0], c, recv.peer[1]), len(msgs))
    return (summaries, np.array(sent_k, dtype=np.int64), np.array(got_k, dtype=np.int64),
            len(msgs))


def _limits(off: np.ndarray, flags: np.ndarray,
            src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each class's prefix end, whether each node lies in its class's prefix). The end: its
    first unsolvable step (``NONE`` among its ``flags``: no summary), its first step whose
    message is not sent by a solvable step, or its first step whose message is sent beyond
    the sender's prefix (``src``: the node whose message each node receives, -1 for none)."""
    receives = src >= 0
    lim = _prefix(off, np.flatnonzero((flags & NONE > 0) | ((flags & RECEIVES > 0) & ~receives)))
    while True:
        past = np.ones(len(src), dtype=bool)      # beyond its class's prefix
        for a, b in zip(off[:-1].tolist(), lim.tolist()):
            past[a:b] = False
        beyond = past.take(src, mode="wrap")      # (src -1 reads the last node: masked)
        beyond &= receives
        beyond &= ~past
        if not beyond.any():
            return lim, ~past
        lim = np.minimum(lim, _prefix(off, np.flatnonzero(beyond)))


def _table(summaries: list, sent_k: np.ndarray, got_k: np.ndarray, n_msgs: int,
           M: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per key (columns): its summary's A, F, E and send seconds (0: none; zeros for no
    summary), four contiguous rows; per key (columns), the first message slot of the message
    it sends (``n_msgs · M`` for none) and of the one it receives (``(n_msgs + 1) · M`` for
    none); its :func:`_flags`."""
    none = (0.0,) * 4
    floats = np.array([(s.A, s.F, s.E, s.send.dur if s.send is not None else 0.0)
                       if s is not None else none for s in summaries], dtype=float).reshape(-1, 4)
    floats = np.ascontiguousarray(floats.T)
    slots = np.stack([np.where(sent_k >= 0, sent_k, n_msgs),
                      np.where(got_k >= 0, got_k, n_msgs + 1)]) * M
    return floats, slots, _flags(summaries)


#: Bits of :func:`_flags` (``Nodes.flags``).
WAITS, AFTER, BLOCKING, NONE, SIDE, SENDS, RECEIVES = 1, 2, 4, 8, 16, 32, 64


def _flags(summaries: list) -> np.ndarray:
    """Per key, its summary's ``waits``, ``after``, ``blocking`` and ``side``, whether it
    sends and whether it receives, as bits, or ``NONE``."""
    return np.array([NONE if s is None else WAITS * s.waits | AFTER * s.after
                     | BLOCKING * s.blocking | SIDE * s.side | SENDS * (s.send is not None)
                     | RECEIVES * (s.recv is not None) for s in summaries], dtype=np.uint8)


def _prefix(off: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """Per class, the absolute index of its first node listed in ``bad`` (its end if none)."""
    first = np.searchsorted(bad, off[:-1])
    return np.minimum(np.append(bad, off[-1])[first], off[1:])


def solve(nd: Nodes) -> tuple[np.ndarray, np.ndarray] | None:
    """(end of each node's compute stream, when each posts its message, with ``-inf`` after
    the last node: ``post[nd.src]`` is when a node's message was posted, ``-inf`` for none)
    over the prefixes, or None when the sweeps do not settle.

    A send after the instruction waiting for the message (or in a step without one) is
    posted ``A - E`` before the step ends; one before it, ``E`` after the step starts.
    A class is re-solved only over the window of steps whose received messages changed
    since its last solve (:class:`_Chain`); the values are those of a full re-solve.
    """
    N = len(nd.cls)
    C = len(nd.off) - 1
    if not ((nd.A > 0) & (~nd.waits | (nd.t + nd.A - nd.F > 0)) | ~nd.live).all():
        return None               # a zero-length node: cycles could settle; not solved
    # every class's ends after a 0 (the end before its first step): its step j reads j
    ends = np.zeros(N + C)
    rm = np.zeros(N)                 # per class, the running maximum of ``ends - P``
    post = np.full(N + 1, -np.inf)   # post[-1]: the message of nodes that receive none
    src = nd.src.copy()
    np.copyto(src, N, where=src < 0)
    P = np.zeros(N)
    for a, b in zip(nd.off[:-1].tolist(), nd.lim.tolist()):
        np.cumsum(nd.A[a:b], out=P[a:b])
    lag = nd.A - nd.F                # post → step end: t + A - F (-inf: no wait)
    np.copyto(lag, -np.inf, where=~nd.waits)
    lag += nd.t
    lag -= P
    late = np.flatnonzero(nd.waits & ~nd.after & nd.live)  # posted before the message
    arrays = (src, ends, rm, post, P, lag, nd.A - nd.E, late, nd.E[late])
    longest = int((nd.lim - nd.off[:-1]).max())
    scratch = (np.empty(longest), np.empty(longest, dtype=bool))
    chains = [_Chain(nd, c, arrays, scratch) for c in range(C)]
    for reader, sender, ri, M, m in _reads(nd, src):
        chains[sender].readers.append((chains[reader], ri, M, m))
    settled = _sweeps([ch for ch in chains if ch.n], post)
    for ch in chains:       # the chains read each other: free them without the cycle collector
        ch.readers.clear()
    if not settled:
        return None
    out = np.empty(N)                # every class's ends without its leading 0
    for c, (a, b) in enumerate(zip(nd.off[:-1].tolist(), nd.off[1:].tolist())):
        out[a:b] = ends[a + c + 1:b + c + 1]
    return out, post


def _sweeps(chains: list, post: np.ndarray) -> bool:
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


class _Chain:
    """One class's solvable prefix as a max-plus chain, and the window (``lo``..``hi``,
    local step indices) of the steps whose received messages changed since its last solve.
    Its arrays are views of the solver's, indexed by the class's step."""

    def __init__(self, nd: Nodes, c: int, arrays: tuple, scratch: tuple):
        src, ends, rm, post, P, lag, AmE, late, Ee = arrays
        a, b = int(nd.off[c]), int(nd.lim[c])
        self.n = b - a
        self.sc = src[a:b]
        self.endz = ends[a + c:b + c + 1]   # endz[j]: the end of step j - 1 (0 before the first)
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
        prev = rm[lo - 1] if lo > 0 else 0.0
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


def _reads(nd: Nodes, src: np.ndarray) -> list[tuple]:
    """Which class reads which: per reader class and each class it reads from (``src``:
    the node each node reads, ``N`` for none), ``(reader, sender, *_window_map(...))`` of
    the reader's solvable steps that receive the sender's messages."""
    C = len(nd.off) - 1
    sender = np.append(nd.cls, C).take(src, mode="clip")   # each node's message's class, or C
    out = []
    for c, (a, b) in enumerate(zip(nd.off[:-1].tolist(), nd.lim.tolist())):
        of = sender[a:b]
        for s in np.bincount(of, minlength=C + 1)[:C].nonzero()[0].tolist():
            ri = np.flatnonzero(of == s)
            out.append((c, s, *_window_map(ri, src[a:b][ri] - int(nd.off[s]))))
    return out


def _window_map(ri: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, ...]:
    """For a reader's steps ``ri`` that read a sender's steps ``pos``: (``ri``, the running
    maximum and the suffix minimum of ``pos``), so that the reader's steps reading sender
    steps ``g0``..``g1`` lie between ``ri[searchsorted(M, g0)]`` and
    ``ri[searchsorted(m, g1, 'right') - 1]``."""
    if (pos[1:] >= pos[:-1]).all():   # read in the sender's order (as pipelines do)
        return ri, pos, pos
    return ri, np.maximum.accumulate(pos), np.minimum.accumulate(pos[::-1])[::-1]
