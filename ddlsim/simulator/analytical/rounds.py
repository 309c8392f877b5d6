"""Windows of scalar steps timed by the max-plus solver between the scheduler's runs.

The scheduler (:mod:`.interpreter`) runs each class until it reaches a *park point*: the
first step of a run of scalar steps (:mod:`.summaries`), the class's first step or a run of
at least :data:`MIN_RUN` steps. When no class can go on without another, the parked classes'
windows are solved at once (:func:`.maxplus.solve`), each from where its compute stream is
free, reading the messages posted before it (``State.posted``); a window ends where a step is
not scalar, or reads a message no window sends and none has posted yet (:func:`.maxplus.
window`). The state is then left as the scheduler would have left it after those steps
(accounting, stream ends, positions, the messages the windows post), and the scheduler goes
on from each window's end. A pipeline whose first step of each stage is not scalar (the
distributed optimizer's parameter gather waited for in the first forward) is thus solved
after it, not left to the scheduler whole.
"""

from __future__ import annotations

import numpy as np

from ..result import ClassTiming
from ..timing import split_gaps
from . import maxplus
from .interpreter import State, run_step

__all__ = ["MIN_RUN", "Rounds"]

#: A run of scalar steps shorter than this (except at a class's first step) is left to the
#: scheduler: a round costs about as much as this many steps run one by one.
MIN_RUN = 8


class Rounds:
    """The solver's side of the engine for ``programs``: park points in ``st.park``, and
    :meth:`solve` for the classes parked there."""

    def __init__(self, programs: list, st: State):
        self.programs = programs
        self.nd = nd = maxplus.nodes(programs)
        if nd is None:
            return
        #: a step the solver can time, its message permitting
        self.ok = ok = ~maxplus.unsolvable(nd.flags, nd.src)
        # per node, the end (absolute, exclusive) of the run of scalar steps it lies in
        N = len(ok)
        stop = np.append(np.flatnonzero(~ok), N)
        self.run_end = np.minimum(stop[np.searchsorted(stop, np.arange(N))],
                                  np.repeat(nd.off[1:], np.diff(nd.off)))
        st.park = [self._points(int(a), int(b)) for a, b in zip(nd.off[:-1], nd.off[1:])]
        st.resumed = [-1] * len(programs)
        # per block key, how long before the step's end each closed stream is free (NaN:
        # unused)
        sids = sorted({sid for s in nd.summaries if s is not None for sid, _ in s.tails})
        self.closed = sids
        self.tails = np.full((len(nd.summaries), len(sids)), np.nan)
        for k, s in enumerate(nd.summaries):
            for sid, t in (s.tails if s is not None else ()):
                self.tails[k, sids.index(sid)] = t

    def _points(self, a: int, b: int) -> set[int]:
        """A class's park points (local step indices): where its runs of scalar steps start,
        the first step, or a run of at least :data:`MIN_RUN`."""
        ok = self.ok[a:b]
        first = np.flatnonzero(ok & ~np.r_[False, ok[:-1]])
        long = (self.run_end[a + first] - (a + first) >= MIN_RUN) | (first == 0)
        return set(first[long].tolist())

    # ------------------------------------------------------------------ a round
    def solve(self, st: State, parked: list[int]) -> None:
        """Solve the windows of the classes ``parked`` (at a step boundary, ``st.pos``) and
        leave ``st`` as the scheduler would; without a solution (the sweeps do not settle),
        park no more: the scheduler runs every step from here."""
        nd, C = self.nd, len(self.programs)
        start = nd.off[1:].copy()    # no window but the parked classes'
        f0 = np.zeros(C)
        for c in parked:
            start[c] = nd.off[c] + st.pos[c][0]
            f0[c] = st.free[c][0]
        w = maxplus.window(nd, start, lambda n: np.array(
            [self._key(x) in st.posted for x in n.tolist()], dtype=bool))
        outside = w.live & (w.src >= 0)
        outside &= ~np.append(w.live, False).take(w.src, mode="clip")
        read = np.flatnonzero(outside)
        posts = (w.src[read], np.array([st.posted[self._key(x)][0] for x in read.tolist()]))
        solved = maxplus.solve(w, f0, posts)
        if solved is None:
            st.park = None
            for c in parked:
                st.resumed[c] = st.pos[c][0]
            return
        ends, post = solved
        prev = np.empty_like(ends)               # the compute stream free before each node
        prev[0], prev[1:] = 0.0, ends[:-1]
        for c in parked:
            if start[c] < len(prev):
                prev[start[c]] = f0[c]
        sent = post.take(w.src, mode="wrap")     # message posted at (-inf: none; -1 wraps)
        side = w.flags & maxplus.SIDE > 0
        _account(w, st, w.live & ~side, prev, sent + w.t)
        replay = w.live & (side | (st.rec is not None))
        scratch = State(0, 0)   # the replays' own messages
        scratch.rec = st.rec
        for n in np.flatnonzero(replay).tolist():
            _replay(self.programs, w, st, n, float(prev[n]), float(sent[n]), side[n], scratch)
        for c in parked:
            self._advance(st, c, int(start[c]), int(w.lim[c]), ends)
        _post_unread(self.programs, w, st, post)

    def _advance(self, st: State, c: int, a: int, b: int, ends: np.ndarray) -> None:
        """Class ``c`` after its window ``a``..``b``: its position, its streams' ends; a
        window its message cut short parks again after the step that reads it."""
        off = int(self.nd.off[c])
        st.pos[c] = [b - off, 0]
        st.resumed[c] = b - off
        if b > a:
            fr = st.free[c]
            fr[0] = float(ends[b - 1])
            tails = self.tails[self.nd.key[a:b]]
            for k, sid in enumerate(self.closed):
                used = np.flatnonzero(~np.isnan(tails[:, k]))
                if len(used):
                    fr[sid] = float(ends[a + used[-1]] - tails[used[-1], k])
        n = b + 1
        if (b < int(self.nd.off[c + 1]) - 1 and self.ok[b] and self.ok[n]
                and self.run_end[n] - n >= MIN_RUN):
            st.park[c].add(n - off)

    def _key(self, n: int) -> tuple:
        """The ``State.posted`` key of the message node ``n`` receives."""
        nd = self.nd
        c = int(nd.cls[n])
        peer = nd.summaries[int(nd.key[n])].recv.peer
        return (c, peer[0], peer[1], int(self.programs[c].microbatch[n - int(nd.off[c])]))


def _post_unread(programs: list, nd: maxplus.Nodes, st: State, post: np.ndarray) -> None:
    """Post the solved sends no solved recv consumed, and wake the classes waiting for
    them: the scheduler's recvs will find them."""
    consumed = np.zeros(len(nd.cls) + 1, dtype=bool)   # (the last: src -1, none)
    consumed[nd.src[nd.live]] = True
    has_send = nd.flags & maxplus.SENDS > 0
    for n in np.flatnonzero(nd.live & has_send & ~consumed[:-1]).tolist():
        c = int(nd.cls[n])
        s = nd.summaries[int(nd.key[n])]
        mb = int(programs[c].microbatch[n - int(nd.off[c])])
        key = (s.send.peer[0], c, s.send.peer[1], mb)
        st.posted[key] = (float(post[n]), s.send.dur)
        if key in st.waiting:
            st.wake(key)


def _account(nd: maxplus.Nodes, st: State, mine: np.ndarray, prev: np.ndarray,
             arrive: np.ndarray) -> None:
    """Book the nodes ``mine``: their blocks' accounting once per block and class, and the
    compute-stream gap before the instruction waiting for the message (exposed up to the
    transfer, the rest bubble: :func:`ddlsim.simulator.timing.attribute_gap`)."""
    C = len(nd.off) - 1
    NB = len(nd.summaries) // C
    K = len(nd.summaries)   # (every node's key, less the few that are not ``mine``)
    counts = np.bincount(nd.key[mine], minlength=K).tolist()
    for k, n in enumerate(counts):
        if n:
            s, T = nd.summaries[k], st.timings[k // NB]
            T.compute += n * s.compute
            T.optimizer += n * s.optimizer
            T.flops += n * s.flops
            for label, v in s.exposed:
                T.exposed[label] += n * v
            for label, v in s.nbytes:
                T.comm_bytes[label] += n * v
    # element-wise over every node (cheaper than gathering the waiting ones first), read at
    # the nodes ``mine`` whose compute stream may wait
    if nd.blocking.any():   # a blocking receive's transfer starts when both the message
        arrive = np.where(nd.blocking, np.maximum(arrive - nd.t, prev) + nd.t, arrive)
    gap = arrive - (prev + nd.F0)             # and the stream are ready
    n = np.flatnonzero(mine & nd.waits & (gap > 0))   # the gaps (zeros would add nothing)
    exp, rest = split_gaps(gap[n], nd.t[n])
    label_of = {}
    lab = np.array([label_of.setdefault(s.recv.label, len(label_of))
                    if s is not None and s.recv is not None else 0
                    for s in nd.summaries], dtype=np.int64)[nd.key[n]]
    L = max(1, len(label_of))
    cls = nd.cls[n]
    bubble = np.bincount(cls, weights=rest, minlength=C)
    exposed = np.bincount(cls * L + lab, weights=exp, minlength=C * L).reshape(C, L)
    names = list(label_of)
    for c in range(C):
        T = st.timings[c]
        T.bubble += float(bubble[c])
        for li, label in enumerate(names):
            if exposed[c, li] > 0:
                T.exposed[label] += float(exposed[c, li])


def _replay(programs: list, nd: maxplus.Nodes, st: State, n: int, start: float,
            sent: float, side: bool, scratch: State) -> None:
    """Run solved node ``n`` through the scheduler from its solved start: for its other
    streams (``side``: booked) or only for its spans (booked nowhere); ``scratch`` holds
    the one message it receives (and those it sends, which nothing reads)."""
    c = int(nd.cls[n])
    j = n - int(nd.off[c])
    prog = programs[c]
    s = nd.summaries[int(nd.key[n])]
    mb = int(prog.microbatch[j])
    scratch.posted.clear()
    if s.recv is not None:
        scratch.posted[(c,) + s.recv.peer + (mb,)] = (sent, float(nd.t[n]))
    fr = st.free[c]
    fr[0] = start
    T = st.timings[c] if side else ClassTiming()
    b = int(prog.block[j])
    run_step(c, prog.blocks[b], mb, 0, fr, st.kind[c], T, [], scratch, (prog.names[b], j))
