"""What the analytical engine says when a program cannot finish: which op of which block each
stuck rank class waits at, and for what.

A class stops only at a ``recv`` whose send was never posted or at a collective across
classes that some class of its group has not reached. The engine's instructions are the
block's ops one for one, in issue order, so the instruction a class stopped at is the op.
"""

from __future__ import annotations

from ...workloads.trace import Op, P2P, Workload
from .instructions import RECV

__all__ = ["describe_deadlock"]


def describe_deadlock(workload: Workload, programs: list, st, done: list[bool]) -> str:
    """One paragraph naming, for every class that has not finished, the op it waits at.

    Parameters
    ----------
    workload : the trace being timed.
    programs : the engine's resolved programs, per class (:class:`.instructions.Program`).
    st : the scheduler's state (``pos``: per class ``[step, instruction]``; ``occ`` and
        ``arrivals``: collective rendezvous).
    done : per class, whether it finished.
    """
    parts = []
    for ci, cls in enumerate(workload.classes):
        if done[ci]:
            continue
        si, oi = st.pos[ci]
        step = cls.program.steps[si]
        prog = programs[ci]
        ins = prog.blocks[int(prog.block[si])][oi]
        op = cls.program.blocks[step.block].lean.ops[oi]
        parts.append(f"class {cls.name} ({_ranks(cls.ranks)}) waits at step {si} (block "
                     f"{step.block!r}, micro-batch {step.microbatch}) on op {oi} "
                     f"{_what(op)}: {_why(workload, ci, ins, op, step, st)}")
    return "deadlock: no rank class can make progress: " + "; ".join(parts)


def _what(op: Op) -> str:
    p = op.payload
    if isinstance(p, P2P):
        return (f"{p.name!r} ({p.kind} from peer {p.peer:+d} of group {p.group!r}, tag "
                f"{p.tag!r}, stream {op.stream!r})")
    return f"{p.name!r} ({p.op} on group {p.group!r}, stream {op.stream!r})"


def _why(workload: Workload, ci: int, ins: tuple, op: Op, step, st) -> str:
    names = [c.name for c in workload.classes]
    if ins.code == RECV:
        peer, tag = ins.peer
        return (f"no send from class {names[peer]} with tag {tag!r} for micro-batch "
                f"{step.microbatch} was ever posted")
    x = ins.group
    arrived = st.arrivals.get((x, st.occ[ci][x]), {})
    missing = sorted(set(x[1]) - set(arrived))
    who = ", ".join(names[m] for m in missing)
    return (f"it waits for class{'es' if len(missing) > 1 else ''} {who} of its "
            f"{op.payload.group!r} group, which {'have' if len(missing) > 1 else 'has'} not "
            "reached this collective")


def _ranks(ranks: tuple[int, ...]) -> str:
    shown = ", ".join(str(r) for r in ranks[:4])
    return f"ranks {shown}{', …' if len(ranks) > 4 else ''}"
