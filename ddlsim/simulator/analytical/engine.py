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
from collections import defaultdict, deque

import numpy as np

from ...errors import DeadlockError
from ...workloads.trace import Collective, Compute, P2P, Wait, Workload
from ..costs import CostModel
from ..result import ClassTiming

__all__ = ["simulate_analytical", "ClassTiming"]

_COMPUTE, _COLL, _SEND, _RECV, _WAIT, _MACRO, _PIPE = range(7)
_INF = math.inf


class _Groups:
    """Cached group lookups of representative ranks (inverse indices built once per family)."""

    def __init__(self, workload: Workload):
        self.workload = workload
        self.class_of = workload.class_of()
        self._inv: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._rows: dict[tuple[str, int], tuple] = {}

    def row(self, group: str, rank: int) -> tuple[tuple[int, ...], int, frozenset]:
        key = (group, rank)
        hit = self._rows.get(key)
        if hit is None:
            members = self.workload.groups[group].members
            if group not in self._inv:
                g_of = np.empty(self.workload.world_size, dtype=np.int64)
                i_of = np.empty(self.workload.world_size, dtype=np.int64)
                n_g, size = members.shape
                g_of[members.ravel()] = np.repeat(np.arange(n_g), size)
                i_of[members.ravel()] = np.tile(np.arange(size), n_g)
                self._inv[group] = (g_of, i_of)
            g_of, i_of = self._inv[group]
            row_arr = members[g_of[rank]]
            row = tuple(row_arr.tolist())
            hit = (row, int(i_of[rank]), frozenset(self.class_of[row_arr].tolist()))
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
    """Per class: the issue-ordered list of (resolved block, micro-batch, fast form)."""
    groups = _Groups(workload)
    memo: dict = {}
    resolved = []
    for cls in workload.classes:
        rep = cls.ranks[0]
        blocks = {}
        for bname, block in cls.program.blocks.items():
            instrs = []
            for op in block.ops:
                local = not isinstance(op.payload, (P2P, Collective)) or (
                    isinstance(op.payload, Collective)
                    and len(groups.row(op.payload.group, rep)[2]) == 1)
                key = (op, op.stream) if local else None
                ins = memo.get(key) if local else None
                if ins is None:
                    ins = _instr(op, rep, groups, cost, streams)
                    if local:
                        memo[key] = ins
                instrs.append(ins)
            blocks[bname] = _merged(instrs, block.ops, memo)
        resolved.append((cls.program.steps, blocks))
    return resolved


def _merged(instrs: list, ops, memo: dict) -> tuple[list, tuple | None]:
    """Merge a block, reusing the merge of any earlier block of the same shape (blocks of
    different stages differ only in their point-to-point partners, which are never fused)."""
    p2p = [ins[5] for ins in instrs if ins[0] in (_SEND, _RECV)]
    shape = tuple(ins[:5] + (None,) + ins[6:] if ins[0] in (_SEND, _RECV) else ins
                  for ins in instrs)
    key = (shape, tuple((o.payload.group, o.deps) if isinstance(o.payload, Collective) else None
                        for o in ops))
    template = memo.get(key)
    if template is None:
        template = memo[key] = _collapse_pairs(_merge(_share_concurrent(list(shape), ops)))
    if not p2p:
        merged = template
    else:
        it = iter(p2p)
        merged = [ins[:5] + (next(it),) + ins[6:] if ins[0] in (_SEND, _RECV) else ins
                  for ins in template]
    return merged, _fast_form(merged)


def _fast_form(instrs: list) -> tuple | None:
    """The common pipeline block — [recv] → one fused compute-stream run → [send] — as a
    compact tuple the scheduler can time without the general loop; None otherwise."""
    i, recv = 0, None
    if instrs and instrs[0][0] == _RECV and not instrs[0][2]:
        recv, i = instrs[0], 1
    if i >= len(instrs) or instrs[i][0] != _MACRO or instrs[i][2] != ((0,) if recv else ()):
        return None
    macro, send = instrs[i], None
    if i + 1 < len(instrs):
        send = instrs[i + 1]
        if send[0] != _SEND or send[2] != (i,) or i + 2 != len(instrs):
            return None
    return (recv[5] if recv else None, recv[4] if recv else "", macro[3],
            send[5] if send else None, send[3] if send else 0.0, macro, send)


def _merge(instrs: list) -> list:
    """Fuse runs of compute-stream ops that only follow each other into one macro op.

    An op that a later op depends on ends its run, so overlap (DDP buckets after a backward
    segment) is timed exactly. A macro carries its accounting: (compute, optimizer,
    exposed by kind, bytes by kind).
    """
    # a dependency on an earlier op of the same stream is implied by stream order
    # (point-to-point ops excepted: they do not block their stream)
    instrs = [ins[:2] + (tuple(d for d in ins[2] if instrs[d][1] != ins[1]
                               or instrs[d][0] in (_SEND, _RECV)),) + ins[3:] for ins in instrs]
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


def _collapse_pairs(instrs: list) -> list:
    """Replace runs of identical (compute run, collective on another stream that depends on
    it) pairs — DDP gradient buckets issued as backward segments finish — by one exact
    instruction. With segment time c, collective time a, start S and the stream free at F,
    the i-th collective ends at D_i = max(D_{i-1}, S + i·c) + a, so
    D_n = max(F + n·a, S + c + n·a) if a ≥ c else max(F + n·a, S + n·c + a)."""
    referenced = {d for ins in instrs for d in ins[2]}
    out: list = []
    remap: dict[int, int] = {}
    i = 0
    while i < len(instrs):
        n = 0
        while (i + 2 * n + 1 < len(instrs) and _is_pair(instrs, i + 2 * n)
               and (n == 0 or _same_pair(instrs, i, i + 2 * n))
               and (n == 0 or (i + 2 * n - 2) not in referenced)):
            n += 1
        if n >= 2:
            m, c = instrs[i], instrs[i + 1]
            last = i + 2 * n - 1
            deps = tuple(sorted({remap[d] for d in m[2]}))
            pipe = (_PIPE, 0, deps, n * m[3], "compute", (m, c, n), n * m[6], 0.0)
            for j in range(i, last + 1):
                remap[j] = len(out)
            out.append(pipe)
            i = last + 1
            continue
        ins = instrs[i]
        remap[i] = len(out)
        out.append(ins[:2] + (tuple(sorted({remap[d] for d in ins[2]})),) + ins[3:])
        i += 1
    return out


def _is_pair(instrs: list, i: int) -> bool:
    m, c = instrs[i], instrs[i + 1]
    return (m[0] == _MACRO and c[0] == _COLL and c[1] != 0 and c[5] is None
            and c[2] == (i,) and all(d < i for d in m[2]))


def _same_pair(instrs: list, i: int, j: int) -> bool:
    a, b = instrs[i], instrs[j]
    return (a[3] == b[3] and a[5] == b[5] and b[2] == () and instrs[i + 1][1:2] == instrs[j + 1][1:2]
            and instrs[i + 1][3:] == instrs[j + 1][3:])


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
        k = len({instrs[i][1] for i in members})  # ops on one stream run one after another
        if k > 1:
            for i in members:
                ins = out[i]
                out[i] = ins[:3] + (ins[3] * k,) + ins[4:]
    return out


def simulate_analytical(workload: Workload, cost: CostModel) -> list[ClassTiming]:
    """Time every rank class; raises :class:`DeadlockError` if the program cannot finish.

    Classes run until they block on a message or a collective; a blocked class sleeps until
    the send or the last arrival it waits for happens (FIFO, so the order is deterministic).
    """
    streams: dict[str, int] = {"compute": 0}
    programs = _resolve(workload, cost, streams)
    st = _State(len(programs), len(streams))
    if FAST_PREFIX:
        _fast_prefix(programs, st)
    done = [False] * len(programs)
    queue = deque(range(len(programs)))
    queued = [True] * len(programs)
    while queue:
        ci = queue.popleft()
        queued[ci] = False
        _, done[ci] = _run(ci, programs[ci], st)
        for w in st.woken:
            if not queued[w] and not done[w]:
                queued[w] = True
                queue.append(w)
        st.woken.clear()
    if not all(done):
        raise DeadlockError(_describe_deadlock(workload, st.pos, done))
    return st.timings


#: Time the leading recv → compute → send steps of every class with the sweep solver below
#: (bit-identical to the general loop, several times faster on deep pipelines).
FAST_PREFIX = True


def _fast_prefix(programs: list, st: "_State") -> None:
    """Run every class through its leading fast-form steps, sweeping the classes alternately
    upwards and downwards (so forward and backward pipeline chains propagate in one sweep), each
    as far as its received messages allow. Same arithmetic, in the same order per class, as
    the fast path of :func:`_run`, which then continues from the state left here."""
    limits = []
    for steps, blocks in programs:
        n = 0
        for block, _, _ in steps:
            if blocks[block][1] is None:
                break
            n += 1
        limits.append(n)
    pos = [0] * len(programs)
    posted, seen = st.posted, st.fast_seen
    up = list(range(len(programs)))
    sweeps = (up, up[::-1])
    k = 0
    while True:
        moved = False
        for ci in sweeps[k & 1]:
            j, limit = pos[ci], limits[ci]
            if j >= limit:
                continue
            steps, blocks = programs[ci]
            fr, T, counts = st.free[ci], st.timings[ci], st.fast_counts[ci]
            exposed = T.exposed
            f = fr[0]
            while j < limit:
                block, mb, _ = steps[j]
                fast = blocks[block][1]
                rx, rlabel, dur, sx, sdur = fast[:5]
                if rx is not None:
                    sent = posted.get((ci, rx[0], rx[1], mb))
                    if sent is None:
                        break
                    arrive = sent[0] + sent[1] if sent[0] > 0.0 else sent[1]
                    if arrive > f:
                        gap = arrive - f
                        exp = gap if sent[1] >= gap else sent[1]
                        exposed[rlabel] += exp
                        T.bubble += gap - exp
                        f = arrive
                f += dur
                if sx is not None:
                    posted[(sx[0], ci, sx[1], mb)] = (f, sdur)
                key = id(fast)
                counts[key] = counts.get(key, 0) + 1
                seen[key] = fast
                j += 1
            if j != pos[ci]:
                moved = True
                pos[ci] = j
                fr[0] = f
        k += 1
        if not moved:
            break
    for ci, j in enumerate(pos):
        st.pos[ci] = [j, 0]


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
        self.fast_counts: list[dict[int, int]] = [{} for _ in range(n_cls)]
        self.fast_seen: dict[int, tuple] = {}
        self.waiting: dict[tuple, list[int]] = {}   # message or collective key → sleepers
        self.woken: list[int] = []

    def sleep(self, key: tuple, ci: int) -> None:
        self.waiting.setdefault(key, []).append(ci)

    def wake(self, key: tuple) -> None:
        sleepers = self.waiting.pop(key, None)
        if sleepers:
            self.woken.extend(sleepers)


def _settle(T: ClassTiming, counts: dict[int, int], seen: dict[int, tuple]) -> None:
    """Add the accounting of fast-path blocks, once per block kind × count."""
    for key in sorted(counts, key=lambda k: (seen[k][2], seen[k][4])):
        n, fast = counts[key], seen[key]
        macro, send = fast[5], fast[6]
        c, o, ex, nb = macro[5]
        T.flops += n * macro[6]
        T.compute += n * c
        T.optimizer += n * o
        for k, v in ex:
            T.exposed[k] += n * v
        for k, v in nb:
            T.comm_bytes[k] += n * v
        if send is not None:
            T.comm_bytes[send[4]] += n * send[7]


def _run(ci: int, steps: list, st: _State) -> tuple[bool, bool]:
    """Advance class ``ci`` until it blocks or finishes: (moved, finished)."""
    si, oi = st.pos[ci]
    fr, sk, T, loc = st.free[ci], st.stream_kind[ci], st.timings[ci], st.local[ci]
    posted, exposed = st.posted, T.exposed
    moved = False
    steps, blocks = steps
    n_steps = len(steps)
    fast_counts = st.fast_counts[ci]
    while si < n_steps:
        block, mb, _ = steps[si]
        instrs = blocks[block][0]
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
                    st.sleep((ci, x[0], x[1], mb), ci)
                    return moved, False
                loc.append((max(ready, sent[0]) + sent[1], label, sent[1]))
                oi += 1
                moved = True
                continue
            if code == _SEND:
                key = (x[0], ci, x[1], mb)
                posted[key] = (ready, dur)
                if key in st.waiting:
                    st.wake(key)
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
                    st.sleep(key, ci)
                    return moved, False
                st.wake(key)
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
            if code == _PIPE:
                m, c, k = x
                seg, a, cs = m[3], c[3], c[1]
                tail = start + seg + k * a if a >= seg else start + k * seg + a
                prev = fr[cs] + k * a
                fr[cs] = tail if tail > prev else prev
                sk[cs] = c[4]
                cc, o, ex, nb = m[5]
                T.flops += flops
                T.compute += k * cc
                T.optimizer += k * o
                for key_, v in ex:
                    exposed[key_] += k * v
                for key_, v in nb:
                    T.comm_bytes[key_] += k * v
                T.comm_bytes[c[4]] += k * c[7]
            elif code == _MACRO:
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
    _settle(T, fast_counts, st.fast_seen)
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
