"""ZeRO-3's edge units on arrays of plans: DeepSpeed's embedding and head gathers and
reduce-scatters as :func:`ddlsim.workloads.decoder.zero3_edges.hook_units` puts them in the
trace, timed as the search tier times a layer's module units
(:func:`.decoder_zero3._module_units`, with the same pricing of a unit's gathers and
reduce-scatters: :func:`price_gathers`, :func:`price_reduces`), and FSDP1's root unit
(:mod:`ddlsim.workloads.decoder.fsdp_edges`)."""

from __future__ import annotations

import numpy as np

from ..simulator.kernels.host import stream_times
from ..workloads.decoder.builder import with_edges
from ..workloads.decoder.fsdp1_passes import grad_passes
from ..workloads.decoder.fsdp_edges import layout
from ..workloads.decoder.zero3_edges import edge_fetches
from ..workloads.decoder.zero3_fetch import (FETCH_FILL_PASSES, FETCH_PASSES, REDUCE_PASSES,
                                             gather_host_split, reduce_host_split)
from .zero3 import Unit

__all__ = ["edge_units", "root_unit", "price_gathers", "price_reduces"]


def edge_units(ctx, plans, on, coll, full, parts) -> list[Unit]:
    """The forward's embedding and head units and the backward's head and embedding units
    of the ZeRO-3 plans ``on``, as DeepSpeed's module hooks fetch and reduce them
    (:func:`ddlsim.workloads.decoder.zero3_edges.edge_fetches`).

    Parameters
    ----------
    ctx : the decoder family's context (``cfg``, ``shape``, ``dt``, ``gdt``, ``dev``).
    plans : PlanSet
        The plans (``tp``, ``dp`` per plan).
    on : numpy.ndarray
        Per plan, whether it is a ZeRO-3 plan the units are priced for.
    coll : callable
        ``coll(op, group, bytes, mask)``: a collective's seconds per plan.
    full : numpy.ndarray
        Per plan, full recomputation (it sets the embedding's reuse distance).
    parts : (float or array, float or array, float or array)
        Seconds of the embedding, the head's forward and the head's backward on the compute
        stream.

    Returns
    -------
    list of Unit
        The four units (:class:`.zero3.Unit`, arrays over all plans, 0 off ``on``), in pass
        order: forward embedding, forward head, backward head, backward embedding.
    """
    n, sw = len(plans), ctx.cfg.software
    synced = sw.zero3_gather == "per_tensor"
    e, hf, hb = (np.broadcast_to(np.asarray(x, dtype=float), (n,)) for x in parts)
    units = [Unit(comp.copy(), np.zeros(n), np.zeros(n, bool), np.zeros(n), np.zeros(n, bool),
                  np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n))
             for comp in (e, hf, hb, np.zeros(n))]
    for tp, rec in sorted({(int(t), bool(x)) for t, x in zip(plans["tp"][on], full[on])}):
        here = on & (plans["tp"] == tp) & (full == rec)
        f = edge_fetches(ctx.shape, tp, sw, ctx.shape.layers, rec)
        work = ((f.emb_forward, ()), (f.head_forward, ()), (f.head_backward, f.head_reduce),
                (f.emb_backward, f.emb_reduce))
        lives = [sum(f.emb_forward), sum(f.head_forward)] * 2
        lives[2:] = lives[2:][::-1]            # the backward's head, then embedding
        for u, (need, red), live in zip(units, work, lives):
            price_gathers(ctx, plans, here, coll, u, need, synced)
            price_reduces(ctx, plans, here, coll, u, red, synced)
            u.live[here] = live
    return units


def memory_pass_s(ctx, nbytes):
    """Seconds of one memory-pass op over ``nbytes`` bytes (a float, or an array of them:
    one op each): its kernel at the device's memory bandwidth (``ctx.dev.memory_Bps``, B/s)
    and its launch (:func:`~ddlsim.simulator.kernels.host.stream_times`); 0 for no bytes."""
    if isinstance(nbytes, np.ndarray):   # element by element the same floats as one at a time
        return stream_times(nbytes / ctx.dev.memory_Bps, (nbytes > 0).astype(float),
                            ctx.dev.launch)
    return float(stream_times(nbytes / ctx.dev.memory_Bps, float(nbytes > 0), ctx.dev.launch))


def price_gathers(ctx, plans, here, coll, u: Unit, need, synced: bool) -> None:
    """Add to unit ``u`` (its arrays, in place) at the plans ``here`` the all-gathers of the
    tensors ``need`` (elements each, one collective per tensor, in the parameter dtype) and,
    under DeepSpeed's per-tensor gathers (``synced``), their memory passes: the fill the host
    waits for (:data:`~ddlsim.workloads.decoder.zero3_fetch.FETCH_FILL_PASSES`, with the
    host's list-form issue until the launch and its copy-out after it,
    :func:`~ddlsim.workloads.decoder.zero3_fetch.gather_host_split`)
    and the rest on the gathers' stream, as :func:`ddlsim.workloads.decoder.zero3._pass`
    issues them. ``coll(op, group, bytes, mask)``: a collective's seconds per plan."""
    for x in need:
        u.gather[here] += coll("all_gather", "dp", float(x * ctx.dt), here)[here]
    if synced:
        fill = FETCH_FILL_PASSES * sum(need) * ctx.dt   # waited for by the host
        u.gather[here] += memory_pass_s(ctx, FETCH_PASSES * sum(need) * ctx.dt - fill)
        issue, u.host_copy_out[here] = gather_host_split(ctx.cfg.software, plans["dp"][here],
                                                         len(need))
        u.host_gather[here] = memory_pass_s(ctx, fill) + issue
    u.has_gather[here] = bool(need)


def price_reduces(ctx, plans, here, coll, u: Unit, red, synced: bool) -> None:
    """Add to unit ``u`` (in place) at the plans ``here`` the reduce-scatters of the gradients
    ``red`` (elements each, in the reduce dtype) and their memory passes
    (:data:`~ddlsim.workloads.decoder.zero3_fetch.REDUCE_PASSES`): on the compute stream
    with the host's list-form issue under per-tensor gathers (``synced``), before the
    reduce-scatters on their stream otherwise."""
    passes = memory_pass_s(ctx, REDUCE_PASSES * sum(red) * ctx.gdt)
    if synced:
        u.compute[here] += passes
        u.host_reduce[here], u.host_reduce_after[here] = reduce_host_split(
            ctx.cfg.software, plans["dp"][here], red)
    else:
        u.reduce[here] += passes
    for x in red:
        u.reduce[here] += coll("reduce_scatter", "dp", float(x * ctx.gdt), here)[here]
    u.has_reduce[here] = bool(red)


def root_unit(ctx, plans, on, coll, emb_backward=0.0):
    """The collectives of FSDP's root unit (the embedding, final norm and output layer on a
    rank, :func:`~ddlsim.workloads.decoder.builder.with_edges` of no layer) where the stack
    wraps the edges so (:func:`ddlsim.workloads.decoder.fsdp_edges.layout` ``edges``).

    Parameters
    ----------
    ctx : the decoder family's context (``cfg``, ``shape``, ``dt``, ``gdt``).
    plans : PlanSet
        The plans (``tp`` per plan).
    on : numpy.ndarray
        Per plan, whether it is a ZeRO-3 plan the unit is priced for.
    coll : callable
        ``coll(op, group, bytes, mask)``: a collective's seconds per plan.
    emb_backward : numpy.ndarray or float
        Seconds of the embedding's backward at the plans ``on``: the root unit's compute in
        the backward (:func:`~ddlsim.workloads.decoder.fsdp_edges.backward_edges`).

    Returns
    -------
    (numpy.ndarray, numpy.ndarray, numpy.ndarray) or None
        Seconds of the root's all-gather (parameter dtype) and reduce-scatter (reduce
        dtype) and of its backward's compute at the plans ``on``, in their order; None where
        the stack has no root unit.
    """
    if layout(ctx.cfg.software) != "edges":
        return None
    root = with_edges(ctx.shape, plans["tp"].astype(float), 0.0, True, True, 1)
    gather = coll("all_gather", "dp", root * ctx.dt, on)
    reduce = coll("reduce_scatter", "dp", root * ctx.gdt, on)
    cat, pre, post = fsdp1_grad_seconds(ctx, plans, on, root)    # FSDP1's passes, else 0
    return (np.broadcast_to(gather, on.shape)[on], np.broadcast_to(reduce, on.shape)[on],
            np.broadcast_to(emb_backward, (int(on.sum()),)) + cat[on], pre[on], post[on])


def fsdp1_grad_seconds(ctx, plans, on, params) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seconds per plan of FSDP1's passes over one backward's gradients of a unit of
    ``params`` parameters a rank (:func:`ddlsim.workloads.decoder.fsdp1_passes.grad_passes`,
    sharded over the plan's ``dp`` ranks): the flat gradient's ``cat`` on the compute stream,
    and the passes before and after the reduce-scatter on FSDP1's post-backward stream, each
    one memory-pass op (:func:`memory_pass_s`); zeros where the stack's ZeRO-3 is not FSDP1
    (``zero3_implementation: torch_fsdp``) or the plan is not ``on``."""
    n = len(plans)
    cat, pre, post = np.zeros(n), np.zeros(n), np.zeros(n)
    if ctx.cfg.software.zero3_implementation != "torch_fsdp":
        return cat, pre, post
    rows = np.flatnonzero(on)
    if not len(rows):
        return cat, pre, post
    params = np.broadcast_to(np.asarray(params, dtype=float), (n,))[rows]
    dp = plans["dp"][rows]
    m = plans["gbs"][rows] // np.maximum(plans["mbs"][rows] * np.maximum(dp, 1), 1)
    # the passes once per distinct (parameters, DP, micro-batches), timed in one call
    keys, inverse = np.unique(np.stack([params, dp, m]), axis=1, return_inverse=True)
    passes = [grad_passes(p, d, d, ctx.dt, ctx.gdt, k) for p, d, k in
              zip(keys[0].tolist(), map(int, keys[1].tolist()), map(int, keys[2].tolist()))]
    seconds = memory_pass_s(ctx, np.array(passes, dtype=float).reshape(-1, 3))
    cat[rows], pre[rows], post[rows] = seconds[inverse.reshape(-1)].T
    return cat, pre, post
