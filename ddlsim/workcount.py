"""What a run will cost, counted from its config (and its trace, once built) in the units of
the work budgets of :class:`ddlsim.limits.Limits`: ranks, pipeline steps, the cluster graph's
links, and the trace's ops per rank class and over all ranks. :func:`ddlsim.limits.check_work`
refuses a run whose counts exceed a budget.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .config import RunConfig

__all__ = ["estimate_work", "topology_links", "trace_ops"]


def estimate_work(cfg: RunConfig, engine: str) -> dict[str, int]:
    """What running ``cfg`` on ``engine`` costs before the trace is built, in the units of
    :class:`Limits` (the DES's ``des_rank_ops`` needs the trace: see :func:`check_work`).
    Both engines build the topology graph, so ``topology_links`` is counted for either."""
    p = cfg.parallel
    chunks = p.vpp if p.schedule == "interleaved" else 1
    return {"ranks": cfg.world_size,
            "pipeline_steps": p.pp * (2 * cfg.num_microbatches * chunks + 1),
            # both engines build the cluster graph (the analytical one measures the links a
            # group crosses on it), so both are bounded by its size
            "topology_links": topology_links(cfg.system)}


def topology_links(system: Any) -> int:
    """Directed links of the cluster graph of ``system`` (a system section or topology spec),
    counted from its shape: an upper estimate of what :mod:`ddlsim.topologies` builds."""
    n, d, k = system.nodes, system.devices_per_node, system.nics_per_node
    kind, net = system.intra_node.kind, system.network
    intra = d * (d - 1) // 2 if kind == "nvlink_mesh" else d + 1
    attach = d * max(1, k // d) if kind in ("nvlink_ring", "nvlink_mesh") else k
    fabric = {"single_switch": k, "torus": k + len(net.torus_dims or (0, 0))}.get(net.topology)
    if fabric is None and net.topology == "dragonfly":
        per_group = getattr(net, "routers_per_group", None) or math.isqrt(max(n - 1, 0)) + 1
        groups = -(-n // per_group)
        fabric = k + per_group + groups * getattr(net, "global_links", 1)
    if fabric is None:  # trees: NIC-leaf links and at most two levels of uplinks
        fabric = 3 * k
    return 2 * n * (intra + attach + fabric)


def trace_ops(workload: Any) -> tuple[int, int]:
    """Ops of one iteration's trace: ``(Σ classes of Σ steps of block ops, the same × ranks
    of each class)``: what the analytical engine times (one rank per class) and what the
    DES executes (every rank). A :class:`~ddlsim.workloads.trace.Loop` counts as the ops it
    unrolls to, counted without unrolling it."""
    per_class = per_rank = 0
    seen: dict[int, int] = {}   # ops per block, a block shared by classes counted once
    for c in workload.classes:
        blocks = c.program.blocks
        for block in blocks.values():
            if id(block) not in seen:
                seen[id(block)] = _unrolled_ops(block.ops)
        steps = c.program.steps
        if hasattr(steps, "names"):  # a StepTable: each step's ops by its block index
            ops = np.array([seen[id(blocks[name])] for name in steps.names], dtype=np.int64)
            n = int(ops.take(steps.block).sum())
        else:
            n = sum(seen[id(blocks[s.block])] for s in steps)
        per_class += n
        per_rank += len(c.ranks) * n
    return per_class, per_rank


def _unrolled_ops(ops: Any) -> int:
    """How many ops ``ops`` unroll to (a Loop: count × repeat × its body's)."""
    from .workloads.trace import Loop

    n = len(ops)
    for op in ops:
        if type(op.payload) is Loop:
            n += op.payload.count * op.repeat * _unrolled_ops(op.payload.body) - 1
    return n
