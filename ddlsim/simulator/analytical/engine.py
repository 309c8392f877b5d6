"""The analytical engine: a contention-free list scheduler over the workload trace.

Every op gets its closed-form duration from :class:`~ddlsim.simulator.costs.CostModel`
(:mod:`.instructions`); the engine then times the program exactly as the trace semantics say
(streams in issue order, dependencies, collective rendezvous across rank classes,
point-to-point matching; :mod:`.interpreter`), so pipeline schedules are timed step by step
rather than by the bubble formula, and gradient buckets overlap backward as their
dependencies allow. One representative rank per class is simulated.

The leading scalar steps of every class (:mod:`.maxplus`) are timed first, all at once, by
the max-plus recurrence they obey, vectorised over steps; the scheduler replays the ones that
also use other streams and times the rest. Both apply the one timing rule and gap attribution
of :mod:`ddlsim.simulator.timing`: idle time on a class's compute stream waiting for a
received activation counts as exposed ``pp`` communication up to the transfer's duration and
as pipeline bubble beyond it; waiting on a communication stream (DDP buckets, ZeRO prefetch)
counts as exposed communication of that group's kind; waiting for peers at a collective
counts as bubble (load imbalance).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ...errors import DeadlockError
from ...workloads.trace import Workload
from ..costs import CostModel
from ..result import ClassTiming, EngineRun
from ..timing import split_gaps, stream_kinds
from . import maxplus
from .instructions import lower
from .interpreter import State, run_class, run_step

__all__ = ["simulate_analytical", "ClassTiming"]

#: Time the leading scalar steps with the vectorised max-plus solver (False: the scheduler
#: times every step; tests compare the two).
SOLVER = True


def simulate_analytical(workload: Workload, cost: CostModel, *,
                        record_spans: bool = False) -> EngineRun:
    """Time every rank class; raises :class:`DeadlockError` if the program cannot finish.

    Parameters
    ----------
    workload : the trace of one iteration.
    cost : the closed-form durations of its ops.
    record_spans : also return the spans of each class's representative (first) rank, as
        the engine times them (same timings: recording only observes).

    Returns
    -------
    EngineRun
        ``timings``: one :class:`ClassTiming` per class, in ``workload.classes`` order
        (``end`` in seconds); ``algorithms``: the collective choices of the ops it timed
        (:meth:`~ddlsim.simulator.costs.CostModel.choice` key → label); with ``record_spans``,
        ``spans``: :class:`~ddlsim.simulator.result.Span` sorted by rank, stream and start.
    """
    from ..hostcollectives import on_compute_cores
    workload = on_compute_cores(workload, cost.system)  # a CPU rank's collectives: its cores
    programs, streams, choices = lower(workload, cost)
    st = State(len(programs), len(streams), stream_kinds(streams))
    if record_spans:
        from .spans import SpanRecorder
        st.rec = SpanRecorder(len(programs))
    if SOLVER:
        _solve_prefix(programs, st)
    done = [False] * len(programs)
    queue = deque(range(len(programs)))
    queued = [True] * len(programs)
    while queue:
        ci = queue.popleft()
        queued[ci] = False
        done[ci] = run_class(ci, programs[ci], st)
        for w in st.woken:
            if not queued[w] and not done[w]:
                queued[w] = True
                queue.append(w)
        st.woken.clear()
    if not all(done):
        from .deadlock import describe_deadlock
        raise DeadlockError(describe_deadlock(workload, programs, st, done))
    spans = st.rec.spans(workload, streams) if st.rec is not None else ()
    return EngineRun(st.timings, choices, spans)


def _solve_prefix(programs: list, st: State) -> None:
    """Time every class's solvable prefix with :func:`maxplus.solve` and leave the state as
    the scheduler would have left it there: accounting, streams, positions, posted sends."""
    nd = maxplus.nodes(programs)
    if nd is None:
        return
    solved = maxplus.solve(nd)
    if solved is None:
        return
    ends, post = solved
    C = len(programs)
    sent = post.take(nd.src, mode="wrap")    # message posted at (-inf: none; -1 wraps)
    prev = np.empty_like(ends)               # the compute stream free before each node
    prev[0], prev[1:] = 0.0, ends[:-1]
    prev[nd.off[:-1][nd.off[:-1] < len(ends)]] = 0.0
    side = nd.flags & maxplus.SIDE > 0
    _account(nd, st, nd.live & ~side, prev, sent + nd.t)
    replay = nd.live & (side | (st.rec is not None))
    scratch = State(0, 0)   # the replays' own messages
    scratch.rec = st.rec
    for n in np.flatnonzero(replay).tolist():
        _replay(programs, nd, st, n, float(prev[n]), float(sent[n]), side[n], scratch)
    for c in range(C):
        a, b = int(nd.off[c]), int(nd.lim[c])
        st.pos[c] = [b - a, 0]
        if b > a:
            st.free[c][0] = float(ends[b - 1])
    _post_unread(programs, nd, st, post)


def _post_unread(programs: list, nd: maxplus.Nodes, st: State, post: np.ndarray) -> None:
    """Post the solved sends no solved recv consumed: the scheduler's recvs will find them."""
    consumed = np.zeros(len(nd.cls) + 1, dtype=bool)   # (the last: src -1, none)
    consumed[nd.src[nd.live]] = True
    has_send = nd.flags & maxplus.SENDS > 0
    for n in np.flatnonzero(nd.live & has_send & ~consumed[:-1]).tolist():
        c = int(nd.cls[n])
        s = nd.summaries[int(nd.key[n])]
        mb = int(programs[c].microbatch[n - int(nd.off[c])])
        st.posted[(s.send.peer[0], c, s.send.peer[1], mb)] = (float(post[n]), s.send.dur)


def _account(nd: maxplus.Nodes, st: State, mine: np.ndarray, prev: np.ndarray,
             arrive: np.ndarray) -> None:
    """Book the nodes ``mine``: their blocks' accounting once per block and class, and the
    compute-stream gap before the instruction waiting for the message (exposed up to the
    transfer, the rest bubble: :func:`ddlsim.simulator.timing.attribute_gap`)."""
    C = len(nd.off) - 1
    NB = len(nd.summaries) // C
    K = len(nd.summaries)   # (every node's key, less the few that are not ``mine``)
    counts = (np.bincount(nd.key, minlength=K)
              - np.bincount(nd.key[np.flatnonzero(~mine)], minlength=K)).tolist()
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
