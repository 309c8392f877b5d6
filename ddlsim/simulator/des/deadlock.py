"""Deadlock reports: which ranks are stuck at which op, waiting for what.

The simulation ends when no event is left; if a class has not finished or a posted send or
recv never met its other side, the program cannot make progress (an unmatched send, or a
cycle of waits). The report names the ranks, the stream, the step and the op of every stuck
place, and what it waits for.
"""

from __future__ import annotations

from .program import COLL, RECV, SEND, WAIT

__all__ = ["describe_deadlock", "format_ranks"]


def format_ranks(ranks, limit: int = 6) -> str:
    """``0, 1, 2`` or ``0, 1, 2, … (64 ranks)``."""
    ranks = [int(r) for r in ranks]
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown if len(ranks) <= limit else f"{shown}, … ({len(ranks)} ranks)"


def _where(st, flat: int) -> str:
    prog = st.prog
    si = int(prog.step_of[flat])
    return (f"class {prog.name} (ranks {format_ranks(prog.ranks)}) at step {si} "
            f"({prog.block_of_step[si]}, micro-batch {prog.microbatch[si]})")


def _op_desc(ins) -> str:
    p = ins.payload
    if ins.code in (SEND, RECV):
        return (f"{'send' if ins.code == SEND else 'recv'} {ins.name!r} (group {p.group}, "
                f"peer {p.peer:+d}, tag {p.tag!r})")
    if ins.code == COLL:
        return f"collective {ins.name!r} ({p.op} on group {p.group})"
    return f"op {ins.name!r}"


def _waiting_for(engine, st, flat: int, what: str) -> str:
    prog = st.prog
    ins = prog.instrs[flat]
    base = int(prog.base_of[flat])
    if what == "deps":
        missing = [prog.instrs[base + d] for d in ins.deps if base + d not in st.info]
        return "its dependencies " + ", ".join(_op_desc(m) for m in missing)
    if what == "wait" and ins.code == WAIT:
        target, _ = prog.waits[flat]
        return f"stream join on {_op_desc(prog.instrs[target])}"
    if what == "rendezvous":
        for (group, _cid, n), issue in engine.collectives.open.items():
            if st.index in issue.arrived and group == ins.payload.group:
                absent = [engine.programs[c] for c in issue.classes if c not in issue.arrived]
                names = "; ".join(f"class {p.name} (ranks {format_ranks(p.ranks)})"
                                  for p in absent)
                return f"the other members of group {group} (issue {n}): {names}"
    return what


def _unmatched_desc(engine, kind: str, key: tuple, post) -> str:
    src, dst, tag, mb = key
    a, b = engine.programs[src], engine.programs[dst]
    ins = post.ins
    if kind == "send":
        return (f"send {ins.name!r} from class {a.name} (ranks {format_ranks(a.ranks)}) to class "
                f"{b.name} (ranks {format_ranks(b.ranks)}), tag {tag!r}, micro-batch {mb}, has "
                "no matching recv")
    return (f"recv {ins.name!r} on class {b.name} (ranks {format_ranks(b.ranks)}) from class "
            f"{a.name} (ranks {format_ranks(a.ranks)}), tag {tag!r}, micro-batch {mb}, has no "
            "matching send")


def describe_deadlock(engine, stuck, unmatched) -> str:
    """One message naming every stuck place and every unmatched send or recv."""
    parts = []
    names = {v: k for k, v in engine.streams.items()}
    for st in stuck:
        for sid, (flat, what) in sorted(st.at.items()):
            ins = st.prog.instrs[flat]
            parts.append(f"{_where(st, flat)}, stream {names[sid]!r}, is stuck at "
                         f"{_op_desc(ins)} waiting for {_waiting_for(engine, st, flat, what)}")
    parts += [_unmatched_desc(engine, kind, key, post) for kind, key, post in unmatched]
    return "deadlock: the program cannot make progress: " + "; ".join(parts)
