"""SMs that NCCL's channels take from the GEMMs they overlap, for arrays of plans.

The decoder's overlapped data-parallel collectives (gradient buckets, ZeRO-3 gathers, the
distributed optimizer's parameter gather) hold SMs while the layers' GEMMs run beside them
(:mod:`ddlsim.workloads.smcontention`, :mod:`ddlsim.simulator.kernels.contention`): here the
same rule on each plan's network and GEMM FLOPs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..simulator.kernels.contention import extra_seconds as extra, gemm_seconds, \
    nccl_ring_ctas
from ..workloads.decoder.layerkernels import compute_dtype

__all__ = ["nccl_ctas", "sm_taken", "extra_seconds"]


def nccl_ctas(cfg: Any, net: Any, mesh_index: np.ndarray) -> np.ndarray:
    """SMs NCCL's channels hold on each plan's ``dp`` group
    (:func:`~ddlsim.simulator.kernels.contention.nccl_ring_ctas`; 0 under another backend).

    Parameters
    ----------
    cfg : the context's :class:`~ddlsim.config.RunConfig` (its system).
    net : the meshes' :class:`~ddlsim.search.netcost.MeshNets`.
    mesh_index : each plan's mesh (into ``net.nets``).

    Returns
    -------
    numpy.ndarray
        SMs per plan.
    """
    if net.backend != "nccl":
        return np.zeros(len(mesh_index))
    per_mesh = np.array([nccl_ring_ctas(cfg.system, n["dp"]) for n in net.nets], dtype=float)
    return per_mesh[mesh_index]


def sm_taken(ctx: Any, fwd_flops, bwd_flops, ctas):
    """The extra seconds of a run of layers' GEMMs beside overlapped collectives, forward and
    backward, as functions (:func:`extra_seconds`).

    Parameters
    ----------
    ctx : the decoder family's context (``cfg``: the run, ``dev``: the kernel model's device).
    fwd_flops, bwd_flops : GEMM FLOPs of one layer's forward and backward per plan.
    ctas : SMs the collectives hold per plan (:func:`nccl_ctas`).

    Returns
    -------
    (callable, callable)
        ``f(C, layers=1)`` for the forward and the backward: seconds per plan that
        ``layers`` layers take beyond their own beside ``C`` seconds of collectives.
    """
    def taken(flops):
        return lambda C, layers=1: extra_seconds(ctx, layers * flops, C, ctas)
    return taken(fwd_flops), taken(bwd_flops)


def extra_seconds(ctx: Any, flops, C, ctas) -> np.ndarray:
    """Per plan, the extra seconds of GEMMs of ``flops`` beside ``C`` seconds of collectives
    holding ``ctas`` SMs (:func:`~ddlsim.simulator.kernels.contention.extra_seconds`, the
    GEMMs at the device's matmul ceiling:
    :func:`~ddlsim.simulator.kernels.contention.gemm_seconds`).

    Parameters
    ----------
    ctx : the decoder family's context (``cfg``: the run, ``dev``: the kernel model's device).
    flops : FLOPs of the GEMMs per plan (or one for all).
    C : seconds of the collectives beside them per plan (or one for all).
    ctas : SMs the collectives hold per plan (:func:`nccl_ctas`).

    Returns
    -------
    numpy.ndarray
        Seconds per plan.
    """
    dev = ctx.dev
    shape = np.shape(ctas)
    C = np.broadcast_to(np.asarray(C, dtype=float), shape)
    g = np.broadcast_to(gemm_seconds(np.asarray(flops, dtype=float), dev,
                                     compute_dtype(ctx.cfg.train.dtype)), shape)
    out = np.zeros(shape)
    for k in np.unique(ctas):
        at = ctas == k
        out[at] = extra(g[at], C[at], int(k), dev.sm_count)
    return out
