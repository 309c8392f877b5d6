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
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from ...errors import DeadlockError
from ...workloads.trace import Collective, Compute, P2P, StepTable, Workload
from ..costs import CostModel
from ..result import ClassTiming, EngineRun

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


def _local_instr(op, cost: CostModel, streams: dict[str, int], partners,
                 choices: dict[str, str]) -> tuple:
    """(code, stream, deps, duration, label, partner, flops, bytes) of a non-P2P op;
    ``partners``: the classes a collective's group spans, or None when it is local. A
    collective's algorithm choice is added to ``choices`` (what the engine returns)."""
    p, k = op.payload, op.repeat
    sid = streams.setdefault(op.stream, len(streams))
    if isinstance(p, Compute):
        label = "optimizer" if p.kind == "optimizer" else "compute"
        return (_COMPUTE, sid, op.deps, k * cost.compute(p), label, None, k * p.flops, 0.0)
    if isinstance(p, Collective):
        x = (p.group, partners) if partners is not None else None
        choice = cost.choice(p)
        if choice is None:
            return (_COLL, sid, op.deps, 0.0, cost.kind[p.group], x, 0.0, k * p.bytes)
        choices.setdefault(choice.key, choice.label)
        return (_COLL, sid, op.deps, k * choice.time_s, cost.kind[p.group], x, 0.0, k * p.bytes)
    target = streams.setdefault(p.stream, len(streams))
    return (_WAIT, sid, op.deps, 0.0, "", target, 0.0, 0.0)


class _Template(NamedTuple):
    """A block merged once for every class that shares it: point-to-point instructions hold
    placeholders (``slots``: their positions and payloads) filled per class."""

    merged: list
    slots: tuple
    fast: tuple | None   # (recv slot or None, send slot or None, core duration, acct, side)


class _Resolver:
    """Blocks → engine instructions for one workload and cost model. A block object shared by
    several classes (GPT's middle stages) is merged once; each class fills in only its
    point-to-point partners and transfer times."""

    def __init__(self, workload: Workload, cost: CostModel, streams: dict[str, int]):
        self.groups = _Groups(workload)
        self.cost = cost
        self.streams = streams
        self.templates: dict[tuple, _Template] = {}
        self.coll_groups: dict[int, tuple[str, ...]] = {}
        self.partner_sets: dict[tuple[int, str], frozenset | None] = {}
        self.p2p: dict[tuple, tuple] = {}
        self.instrs: dict[tuple, tuple] = {}
        self.choices: dict[str, str] = {}  # collective key → algorithm, in resolution order

    def partners(self, ci: int, rep: int, group: str) -> frozenset | None:
        key = (ci, group)
        if key not in self.partner_sets:
            parts = self.groups.row(group, rep)[2]
            self.partner_sets[key] = parts if len(parts) > 1 else None
        return self.partner_sets[key]

    def block(self, ci: int, rep: int, block) -> tuple[list, tuple | None]:
        """(merged instructions, fast form) of ``block`` as class ``ci`` runs it."""
        bid = id(block)
        groups = self.coll_groups.get(bid)
        if groups is None:
            groups = self.coll_groups[bid] = tuple(sorted(
                {op.payload.group for op in block.ops if isinstance(op.payload, Collective)}))
        sig = tuple(self.partners(ci, rep, g) for g in groups)
        tmpl = self.templates.get((bid, sig))
        if tmpl is None:
            tmpl = self.templates[(bid, sig)] = self._template(block, dict(zip(groups, sig)))
        if not tmpl.slots:
            fast = tmpl.fast
            return tmpl.merged, (fast and (None, None) + fast[2:])
        merged = list(tmpl.merged)
        filled = []
        for i, payload in tmpl.slots:
            part = self._p2p(ci, rep, payload)
            ins = merged[i]
            merged[i] = ins[:3] + (part[1], ins[4], part[0]) + ins[6:]
            filled.append(part)
        fast = tmpl.fast
        if fast is not None:
            recv = filled[0] if fast[0] is not None else None
            send = filled[fast[1]] if fast[1] is not None else None
            fast = (recv, send) + fast[2:]
        return merged, fast

    def _p2p(self, ci: int, rep: int, p: P2P) -> tuple:
        """((peer class, tag), transfer seconds) of a send or recv of class ``ci``."""
        key = (ci, p.group, p.peer, p.bytes, p.tag)
        hit = self.p2p.get(key)
        if hit is None:
            row, i, _ = self.groups.row(p.group, rep)
            peer = row[(i + p.peer) % len(row)]
            hit = self.p2p[key] = ((int(self.groups.class_of[peer]), p.tag),
                                   self.cost.p2p(p, rep, peer))
        return hit

    def _template(self, block, partners: dict) -> _Template:
        instrs, slots = [], []
        local = not any(v is not None for v in partners.values())
        memo = self.instrs
        for op in block.ops:
            ins = memo.get(id(op)) if local else None
            if ins is not None:   # ops are shared (a layer's ops by every segment and stage)
                instrs.append(ins)
                continue
            p = op.payload
            if isinstance(p, P2P):
                sid = self.streams.setdefault(op.stream, len(self.streams))
                code = _SEND if p.kind == "send" else _RECV
                instrs.append((code, sid, op.deps, 0.0, self.cost.kind[p.group], None, 0.0,
                               p.bytes if code == _SEND else 0.0))
                slots.append(p)
                continue
            partner = partners.get(p.group) if isinstance(p, Collective) else None
            key = id(op) if partner is None else (id(op), partner)
            ins = memo.get(key)
            if ins is None:
                ins = memo[key] = _local_instr(op, self.cost, self.streams, partner,
                                               self.choices)
            instrs.append(ins)
        merged = _chain(instrs)
        if merged is None:
            merged = _collapse_pairs(_merge(_compress(_share_concurrent(instrs, block.ops))))
        positions = [i for i, ins in enumerate(merged) if ins[0] in (_SEND, _RECV)]
        return _Template(merged, tuple(zip(positions, slots)), _fast_form(merged))


def _chain(instrs: list) -> list | None:
    """The common block shape — [recv] → ops that only follow each other on the compute
    stream → [send after the last] — merged directly: what :func:`_merge` makes of it (one
    macro between the two), at a fraction of the cost; None for any other shape."""
    n = len(instrs)
    if not n:
        return None
    i = 1 if instrs[0][0] == _RECV and not instrs[0][2] else 0
    j = n - 1 if n - i > 1 and instrs[-1][0] == _SEND and instrs[-1][2] == (n - 2,) else n
    if i == j or instrs[i][2] != ((0,) if i else ()):
        return None
    for k in range(i, j):
        code, sid, deps = instrs[k][:3]
        if sid or not (code == _COMPUTE or (code == _COLL and instrs[k][5] is None)):
            return None
        if k > i and deps and (min(deps) < i or max(deps) >= k):
            return None
    out = [instrs[0]] if i else []
    out.append(_macro(instrs[i:j], instrs[i][2]))
    if j < n:
        out.append(instrs[-1][:2] + ((i,),) + instrs[-1][3:])
    return out


def _unit(instrs: list, i: int) -> int:
    """Length of the (compute-stream run without deps, local collective on another stream
    after its last op) unit at ``i`` — a backward segment and its gradient bucket — or 0."""
    k = i
    while k < len(instrs) and instrs[k][1] == 0 and not instrs[k][2] and (
            instrs[k][0] == _COMPUTE or (instrs[k][0] == _COLL and instrs[k][5] is None)):
        k += 1
    if k == i or k >= len(instrs):
        return 0
    c = instrs[k]
    return k - i + 1 if c[0] == _COLL and c[1] != 0 and c[5] is None and c[2] == (k - 1,) else 0


def _compress(instrs: list) -> list:
    """Replace the 2nd…nth of n ≥ 3 identical units (see :func:`_unit`) by the closed-form
    pipe :func:`_collapse_pairs` would make of them, before merging: a backward split into 96
    bucket segments costs two units of work, not 96 (the first unit is kept, as it may fuse with
    what precedes it)."""
    out: list = []
    remap: list[int] = []
    i = 0
    n_in = len(instrs)
    while i < n_in:
        ins = instrs[i]
        k = _unit(instrs, i) if ins[1] == 0 and not ins[2] else 0
        n = 1
        if k:
            body, coll = instrs[i:i + k - 1], instrs[i + k - 1]
            j = i + k
            while (j + k <= n_in and _unit(instrs, j) == k and instrs[j:j + k - 1] == body
                   and instrs[j + k - 1][:2] == coll[:2] and instrs[j + k - 1][3:] == coll[3:]):
                n += 1
                j += k
        if n < 3:
            for ins in instrs[i:i + max(k, 1)]:   # no repeated unit starts inside a unit
                remap.append(len(out))
                out.append(ins[:2] + (tuple(remap[d] for d in ins[2]),) + ins[3:])
            i += max(k, 1)
            continue
        for ins in instrs[i:i + k]:          # the first unit, as it is
            remap.append(len(out))
            out.append(ins[:2] + (tuple(remap[d] for d in ins[2]),) + ins[3:])
        m = _macro(list(body), ())
        c = coll[:2] + ((0,),) + coll[3:]
        pipe = (_PIPE, 0, (), (n - 1) * m[3], "compute", (m, c, n - 1), (n - 1) * m[6], 0.0)
        remap.extend([len(out)] * (k * (n - 1)))
        out.append(pipe)
        i += k * n
    return out


def _fast_form(instrs: list) -> tuple | None:
    """The pipeline block — [recv] → compute-stream instructions (fused runs, overlapped
    bucket pipes) with local collectives on other streams hanging off them → [send after the
    last compute] — as (recv slot, send slot, compute-stream seconds, accounting, side) for the
    sweep solver; None for any other shape. ``side`` is set when the block also occupies other
    streams (replayed after the sweep)."""
    i, recv, slot = 0, None, 0
    if instrs and instrs[0][0] == _RECV and not instrs[0][2]:
        recv, i, slot = 0, 1, 1
    compute: list[int] = []
    side = False
    send = None
    for j in range(i, len(instrs)):
        code, sid, deps = instrs[j][:3]
        if code == _SEND:
            if j != len(instrs) - 1 or not compute or deps != (compute[-1],):
                return None
            send = slot
            continue
        if code in (_MACRO, _PIPE) and sid == 0:
            if not compute and recv is not None and deps != (0,):
                return None
            if compute and not set(deps) <= set(compute):
                return None
            compute.append(j)
            side = side or code == _PIPE
        elif code == _COLL and sid != 0 and instrs[j][5] is None:
            if not set(deps) <= set(compute):
                return None
            side = True
        else:
            return None
    if not compute:
        return None
    dur = 0.0
    comp = opt = flops = 0.0
    nbytes: dict[str, float] = defaultdict(float)
    exposed: dict[str, float] = defaultdict(float)
    for j in compute:
        code, _, _, d, _, x, fl, _ = instrs[j]
        dur += d
        flops += fl
        if code == _MACRO:
            c, o, ex, nb = x
            k = 1
        else:
            m, c_ins, k = x
            c, o, ex, nb = m[5]
            nbytes[c_ins[4]] += k * c_ins[7]
        comp += k * c
        opt += k * o
        for key, v in ex:
            exposed[key] += k * v
        for key, v in nb:
            nbytes[key] += k * v
    for ins in instrs:
        if ins[0] == _COLL and ins[1] != 0:
            nbytes[ins[4]] += ins[7]
        elif ins[0] == _SEND:
            nbytes[ins[4]] += ins[7]
    acct = (comp, opt, flops, tuple(exposed.items()), tuple(nbytes.items()))
    return (recv, send, dur, acct, instrs if side else None)


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
    """A run of compute-stream instructions fused into one: (_MACRO, 0, deps, total seconds,
    "compute", accounting, flops, the fused instructions). The last field (bytes in other
    instructions; a macro moves none itself) keeps ``run`` (a new list no caller changes)
    for timelines (``spans.py``)."""
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
    return (_MACRO, 0, deps, total, "compute", acct, flops, run)


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


class _ClassBlocks(dict):
    """A class's blocks by name → (merged instructions, fast form), resolved on first use."""

    def __init__(self, resolver: _Resolver, ci: int, rep: int, blocks):
        super().__init__()
        self.resolver, self.ci, self.rep, self.blocks = resolver, ci, rep, blocks

    def __missing__(self, name: str) -> tuple[list, tuple | None]:
        hit = self[name] = self.resolver.block(self.ci, self.rep, self.blocks[name].flat)
        return hit


def _resolve(workload: Workload, cost: CostModel, streams: dict[str, int]
             ) -> tuple[list, dict[str, str]]:
    """Per class: (steps, blocks by name → (instructions, fast form)); and the collective
    algorithm choices of every resolved block."""
    resolver = _Resolver(workload, cost, streams)
    out = []
    for ci, cls in enumerate(workload.classes):
        steps = cls.program.steps
        blocks = _ClassBlocks(resolver, ci, cls.ranks[0], cls.program.blocks)
        names = steps.names if isinstance(steps, StepTable) else dict.fromkeys(s.block for s in steps)
        for name in names:   # resolve up front: every stream is known before timing starts
            blocks[name]
        out.append((steps, blocks))
    return out, resolver.choices


def simulate_analytical(workload: Workload, cost: CostModel, *,
                        record_spans: bool = False) -> EngineRun:
    """Time every rank class; raises :class:`DeadlockError` if the program cannot finish.

    The leading pipeline steps of every class are timed by :func:`_sweep`; then classes run
    the rest until they block on a message or a collective; a blocked class sleeps until the
    send or the last arrival it waits for happens (FIFO, so the order is deterministic).

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
    streams: dict[str, int] = {"compute": 0}
    programs, choices = _resolve(workload, cost, streams)
    st = _State(len(programs), len(streams))
    if record_spans:
        from .spans import SpanRecorder
        st.rec = SpanRecorder(programs)
    if FAST_PREFIX:
        _sweep(programs, st)
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
        from .deadlock import describe_deadlock
        raise DeadlockError(describe_deadlock(workload, programs, st, done))
    spans = st.rec.spans(workload, streams) if st.rec is not None else ()
    return EngineRun(st.timings, choices, spans)


#: Time the leading [recv] → compute → [send] steps of every class with :func:`_sweep`
#: (False: the general loop times every step; tests compare the two).
FAST_PREFIX = True
#: Extrapolate a periodic steady state once it is reached (False: time every step).
PERIODIC = True
#: Extrapolate only when it could skip at least this many steps: the checks cost about as much
#: as sweeping a few thousand steps (measured with benchmarks/analytical_speed.py).
PERIODIC_MIN_STEPS = 2000


def _step_arrays(steps) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, tuple | None]:
    if isinstance(steps, StepTable):
        return steps.names, steps.block, steps.microbatch, steps.steady
    names = tuple(dict.fromkeys(s.block for s in steps))
    index = {n: i for i, n in enumerate(names)}
    block = np.fromiter((index[s.block] for s in steps), dtype=np.int64, count=len(steps))
    mb = np.fromiter((s.microbatch for s in steps), dtype=np.int64, count=len(steps))
    return names, block, mb, None


class _Nodes:
    """Every class's steps as one flat array of nodes (class-major), with what the sweep needs
    per node: duration on the compute stream, the node whose send it receives (``src``) and
    the transfer time."""

    def __init__(self, programs: list):
        C = len(programs)
        arrays = [_step_arrays(steps) for steps, _ in programs]
        NB = max(len(a[0]) for a in arrays)
        self.C, self.NB = C, NB
        fast: list[tuple | None] = [None] * (C * NB)
        msgs: dict[tuple, int] = {}       # (sender, receiver, tag) → message id
        labels: dict[str, int] = {}
        dur_t = [0.0] * (C * NB)
        ok_t = [False] * (C * NB)
        sent_t = [-1] * (C * NB)          # message a block sends, received one, label
        recv_t = [-1] * (C * NB)
        lab_t = [0] * (C * NB)
        send_dur_t = [0.0] * (C * NB)
        for c, ((_, blocks), (names, _, _, _)) in enumerate(zip(programs, arrays)):
            for b, name in enumerate(names):
                instrs, f = blocks[name]
                k = c * NB + b
                fast[k] = f
                if f is None:
                    continue
                recv, send = f[0], f[1]
                dur_t[k] = f[2]
                ok_t[k] = True
                if send is not None:
                    (dest, tag), send_dur_t[k] = send
                    sent_t[k] = msgs.setdefault((c, dest, tag), len(msgs))
                if recv is not None:
                    (src, tag), _ = recv
                    recv_t[k] = msgs.setdefault((src, c, tag), len(msgs))
                    ok_t[k] = src != c
                    lab_t[k] = labels.setdefault(instrs[0][4], len(labels))
        self.fast, self.labels = fast, list(labels)
        lens = np.fromiter((len(a[1]) for a in arrays), dtype=np.int64, count=C)
        self.off = np.concatenate([[0], np.cumsum(lens)])
        N = int(self.off[-1])
        self.N = N
        cls = np.repeat(np.arange(C), lens)
        blk = np.concatenate([a[1] for a in arrays])
        mb = np.concatenate([a[2] for a in arrays])
        key = cls * NB + blk
        self.cls, self.blk, self.mb, self.key = cls, blk, mb, key
        self.dur = np.asarray(dur_t)[key]
        sent = np.asarray(sent_t)[key]
        got = np.asarray(recv_t)[key]
        ok = np.asarray(ok_t)[key]
        self.lab = np.asarray(lab_t)[key]
        M = int(mb.max()) + 1 if N else 1
        where = np.full(max(1, len(msgs)) * M, -1, dtype=np.int64)
        sending = np.flatnonzero(sent >= 0)
        where[sent[sending] * M + mb[sending]] = sending
        need = got >= 0
        src = np.where(need, where[np.maximum(got, 0) * M + mb], -1)
        self.src = src
        self.src_cls = np.where(src >= 0, cls[np.maximum(src, 0)], -1)
        self.t = np.where(src >= 0, np.asarray(send_dur_t)[key][np.maximum(src, 0)], 0.0)
        bad = ~ok | (need & (src < 0))
        # prefix limit of each class: its first step the sweep cannot time
        bad_at = np.flatnonzero(bad)
        first = np.searchsorted(bad_at, self.off[:-1])
        first_bad = np.append(bad_at, N)[first]
        self.limit = np.minimum(first_bad, self.off[1:])
        self.steady = [a[3] for a in arrays]


def _gs(prog: list, lim: list, src: list, src_cls: list, t: list, dur: list, ends: list,
        free: list) -> bool:
    """Gauss–Seidel over classes, alternately upwards and downwards, each as far as its
    received messages allow (a forward chain runs in one upward pass, a backward chain in one
    downward pass). ``end = max(previous end, arrival) + duration`` per node."""
    C = len(prog)
    up = list(range(C))
    sweeps = (up, up[::-1])
    k = 0
    moved_any = False
    while True:
        moved = False
        for c in sweeps[k & 1]:
            j, L = prog[c], lim[c]
            if j >= L:
                continue
            f = free[c]
            j0 = j
            while j < L:
                s = src[j]
                if s >= 0:
                    if s >= prog[src_cls[j]]:
                        break
                    a = ends[s] + t[j]
                    if a > f:
                        f = a
                f += dur[j]
                ends[j] = f
                j += 1
            if j != j0:
                moved = True
                prog[c] = j
                free[c] = f
        k += 1
        if not moved:
            return moved_any
        moved_any = True


def _sweep(programs: list, st: "_State") -> None:
    """Time every class's leading fast-form steps (see :func:`_fast_form`) over flat arrays,
    extrapolating a periodic steady state when there is one (:func:`_periodic`), then leave
    the state as the general loop would have: stream times, accounting, side streams replayed,
    pending messages posted."""
    nodes = _Nodes(programs)
    C, N = nodes.C, nodes.N
    if N == 0:
        return
    off = nodes.off.tolist()
    limit = nodes.limit.tolist()
    prog = off[:-1]
    free = [0.0] * C
    src, src_cls = nodes.src.tolist(), nodes.src_cls.tolist()
    t, dur = nodes.t.tolist(), nodes.dur.tolist()
    ends = [0.0] * N
    if PERIODIC:
        ends = _periodic(nodes, prog, limit, src, src_cls, t, dur, ends, free)
    _gs(prog, list(limit), src, src_cls, t, dur, ends, free)
    _settle(nodes, programs, st, np.asarray(ends), prog)


def _periodic(nodes: _Nodes, prog: list, limit: list, src, src_cls, t, dur, ends: list,
              free: list) -> list:
    """Run the sweep until every class with a steady state (``StepTable.steady``) is two
    periods into it; if the last period of every class repeats the one before shifted by one
    common λ, fill the rest of the steady state in by that shift, else try one period later.

    Why this is exact: in the steady state step ``x + P`` has the same duration as step ``x``
    and receives from the step ``P'`` after ``x``'s source (checked below); ``end = max(prev,
    arrival) + duration`` commutes with adding λ to every input, so once one whole period of
    every class (and every source a later step reads) is the previous one plus λ, every later
    period is too (max-plus linearity; by induction over the steps in dependency order).
    """
    C, off = nodes.C, nodes.off
    a = np.zeros(C, dtype=np.int64)
    b = np.zeros(C, dtype=np.int64)
    P = np.zeros(C, dtype=np.int64)
    shift = np.zeros(C, dtype=np.int64)
    for c, hint in enumerate(nodes.steady):
        if hint is not None and hint[2] > 0:
            a[c] = off[c] + hint[0]
            b[c] = min(off[c] + hint[1], limit[c])
            P[c], shift[c] = hint[2], hint[3]
    steady = (b - a >= 4 * P) & (P > 0)
    if not steady.any() or int((b - a - 3 * P)[steady].sum()) < PERIODIC_MIN_STEPS:
        return ends   # nothing to gain, or less than the checks below cost
    a, b, P = np.where(steady, a, 0), np.where(steady, b, 0), np.where(steady, P, 0)
    # structure repeats: step x + P is step x one period on, reading its source's successor;
    # where it does not (sources still in another stage's warm-up), start checking later
    cls = nodes.cls
    idx = np.arange(nodes.N)
    x = idx[(idx >= a[cls]) & (idx < b[cls] - P[cls])]
    xp = x + P[cls[x]]
    sx, sxp = nodes.src[x], nodes.src[xp]
    has = sx >= 0
    sc = np.maximum(nodes.src_cls[x], 0)
    ok = ((nodes.blk[xp] == nodes.blk[x]) & (nodes.mb[xp] == nodes.mb[x] + shift[cls[x]])
          & (has == (sxp >= 0)))
    ok &= ~has | (steady[sc] & (sxp == sx + P[sc]) & (sx < b[sc] - P[sc]))
    bad = x[~ok]
    last_bad = np.full(C, -1, dtype=np.int64)
    if len(bad):
        np.maximum.at(last_bad, cls[bad], bad)
    sc_of = np.flatnonzero(steady)
    thr = np.maximum(a + 2 * P, last_bad + 1 + P)
    if (thr[sc_of] + P[sc_of] > b[sc_of]).any():
        return ends
    lim = list(limit)
    for c in sc_of.tolist():
        lim[c] = int(thr[c])
    Ps = P[sc_of]
    sc_list, P_l, last_l = sc_of.tolist(), P.tolist(), (b - P).tolist()
    grow = 1
    while True:
        _gs(prog, lim, src, src_cls, t, dur, ends, free)
        reached = [prog[c] >= lim[c] for c in sc_list]
        if not all(reached):
            if not any(reached):
                return ends
            for c, r in zip(sc_list, reached):   # let the blocked wait for the others
                if r and lim[c] + P_l[c] <= last_l[c]:
                    lim[c] += P_l[c]
            if all(lim[c] >= last_l[c] for c in sc_list):
                return ends
            continue
        y = np.array([prog[c] for c in sc_list])
        if (y + Ps > b[sc_of]).any():
            return ends
        # the last two periods of every steady class
        starts = y - 2 * Ps
        w = np.repeat(starts, Ps) + (np.arange(Ps.sum()) - np.repeat(np.cumsum(Ps) - Ps, Ps))
        wp = w + np.repeat(Ps, Ps)
        ew = np.array(itemgetter(*w.tolist(), *wp.tolist())(ends))
        diff = ew[len(w):] - ew[:len(w)]
        lam = float(diff[0])
        tol = 1e-12 * max(1.0, float(np.abs(ew).max()))
        later_src = nodes.src[wp]
        lc = np.maximum(nodes.src_cls[wp], 0)
        y_of = np.zeros(C, dtype=np.int64)
        y_of[sc_of] = y
        reads_ok = (later_src < 0) | (later_src >= y_of[lc] - 2 * P[lc])
        if np.abs(diff - lam).max() <= tol and reads_ok.all():
            break
        for c in sc_list:   # not yet periodic: check again 1, 2, 4, … periods later
            lim[c] += grow * P_l[c]
        grow *= 2
        if any(lim[c] > last_l[c] for c in sc_list):
            return ends
    e = np.asarray(ends)
    # fill [y, b) of every steady class: e[x] = e[x - kP] + kλ
    fill_len = b[sc_of] - y
    tot = int(fill_len.sum())
    if tot:
        xs = np.repeat(y, fill_len) + (np.arange(tot) - np.repeat(np.cumsum(fill_len) - fill_len, fill_len))
        Px = np.repeat(Ps, fill_len)
        k = (xs - np.repeat(y, fill_len)) // Px + 1
        e[xs] = e[xs - k * Px] + k * lam
    ends = e.tolist()
    for c, bc in zip(sc_of, b[sc_of].tolist()):
        prog[c] = bc
        free[c] = ends[bc - 1]
    return ends


def _settle(nodes: _Nodes, programs: list, st: "_State", e: np.ndarray, prog: list) -> None:
    """Accounting, side streams, stream times and pending messages after the sweep."""
    C, NB, N = nodes.C, nodes.NB, nodes.N
    off = nodes.off
    progress = np.asarray(prog)
    cls = nodes.cls
    idx = np.arange(N)
    done = idx < progress[cls]
    first = idx == off[cls]
    prev = np.where(first, 0.0, e[np.maximum(idx - 1, 0)])
    has = (nodes.src >= 0) & done
    arrive = np.where(has, e[np.maximum(nodes.src, 0)] + nodes.t, 0.0)
    gap = np.where(has & (arrive > prev), arrive - prev, 0.0)
    exp = np.minimum(gap, nodes.t)
    bubble = np.bincount(cls, weights=gap - exp, minlength=C)
    L = max(1, len(nodes.labels))
    exposed = np.bincount(cls * L + nodes.lab, weights=exp, minlength=C * L).reshape(C, L)
    counts = np.bincount(nodes.key[done], minlength=C * NB).tolist()
    for c in range(C):
        T = st.timings[c]
        T.bubble += float(bubble[c])
        for li, label in enumerate(nodes.labels):
            if exposed[c, li]:
                T.exposed[label] += float(exposed[c, li])
        for b in range(NB):
            n = counts[c * NB + b]
            if not n:
                continue
            comp, opt, flops, ex, nb = nodes.fast[c * NB + b][3]
            T.compute += n * comp
            T.optimizer += n * opt
            T.flops += n * flops
            for k, v in ex:
                T.exposed[k] += n * v
            for k, v in nb:
                T.comm_bytes[k] += n * v
        j = int(progress[c])
        st.free[c][0] = float(e[j - 1]) if j > off[c] else 0.0
        st.pos[c] = [j - int(off[c]), 0]
    # other streams: replay the blocks that use them, in step order
    side = np.fromiter((f is not None and f[4] is not None for f in nodes.fast), dtype=bool,
                       count=C * NB)
    rec = st.rec
    for n in np.flatnonzero(side[nodes.key] & done).tolist():
        c = int(cls[n])
        start = max(float(prev[n]), float(arrive[n]))
        _replay(nodes.fast[int(nodes.key[n])][4], start, st.free[c], st.stream_kind[c],
                rec and rec.side(nodes, n))
    if rec is not None:
        rec.swept(nodes, e, prev, arrive, done)
    # sends the sweep made that no swept recv consumed: the general loop will receive them
    sends = np.fromiter((f is not None and f[1] is not None for f in nodes.fast), dtype=bool,
                        count=C * NB)
    consumed = np.zeros(N, dtype=bool)
    consumed[nodes.src[has]] = True
    for n in np.flatnonzero(sends[nodes.key] & done & ~consumed).tolist():
        (dest, tag), dur = nodes.fast[int(nodes.key[n])][1]
        st.posted[(dest, int(cls[n]), tag, int(nodes.mb[n]))] = (float(e[n]), dur)


def _pipe_buckets(x: tuple, start: float, fr: list, sk: list) -> None:
    """The bucket stream of a pipe of k (segment of length c, collective of length a) pairs
    started at ``start`` (see :func:`_collapse_pairs`)."""
    m, c, k = x
    seg, a, cs = m[3], c[3], c[1]
    tail = start + seg + k * a if a >= seg else start + k * seg + a
    prev = fr[cs] + k * a
    fr[cs] = tail if tail > prev else prev
    sk[cs] = c[4]


def _replay(instrs: list, start: float, fr: list, sk: list, rec=None) -> None:
    """The other-stream effects of a fast block whose compute stream started at ``start``
    (the same arithmetic as :func:`_run`); ``rec(ins, start, end, fr)`` sees each one."""
    ends: dict[int, float] = {}
    f = start
    for i, ins in enumerate(instrs):
        code, sid, deps, dur, label, x = ins[:6]
        if code in (_SEND, _RECV):
            continue
        if sid == 0:
            if code == _PIPE:
                if rec is not None:
                    rec(ins, f, f + dur, fr)
                _pipe_buckets(x, f, fr, sk)
            f += dur
            ends[i] = f
            continue
        ready = max((ends[d] for d in deps), default=0.0)
        begin = fr[sid] if fr[sid] > ready else ready
        fr[sid] = ends[i] = begin + dur
        sk[sid] = label
        if rec is not None:
            rec(ins, begin, begin + dur, fr)


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
        self.waiting: dict[tuple, list[int]] = {}   # message or collective key → sleepers
        self.woken: list[int] = []
        self.rec = None   # a spans.SpanRecorder when spans are recorded

    def sleep(self, key: tuple, ci: int) -> None:
        self.waiting.setdefault(key, []).append(ci)

    def wake(self, key: tuple) -> None:
        sleepers = self.waiting.pop(key, None)
        if sleepers:
            self.woken.extend(sleepers)


def _run(ci: int, steps: list, st: _State) -> tuple[bool, bool]:
    """Advance class ``ci`` until it blocks or finishes: (moved, finished)."""
    si, oi = st.pos[ci]
    fr, sk, T, loc = st.free[ci], st.stream_kind[ci], st.timings[ci], st.local[ci]
    posted, exposed = st.posted, T.exposed
    rec = st.rec
    moved = False
    steps, blocks = steps
    n_steps = len(steps)
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
                if rec is not None:
                    rec.add(ci, sid, block, max(ready, sent[0]), loc[-1][0], "recv")
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
                if rec is not None:
                    rec.add(ci, sid, block, ready, ready + dur, "send")
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
            if rec is not None:   # before the pipe's buckets move their stream on
                rec.instr(ci, block, instrs[oi], start, end, fr)
            if code == _PIPE:
                m, c, k = x
                _pipe_buckets(x, start, fr, sk)
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
    end = max(fr)
    if end > fr[0]:  # communication still running after the last compute-stream op
        tail = max(range(len(fr)), key=lambda s: fr[s])
        exposed[sk[tail] or "other"] += end - fr[0]
    T.end = end
    return True, True
