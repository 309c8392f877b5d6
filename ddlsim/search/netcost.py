"""Collective and point-to-point costs for arrays of plans, from the exact engine's own code.

Two facts make this a reuse rather than a copy of the physics:

* **The group networks** (:class:`~ddlsim.simulator.collectives.GroupNet`: members per node,
  nodes spanned, NIC share) depend only on the mesh (TP, PP, DP) and the system, and a grid
  has few meshes. :func:`mesh_networks` builds them for each distinct mesh with
  :class:`~ddlsim.simulator.costs.CostModel` itself.
* **Every registered closed form is affine in the message size** ``n`` on a fixed network
  (``α·steps + n·(per-byte terms)``; a ``max`` of two per-byte terms is still linear in
  ``n ≥ 0``). So ``time(n) = time(0) + n·(time(N) − time(0))/N``: two calls of the registered
  scalar function per (op, algorithm, network) give the coefficients, and the arrays of
  plans are timed with one multiply-add. :func:`affine_form` checks the affinity at a third
  size and refuses a form that is not affine (a future algorithm with a size threshold would
  need its own vectorised form, registered next to it).

``"auto"`` is the minimum over the registered algorithms, as
:func:`~ddlsim.simulator.collectives.best_algorithm` takes it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np

from ..errors import ConfigError
from ..simulator.collectives import GroupNet, algorithms_for, collective_time

__all__ = ["affine_form", "check_affine", "MeshNets", "mesh_networks", "collective_seconds", "PROBE_BYTES"]

#: The size at which the slope of a closed form is probed (1 GiB: large enough that the
#: latency term does not swamp the per-byte term in float64).
PROBE_BYTES = float(2 ** 30)


@lru_cache(maxsize=65536)
def affine_form(op: str, algorithm: str, net: GroupNet) -> tuple[float, float]:
    """``(a, b)`` with ``time(n) = a + b·n`` for the registered form of ``op``/``algorithm``
    on ``net`` (``(inf, 0)`` where the form cannot run there, e.g. hierarchical on uneven
    placement). Cached: a pure function of the registered forms and a frozen network.
    :func:`check_affine` verifies the premise (``tests/test_search_costs.py`` runs it for
    every registered algorithm).
    """
    a = collective_time(op, algorithm, 0.0, net)
    if not math.isfinite(a):
        return math.inf, 0.0
    return a, (collective_time(op, algorithm, PROBE_BYTES, net) - a) / PROBE_BYTES


def check_affine(op: str, algorithm: str, net: GroupNet, rel: float = 1e-9) -> None:
    """Raise :class:`ConfigError` if the registered form is not affine in the message size
    on ``net`` (checked at a third size)."""
    a, b = affine_form(op, algorithm, net)
    if not math.isfinite(a):
        return
    mid = collective_time(op, algorithm, PROBE_BYTES / 3, net)
    if abs(mid - (a + b * PROBE_BYTES / 3)) > rel * max(mid, 1e-30):
        raise ConfigError(f"collective {op!r} algorithm {algorithm!r} is not affine in the "
                          "message size, so the vectorised search tier cannot time it; give "
                          "it a vectorised form in ddlsim/search/netcost.py or fix "
                          "parallel.collective_algorithm to another algorithm")


class MeshNets(NamedTuple):
    """The networks of each distinct mesh: ``nets[i][family]``, and the pipeline's
    point-to-point hops as :meth:`~ddlsim.simulator.costs.CostModel.p2p` times them between
    the first ranks of consecutive stages: over the ``pp − 1`` hops, the sum of latencies
    (``hop_alpha_s``) and of seconds per byte (``hop_s_per_byte``); ``wrap_alpha_s`` and
    ``wrap_s_per_byte`` for the hop from the last stage back to the first (the interleaved
    schedule's chunk boundary)."""

    nets: list[dict[str, GroupNet]]
    hop_alpha_s: np.ndarray
    hop_s_per_byte: np.ndarray
    wrap_alpha_s: np.ndarray
    wrap_s_per_byte: np.ndarray


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
    from ..workloads.mesh import DeviceMesh

    nets, hops, wraps = [], [], []
    for tp, pp, dp in meshes.tolist():
        mesh = DeviceMesh.from_megatron(tensor_model_parallel_size=tp,
                                        pipeline_model_parallel_size=pp, data_parallel_size=dp,
                                        order=cfg.parallel.rank_order)
        groups = _first_groups(mesh)
        stand_in = SimpleNamespace(world_size=mesh.world_size, groups=groups)
        devices = place_ranks_on_system(cfg.system, mesh.world_size)
        cost = CostModel(cfg.system, stand_in, cfg.parallel.collective_algorithm,
                         devices=devices)
        nets.append(cost.nets)
        stages = groups["pp"].members[0]
        hops.append(_hops(cost, stages))
        wraps.append(_hops(cost, stages[[-1, 0]]) if pp > 1 else (0.0, 0.0))
    hops, wraps = np.array(hops).reshape(-1, 2), np.array(wraps).reshape(-1, 2)
    return MeshNets(nets, hops[:, 0], hops[:, 1], wraps[:, 0], wraps[:, 1])


def _first_groups(mesh) -> dict:
    """The ``tp``, ``dp`` and ``pp`` families with only their first group (the one holding
    rank 0): all :meth:`CostModel._group_net` reads (:meth:`DeviceMesh.groups`' row 0, built
    with :meth:`DeviceMesh.rank_of` instead of every group)."""
    from ..workloads.mesh import AXES
    from ..workloads.trace import GroupFamily

    axes = ("tp", "dp", "pp")
    out = {}
    for i, name in enumerate(axes):
        n = mesh.size(name)
        coords = np.zeros((n, 3), dtype=np.int64)
        coords[:, i] = np.arange(n)
        out[name] = GroupFamily(name, AXES[name], mesh.rank_of(coords, axes)[None, :])
    return out


def _hops(cost, stages: np.ndarray) -> tuple[float, float]:
    """(Σ latency, Σ seconds per byte) of the hops stage s → s + 1 between ``stages``' ranks,
    each as :meth:`CostModel.p2p` times it (zero bytes and :data:`PROBE_BYTES` give the two
    parts of its affine form)."""
    from ..workloads.trace import P2P

    one = P2P("hop", "send", "pp", 1, PROBE_BYTES, "hop")
    zero = P2P("hop", "send", "pp", 1, 0.0, "hop")
    alpha = per_byte = 0.0
    for src, dst in zip(stages[:-1].tolist(), stages[1:].tolist()):
        a = cost.p2p(zero, src, dst)
        alpha += a
        per_byte += (cost.p2p(one, src, dst) - a) / PROBE_BYTES
    return alpha, per_byte


def _coefficients(op: str, family: str, nets: list[dict[str, GroupNet]],
                  choice: str) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)`` arrays of shape (algorithms, meshes); a group of one rank costs 0. An
    algorithm no faster than another on every mesh at every size (``a`` and ``b`` both no
    smaller) cannot be the minimum and is dropped."""
    names = algorithms_for(op) if choice == "auto" else [choice]
    a = np.zeros((len(names), len(nets)))
    b = np.zeros_like(a)
    for j, per_mesh in enumerate(nets):
        net = per_mesh[family]
        if net.p <= 1:
            continue
        for i, name in enumerate(names):
            a[i, j], b[i, j] = affine_form(op, name, net)
    keep = [i for i in range(len(names))
            if not any(np.all(a[i] >= a[k]) and np.all(b[i] >= b[k])
                       and (np.any(a[i] > a[k]) or np.any(b[i] > b[k]) or k < i)
                       for k in range(len(names)) if k != i)]
    return a[keep], b[keep]


def collective_seconds(op: str, family: str, nbytes: np.ndarray, mesh_index: np.ndarray,
                       nets: list[dict[str, GroupNet]],
                       algorithms: Mapping[str, str] | None = None,
                       memo: dict | None = None) -> np.ndarray:
    """Seconds of one ``op`` of ``nbytes[i]`` bytes on family ``family`` of plan i's mesh
    (``mesh_index[i]`` into ``nets``), with the configured algorithm or the cheapest;
    ``memo`` keeps the coefficients of each (op, family, choice) between calls on the same
    ``nets``.

    The same numbers as :meth:`ddlsim.simulator.costs.CostModel.collective` to rounding
    (``tests/test_search_costs.py``).
    """
    choice = (algorithms or {}).get(op, "auto")
    key = (op, family, choice)
    if memo is not None and key in memo:
        a, b = memo[key]
    else:
        a, b = _coefficients(op, family, nets, choice)
        if memo is not None:
            memo[key] = a, b
    times = a[:, mesh_index] + b[:, mesh_index] * np.asarray(nbytes, dtype=float)
    return times.min(axis=0)
