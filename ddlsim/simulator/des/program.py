"""Class programs flattened for the event engine: instructions, streams, waits, rendezvous.

Every op issue of a rank class gets a *flat index* (issue order). Per class and stream the
engine walks the flat indices of that stream; a :class:`~ddlsim.workloads.trace.Wait` is
resolved here, once, to the last op issued before it on the awaited stream. Collectives
rendezvous over the connected component of classes that the rows of their group family link
(the classes that must arrive before the collective can start).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, repeat

import numpy as np

from ...workloads.steps import StepTable
from ...workloads.trace import Collective, Compute, P2P, Wait, Workload
from ..costs import CostModel
from ..timing import HOST

__all__ = ["COMPUTE", "COLL", "SEND", "RECV", "WAIT", "Instr", "ClassProgram", "resolve",
           "rendezvous_components"]

COMPUTE, COLL, SEND, RECV, WAIT = range(5)


@dataclass(frozen=True, slots=True)
class Instr:
    """One op of a block, resolved: what the engine needs to run it and to account for it.

    ``label`` is ``compute``/``optimizer`` for compute ops and the group kind (``tp``, ``dp``,
    ``pp``…) for communication; ``nbytes`` is what the op adds to the class's
    communication bytes (nccl-tests convention, × repeat for collectives).
    """

    code: int
    stream: int
    deps: tuple[int, ...]
    name: str
    label: str
    duration_s: float = 0.0
    flops: float = 0.0
    nbytes: float = 0.0
    payload: object = None
    repeat: int = 1
    target: int = -1  # WAIT: the awaited stream


@dataclass
class ClassProgram:
    """One class's program with flat issue indices."""

    name: str
    ranks: np.ndarray
    instrs: list[Instr]                  # by flat index
    step_of: np.ndarray                  # flat index → step index
    base_of: np.ndarray                  # flat index → flat index of its step's first op
    microbatch: list[int]                # step index → micro-batch
    block_of_step: list[str]
    stream_ops: dict[int, list[int]]     # stream id → flat indices (not P2P), issue order
    p2p_ops: list[int]
    waits: dict[int, tuple[int, str]] = field(default_factory=dict)  # flat → (target, label)
    bases: list[int] = field(default_factory=list)  # base_of as Python ints (the engine's loop)


def _instr(op, sid: int, streams: dict[str, int], cost: CostModel,
           choices: dict[str, str]) -> Instr:
    p, k = op.payload, op.repeat
    if isinstance(p, Compute):
        label = ("optimizer" if p.kind == "optimizer" else HOST if op.stream == HOST
                 else "compute")
        return Instr(COMPUTE, sid, op.deps, p.name, label, k * cost.compute(p), k * p.flops,
                     payload=p, repeat=k)
    if isinstance(p, Collective):
        choice = cost.choice(p)
        if choice is not None:
            choices.setdefault(choice.key, choice.label)
        return Instr(COLL, sid, op.deps, p.name, cost.kind[p.group], nbytes=k * p.bytes,
                     payload=p, repeat=k)
    if isinstance(p, P2P):
        code = SEND if p.kind == "send" else RECV
        return Instr(code, sid, op.deps, p.name, cost.kind[p.group],
                     nbytes=p.bytes if code == SEND else 0.0, payload=p, repeat=k)
    if isinstance(p, Wait):
        target = streams.setdefault(p.stream, len(streams))
        return Instr(WAIT, sid, op.deps, p.name, "", payload=p, target=target)
    raise TypeError(f"unknown op payload {type(p).__name__}")


def resolve(workload: Workload, cost: CostModel
            ) -> tuple[list[ClassProgram], dict[str, int], dict[str, str]]:
    """Flatten every class; streams are numbered as the analytical engine numbers them.
    Also returns the collective algorithm choices (key → algorithm, as the analytical
    engine reports them)."""
    streams: dict[str, int] = {"compute": 0}
    choices: dict[str, str] = {}
    out = []
    for cls in workload.classes:
        blocks: dict[str, list[Instr]] = {}
        for bname, block in cls.program.blocks.items():
            blocks[bname] = [_instr(op, streams.setdefault(op.stream, len(streams)), streams, cost,
                                    choices) for op in block.flat.ops]
        out.append(_flatten(cls, blocks))
    return out, streams, choices


def _step_rows(steps) -> tuple[list[str], np.ndarray, list[int]]:
    """Distinct block names, each step's index into them and its micro-batch (the arrays of
    a :class:`~ddlsim.workloads.steps.StepTable` as they are, without a Step per step)."""
    if isinstance(steps, StepTable):
        return list(steps.names), np.asarray(steps.block, dtype=np.int64), \
            steps.microbatch.tolist()
    names = list(dict.fromkeys(s.block for s in steps))
    index = {b: k for k, b in enumerate(names)}
    return (names, np.array([index[s.block] for s in steps], dtype=np.int64),
            [s.microbatch for s in steps])


def _flatten(cls, blocks: dict[str, list[Instr]]) -> ClassProgram:
    """The class's steps laid end to end, in numpy over the steps (a class issues a few
    blocks many times): op ``i`` of a step has flat index ``base + i``."""
    names, kind, microbatch = _step_rows(cls.program.steps)
    size = np.array([len(blocks[b]) for b in names], dtype=np.int64)
    lengths = size[kind]
    step_base = np.cumsum(lengths) - lengths
    base_of = np.repeat(step_base, lengths)
    step_of = np.repeat(np.arange(len(kind), dtype=np.int64), lengths)
    table = [ins for b in names for ins in blocks[b]]  # every block once; a flat op's row:
    row = np.repeat((np.cumsum(size) - size)[kind], lengths) + np.arange(len(base_of)) - base_of
    instrs = list(map(table.__getitem__, row.tolist()))
    code = np.array([ins.code for ins in table], dtype=np.int64)[row]
    stream = np.array([ins.stream for ins in table], dtype=np.int64)[row]
    p2p = (code == SEND) | (code == RECV)
    on = np.flatnonzero(~p2p)
    stream_ops = {int(sid): on[stream[on] == sid].tolist() for sid in np.unique(stream[on])}
    target = np.array([ins.target for ins in table], dtype=np.int64)[row]
    return ClassProgram(cls.name, np.asarray(cls.ranks, dtype=np.int64), instrs, step_of,
                        base_of, microbatch, [names[k] for k in kind.tolist()], stream_ops,
                        np.flatnonzero(p2p).tolist(), _waits(instrs, code, stream, target, on),
                        list(chain.from_iterable(map(repeat, step_base.tolist(),
                                                     lengths.tolist()))))  # an int per step


def _waits(instrs: list[Instr], code: np.ndarray, stream: np.ndarray, target: np.ndarray,
           on: np.ndarray) -> dict[int, tuple[int, str]]:
    """Per Wait (flat index, ascending): the last op issued before it on the awaited stream
    (−1: none) and the label of that stream's last collective before it (``""``: none)."""
    where = np.flatnonzero(code == WAIT)
    last = np.full(len(where), -1, dtype=np.int64)
    label = [""] * len(where)
    coll = np.flatnonzero(code == COLL)
    for t in np.unique(target[where]).tolist():
        at = np.flatnonzero(target[where] == t)
        ops, colls = on[stream[on] == t], coll[stream[coll] == t]
        if len(ops):
            i = np.searchsorted(ops, where[at]) - 1
            last[at] = np.where(i >= 0, ops[i], -1)
        j = np.searchsorted(colls, where[at]) - 1
        labels = [instrs[c].label for c in colls.tolist()]
        for k, jj in zip(at.tolist(), j.tolist()):
            if jj >= 0:
                label[k] = labels[jj]
    return dict(zip(where.tolist(), zip(last.tolist(), label)))


def rendezvous_components(workload: Workload) -> dict[str, tuple[np.ndarray, list[tuple[int, ...]]]]:
    """Per group family: component id of each class, and each component's classes.

    Two classes are in one component when some group of the family holds ranks of both; a
    collective of the family starts when every class of the component has reached it.
    """
    class_of = workload.class_of()
    n = len(workload.classes)
    out = {}
    for name, fam in workload.groups.items():
        parent = list(range(n))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for row in class_of[fam.members]:
            present = np.unique(row)
            present = present[present >= 0]
            for c in present[1:]:
                a, b = find(int(present[0])), find(int(c))
                if a != b:
                    parent[max(a, b)] = min(a, b)
        roots = [find(c) for c in range(n)]
        ids = {r: i for i, r in enumerate(sorted(set(roots)))}
        comp = np.asarray([ids[r] for r in roots], dtype=np.int64)
        members = [tuple(int(c) for c in np.flatnonzero(comp == i)) for i in range(len(ids))]
        out[name] = (comp, members)
    return out
