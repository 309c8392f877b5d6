"""ZeRO-3 (one pipeline stage) of the decoder family's plans: the per-layer or per-module
units of :mod:`ddlsim.workloads.decoder.zero3`, timed on arrays of plans by the recurrences of
:mod:`.zero3` and priced as :mod:`.zero3_edges` prices the edges' units; split from
:mod:`.decoder`, whose :meth:`~.decoder.DecoderVectors.costs` calls :func:`zero3_seconds`.
"""

from __future__ import annotations

import numpy as np

from ..simulator.kernels.dtensor import regathers_input
from ..simulator.kernels.host import stream_times
from ..workloads.decoder.fp8linear import fp8_sp_gather, weight_cast_microbatches
from ..workloads.decoder.wgrad import accumulate_pass_bytes
from ..workloads.decoder.zero3 import list_host_seconds, module_fetches, unit_live_elements
from ..workloads.decoder.zero3_fetch import persistent_gather_seconds, persistent_tensors
from .kerneltimes import kernel_times
from .plans import RECOMPUTE, microbatches
from .smtaken import sm_taken
from .zero3 import Unit, zero3_time, zero3_units_time
from .zero3_edges import (edge_units, fsdp1_grad_seconds, price_gathers, price_reduces,
                          root_unit)

__all__ = ["zero3_seconds", "optimizer_seconds"]


def zero3_seconds(ctx, plans, parts, coll, first_params, gemm=None) -> np.ndarray:
    """ZeRO-3 (one stage), as :mod:`ddlsim.workloads.decoder.zero3` builds it: the
    builder's two streams (compute; gathers and reduce-scatters in issue order on ``dp``)
    run op by op over the layers — or, from module hooks, the modules' parts of the
    layers — of three micro-batches (:func:`zero3_time`, :func:`zero3_units_time`), later
    micro-batches repeat the third's period; then the optimizer on the 1/DP shard.
    ``gemm``: (a layer's forward and backward GEMM FLOPs, NCCL's channels on ``dp``)
    per plan: per-layer gathers take the layers' SMs as the builder's contention ops do
    (:mod:`ddlsim.workloads.smcontention`). ``parts``: the pieces' seconds (embedding,
    layer forward, head forward and backward, layer backward, the embedding's backward
    on a PP = 1 rank, which FSDP's root unit computes before its reduce-scatter).

    Parameters
    ----------
    ctx : the decoder family's context (:meth:`.decoder.DecoderVectors.prepare`).
    plans : the plans (a structured array with ``tp``, ``dp``, ``zero``, ``mbs``, ``gbs``
        and ``recompute`` fields).
    parts : tuple of arrays, seconds per plan, as listed above.
    coll : ``coll(op, family, nbytes, where)`` → seconds per plan of one collective.
    first_params : array, parameters per rank of the first stage
        (:meth:`.decoder_dp.DataParallelTerms.stage_params`).
    gemm : tuple of arrays or None, as above.

    Returns
    -------
    numpy.ndarray
        Seconds of the whole stage per plan; NaN where the plan is not ZeRO-3 with DP > 1.
    """
    e, f, hf, hb, bw, eb = parts
    dp = plans["dp"]
    m = microbatches(plans)
    on = (plans["zero"] == 3) & (dp > 1)
    if not on.any():
        return np.full(len(plans), np.nan)
    # the op-by-op recurrence runs over the ZeRO-3 plans only (a few of the grid)
    out = np.full(len(plans), np.nan)
    sw = ctx.cfg.software
    if sw.zero3_gather == "per_layer":
        nbytes = ctx.shape.layer_params / plans["tp"] * ctx.dt
        a = coll("all_gather", "dp", nbytes, on)
        r = coll("reduce_scatter", "dp", nbytes * ctx.gdt / ctx.dt, on)
        sm = None if gemm is None else sm_taken(ctx, *(_take(x, on) for x in gemm))
        cat, pre, post = fsdp1_grad_seconds(ctx, plans, on,
                                            ctx.shape.layer_params / plans["tp"])
        root = root_unit(ctx, plans, on, coll, _take(eb, on))
        grads = None       # FSDP1's post-backward stream (.zero3_edges.fsdp1_grad_seconds)
        if sw.zero3_implementation == "torch_fsdp":
            none = (np.zeros(int(on.sum())),) * 2
            grads = (pre[on], post[on], *(none if root is None else root[3:]))
        root = None if root is None else root[:3]
        out[on] = zero3_time(ctx.shape.layers, sw.zero3_prefetch_layers, m[on],
                             tuple(_take(x, on) for x in (e, f, hf, hb, bw + cat)),
                             _take(a, on), _take(r, on), sm, root, grads)
    else:
        full = plans["recompute"] == RECOMPUTE.index("full")
        fwd_u, rec_u, bwd_u = _module_units(ctx, plans, on, coll, full)
        edges = edge_units(ctx, plans, on, coll, full, (e, hf, hb))   # .zero3_edges
        for rec in (False, True):   # the recomputation's units exist under full only
            sel = on & (full == rec)
            if sel.any():
                units = [fwd_u, (rec_u if rec else []) + bwd_u]
                fu, bu = ([Unit(*(_take(x, sel) for x in u)) for u in us] for us in units)
                out[sel] = zero3_units_time(
                    ctx.shape.layers, sw.zero3_prefetch_modules, m[sel],
                    [Unit(*(_take(x, sel) for x in u)) for u in edges], fu, bu,
                    sw.zero3_gather == "per_tensor", sw.zero3_max_live_parameters)
    out[on] += optimizer_seconds(ctx, first_params[on] / np.maximum(dp[on], 1))
    for tp in np.unique(plans["tp"][on]):   # DeepSpeed 2021's persistent parameters
        here = on & (plans["tp"] == tp)
        tensors = persistent_tensors(ctx.shape, int(tp), sw, ctx.shape.layers, True)
        out[here] += persistent_gather_seconds(sw, tensors, dp[here])
        if sw.zero3_gather == "per_tensor":   # refetched by the later micro-batches
            refetch = list_host_seconds(sw, dp[here], sum(tensors.values()), gather=True)
            for n, count in tensors.items():
                refetch = refetch + count * coll("all_gather", "dp", n * ctx.dt, here)[here]
            out[here] += (m[here] - 1) * refetch
    return out


def _module_units(ctx, plans, on, coll, full):
    """One layer's units under ZeRO-3 from module hooks, forward and backward, as
    :func:`ddlsim.workloads.decoder.zero3._module_units` cuts the layer: per unit its
    compute, its gathers (and their memory passes under ``per_tensor``) and its
    reduce-scatters (with the gradients' passes, on the compute stream under
    ``per_tensor``, before the reduce-scatters otherwise), per TP size and recomputation:
    (forward units, the recomputed forward's units, the backward's units)."""
    k, tp_f, tp_b, acc = _module_pieces(ctx, plans, coll)
    n, sw = len(plans), ctx.cfg.software
    zeros = lambda: np.zeros(n)  # noqa: E731
    sel = np.where(plans["recompute"] == RECOMPUTE.index("selective"), k["recompute"], 0.0)
    fwd_comp = {1: k["attn.qkv"], 2: k["attn.proj"] + tp_f, 4: k["mlp.fc1"],
                5: k["mlp.fc2"] + tp_f + k["ew"]}
    bwd_comp = {5: sel + k["bwd.mlp.fc2"], 4: k["bwd.mlp.fc1"] + tp_b,
                2: k["bwd.attn.proj"], 1: k["bwd.attn.qkv"] + tp_b + k["bwd.ew"] + acc}
    order_f, order_b = (1, 2, 4, 5), (5, 4, 2, 1)
    units = {key: Unit(zeros(), zeros(), np.zeros(n, bool), zeros(), np.zeros(n, bool),
                       zeros(), zeros(), zeros(), zeros(), zeros())
             for key in [("f", mo) for mo in order_f] + [("r", mo) for mo in order_f]
             + [("b", mo) for mo in order_b]}
    synced = sw.zero3_gather == "per_tensor"
    for tp, rec in sorted({(int(t), bool(x)) for t, x in zip(plans["tp"][on], full[on])}):
        here = on & (plans["tp"] == tp) & (full == rec)
        for key, live in unit_live_elements(ctx.shape, tp, sw, rec).items():
            units[key].live[here] = live
        for fm in module_fetches(ctx.shape, tp, sw, rec):   # priced as the edges' units
            for visit, need in (("f", fm.forward), ("r", fm.recompute), ("b", fm.backward)):
                price_gathers(ctx, plans, here, coll, units[(visit, fm.module)], need,
                              synced)
            price_reduces(ctx, plans, here, coll, units[("b", fm.module)], fm.reduce,
                          synced)
    for visit, comp in (("f", fwd_comp), ("r", fwd_comp), ("b", bwd_comp)):
        for mo in comp:
            u = units[(visit, mo)]
            units[(visit, mo)] = u._replace(compute=u.compute + comp[mo])
    return ([units[("f", mo)] for mo in order_f], [units[("r", mo)] for mo in order_f],
            [units[("b", mo)] for mo in order_b])


def _module_pieces(ctx, plans, coll):
    """(ops' kernel times, TP collectives of a layer's forward and backward, gradient
    accumulation) per plan, for ZeRO-3 from module hooks: the layer cut at its modules,
    which :func:`.blocks.stage_pieces` does not time (it times whole layers)."""
    sh, dt = ctx.shape, ctx.dt
    b, t = plans["mbs"].astype(float), plans["tp"].astype(float)
    sp = plans["sp"].astype(bool)
    m = microbatches(plans)
    k = kernel_times(ctx, plans["mbs"], plans["tp"], sp,   # FP8 weight casts per step
                     weight_cast_microbatches(ctx.cfg.software, ctx.cfg.train.dtype, m))
    act = b * ctx.s * sh.hidden * dt
    multi = t > 1
    # Transformer Engine gathers FP8 under SP (Megatron1D._gather_bytes)
    gather = act / dt if fp8_sp_gather(ctx.cfg.software, ctx.cfg.train.dtype, 2, True,
                                       sh) else act
    tp_f = np.where(sp, coll("reduce_scatter", "tp", act) + coll("all_gather", "tp", gather),
                    coll("all_reduce", "tp", act)) * multi
    # SP: the backward gathers each block's input again where it was not saved
    # (dtensor.regathers_input, per plan's recomputation)
    regather = np.array([regathers_input(ctx.cfg.software, r) for r in RECOMPUTE])
    tp_b = tp_f + np.where(sp & regather[plans["recompute"]],
                           coll("all_gather", "tp", gather), 0.0) * multi
    acc = accumulate_pass_bytes(ctx.cfg.software, dt, ctx.gdt)
    acc_s = stream_times(sh.layer_params / t * acc / ctx.dev.memory_Bps, float(acc > 0),
                         ctx.dev.launch)
    return k, tp_f, tp_b, acc_s


def _take(x, mask: np.ndarray) -> np.ndarray:
    """``x`` (an array over the plans, or a scalar) at the plans ``mask`` selects."""
    return np.broadcast_to(np.asarray(x), mask.shape)[mask]


def optimizer_seconds(ctx, n_params) -> np.ndarray:
    """The builder's optimizer step (:meth:`StageBuilder.optimizer_op`) over ``n_params``
    parameters: its op's device time is linear in them, so one parameter's seconds times
    the count, and the op's one launch (:func:`~ddlsim.simulator.kernels.host.stream_times`).

    Parameters
    ----------
    ctx : the decoder family's context (``step_s``: the step's device seconds per parameter).
    n_params : array_like, parameters per rank, per plan.

    Returns
    -------
    numpy.ndarray
        Seconds of the step per plan (0 where there are no parameters).
    """
    n = np.asarray(n_params, dtype=float)
    return stream_times(ctx.step_s * n, (n > 0).astype(float), ctx.dev.launch)
