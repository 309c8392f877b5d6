"""The analytical engine: a contention-free list scheduler over the workload trace.

Every op gets its closed-form duration from :class:`~ddlsim.simulator.costs.CostModel`; the
engine then times the program exactly as the trace semantics say (streams in issue order,
dependencies, collective rendezvous across rank classes, point-to-point matching), so pipeline
schedules are timed step by step rather than by the bubble formula, and gradient buckets overlap
backward as their dependencies allow. One representative rank per class is simulated.

Idle time on a class's compute stream is attributed to its cause: waiting for a received
activation counts as exposed ``pp`` communication up to the transfer's duration and as
pipeline bubble beyond it; waiting on a communication stream (DDP buckets, ZeRO prefetch)
counts as exposed communication of that group's kind; waiting for peers at a collective counts
as bubble (load imbalance).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from ...errors import DeadlockError
from ...workloads.trace import Collective, Compute, P2P, Wait, Workload
from ..costs import CostModel

__all__ = ["simulate_analytical", "ClassTiming"]

_COMPUTE, _COLL, _SEND, _RECV, _WAIT, _MACRO = range(6)
_INF = math.inf


class ClassTiming:
    """Accumulated times of one rank class."""

    __slots__ = ("end", "compute", "optimizer", "exposed", "bubble", "comm_bytes", "flops")

    def __init__(self) -> None:
        self.end = 0.0
        self.compute = 0.0
        self.optimizer = 0.0
        self.exposed: dict[str, float] = defaultdict(float)
        self.bubble = 0.0
        self.comm_bytes: dict[str, float] = defaultdict(float)
        self.flops = 0.0


class _Groups:
    """Cached group lookups of representative ranks."""

    def __init__(self, workload: Workload):
        self.workload = workload
        self.class_of = workload.class_of()
        self._rows: dict[tuple[str, int], tuple] = {}

    def row(self, group: str, rank: int) -> tuple[tuple[int, ...], int, frozenset]:
        key = (group, rank)
        hit = self._rows.get(key)
        if hit is None:
            members = self.workload.groups[group].members
            g, i = (int(x) for x in np.argwhere(members == rank)[0])
            row = tuple(int(r) for r in members[g])
            hit = (row, i, frozenset(int(c) for c in self.class_of[list(row)]))
            self._rows[key] = hit
        return hit


def _instr(op, rep: int, groups: _Groups, cost: CostModel, streams: dict[str, int]) -> tuple:
    """(code, stream, deps, duration, label, partner, flops, bytes) for one op."""
    p, k = op.payload, op.repeat
    sid = streams.setdefault(op.stream, len(streams))
    if isinstance(p, Compute):
        label = "optimizer" if p.kind == "optimizer" else "compute"
        return (_COMPUTE, sid, op.deps, k * cost.compute(p), label, None, k * p.flops, 0.0)
    if isinstance(p, Collective):
        _, _, partners = groups.row(p.group, rep)
        x = (p.group, partners) if len(partners) > 1 else None
        return (_COLL, sid, op.deps, k * cost.collective(p), cost.kind[p.group], x, 0.0, k * p.bytes)
    if isinstance(p, P2P):
        row, i, _ = groups.row(p.group, rep)
        peer = row[(i + p.peer) % len(row)]
        code = _SEND if p.kind == "send" else _RECV
        return (code, sid, op.deps, cost.p2p(p, rep, peer), cost.kind[p.group],
                (int(groups.class_of[peer]), p.tag), 0.0, p.bytes if code == _SEND else 0.0)
    target = streams.setdefault(p.stream, len(streams))
    return (_WAIT, sid, op.deps, 0.0, "", target, 0.0, 0.0)


def _resolve(workload: Workload, cost: CostModel, streams: dict[str, int]):
    """Per class: the issue-ordered list of (resolved block, micro-batch)."""
    groups = _Groups(workload)
    resolved = []
    for cls in workload.classes:
        rep = cls.ranks[0]
        blocks = {}
        for bname, block in cls.program.blocks.items():
            instrs = [_instr(op, rep, groups, cost, streams) for op in block.ops]
            blocks[bname] = _merge(_share_concurrent(instrs, block.ops))
        resolved.append([(blocks[s.block], s.microbatch) for s in cls.program.steps])
    return resolved


def _merge(instrs: list) -> list:
    """Fuse runs of compute-stream ops that only follow each other into one macro op.

    An op that a later op depends on ends its run, so overlap (DDP buckets after a backward
    segment) is timed exactly. A macro carries its accounting: (compute, optimizer,
    exposed by kind, bytes by kind).
    """
    referenced = {d for ins in instrs for d in ins[2]}
    out: list = []
    remap: dict[int, int] = {}
    run: list | None = None
    start = 0

    def close() -> None:
        nonlocal run
        if run is not None:
            out.append(_macro(run, tuple(sorted({remap[d] for d in run[0][2]}))))
            run = None

    for i, ins in enumerate(instrs):
        fusible = ins[1] == 0 and (ins[0] == _COMPUTE or (ins[0] == _COLL and ins[5] is None))
        if fusible and run is not None and all(d >= start for d in ins[2]):
            run.append(ins)
        else:
            close()
            if fusible:
                run, start = [ins], i
            else:
                out.append(ins[:2] + (tuple(sorted({remap[d] for d in ins[2]})),) + ins[3:])
        remap[i] = len(out) if run is not None else len(out) - 1
        if i in referenced:
            close()
    close()
    return out


def _macro(run: list, deps: tuple) -> tuple:
    compute = optimizer = flops = 0.0
    exposed: dict[str, float] = defaultdict(float)
    nbytes: dict[str, float] = defaultdict(float)
    for code, _, _, dur, label, _, fl, nb in run:
        flops += fl
        if code == _COMPUTE:
            if label == "optimizer":
                optimizer += dur
            else:
                compute += dur
        else:
            exposed[label] += dur
            nbytes[label] += nb
    total = sum(ins[3] for ins in run)
    acct = (compute, optimizer, tuple(exposed.items()), tuple(nbytes.items()))
    return (_MACRO, 0, deps, total, "compute", acct, flops, 0.0)


def _share_concurrent(instrs: list, ops) -> list:
    """Collectives of one group family issued together (same deps) on separate communication
    streams share the same links: each takes k times as long when k run at once (fair
    sharing). The analytical engine cannot see which links they really share; the DES can."""
    together: dict[tuple, list[int]] = defaultdict(list)
    for i, (ins, op) in enumerate(zip(instrs, ops)):
        if ins[0] == _COLL and ins[1] != 0:
            together[(op.payload.group, op.deps)].append(i)
    out = list(instrs)
    for members in together.values():
        if len(members) > 1:
            for i in members:
                ins = out[i]
                out[i] = ins[:3] + (ins[3] * len(members),) + ins[4:]
    return out


def simulate_analytical(workload: Workload, cost: CostModel) -> list[ClassTiming]:
    """Time every rank class; raises :class:`DeadlockError` if the program cannot finish."""
    streams: dict[str, int] = {"compute": 0}
    programs = _resolve(workload, cost, streams)
    state = _State(len(programs), len(streams))
    done = [False] * len(programs)
    while not all(done):
        progress = False
        for ci in range(len(programs)):
            if not done[ci]:
                moved, done[ci] = _run(ci, programs[ci], state)
                progress |= moved
        if not progress:
            raise DeadlockError(_describe_deadlock(workload, state.pos, done))
    return state.timings


class _State:
    """Everything the list scheduler keeps between resumptions of a class."""

    def __init__(self, n_cls: int, n_streams: int):
        self.free = [[0.0] * n_streams for _ in range(n_cls)]
        self.stream_kind = [[""] * n_streams for _ in range(n_cls)]
        self.pos = [[0, 0] for _ in range(n_cls)]
        self.local: list[list[tuple[float, str, float]]] = [[] for _ in range(n_cls)]
        self.occ = [defaultdict(int) for _ in range(n_cls)]
        self.posted: dict[tuple, tuple[float, float]] = {}
        self.arrivals: dict[tuple, dict[int, float]] = {}
        self.timings = [ClassTiming() for _ in range(n_cls)]


def _run(ci: int, steps: list, st: _State) -> tuple[bool, bool]:
    """Advance class ``ci`` until it blocks or finishes: (moved, finished)."""
    si, oi = st.pos[ci]
    fr, sk, T, loc = st.free[ci], st.stream_kind[ci], st.timings[ci], st.local[ci]
    posted, exposed = st.posted, T.exposed
    moved = False
    n_steps = len(steps)
    while si < n_steps:
        instrs, mb = steps[si]
        n = len(instrs)
        while oi < n:
            code, sid, deps, dur, label, x, flops, nbytes = instrs[oi]
            ready, why, why_dur = 0.0, "", 0.0
            for d in deps:
                e = loc[d]
                if e[0] > ready:
                    ready, why, why_dur = e
            if code == _RECV:
                sent = posted.get((ci, x[0], x[1], mb))
                if sent is None:
                    st.pos[ci] = [si, oi]
                    return moved, False
                loc.append((max(ready, sent[0]) + sent[1], label, sent[1]))
                oi += 1
                moved = True
                continue
            if code == _SEND:
                posted[(x[0], ci, x[1], mb)] = (ready, dur)
                T.comm_bytes[label] += nbytes
                loc.append((ready, label, 0.0))
                oi += 1
                moved = True
                continue
            if code == _WAIT and fr[x] > ready:
                ready, why, why_dur = fr[x], sk[x], _INF
            elif code == _COLL and x is not None:
                key = (x, st.occ[ci][x])
                arr = st.arrivals.setdefault(key, {})
                mine = max(ready, fr[sid])
                arr[ci] = mine
                if len(arr) < len(x[1]):
                    st.pos[ci] = [si, oi]
                    return moved, False
                rv = max(arr.values())
                if rv > mine:
                    ready, why, why_dur = rv, "bubble", 0.0
                st.occ[ci][x] += 1
            f = fr[sid]
            start = f if f > ready else ready
            if sid == 0 and start > f:
                gap = start - f
                if why and why != "bubble" and why != "compute":
                    exp = gap if why_dur >= gap else why_dur
                    exposed[why] += exp
                    gap -= exp
                T.bubble += gap
            end = start + dur
            fr[sid] = end
            if code == _MACRO:
                T.flops += flops
                c, o, ex, nb = x
                T.compute += c
                T.optimizer += o
                for k, v in ex:
                    exposed[k] += v
                for k, v in nb:
                    T.comm_bytes[k] += v
            elif code == _COMPUTE:
                T.flops += flops
            elif code == _COLL:
                T.comm_bytes[label] += nbytes
                sk[sid] = label
                if sid == 0:
                    exposed[label] += dur
            loc.append((end, label, dur))
            oi += 1
            moved = True
        si, oi = si + 1, 0
        loc.clear()
    st.pos[ci] = [si, oi]
    end = max(fr)
    if end > fr[0]:  # communication still running after the last compute-stream op
        tail = max(range(len(fr)), key=lambda s: fr[s])
        exposed[sk[tail] or "other"] += end - fr[0]
    T.end = end
    return True, True


def _describe_deadlock(workload: Workload, pos, done) -> str:
    parts = []
    for ci, cls in enumerate(workload.classes):
        if done[ci]:
            continue
        si, oi = pos[ci]
        step = workload.classes[ci].program.steps[si]
        op = workload.classes[ci].program.blocks[step.block].ops[oi]
        parts.append(f"class {cls.name} (ranks {cls.ranks[0]}…) waits at step {si} "
                     f"({step.block}, micro-batch {step.microbatch}) on op {op.name!r}")
    return "deadlock: no rank class can make progress: " + "; ".join(parts)
