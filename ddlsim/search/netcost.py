"""The meshes' group networks and pipeline hops for arrays of plans, from the exact
engine's own code.

**The group networks** (:class:`~ddlsim.simulator.collectives.GroupNet`: members per node,
nodes spanned, NIC share, NCCL's view of the machine) depend only on the mesh (TP, PP, DP)
and the system, and a grid has few meshes. :func:`mesh_networks` builds them for each
distinct mesh with :class:`~ddlsim.simulator.costs.CostModel` itself, and records its
collective backend (``nccl``, ``mpi``, ``mpich`` or ``openmpi``); the pipeline's hops are
timed by :meth:`~ddlsim.simulator.costs.CostModel.p2p`. The collectives on those networks
are timed by :func:`.collforms.collective_seconds` (the registered closed forms and NCCL's
model on arrays).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple

import numpy as np

from ..simulator.collectives import GroupNet
from ..workloads.mesh import AXES
from ..workloads.trace import P2P
from .collforms import PROBE_BYTES, affine_form, check_affine, collective_seconds

__all__ = ["affine_form", "check_affine", "MeshNets", "mesh_networks", "collective_seconds",
           "PROBE_BYTES", "cache_clear"]

class MeshNets(NamedTuple):
    """The networks of each distinct mesh: ``nets[i][family]``, and the pipeline's
    point-to-point hops as :meth:`~ddlsim.simulator.costs.CostModel.p2p` times them between
    the first ranks of consecutive stages: over the ``pp − 1`` hops, the sum of latencies
    (``hop_alpha_s``) and of seconds per byte (``hop_s_per_byte``); ``wrap_alpha_s`` and
    ``wrap_s_per_byte`` for the hop from the last stage back to the first (the interleaved
    schedule's chunk boundary); ``stage_alpha_s`` and ``stage_s_per_byte``, shape (meshes,
    k, 2): the same parts of the hops each stage receives over (a hop that leaves its node
    costs more than one inside it), as :func:`_stage_hops` rows them; ``each_alpha_s`` and
    ``each_s_per_byte``, shape (meshes, max PP − 1): the same parts of each hop s → s + 1 in
    order (0 past a mesh's last hop)."""

    nets: list[dict[str, GroupNet]]
    hop_alpha_s: np.ndarray
    hop_s_per_byte: np.ndarray
    wrap_alpha_s: np.ndarray
    wrap_s_per_byte: np.ndarray
    stage_alpha_s: np.ndarray
    stage_s_per_byte: np.ndarray
    #: the system's collective backend, :attr:`CostModel.comm_backend`
    backend: str = "mpi"
    each_alpha_s: np.ndarray | None = None
    each_s_per_byte: np.ndarray | None = None


def mesh_networks(cfg, meshes: np.ndarray) -> MeshNets:
    """Group networks for each row ``(tp, pp, dp)`` of ``meshes`` on ``cfg``'s system.

    Parameters
    ----------
    cfg : a :class:`~ddlsim.config.RunConfig` giving the system and the rank order.
    meshes : int array of shape (k, 3).

    Returns
    -------
    MeshNets
    """
    from ..simulator.costs import CostModel, place_ranks_on_system
    from ..workloads.decoder.tied_embedding import family_of
    from ..workloads.mesh import DeviceMesh

    rows = meshes.tolist()
    shape = getattr(cfg.model, "shape", None)   # a decoder's (tied_embeddings)
    tied = bool(getattr(shape(), "tied_embeddings", False)) if shape else False
    nets: list[dict[str, GroupNet]] = [{} for _ in rows]
    hops, wraps, backend = np.zeros((len(rows), 2)), np.zeros((len(rows), 2)), "mpi"
    stage_rows: list[np.ndarray] = [np.empty((0, 2, 2))] * len(rows)
    each = np.zeros((len(rows), max(max(pp for _, pp, _ in rows) - 1, 1), 2))
    system_key = cfg.system.model_dump_json()
    by_world: dict[int, list[int]] = {}
    for i, (tp, pp, dp) in enumerate(rows):
        by_world.setdefault(tp * pp * dp, []).append(i)
    # one cost model per world size (the ranks' placement), holding the families of all its
    # meshes, each under its own name: "tp3" is mesh 3's tensor-parallel family
    for world, members in by_world.items():
        groups, stages = {}, {}
        for i in members:
            tp, pp, dp = rows[i]
            mesh = DeviceMesh.from_megatron(tensor_model_parallel_size=tp,
                                            pipeline_model_parallel_size=pp,
                                            data_parallel_size=dp, order=cfg.parallel.rank_order)
            for name, fam in _families(mesh).items():
                groups[f"{name}{i}"] = fam
            if tied and pp > 1:   # the tied embedding's first and last stages
                groups[f"embedding{i}"] = family_of(groups[f"pp{i}"].members)
            stages[i] = groups[f"pp{i}"].members[0]
        stand_in = SimpleNamespace(world_size=world, groups=groups)
        cost = CostModel(cfg.system, stand_in, cfg.parallel.collective_algorithm,
                         devices=place_ranks_on_system(cfg.system, world),
                         system_key=system_key)
        backend = cost.comm_backend
        for i in members:
            nets[i] = {name: cost.nets[f"{name}{i}"] for name in ("tp", "dp", "pp", "embedding")
                       if f"{name}{i}" in groups}
            parts = _hop_parts(cost, f"pp{i}", stages[i])
            hops[i], stage_rows[i] = _hops(parts), _stage_hops(parts)
            each[i, :len(parts)] = parts
            if rows[i][1] > 1:
                wraps[i] = _hops(_hop_parts(cost, f"pp{i}", stages[i][[-1, 0]]))
    k = max(len(r) for r in stage_rows)
    staged = np.zeros((len(rows), k, 2, 2))
    staged[..., 0] = -np.inf
    for i, r in enumerate(stage_rows):
        staged[i, :len(r)] = r
    return MeshNets(nets, hops[:, 0], hops[:, 1], wraps[:, 0], wraps[:, 1], staged[..., 0],
                    staged[..., 1], backend, each[..., 0], each[..., 1])


def _families(mesh) -> dict:
    """The ``tp``, ``dp`` and ``pp`` families with all their groups: the topology graph's
    fair shares (:func:`~ddlsim.simulator.netmodel.family_net`) count every group of a family
    that shares the node's links."""
    return {name: mesh.family(name, AXES[name], name) for name in ("tp", "dp", "pp")}


def _hop_parts(cost, group: str, stages: np.ndarray) -> np.ndarray:
    """(latency, seconds per byte) of each hop stage s → s + 1 between ``stages``' ranks on
    the pipeline family ``group`` of ``cost``, shape (hops, 2), each as :meth:`CostModel.p2p`
    times it (zero bytes and :data:`PROBE_BYTES` give the two parts of its affine form)."""
    one = P2P("hop", "send", group, 1, PROBE_BYTES, "hop")
    zero = P2P("hop", "send", group, 1, 0.0, "hop")
    # CostModel.p2p times a hop by whether it leaves its node: ask once per kind (the
    # stages as Python ints: a mesh has at most a few dozen)
    ranks = stages.tolist()
    nodes = cost.node_of_rank[stages].tolist()
    cross = [int(a != b) for a, b in zip(nodes, nodes[1:])]
    kinds = np.empty((2, 2))
    for kind in set(cross):
        s = cross.index(kind)
        a = cost.p2p(zero, ranks[s], ranks[s + 1])
        kinds[kind] = (a, (cost.p2p(one, ranks[s], ranks[s + 1]) - a) / PROBE_BYTES)
    return kinds[np.array(cross, dtype=np.intp)].reshape(len(cross), 2)


def _stage_hops(parts: np.ndarray) -> np.ndarray:
    """The hops each stage receives over, from each hop's (latency, seconds per byte)
    ``parts`` (:func:`_hop_parts`): shape (rows, 2, 2), a row per stage, its (activation
    hop, gradient hop); row 0 the first stage's (none, hop 0 → 1), row 1 the last stage's
    (hop p − 2 → p − 1, none), then each distinct middle stage's (hops s − 1 and s). An
    absent hop has latency −inf and 0 seconds per byte."""
    none = np.array([-np.inf, 0.0])
    if not len(parts):
        return np.stack([[none, none], [none, none]])
    # the distinct (hop s − 1, hop s) pairs in ascending order, as np.unique(axis=0) sorts
    # them (by the first row's latency, …), at a third of its cost on these few rows
    pairs = sorted(set(zip(*parts[:-1].T.tolist(), *parts[1:].T.tolist())))
    middle = np.array(pairs, dtype=float).reshape(-1, 2, 2)
    return np.concatenate([np.stack([[none, parts[0]], [parts[-1], none]]), middle])


def _hops(parts: np.ndarray) -> tuple[float, float]:
    """(Σ latency, Σ seconds per byte) of the hops ``parts`` (:func:`_hop_parts`), added in
    order (np.cumsum adds one after another, as a loop would: the same sums, bit for bit, as
    asking every hop)."""
    if not len(parts):
        return 0.0, 0.0
    alpha, per_byte = np.cumsum(parts, axis=0)[-1].tolist()
    return alpha, per_byte


def cache_clear() -> None:
    """Forget the cached forms, the group networks measured on the topology (and the tree
    fabric's routes they took), the decoder
    builder's memos (a layer's and the head's kernels, the final norm's and the embedding
    backward's ops, the pipeline splits and schedules), NCCL's channel and tree rules per
    network, the configs' meshes and the resolved software stacks,
    for timing a cold run; the topology graph itself, built once per system, and the tables
    read from the package's data files are kept."""
    from .. import software
    from ..config import _mesh_of
    from ..simulator.costs import _NETS, _P2P
    from ..simulator.collectives.nccl import model as nccl_model
    from ..simulator.collectives.nccl.model import nccl_form
    from ..simulator.netmodel import cache_clear as forget_intra
    from ..topologies.tree_routes import cache_clear as forget_routes
    from ..workloads import schedules
    from ..workloads.decoder import embedding_grad, layerkernels, split
    # (the final norm's, the embedding backward's and NCCL's rules are keyed by value:
    # left, a later grid found the last one's, 11 M instructions of a cold grid's ~980 M)
    for memo in (layerkernels.layer_kernels, layerkernels.logits_kernels,
                 layerkernels.loss_op, split._split, schedules._cached, _mesh_of,
                 layerkernels.final_norm_op, embedding_grad.embedding_backward_op,
                 nccl_model._channel_rule, nccl_model._tree_levels):
        memo.cache_clear()
    forget_intra()
    forget_routes()
    affine_form.cache_clear()
    nccl_form.cache_clear()
    _NETS.clear()
    _P2P.clear()
    software.cache_clear()
