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
settle the first ``PREFIXES[0]`` steps of every class (:mod:`.chains`), then the first
``PREFIXES[1]``, …, then all: the pipeline's warm-up settles on short arrays, and the steady
state that follows, whose steps the compute stream binds, settles in a few sweeps of windows.

A class's window need not start at its first step (:func:`window`): from ``start`` with its
compute stream free at ``f0``, the recurrence starts from ``f0`` instead of 0, and a message
sent before every window is read at the time it was posted (:func:`solve`'s ``posts``). The
engine alternates the scheduler and such windows (:mod:`.rounds`).

Which steps are scalar, and their summaries: :mod:`.summaries`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .chains import Chain, reads, sweeps
from .summaries import Summary, closed_streams, shape_summary, summarise

__all__ = ["Summary", "summarise", "closed_streams", "Nodes", "nodes", "unsolvable", "window",
           "solve"]

class Nodes(NamedTuple):
    """Every step of every class as one flat array (class-major), and each class's window
    (:func:`window`): from ``start[c]`` to ``lim[c]`` (absolute indices), ``live`` marking
    the nodes of the windows."""

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
    live: np.ndarray         # the node lies in its class's window
    flags: np.ndarray        # its block's bits (WAITS, AFTER, BLOCKING, NONE, SIDE, SENDS,
                             # RECEIVES)
    start: np.ndarray | None = None   # each class's window start (None: its first step)


def nodes(programs: list) -> Nodes | None:
    """The nodes of every step of every class, no window open yet (:func:`window` opens
    them), or None when there is nothing to solve."""
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
    return Nodes(off, off[:-1].copy(), cls, key, src, summaries, A, F, waits, E, after, t,
                 blocking, F0, np.zeros(N, dtype=bool), flags)


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


def _limits(off: np.ndarray, flags: np.ndarray, src: np.ndarray,
            start: np.ndarray | None = None,
            known=None) -> tuple[np.ndarray, np.ndarray]:
    """(each class's window end, whether each node lies in its class's window). A window
    runs from ``start[c]`` (default: the class's first step) to its first unsolvable step
    (``NONE`` among its ``flags``: no summary), its first step whose message is not sent by
    a solvable step, or its first step whose message is sent outside the sender's window
    (``src``: the node whose message each node receives, -1 for none) unless ``known``
    (called with such nodes, a mask) says the message was posted already."""
    first = off[:-1] if start is None else start
    receives = src >= 0
    lim = _prefix(first, off, np.flatnonzero(unsolvable(flags, src)))
    while True:
        past = np.ones(len(src), dtype=bool)      # beyond its class's window
        for a, b in zip(first.tolist(), lim.tolist()):
            past[a:b] = False
        beyond = past.take(src, mode="wrap")      # (src -1 reads the last node: masked)
        beyond &= receives
        beyond &= ~past
        bad = np.flatnonzero(beyond)
        if len(bad) and known is not None:
            bad = bad[~known(bad)]
        if not len(bad):
            return lim, ~past
        lim = np.minimum(lim, _prefix(first, off, bad))


def unsolvable(flags: np.ndarray, src: np.ndarray) -> np.ndarray:
    """Per node, whether no window can hold it whatever is posted: its step has no summary
    (``NONE``), or it receives a message no solvable step sends (``src`` -1)."""
    return (flags & NONE > 0) | ((flags & RECEIVES > 0) & (src < 0))


def window(nd: Nodes, start: np.ndarray, known=None) -> Nodes:
    """``nd`` with each class's window from ``start[c]`` (absolute; ``off[c + 1]``: none) as
    :func:`_limits` ends it, ``known(nodes)`` marking the nodes whose message, sent
    outside every window, was posted already."""
    lim, live = _limits(nd.off, nd.flags, nd.src, start, known)
    return nd._replace(lim=lim, live=live, start=start)


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


def _prefix(first: np.ndarray, off: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """Per class, the absolute index of its first node at or after ``first[c]`` listed in
    ``bad`` (its end if none)."""
    i = np.searchsorted(bad, first)
    return np.minimum(np.append(bad, off[-1])[i], off[1:])


def solve(nd: Nodes, f0: np.ndarray | None = None,
          posts: tuple[np.ndarray, np.ndarray] | None = None
          ) -> tuple[np.ndarray, np.ndarray] | None:
    """(end of each node's compute stream, when each posts its message, with ``-inf`` after
    the last node: ``post[nd.src]`` is when a node's message was posted, ``-inf`` for none)
    over the windows, or None when the sweeps do not settle.

    ``f0``: per class, when its compute stream is free before its window (default 0);
    ``posts``: (nodes, times) of the messages sent before the windows that they read.
    A send after the instruction waiting for the message (or in a step without one) is
    posted ``A - E`` before the step ends; one before it, ``E`` after the step starts.
    A class is re-solved only over the window of steps whose received messages changed
    since its last solve (:class:`.chains.Chain`); the values are those of a full re-solve.
    """
    N = len(nd.cls)
    C = len(nd.off) - 1
    start = nd.off[:-1] if nd.start is None else nd.start
    if not ((nd.A > 0) & (~nd.waits | (nd.t + nd.A - nd.F > 0)) | ~nd.live).all():
        return None               # a zero-length node: cycles could settle; not solved
    # every class's ends after its window's f0 (the end before its first step): its step j
    # reads j
    ends = np.zeros(N + C)
    rm = np.zeros(N)                 # per class, the running maximum of ``ends - P``
    post = np.full(N + 1, -np.inf)   # post[-1]: the message of nodes that receive none
    if posts is not None:
        post[posts[0]] = posts[1]
    src = nd.src.copy()
    np.copyto(src, N, where=src < 0)
    P = np.zeros(N)
    for a, b in zip(start.tolist(), nd.lim.tolist()):
        np.cumsum(nd.A[a:b], out=P[a:b])
    lag = nd.A - nd.F                # post → step end: t + A - F (-inf: no wait)
    np.copyto(lag, -np.inf, where=~nd.waits)
    lag += nd.t
    lag -= P
    late = np.flatnonzero(nd.waits & ~nd.after & nd.live)  # posted before the message
    arrays = (src, ends, rm, post, P, lag, nd.A - nd.E, late, nd.E[late])
    longest = int((nd.lim - start).max())
    scratch = (np.empty(longest), np.empty(longest, dtype=bool))
    f0 = np.zeros(C) if f0 is None else f0
    chains = [Chain(nd, c, int(start[c]), float(f0[c]), arrays, scratch) for c in range(C)]
    for reader, sender, ri, M, m in reads(nd, src, start):
        chains[sender].readers.append((chains[reader], ri, M, m))
    settled = sweeps([ch for ch in chains if ch.n], post)
    for ch in chains:       # the chains read each other: free them without the cycle collector
        ch.readers.clear()
    if not settled:
        return None
    out = np.empty(N)                # every class's ends without its leading slot
    for c, (a, b) in enumerate(zip(nd.off[:-1].tolist(), nd.off[1:].tolist())):
        out[a:b] = ends[a + c + 1:b + c + 1]
    return out, post
