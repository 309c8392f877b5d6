"""The list scheduler: one representative rank per class runs its instructions in issue order.

Each instruction is timed by the shared rule (:mod:`ddlsim.simulator.timing`): it starts when
its stream is free and its deps have ended, a wait when the awaited stream is free, a
collective across classes when every class of its group has arrived (the last arrival), a
recv when the matching send has been posted (plus the transfer). A class that reaches a recv
whose send is not posted yet, or a collective some class has not reached, sleeps until the
send or the last arrival happens; classes are resumed first in, first out, so the order is
deterministic.
"""

from __future__ import annotations

import math
from collections import defaultdict

from ..result import ClassTiming
from ..timing import attribute_gap, book, finish_class
from .instructions import COLL, COMPUTE, RECV, SEND, WAIT, Instr, Program

__all__ = ["State", "run_class", "run_step", "block_booking"]

_INF = math.inf


class State:
    """What the scheduler keeps between resumptions of the classes."""

    def __init__(self, n_cls: int, n_streams: int, kinds: dict[int, str] | None = None):
        self.free = [[0.0] * n_streams for _ in range(n_cls)]
        kind = [""] * n_streams   # each stream's last kind (finish_class), the host's preset
        for sid, k in (kinds or {}).items():
            kind[sid] = k
        self.kind = [list(kind) for _ in range(n_cls)]
        self.pos = [[0, 0] for _ in range(n_cls)]            # per class: step, instruction
        self.local: list[list[tuple[float, str, float]]] = [[] for _ in range(n_cls)]
        self.occ = [defaultdict(int) for _ in range(n_cls)]  # collective key → times done
        self.posted: dict[tuple, tuple[float, float]] = {}   # message → (posted at, transfer s)
        self.arrivals: dict[tuple, dict[int, float]] = {}
        self.timings = [ClassTiming() for _ in range(n_cls)]
        self.waiting: dict[tuple, list[int]] = {}            # message or collective → sleepers
        self.woken: list[int] = []
        self.rec = None   # a spans.SpanRecorder when spans are recorded
        self.steps: list = [None] * n_cls   # per class (first, blocks, micro-batches from it)
        #: per class, the steps where it parks for the solver (:mod:`.rounds`; None: never)
        self.park: list[set[int]] | None = None
        self.resumed: list[int] = [-1] * n_cls   # per class, a step it does not park at
        self.parked: list[int] = []              # the classes parked, in order
        #: per block (by ``id`` of its instructions, alive while the programs are), what its
        #: step books: :func:`block_booking`
        self.booked: dict[int, tuple] = {}

    def wake(self, key: tuple) -> None:
        sleepers = self.waiting.pop(key, None)
        if sleepers:
            self.woken.extend(sleepers)


def run_class(ci: int, prog: Program, st: State) -> bool:
    """Advance class ``ci`` until it blocks or parks at a step for the solver (False, the
    latter listed in ``st.parked``) or finishes (True)."""
    si, oi = st.pos[ci]
    n_steps = len(prog.block)
    steps = st.steps[ci]
    if steps is None:   # as lists from the first step run here (the solver ran the rest)
        steps = st.steps[ci] = (si, prog.block[si:].tolist(), prog.microbatch[si:].tolist())
    first, block, mb = steps
    park = st.park[ci] if st.park is not None else ()
    while si < n_steps:
        if oi == 0 and si in park and si != st.resumed[ci]:
            st.pos[ci] = [si, 0]
            st.parked.append(ci)
            return False
        b = block[si - first]
        oi = run_step(ci, prog.blocks[b], mb[si - first], oi, st.free[ci], st.kind[ci],
                      st.timings[ci], st.local[ci], st, (prog.names[b], si))
        if oi >= 0:
            st.pos[ci] = [si, oi]
            return False
        si, oi = si + 1, 0
    st.pos[ci] = [si, 0]
    finish_class(st.timings[ci], st.free[ci], st.kind[ci])
    return True


def block_booking(instrs: tuple[Instr, ...]) -> tuple:
    """What one step of ``instrs`` adds to its class's accumulators whatever its timing: each
    compute op and collective as :func:`~ddlsim.simulator.timing.book` books it, each send's
    bytes; as ``(flops, compute, optimizer, comm_bytes items, exposed items)``. The gaps the
    step waits (:func:`~ddlsim.simulator.timing.attribute_gap`) depend on its timing and are
    booked as they happen."""
    T = ClassTiming()
    for x in instrs:
        if x.code == COMPUTE:
            book(T, x.stream == 0, x.label, True, x.dur, x.flops, 0.0)
        elif x.code == COLL:
            book(T, x.stream == 0, x.label, False, x.dur, 0.0, x.nbytes)
        elif x.code == SEND:
            T.comm_bytes[x.label] += x.nbytes
    return (T.flops, T.compute, T.optimizer, tuple(T.comm_bytes.items()),
            tuple(T.exposed.items()))


def run_step(ci: int, instrs: tuple[Instr, ...], mb: int, oi: int, fr: list[float],
             sk: list[str], T: ClassTiming, loc: list, st: State, where: tuple) -> int:
    """Run one step's block from instruction ``oi``: -1 when done (``loc`` cleared, the
    block's :func:`block_booking` added to ``T``), else the instruction it blocks at (the
    class is put to sleep on what it waits for).

    ``fr``/``sk``: the class's stream free times and last communication kinds; ``loc``: the
    (end, label, duration) of the block's instructions run so far; ``where``: (block name,
    step index) for the span recorder.
    """
    posted, rec = st.posted, st.rec
    n = len(instrs)
    while oi < n:
        code, sid, deps, dur, label, flops, nbytes, peer, group, target = instrs[oi]
        ready, why, why_dur = 0.0, "", 0.0
        for d in deps:
            e = loc[d]
            if e[0] > ready:
                ready, why, why_dur = e
        if code == RECV:
            key = (ci, peer[0], peer[1], mb)
            sent = posted.get(key)
            if sent is None:
                st.waiting.setdefault(key, []).append(ci)
                return oi
            start = sent[0] if sent[0] > ready else ready
            loc.append((start + sent[1], label, sent[1]))
            if rec is not None:
                rec.add(ci, sid, where[0], start, start + sent[1], "recv")
            oi += 1
            continue
        if code == SEND:
            key = (peer[0], ci, peer[1], mb)
            posted[key] = (ready, dur)
            if key in st.waiting:
                st.wake(key)
            loc.append((ready, label, 0.0))
            if rec is not None:
                rec.add(ci, sid, where[0], ready, ready + dur, "send")
            oi += 1
            continue
        if code == WAIT:
            if fr[target] > ready:
                ready, why, why_dur = fr[target], sk[target], _INF
        elif group is not None:
            rv = _rendezvous(ci, group, max(ready, fr[sid]), st)
            if rv is None:
                return oi
            if rv > max(ready, fr[sid]):
                ready, why, why_dur = rv, "bubble", 0.0
        f = fr[sid]
        if ready > f:               # the timing rule: start = max(ready, stream free)
            if sid == 0:
                attribute_gap(T, ready - f, why, why_dur)
            f = ready
        fr[sid] = end = f + dur
        if code == COLL:
            sk[sid] = label
        if rec is not None and code != WAIT:
            rec.add(ci, sid, where[0], f, end, label)
        loc.append((end, label, dur))
        oi += 1
    loc.clear()
    booked = st.booked.get(id(instrs))
    if booked is None:
        booked = st.booked[id(instrs)] = block_booking(instrs)
    flops, compute, optimizer, comm_bytes, exposed = booked
    T.flops += flops
    T.compute += compute
    T.optimizer += optimizer
    for label, v in comm_bytes:
        T.comm_bytes[label] += v
    for label, v in exposed:
        T.exposed[label] += v
    return -1


def _rendezvous(ci: int, group: tuple, mine: float, st: State) -> float | None:
    """The time the last class of ``group`` arrives at this collective, or None when some
    class has not arrived yet (``ci`` sleeps until it does)."""
    key = (group, st.occ[ci][group])
    arr = st.arrivals.setdefault(key, {})
    arr[ci] = mine
    if len(arr) < len(group[1]):
        st.waiting.setdefault(key, []).append(ci)
        return None
    st.wake(key)
    st.occ[ci][group] += 1
    return max(arr.values())
