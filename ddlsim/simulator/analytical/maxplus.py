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

A step is scalar when its block has at most one recv (without deps) and at most one send
(after compute-stream instructions only), no collective across classes, no wait on the
compute stream, and no compute-stream instruction waiting for another stream. Instructions on
other streams (gradient buckets hanging off the backward) may be present: they cannot change
the compute stream, so they are replayed by the scheduler afterwards, in step order.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import numpy as np

from ..timing import NOT_COMM
from .instructions import COLL, COMPUTE, RECV, SEND, WAIT, Instr

__all__ = ["Summary", "summarise", "MAX_SWEEPS"]

#: Sweeps of one prefix after which the solver gives up (the scheduler then times every step).
MAX_SWEEPS = 256
#: The prefixes settled one after the other (steps per class) before every step: a short
#: one holds a deep pipeline's warm-up (64: fastest on the 32-stage plan of
#: ``benchmarks/analytical_speed.py`` of 32, 48, 64, 96 and 128, and faster there than
#: prefixes growing ×4 or ×8).
PREFIXES = (64,)


class Summary(NamedTuple):
    """A scalar step's max-plus form and its accounting (see the module docstring).

    ``E`` is the compute-stream seconds up to and including the send's last dep, ``after``
    whether that dep comes after the first instruction waiting for the message; ``exposed``
    and ``nbytes`` are (label, seconds or bytes) pairs; ``side``: the block also uses other
    streams (replayed by the scheduler, which then does its accounting).
    """

    A: float
    F: float
    waits: bool
    recv: Instr | None
    send: Instr | None
    E: float
    after: bool
    side: bool
    compute: float
    optimizer: float
    flops: float
    exposed: tuple[tuple[str, float], ...]
    nbytes: tuple[tuple[str, float], ...]
    blocking: bool = False


def closed_streams(programs: list) -> frozenset[int]:
    """Streams every block drains itself: wherever one is used, its ops are class-local
    collectives, compute ops or waits, and a compute-stream wait for it follows its last op
    in the block (the TP overlaps of ``ddlsim.workloads.decoder.tp_overlap``). Such a stream
    is free when each block begins, so a block using it is still a max-plus affine map of the
    compute stream (:func:`summarise`)."""
    used: set[int] = set()
    bad: set[int] = set()
    seen: set[int] = set()
    for p in programs:
        for instrs, shape in zip(p.blocks, p.shapes):
            if shape in seen:   # blocks of one shape differ only in p2p peers and times
                continue
            seen.add(shape)
            pending: set[int] = set()   # streams with ops not yet waited for
            for x in instrs:
                sid = x.stream
                if sid == 0:
                    if x.code == WAIT:
                        pending.discard(x.target)
                    continue
                used.add(sid)
                if x.code == SEND or x.code == RECV or x.group is not None:
                    bad.add(sid)
                pending.add(sid)
            bad |= pending
    return frozenset(used - bad)


def _volume(instrs: tuple[Instr, ...]) -> tuple[float, dict[str, float]] | None:
    """A block's FLOPs and communication bytes by label (collectives and sends), or None
    when a collective meets other classes (such a block is never scalar)."""
    flops = 0.0
    nbytes: dict[str, float] = defaultdict(float)
    for x in instrs:
        if x.group is not None:
            return None
        if x.code == COMPUTE:
            flops += x.flops
        elif x.code == COLL or x.code == SEND:
            nbytes[x.label] += x.nbytes
    return flops, nbytes


def summarise(instrs: tuple[Instr, ...], closed: frozenset[int] = frozenset()) -> Summary | None:
    """The max-plus form of a block, or None when it is not scalar.

    Ops on a ``closed`` stream (:func:`closed_streams`) and the compute stream's waits for
    them are timed here, by the timing rule from the block's start, provided they all come
    after the first instruction that waits for the block's received message (if any): the
    rest of the block then runs rigidly from that instruction's start, and ``A`` is the
    compute stream's end with the waits' gaps, booked as exposed communication of the
    awaited stream's last collective as the scheduler books them. Every instruction of the
    compute stream and of the closed streams is timed by the timing rule from the block's
    start, all streams free at 0; with no closed stream, ``A`` is the sum of the compute
    stream's durations."""
    recvs = [i for i, x in enumerate(instrs) if x.code == RECV]
    sends = [i for i, x in enumerate(instrs) if x.code == SEND]
    # a blocking receive: posted after a wait on the compute stream that opens the block,
    # i.e. when the compute stream is free (the step's f); see :func:`nodes`
    opens = bool(instrs) and instrs[0].code == WAIT and instrs[0].stream == 0 \
        and instrs[0].target == 0 and not instrs[0].deps
    blocking = bool(recvs) and opens and instrs[recvs[0]].deps == (0,)
    if len(recvs) > 1 or len(sends) > 1 or (recvs and instrs[recvs[0]].deps and not blocking):
        return None
    volume = _volume(instrs)
    if volume is None:
        return None
    r = recvs[0] if recvs else -1
    send = instrs[sends[0]] if sends else None
    # (end, label, duration) of each timed instruction, as the scheduler's ``loc``
    loc: dict[int, tuple[float, str, float]] = {0: (0.0, "", 0.0)} if blocking else {}
    free: dict[int, float] = dict.fromkeys(closed, 0.0)
    last_kind: dict[int, str] = dict.fromkeys(closed, "")
    t0 = F = 0.0
    first_wait = -1
    side = False
    compute = optimizer = 0.0
    exposed: dict[str, float] = defaultdict(float)
    for i, x in enumerate(instrs):
        if x.code == SEND or x.code == RECV:
            continue
        if x.stream != 0 and x.stream not in closed:
            side = True
            continue
        if x.stream in closed and first_wait < 0 and r >= 0:
            return None   # issued before the message is waited for: not rigid after it
        ready, why, why_dur = 0.0, "", 0.0
        for d in x.deps:
            if d == r:
                continue
            e = loc.get(d)
            if e is None:
                return None
            if e[0] > ready:
                ready, why, why_dur = e
        if x.stream == 0 and first_wait < 0 and r >= 0 and r in x.deps:
            first_wait, F = i, max(t0, ready)
        if x.code == WAIT:
            if i == 0 and blocking:   # the blocking receive's anchor: the step's own f
                continue
            if x.target == 0:
                if x.stream == 0:
                    return None
                target_free, kind = t0, "compute"
            elif x.target in closed:
                if first_wait < 0 and r >= 0:
                    return None
                target_free, kind = free[x.target], last_kind[x.target]
            else:
                return None
            if target_free > ready:
                ready, why, why_dur = target_free, kind, float("inf")
        f = t0 if x.stream == 0 else free[x.stream]
        if ready > f:
            if x.stream == 0:
                gap = ready - f
                exp = gap if why_dur >= gap else why_dur
                if exp > 0 and why not in NOT_COMM:
                    exposed[why] += exp
                    gap -= exp
                if gap > 0:
                    return None   # a bubble inside the block: left to the scheduler
            f = ready
        end = f + x.dur
        if x.stream == 0:
            t0 = end
            if x.code == COLL:
                exposed[x.label] += x.dur
            elif x.code == COMPUTE:
                if x.label == "optimizer":
                    optimizer += x.dur
                else:
                    compute += x.dur
        else:
            free[x.stream] = end
            if x.code == COLL:
                last_kind[x.stream] = x.label
        loc[i] = (end, x.label, x.dur)
    if any(v > t0 for v in free.values()):
        return None
    if send is not None and (not send.deps or any(d not in loc for d in send.deps)):
        return None
    last = max(send.deps) if send is not None else -1
    E = max(loc[d][0] for d in send.deps) if send is not None else 0.0
    return Summary(t0, F if first_wait >= 0 else t0, first_wait >= 0,
                   instrs[r] if r >= 0 else None, send, E,
                   0 <= first_wait <= last, side, compute, optimizer, volume[0],
                   tuple(exposed.items()), tuple(volume[1].items()), blocking)


class Nodes(NamedTuple):
    """Every step of every class as one flat array (class-major), up to each class's
    solvable prefix: ``lim[c]`` (absolute index) ends class ``c``'s."""

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


def nodes(programs: list) -> Nodes | None:
    """The nodes of every class's solvable prefix, or None when there is nothing to solve."""
    C = len(programs)
    NB = max((len(p.blocks) for p in programs), default=0)
    summaries: list[Summary | None] = [None] * (C * NB)
    msgs: dict[tuple, int] = {}
    sent_t = np.full(C * NB, -1, dtype=np.int64)
    recv_t = np.full(C * NB, -1, dtype=np.int64)
    cache: dict[tuple, Summary | None] = {}
    closed = closed_streams(programs)
    for c, p in enumerate(programs):
        for b, (instrs, shape) in enumerate(zip(p.blocks, p.shapes)):
            s = summaries[c * NB + b] = _summary(instrs, shape, cache, closed)
            if s is None:
                continue
            if s.send is not None:
                dest, tag = s.send.peer
                sent_t[c * NB + b] = msgs.setdefault((c, dest, tag), len(msgs))
            if s.recv is not None:
                srcc, tag = s.recv.peer
                recv_t[c * NB + b] = msgs.setdefault((srcc, c, tag), len(msgs))
                if srcc == c:
                    summaries[c * NB + b] = None
    lens = np.array([len(p.block) for p in programs], dtype=np.int64)
    off = np.concatenate([[0], np.cumsum(lens)])
    N = int(off[-1])
    if N == 0:
        return None
    cls = np.repeat(np.arange(C), lens)
    mb = np.concatenate([p.microbatch for p in programs]).astype(np.int64)
    key = cls * NB + np.concatenate([p.block for p in programs])
    ok = np.array([s is not None for s in summaries])[key]
    sent, got = sent_t[key], recv_t[key]
    mb = mb - mb.min()          # message slots: (message, micro-batch) → node
    M = int(mb.max()) + 1
    sending = np.flatnonzero(ok & (sent >= 0))
    slot = sent[sending] * M + mb[sending]
    where = np.full(max(1, len(msgs)) * M, -1, dtype=np.int64)
    where[slot] = sending
    if not np.array_equal(where[slot], sending):   # a message posted twice: not solved
        return None
    need = ok & (got >= 0)
    src = np.where(need, where[np.maximum(got, 0) * M + mb], -1)
    # each class's prefix ends at its first unsolvable step or at a step whose message is
    # sent beyond its sender's prefix
    lim = _prefix(off, np.flatnonzero(~ok | (need & (src < 0))))
    while True:
        beyond = need & (src >= 0) & (np.arange(N) < lim[cls]) & (src >= lim[cls[np.maximum(src, 0)]])
        if not beyond.any():
            break
        lim = np.minimum(lim, _prefix(off, np.flatnonzero(beyond)))
    table = np.array([(s.A, s.F, s.waits, s.E, s.after,
                        s.send.dur if s.send is not None else 0.0, s.blocking)
                      for s in map(_or_none, summaries)])
    A, F, waits, E, after, send_dur, blocking = np.take(np.ascontiguousarray(table.T), key,
                                                        axis=1)
    t = np.where(src >= 0, send_dur[np.maximum(src, 0)], 0.0)
    # a blocking receive's transfer starts at max(f, posted): the step is the scalar map of
    # A' = A + max(0, t − F), F' = max(F, t) (the sends after the message shift alike)
    blocking = (blocking > 0) & (src >= 0)
    extra = np.where(blocking, np.maximum(0.0, t - F), 0.0)
    E = np.where(blocking & (after > 0), E + extra, E)
    F0 = F
    A, F = A + extra, np.where(blocking, np.maximum(F, t), F)
    return Nodes(off, lim, cls, key, src, summaries, A, F, waits.astype(bool), E,
                 after.astype(bool), t, blocking, F0)


_NONE = Summary(0.0, 0.0, False, None, None, 0.0, False, False, 0.0, 0.0, 0.0, (), (), False)


def _or_none(s: Summary | None) -> Summary:
    return _NONE if s is None else s


def _summary(instrs: tuple[Instr, ...], shape: int, cache: dict,
             closed: frozenset[int] = frozenset()) -> Summary | None:
    """:func:`summarise`, once per block shape (blocks that differ only in their
    point-to-point peers and transfer times, one per pipeline stage, share the work)."""
    hit = cache.get(shape)
    if hit is None:
        s = summarise(instrs, closed)
        where = (-1, -1) if s is None else tuple(
            next((i for i, x in enumerate(instrs) if x.code == code), -1) for code in (RECV, SEND))
        hit = cache[shape] = (s, where)
    s, (r, snd) = hit
    if s is None or (r < 0 and snd < 0):
        return s
    return Summary(s[0], s[1], s[2], instrs[r] if r >= 0 else None,   # (faster than _replace)
                   instrs[snd] if snd >= 0 else None, *s[5:])


def _prefix(off: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """Per class, the absolute index of its first node listed in ``bad`` (its end if none)."""
    first = np.searchsorted(bad, off[:-1])
    return np.minimum(np.append(bad, off[-1])[first], off[1:])


def solve(nd: Nodes) -> tuple[np.ndarray, np.ndarray] | None:
    """(end of each node's compute stream, when each posts its message) over the prefixes,
    or None when the sweeps do not settle.

    A send after the instruction waiting for the message (or in a step without one) is
    posted ``A - E`` before the step ends; one before it, ``E`` after the step starts.
    A class is re-solved only over the window of steps whose received messages changed
    since its last solve (:class:`_Chain`); the values are those of a full re-solve.
    """
    N = len(nd.cls)
    C = len(nd.off) - 1
    live = np.arange(N) < nd.lim[nd.cls]
    if not ((nd.A > 0) & (~nd.waits | (nd.t + nd.A - nd.F > 0)))[live].all():
        return None               # a zero-length node: cycles could settle; not solved
    ends = np.zeros(N)
    rm = np.zeros(N)                 # per class, the running maximum of ``ends - P``
    post = np.full(N + 1, -np.inf)   # post[-1]: the message of nodes that receive none
    src = np.where(nd.src >= 0, nd.src, N)
    early = nd.waits & ~nd.after
    arrival = nd.t + np.where(nd.waits, nd.A - nd.F, -np.inf)   # post → step end (or none)
    chains = [_Chain(nd, c, src, early, arrival) for c in range(C)]
    sender = np.append(nd.cls, C)[src]           # the class of each node's message, or C
    for ch in chains:
        of = sender[ch.a:ch.b]
        for s in np.bincount(of, minlength=C + 1)[:C].nonzero()[0].tolist():
            chains[s].readers.append((ch, *_window_map(ch.sc, of == s, int(nd.off[s]))))
    order = ([ch for ch in chains if ch.b > ch.a],)
    order += (order[0][::-1],)
    longest = max((ch.b - ch.a for ch in order[0]), default=0)
    for W in [w for w in PREFIXES if w < longest] + [longest]:
        for ch in order[0]:
            ch.grow(W)
        for sweep in range(MAX_SWEEPS):
            changed = False
            for ch in order[sweep & 1]:
                if ch.lo <= ch.hi and ch.run(post, ends, rm):
                    changed = True
            if not changed:
                break
        else:
            return None
    return ends, post[:N]


class _Chain:
    """One class's solvable prefix as a max-plus chain, and the window (``lo``..``hi``,
    local step indices) of the steps whose received messages changed since its last solve."""

    def __init__(self, nd: Nodes, c: int, src: np.ndarray, early: np.ndarray,
                 arrival: np.ndarray):
        a, b = self.a, self.b = int(nd.off[c]), int(nd.lim[c])
        self.sc = src[a:b]
        self.P = np.cumsum(nd.A[a:b])
        self.lag = arrival[a:b] - self.P
        self.AmE = nd.A[a:b] - nd.E[a:b]
        self.late = np.flatnonzero(early[a:b])
        self.Ee = nd.E[a:b][self.late]
        self.lo, self.hi, self.cur = b - a, -1, a
        self.readers: list = []

    def grow(self, W: int) -> None:
        """Extend the solved prefix to the first ``W`` steps (the new ones join the window)."""
        new = min(self.b, self.a + W)
        if new > self.cur:
            self.lo, self.hi = min(self.lo, self.cur - self.a), max(self.hi, new - self.a - 1)
            self.cur = new

    def run(self, post: np.ndarray, ends: np.ndarray, rm: np.ndarray) -> bool:
        """Re-solve the window (and the steps after it whose running maximum it raises);
        widen the windows of the classes reading the messages that changed. Whether any
        did."""
        a, lo, L = self.a, self.lo, self.cur - self.a
        hi = min(self.hi, L - 1)
        self.lo, self.hi = self.b - a, -1
        if lo > hi:
            return False
        prev = rm[a + lo - 1] if lo > 0 else 0.0
        while True:
            x = post.take(self.sc[lo:hi + 1], mode="clip")
            x += self.lag[lo:hi + 1]     # message arrival + what follows it, - P
            if x[0] < prev:              # max(stream free, running max): a full sweep's value
                x[0] = prev
            np.maximum.accumulate(x, out=x)
            v, k = x[-1], hi + 1
            if k == L or v == rm[a + hi]:
                break
            if v > rm[a + hi]:           # later steps whose running maximum was below v take v
                k += int(rm[a + k:a + L].searchsorted(v))
                rm[a + hi + 1:a + k] = v
                break
            hi = L - 1                   # lower (never, from lower bounds): redo to the end
        rm[a + lo:a + hi + 1] = x
        K = min(k + 1, L)            # a send posted early reads the previous step's end
        e = ends[a + lo:a + K]
        np.add(rm[a + lo:a + K], self.P[lo:K], out=e)
        new = e - self.AmE[lo:K]
        if len(self.late):           # posted before the wait: previous end + E
            l0, l1 = self.late.searchsorted((lo, K)).tolist()
            li = self.late[l0:l1]
            new[li - lo] = np.where(li > 0, ends[a + np.maximum(li - 1, 0)], 0.0) + self.Ee[l0:l1]
        old = post[a + lo:a + K]
        diff = (new != old).nonzero()[0]
        if not len(diff):
            return False
        old[:] = new
        g0, g1 = lo + int(diff[0]), lo + int(diff[-1])
        for r, ri, M, m in self.readers:
            i = int(M.searchsorted(g0))
            j = int(m.searchsorted(g1, side="right")) - 1
            if i <= j:
                r.lo, r.hi = min(r.lo, int(ri[i])), max(r.hi, int(ri[j]))
        return True


def _window_map(sc: np.ndarray, mine: np.ndarray, a: int) -> tuple[np.ndarray, ...]:
    """For a reader's sources ``sc`` of which ``mine`` come from the sender whose nodes start
    at ``a``: (the reader's steps that read the sender, the running maximum and the suffix
    minimum of the sender steps they read), so that the reader's steps reading sender steps
    ``g0``..``g1`` lie between ``ri[searchsorted(M, g0)]`` and
    ``ri[searchsorted(m, g1, 'right') - 1]``."""
    ri = np.flatnonzero(mine)
    pos = sc[ri] - a
    if (pos[1:] >= pos[:-1]).all():   # read in the sender's order (as pipelines do)
        return ri, pos, pos
    return ri, np.maximum.accumulate(pos), np.minimum.accumulate(pos[::-1])[::-1]
