"""A block timed for many plans at once: the engine's instructions with arrays of durations.

The search tier (:mod:`ddlsim.search.blocks`) times the blocks a family's own builder makes,
for every plan that shares them, where only the collectives' durations differ from plan to
plan (each plan's groups sit on its own network). :func:`lower_ops` resolves a block's ops
into the engine's :class:`~.instructions.Instr` records as :class:`~.instructions._Lowering`
does (a repeated op holds its stream ``repeat`` times as long; collectives of one family
issued together on separate streams share their links, :func:`~.instructions._share_concurrent`),
its collectives left as symbols; :func:`with_collectives` gives them their seconds on each
plan's network (arrays over the plans), and :func:`stream_ends` applies the timing rule of
:mod:`ddlsim.simulator.timing` to them::

    start = max(ready, stream free);   end = start + duration

element-wise over the plans. A block without point-to-point ops and rendezvous (a layer, the
embedding, the head) is timed here exactly as the scheduler times it, bit for bit when the
durations are the same floats (``tests/test_search_blocks.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ...workloads.trace import Block, Collective, Compute, Loop, P2P, Wait
from .instructions import COLL, COMPUTE, WAIT, Instr, _new_instr, _share_concurrent

__all__ = ["lower_ops", "lean_ops", "with_collectives", "stream_ends", "structure", "stream_ends_together"]


def lower_ops(ops: Sequence, compute_s: Callable[[Compute], float]
              ) -> tuple[tuple[Instr, ...], tuple[Collective | None, ...]]:
    """Instructions of ``ops`` (a block's ops, any ``Loop`` unrolled as the analytical engine
    unrolls it: :attr:`~ddlsim.workloads.trace.Block.lean`), collectives left symbolic.

    Parameters
    ----------
    ops : the block's :class:`~ddlsim.workloads.trace.Op` list, without point-to-point ops
        (or a :class:`~ddlsim.workloads.trace.Block` of them, whose unrolled ops it keeps).
    compute_s : seconds of one issue of a compute op (the cost model's
        :meth:`~ddlsim.simulator.costs.CostModel.compute`).

    Returns
    -------
    instrs : tuple of Instr
        ``dur`` in seconds; a collective's ``dur`` is the factor its one issue's seconds
        take (its ``repeat``, times the collectives of its family issued with it: they share
        the links); streams numbered in order of first use, the compute stream 0.
    collectives : per instruction, its :class:`~ddlsim.workloads.trace.Collective`, or the
        :class:`~ddlsim.workloads.trace.Compute` of a contention op with collectives (whose
        seconds follow theirs; None for the others): :func:`with_collectives` puts their
        seconds in.
    """
    lean = ops.lean.ops if isinstance(ops, Block) else lean_ops(tuple(ops))
    streams = {"compute": 0}
    out: list[Instr] = []
    colls: list[Collective | Compute | None] = []
    for op in lean:
        p, k, kind = op.payload, op.repeat, type(op.payload)
        sid = streams.setdefault(op.stream, len(streams))
        symbol = None
        # each Instr as a full tuple of its fields (code, stream, deps, dur, label, flops,
        # nbytes, peer, group, target): faster than its keywords, once per op of a grid
        if kind is Compute and not _symbolic(p):
            label = "optimizer" if p.kind == "optimizer" else "compute"
            fields = (COMPUTE, sid, op.deps, k * compute_s(p), label, k * p.flops, 0.0)
        elif kind is Compute:
            # overlapped GEMMs' extra time, which depends on the collectives' (per plan)
            fields = (COMPUTE, sid, op.deps, float(k), "compute", k * p.flops, 0.0)
            symbol = p
        elif kind is Collective:
            fields = (COLL, sid, op.deps, float(k), p.group, 0.0, k * p.bytes)
            symbol = p
        elif kind is Wait:
            target = streams.setdefault(p.stream, len(streams))
            out.append(_new_instr((WAIT, sid, op.deps, 0.0, "", 0.0, 0.0, None, None, target)))
            colls.append(None)
            continue
        elif kind is P2P:
            raise ValueError(f"op {p.name!r}: point-to-point ops are timed by the pipeline's "
                             "closed form, not in a block of arrays")
        else:
            raise TypeError(f"unexpected op payload {kind.__name__}")
        out.append(_new_instr(fields + (None, None, -1)))
        colls.append(symbol)
    return _share_concurrent(out, lean), tuple(colls)


def lean_ops(ops: tuple) -> tuple:
    """``ops`` as :attr:`~ddlsim.workloads.trace.Block.lean` writes them (self-contained
    loops written once, their ops repeated; the others unrolled): ``ops`` themselves where
    no op is a :class:`~ddlsim.workloads.trace.Loop`, without making a block, whose lean
    form would then be the block itself, a reference cycle only the garbage collector frees
    (a search grid lowers a few hundred op lists)."""
    if Loop not in {type(op.payload) for op in ops}:   # (a set: no generator per op list)
        return ops
    return Block("piece", "forward", ops).lean.ops


def _symbolic(p) -> bool:
    """A contention op whose seconds follow its collectives' (left symbolic, as they are)."""
    return isinstance(p, Compute) and p.contention is not None and bool(p.contention.collectives)


def with_collectives(instrs: Sequence[Instr], collectives: Sequence[Collective | None],
                     seconds: Callable[[Collective], np.ndarray | float]) -> list[Instr]:
    """``instrs`` from :func:`lower_ops` with each collective's factor times ``seconds(op)``
    (one issue, a float or an array over the plans; 0 on a group of one rank; for a
    contention op, its seconds)."""
    return [ins if c is None else _new_instr(ins[:3] + (ins.dur * seconds(c),) + ins[4:])
            for ins, c in zip(instrs, collectives)]


def stream_ends(instrs: Sequence[Instr], n: int) -> tuple[np.ndarray, np.ndarray]:
    """When the block's compute stream, and its last stream, are free, per plan.

    Every stream starts free at 0; an instruction starts at ``max(its deps' ends, the end of
    a waited stream, its stream free)`` and holds its stream for ``dur``.

    Parameters
    ----------
    instrs : from :func:`lower_ops`.
    n : plans (the length of every array duration).

    Returns
    -------
    (compute, last) : arrays of seconds from the block's start.
    """
    # a time stays a float until an array (a collective's seconds per plan) reaches it: the
    # same values element by element, without an array operation per instruction where
    # every plan has the same time (the compute ops before a block's first collective)
    # (:func:`_latest` written out where both times are floats: one call fewer per read)
    # (an Instr unpacked into names, not ``*_``: no list made per instruction)
    free: dict[int, float | np.ndarray] = {}
    ends: list[float | np.ndarray] = []
    for code, stream, deps, dur, _, _, _, _, _, target in instrs:
        ready = 0.0
        for d in deps:
            e = ends[d]
            ready = ((ready if ready >= e or ready != ready else e)
                     if type(e) is float and type(ready) is float else _latest(ready, e))
        if code == WAIT:
            ready = _latest(ready, free.get(target, 0.0))
        e = free.get(stream, 0.0)
        end = ((ready if ready >= e or ready != ready else e)
               if type(e) is float and type(ready) is float else _latest(ready, e)) + dur
        free[stream] = end
        ends.append(end)
    last = 0.0
    for f in free.values():
        last = _latest(last, f)
    return _per_plan(free.get(0, 0.0), n), _per_plan(last, n)


def structure(instrs: Sequence[Instr]) -> tuple:
    """What :func:`stream_ends` reads of ``instrs`` beside their durations: each one's code,
    stream, dependencies and waited stream. Blocks with equal structures are timed together
    by :func:`stream_ends_together`."""
    return tuple((ins.code, ins.stream, ins.deps, ins.target) for ins in instrs)


def stream_ends_together(instrs: Sequence[Instr], durations: Sequence[Sequence],
                         sizes: Sequence[int]) -> list[np.ndarray]:
    """:func:`stream_ends`' compute stream of blocks of one :func:`structure` (``instrs``:
    any one of them), block ``j`` with its instructions' ``durations[j]`` (seconds: floats,
    or arrays over its ``sizes[j]`` plans), timed at once over their plans laid end to end:
    one array operation per instruction rather than one per block and instruction, and
    element by element the same floats as each block timed apart (a float and an array
    holding it, maxima and sums alike).

    Returns
    -------
    list of numpy.ndarray
        Per block, when its compute stream is free, per plan (seconds).
    """
    if len(durations) == 1:
        merged = durations[0]
    else:
        merged = [_laid_end_to_end(column, sizes) for column in zip(*durations)]
    timed = [_new_instr(ins[:3] + (dur,) + ins[4:]) for ins, dur in zip(instrs, merged)]
    ends = stream_ends(timed, int(sum(sizes)))[0]
    bounds = np.cumsum(sizes).tolist()
    return [ends[a:b] for a, b in zip([0, *bounds[:-1]], bounds)]


def _laid_end_to_end(values: Sequence, sizes: Sequence[int]) -> float | np.ndarray:
    """One instruction's durations in several blocks (``values[j]`` a float, or an array of
    ``sizes[j]``) as one duration over all their plans: the float itself where every block
    has the same float (:func:`stream_ends` keeps it a float), else an array."""
    if not any(isinstance(v, np.ndarray) for v in values):
        first = values[0]
        # equal floats (NaN never is), zeros of one sign: the same float in every block
        if all(v == first for v in values) and (first != 0.0 or len(
                {math.copysign(1.0, v) for v in values}) == 1):
            return first
        return np.repeat(np.array(values, dtype=float), sizes)
    return np.concatenate([v if isinstance(v, np.ndarray) else np.full(n, v, dtype=float)
                           for v, n in zip(values, sizes)])


def _latest(a: float | np.ndarray, b: float | np.ndarray) -> float | np.ndarray:
    """:func:`numpy.maximum` of ``a`` and ``b``, a float where both are (NaN propagates)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a >= b or a != a else b


def _per_plan(t: float | np.ndarray, n: int) -> np.ndarray:
    """``t`` as an array over the ``n`` plans."""
    return t if isinstance(t, np.ndarray) else np.full(n, float(t))
