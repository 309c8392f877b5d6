"""ZeRO-3's edge units on arrays of plans: DeepSpeed's embedding and head gathers and
reduce-scatters as :func:`ddlsim.workloads.decoder.zero3_edges.hook_units` puts them in the
trace, timed as the search tier times a layer's module units
(:meth:`.decoder.DecoderVector._module_units`), and FSDP1's root unit
(:mod:`ddlsim.workloads.decoder.fsdp_edges`)."""

from __future__ import annotations

import numpy as np

from ..simulator.kernels.host import stream_times
from ..workloads.decoder.builder import with_edges
from ..workloads.decoder.fsdp_edges import layout
from ..workloads.decoder.zero3_edges import edge_fetches
from ..workloads.decoder.zero3_fetch import (FETCH_FILL_PASSES, FETCH_PASSES, REDUCE_PASSES,
                                             list_host_seconds)
from .zero3 import Unit

__all__ = ["edge_units", "root_unit"]


def edge_units(ctx, plans, on, coll, full, parts) -> list[Unit]:
    """The forward's embedding and head units and the backward's head and embedding units
    (:class:`.zero3.Unit` s over the plans, in that order) of the ZeRO-3 plans ``on``:
    ``parts`` the seconds of the embedding, the head's forward and the head's backward on the
    compute stream; ``full``: full recomputation per plan (the embedding's reuse distance);
    ``coll(op, group, bytes, mask)``: a collective's seconds per plan."""
    n, sw = len(plans), ctx.cfg.software
    synced = sw.zero3_gather == "per_tensor"

    def mem(nbytes: float) -> float:   # one memory-pass op: its kernel and launch
        return float(stream_times(nbytes / ctx.dev.memory_Bps, float(nbytes > 0),
                                  ctx.dev.launch))

    e, hf, hb = (np.broadcast_to(np.asarray(x, dtype=float), (n,)) for x in parts)
    fields = ("compute", "gather", "reduce", "host_gather", "host_reduce", "live")
    units = [{f: np.zeros(n) for f in fields} for _ in range(4)]
    for u, comp in zip(units, (e, hf, hb, np.zeros(n))):
        u["compute"] = comp.copy()
        u["has_gather"], u["has_reduce"] = np.zeros(n, bool), np.zeros(n, bool)
    for tp, rec in sorted({(int(t), bool(x)) for t, x in zip(plans["tp"][on], full[on])}):
        here = on & (plans["tp"] == tp) & (full == rec)
        f = edge_fetches(ctx.shape, tp, sw, ctx.shape.layers, rec)
        work = ((f.emb_forward, ()), (f.head_forward, ()), (f.head_backward, f.head_reduce),
                (f.emb_backward, f.emb_reduce))
        lives = [sum(f.emb_forward), sum(f.head_forward)] * 2
        lives[2:] = lives[2:][::-1]            # the backward's head, then embedding
        for u, (need, red), live in zip(units, work, lives):
            for x in need:
                u["gather"][here] += coll("all_gather", "dp", float(x * ctx.dt), here)[here]
            if synced:
                fill = FETCH_FILL_PASSES * sum(need) * ctx.dt   # waited for by the host
                u["gather"][here] += mem(FETCH_PASSES * sum(need) * ctx.dt - fill)
                u["host_gather"][here] = mem(fill) + list_host_seconds(
                    sw, plans["dp"][here], len(need), gather=True)
                u["compute"][here] += mem(REDUCE_PASSES * sum(red) * ctx.gdt)
                u["host_reduce"][here] = list_host_seconds(sw, plans["dp"][here], len(red),
                                                           gather=False)
            else:
                u["reduce"][here] += mem(REDUCE_PASSES * sum(red) * ctx.gdt)
            for x in red:
                u["reduce"][here] += coll("reduce_scatter", "dp", float(x * ctx.gdt), here)[here]
            u["has_gather"][here], u["has_reduce"][here] = bool(need), bool(red)
            u["live"][here] = live
    return [Unit(**u) for u in units]


def root_unit(ctx, plans, on, coll):
    """(all-gather, reduce-scatter) seconds of FSDP's root unit (the embedding, final norm and
    output layer on a rank, :func:`~ddlsim.workloads.decoder.builder.with_edges` of no layer)
    for the ZeRO-3 plans ``on``, where the stack wraps the edges so
    (:func:`ddlsim.workloads.decoder.fsdp_edges.layout` ``edges``); else None."""
    if layout(ctx.cfg.software) != "edges":
        return None
    root = with_edges(ctx.shape, plans["tp"].astype(float), 0.0, True, True, 1)
    gather = coll("all_gather", "dp", root * ctx.dt, on)
    reduce = coll("reduce_scatter", "dp", root * ctx.gdt, on)
    return (np.broadcast_to(gather, on.shape)[on], np.broadcast_to(reduce, on.shape)[on])
