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

from ...errors import DeadlockError
from ...workloads.trace import Collective, Compute, P2P, Wait, Workload
from ..costs import CostModel

__all__ = ["simulate_analytical", "ClassTiming"]

_COMPUTE, _COLL, _SEND, _RECV, _WAIT = range(5)
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


def _resolve(workload: Workload, cost: CostModel, streams: dict[str, int]):
    """Per class, per block: instruction tuples with durations and partners resolved."""
    class_of = workload.class_of()
    kinds = cost.kind
    resolved = []
    for ci, cls in enumerate(workload.classes):
        rep = cls.ranks[0]
        blocks = {}
        for bname, block in cls.program.blocks.items():
            instrs = []
            for op in block.ops:
                p, k = op.payload, op.repeat
                sid = streams.setdefault(op.stream, len(streams))
                if isinstance(p, Compute):
                    label = "optimizer" if p.kind == "optimizer" else "compute"
                    instrs.append((_COMPUTE, sid, op.deps, k * cost.compute(p), label, None,
                                   k * p.flops, 0.0))
                elif isinstance(p, Collective):
                    fam = workload.groups[p.group]
                    row = fam.group_of(rep)
                    partners = frozenset(int(class_of[r]) for r in row)
                    x = (p.group, partners) if len(partners) > 1 else None
                    instrs.append((_COLL, sid, op.deps, k * cost.collective(p), kinds[p.group], x,
                                   0.0, k * p.bytes))
                elif isinstance(p, P2P):
                    fam = workload.groups[p.group]
                    row = fam.group_of(rep)
                    i = int((row == rep).nonzero()[0][0])
                    peer = int(row[(i + p.peer) % len(row)])
                    dur = cost.p2p(p, rep, peer)
                    code = _SEND if p.kind == "send" else _RECV
                    instrs.append((code, sid, op.deps, dur, kinds[p.group],
                                   (int(class_of[peer]), p.tag), 0.0,
                                   p.bytes if code == _SEND else 0.0))
                elif isinstance(p, Wait):
                    target = streams.setdefault(p.stream, len(streams))
                    instrs.append((_WAIT, sid, op.deps, 0.0, "", target, 0.0, 0.0))
            blocks[bname] = _share_concurrent(instrs, block.ops)
        steps = [(blocks[s.block], s.microbatch) for s in cls.program.steps]
        resolved.append(steps)
    return resolved


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
    n_cls, n_streams = len(programs), len(streams)
    free = [[0.0] * n_streams for _ in range(n_cls)]
    stream_kind = [[""] * n_streams for _ in range(n_cls)]
    pos = [[0, 0] for _ in range(n_cls)]
    local: list[list[tuple[float, str, float]]] = [[] for _ in range(n_cls)]
    occ = [defaultdict(int) for _ in range(n_cls)]
    posted: dict[tuple, tuple[float, float]] = {}
    arrivals: dict[tuple, dict[int, float]] = {}
    timings = [ClassTiming() for _ in range(n_cls)]
    done = [False] * n_cls

    def run(ci: int) -> bool:
        steps, (si, oi) = programs[ci], pos[ci]
        fr, sk, T, loc = free[ci], stream_kind[ci], timings[ci], local[ci]
        moved = False
        while si < len(steps):
            instrs, mb = steps[si]
            while oi < len(instrs):
                code, sid, deps, dur, label, x, flops, nbytes = instrs[oi]
                ready, why, why_dur = 0.0, "", 0.0
                for d in deps:
                    e, lab, ld = loc[d]
                    if e > ready:
                        ready, why, why_dur = e, lab, ld
                if code == _RECV:
                    src_cls, tag = x
                    sent = posted.get((ci, src_cls, tag, mb))
                    if sent is None:
                        pos[ci] = [si, oi]
                        return moved
                    loc.append((max(ready, sent[0]) + sent[1], label, sent[1]))
                    oi += 1
                    moved = True
                    continue
                if code == _SEND:
                    dst_cls, tag = x
                    posted[(dst_cls, ci, tag, mb)] = (ready, dur)
                    T.comm_bytes[label] += nbytes
                    loc.append((ready, label, 0.0))
                    oi += 1
                    moved = True
                    continue
                if code == _WAIT and fr[x] > ready:
                    ready, why, why_dur = fr[x], sk[x], _INF
                if code == _COLL and x is not None:
                    key = (x, occ[ci][x])
                    arr = arrivals.setdefault(key, {})
                    arr[ci] = max(ready, fr[sid])
                    if len(arr) < len(x[1]):
                        pos[ci] = [si, oi]
                        return moved
                    rv = max(arr.values())
                    if rv > max(ready, fr[sid]):
                        ready, why, why_dur = rv, "bubble", 0.0
                    occ[ci][x] += 1
                start = fr[sid] if fr[sid] > ready else ready
                if sid == 0 and start > fr[0]:
                    gap = start - fr[0]
                    exp = gap if why_dur >= gap else why_dur
                    if why and why != "bubble" and why != "compute" and exp > 0:
                        T.exposed[why] += exp
                        gap -= exp
                    T.bubble += gap
                end = start + dur
                fr[sid] = end
                if code == _COMPUTE:
                    T.flops += flops
                    if sid == 0:
                        if label == "optimizer":
                            T.optimizer += dur
                        else:
                            T.compute += dur
                elif code == _COLL:
                    T.comm_bytes[label] += nbytes
                    sk[sid] = label
                    if sid == 0:
                        T.exposed[label] += dur
                loc.append((end, label, dur))
                oi += 1
                moved = True
            si, oi = si + 1, 0
            loc.clear()
        pos[ci] = [si, oi]
        done[ci] = True
        end = max(fr)
        if end > fr[0]:  # communication still running after the last compute-stream op
            tail_stream = max(range(len(fr)), key=lambda s: fr[s])
            T.exposed[sk[tail_stream] or "other"] += end - fr[0]
        T.end = end
        return True

    while not all(done):
        progress = False
        for ci in range(n_cls):
            if not done[ci] and run(ci):
                progress = True
        if not progress:
            raise DeadlockError(_describe_deadlock(workload, programs, pos, done))
    return timings


def _describe_deadlock(workload: Workload, programs, pos, done) -> str:
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
