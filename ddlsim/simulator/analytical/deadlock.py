"""What the analytical engine says when a program cannot finish: which op of which block each
stuck rank class waits at, and for what.

A class stops only at a ``recv`` whose send was never posted or at a collective across
classes that some class of its group has not reached. Neither kind of instruction is ever
fused by the engine's merging (only compute-stream runs and local collectives are), and every
merge keeps instructions in issue order, so the k-th such instruction of a merged block is
the k-th such op of the block: that is how the stuck op is found, not by the merged index.
"""

from __future__ import annotations

from ...workloads.trace import Collective, Op, P2P, Workload
from .engine import _COLL, _RECV

__all__ = ["describe_deadlock"]


def describe_deadlock(workload: Workload, programs: list, st, done: list[bool]) -> str:
    """One paragraph naming, for every class that has not finished, the op it waits at.

    Parameters
    ----------
    workload : the trace being timed.
    programs : the engine's resolved programs, per class ``(steps, blocks)`` where
        ``blocks[name][0]`` are the block's merged instructions.
    st : the engine's state (``pos``: per class ``[step, merged instruction]``; ``occ`` and
        ``arrivals``: collective rendezvous).
    done : per class, whether it finished.
    """
    parts = []
    for ci, cls in enumerate(workload.classes):
        if done[ci]:
            continue
        si, oi = st.pos[ci]
        step = cls.program.steps[si]
        instrs = programs[ci][1][step.block][0]
        ops = cls.program.blocks[step.block].flat.ops
        i = _source_op(ops, instrs, oi)
        parts.append(f"class {cls.name} ({_ranks(cls.ranks)}) waits at step {si} (block "
                     f"{step.block!r}, micro-batch {step.microbatch}) on op {i} "
                     f"{_what(ops[i])}: {_why(workload, ci, instrs[oi], ops[i], step, st)}")
    return "deadlock: no rank class can make progress: " + "; ".join(parts)


def _source_op(ops: tuple[Op, ...], instrs: list, oi: int) -> int:
    """The index in the block of the op that merged instruction ``oi`` (a recv, or a
    collective across classes) was made from."""
    ins = instrs[oi]
    if ins[0] == _RECV:
        k = sum(1 for j in range(oi) if instrs[j][0] == _RECV)
        same = [i for i, op in enumerate(ops)
                if isinstance(op.payload, P2P) and op.payload.kind == "recv"]
    else:
        group = ins[5][0]
        k = sum(1 for j in range(oi) if instrs[j][0] == _COLL and instrs[j][5] is not None
                and instrs[j][5][0] == group)
        same = [i for i, op in enumerate(ops)
                if isinstance(op.payload, Collective) and op.payload.group == group]
    return same[k]


def _what(op: Op) -> str:
    p = op.payload
    if isinstance(p, P2P):
        return (f"{p.name!r} ({p.kind} from peer {p.peer:+d} of group {p.group!r}, tag "
                f"{p.tag!r}, stream {op.stream!r})")
    return f"{p.name!r} ({p.op} on group {p.group!r}, stream {op.stream!r})"


def _why(workload: Workload, ci: int, ins: tuple, op: Op, step, st) -> str:
    names = [c.name for c in workload.classes]
    if ins[0] == _RECV:
        peer, tag = ins[5]
        return (f"no send from class {names[peer]} with tag {tag!r} for micro-batch "
                f"{step.microbatch} was ever posted")
    x = ins[5]
    arrived = st.arrivals.get((x, st.occ[ci][x]), {})
    missing = sorted(set(x[1]) - set(arrived))
    who = ", ".join(names[m] for m in missing)
    return (f"it waits for class{'es' if len(missing) > 1 else ''} {who} of its "
            f"{op.payload.group!r} group, which {'have' if len(missing) > 1 else 'has'} not "
            "reached this collective")


def _ranks(ranks: tuple[int, ...]) -> str:
    shown = ", ".join(str(r) for r in ranks[:4])
    return f"ranks {shown}{', …' if len(ranks) > 4 else ''}"
