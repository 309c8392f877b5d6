"""The collectives of a stage's distinct pieces (:mod:`.blocks`) on each plan's networks.

A distinct piece ``k`` (its instructions lowered once, :func:`~ddlsim.simulator.analytical.
arrays.lower_ops`, with its collectives left symbolic) is held by the plans ``shared[k]``.
:func:`piece_collectives` times each of its collectives on those plans' networks, asking
each distinct (mesh, size) once. :func:`piece_contention` then adds the contention ops'
seconds: the GEMMs' extra time while the collectives they overlap hold SMs. The seconds are
keyed by :func:`seconds_key`.
"""

from __future__ import annotations

import numpy as np

from ..simulator.kernels.contention import contention_seconds
from ..workloads.trace import Compute

__all__ = ["piece_collectives", "piece_contention", "seconds_key"]


def piece_collectives(distinct: list, shared: list[np.ndarray], coll_at,
                      mesh_of: np.ndarray) -> dict:
    """Seconds of each collective of each distinct piece ``k`` on the networks of its plans
    ``shared[k]``, as ``{(k, op, family, bytes): array}``: one :func:`coll_at` call per
    (op, family), on each distinct (mesh, size) its pieces' plans ask once (a plan's time is
    its mesh's at that size: ``mesh_of[i]``, plan i's mesh), put back on every plan."""
    asked: dict[tuple, dict] = {}
    for k, (_, colls, _) in enumerate(distinct):
        for c in colls:
            # a contention op's seconds follow those of its collectives
            for x in (() if c is None else c.contention.collectives if _contends(c) else (c,)):
                asked.setdefault((x.op, x.group), {})[(k, x.bytes)] = None
    meshes = int(mesh_of.max(initial=-1)) + 1
    first = np.zeros(meshes, dtype=np.int64)   # a plan of each mesh (its first) stands for it
    first[mesh_of[::-1]] = np.arange(len(mesh_of) - 1, -1, -1)
    of_piece: dict[int, np.ndarray] = {}   # each piece's plans' meshes, gathered once
    seconds: dict[tuple, np.ndarray] = {}
    for (op, family), wanted in asked.items():
        keys = list(wanted)
        sizes = [len(shared[k]) for k, _ in keys]
        values = sorted({b for _, b in keys})
        at = {b: i * meshes for i, b in enumerate(values)}
        codes = np.concatenate([of_piece[k] if k in of_piece else
                                of_piece.setdefault(k, mesh_of[shared[k]]) for k, _ in keys])
        codes += np.repeat([at[b] for _, b in keys], sizes)   # (size, mesh) as one integer
        pairs = (np.bincount(codes, minlength=len(values) * meshes) != 0).nonzero()[0]
        table = np.empty(len(values) * meshes)
        table[pairs] = coll_at(op, family, np.array(values, dtype=float)[pairs // meshes],
                               first[pairs % meshes])
        for (k, b), part in zip(keys, np.split(table[codes], np.cumsum(sizes)[:-1])):
            seconds[(k, op, family, b)] = part
    return seconds


def _contends(op) -> bool:
    """Whether ``op`` (a collective, or a compute op left symbolic by
    :func:`~ddlsim.simulator.analytical.arrays.lower_ops`) is
    a contention op, whose seconds follow its collectives'."""
    return isinstance(op, Compute)


def seconds_key(k: int, op) -> tuple:
    """The key of ``op``'s seconds in distinct piece ``k``."""
    return (k, op) if _contends(op) else (k, op.op, op.group, op.bytes)


def piece_contention(ctx, distinct: list, seconds: dict, backend: str) -> None:
    """Add to ``seconds`` each contention op's, on arrays over its piece's plans: the GEMMs'
    extra time while NCCL's channels (with the ``nccl`` backend) hold SMs for as long as its
    collectives run, one after another (:meth:`~ddlsim.simulator.costs.CostModel.compute`)."""
    from ..simulator.kernels.contention import nccl_ring_ctas

    ctas = None   # the system's, asked once (it depends on nothing else)
    for k, (_, colls, _) in enumerate(distinct):
        for c in colls:
            if c is not None and _contends(c) and seconds_key(k, c) not in seconds:
                comm = sum(n * seconds[seconds_key(k, x)] for x, n in c.contention.issues())
                if ctas is None:
                    ctas = nccl_ring_ctas(ctx.cfg.system) if backend == "nccl" else 0
                seconds[seconds_key(k, c)] = contention_seconds(c, ctx.dev, ctas, comm)
