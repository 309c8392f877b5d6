"""Collectives of a host library on a CPU rank with no spare core: they run on the
compute's cores, so they add to the compute instead of overlapping it.

A GPU runs its collectives beside its compute on engines of their own (NCCL's kernels on a
few SMs, the copy engines, the NIC; what they take from the GEMMs beside them is
:mod:`.kernels.contention`), so a trace issues them on communication streams that run
alongside the compute stream. A host library on a CPU does a collective's copies and
reductions on CPU threads: Gloo on the worker thread of its process group (torch
``ProcessGroupGloo``: each work item runs on one of its ``threads``), Open MPI on the
calling thread (a blocking collective, or a non-blocking one progressed by the calls that
test it). Where a rank's compute threads already fill the cores it has
(``system.device.spare_cores = 0``: one rank per core with torch or BLAS on one thread, the
closed loops' ranks), those threads run on the compute's cores: Linux's CFS scheduler gives
the runnable threads of a core equal shares of it (``Documentation/scheduler/
sched-design-CFS.rst``), so while both run each progresses at half its rate and the two
finish when the sum of their work is done, as if run one after the other. So on such a
device every collective is timed on the compute stream, in the order the rank issues it:
an overlap the trace grants (a prefetched gather beside the layer before it, a gradient
bucket beside the rest of the backward) is not there to be had, and under a CPU-time clock
the process's CPU time counts the collective's threads whatever they overlap. The
collective's own time is unchanged (the library's time alone, as calibrated).

Not modelled: a rank that waits for its peers inside the collective leaves its core to the
compute under time-sharing, where here the compute waits too (the ranks of a data-parallel
group reach their collectives together); point-to-point transfers (``send``/``recv``, the
pipeline's) stay on their streams; a device with spare cores (``spare_cores`` >= 1, or unset:
a GPU) keeps the trace's overlap.
"""

from __future__ import annotations

from dataclasses import replace

from ..workloads.trace import Block, Collective, Loop, Op, Program, RankClass, Workload

__all__ = ["shares_cores", "on_compute_cores"]


def shares_cores(system) -> bool:
    """Whether ``system``'s ranks run their collectives on their compute's cores: a device
    that declares no spare core (``device.spare_cores == 0``).

    Parameters
    ----------
    system : a :class:`~ddlsim.config.SystemConfig`.

    Returns
    -------
    bool
    """
    return system.device.spare_cores == 0


def on_compute_cores(workload: Workload, system) -> Workload:
    """``workload`` with every collective on the ``compute`` stream where ``system``'s
    ranks have no spare core (:func:`shares_cores`), else ``workload`` itself.

    Parameters
    ----------
    workload : the trace of one iteration.
    system : the :class:`~ddlsim.config.SystemConfig` it runs on.

    Returns
    -------
    Workload
        The same workload (the same object when nothing moves) whose collectives issued on
        another stream are issued on ``compute`` instead, at the same place in their block,
        with the same dependencies (inside loops too).
    """
    if not shares_cores(system):
        return workload
    done: dict[int, Block] = {}
    classes = tuple(RankClass(c.name, c.ranks, Program(
        {name: _block(b, done) for name, b in c.program.blocks.items()}, c.program.steps))
        for c in workload.classes)
    if all(done[id(b)] is b for c in workload.classes for b in c.program.blocks.values()):
        return workload
    return replace(workload, classes=classes)


def _block(block: Block, done: dict[int, Block]) -> Block:
    """``block`` with its collectives on ``compute`` (each block object rewritten once)."""
    if id(block) not in done:
        ops = _ops(block.ops)
        done[id(block)] = block if ops is block.ops else Block(block.name, block.phase, ops)
    return done[id(block)]


def _ops(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """``ops`` with each collective on ``compute`` (loop bodies too); ``ops`` itself when
    none moves."""
    out = tuple(_op(o) for o in ops)
    return ops if all(a is b for a, b in zip(out, ops)) else out


def _op(op: Op) -> Op:
    p = op.payload
    if isinstance(p, Loop):
        body = _ops(p.body)
        return op if body is p.body else replace(op, payload=Loop(p.name, body, p.count))
    if isinstance(p, Collective) and op.stream != "compute":
        return replace(op, stream="compute")
    return op
