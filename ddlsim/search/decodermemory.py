"""Memory per device of decoder plans on arrays: the first and the last pipeline stage.

:func:`ddlsim.workloads.decoder.memory.stage_memory` on arrays of plans: the same rules
(:func:`~ddlsim.workloads.memory.model_state_bytes`, a layer's kept and rebuilt activations
(:func:`~ddlsim.workloads.decoder.memory.layer_kept_bytes`,
:func:`~ddlsim.workloads.decoder.memory.rebuilt_bytes`),
:func:`~ddlsim.workloads.schedules.peak_inflight`,
:func:`~ddlsim.workloads.decoder.memory.stage_activations`,
:func:`~ddlsim.workloads.decoder.memory.stage_buffers`,
:func:`~ddlsim.workloads.decoder.zero3.zero3_gathered_bytes`,
:func:`~ddlsim.workloads.allocator.context_bytes`) with the plans' fields. What does not
depend on the stage (a layer's activations, ZeRO-3's gathered layer, the communicators) is
computed once for both.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..simulator.kernels.step_passes import stack_cross_entropy
from ..workloads.allocator import (context_bytes, framework, head_bytes, pipeline_held_bytes,
                                   step_temporaries)
from ..workloads.decoder.layerkernels import activation_kinds, compute_dtype
from ..workloads.decoder.memory import (layer_kept_bytes, rebuilds_layer, rebuilt_bytes,
                                        stage_activations, stage_buffers, whole_layer_kinds)
from ..workloads.decoder.zero3 import zero3_gathered_bytes
from ..workloads.memory import model_state_bytes
from ..workloads.pipeline_recv import pipeline_recv_bytes
from ..workloads.schedules import peak_inflight
from .blocks import piece_config
from .plans import RECOMPUTE, SCHEDULE

__all__ = ["plans_memory", "plans_memory_floor"]


class _Shared(NamedTuple):
    """Per plan, the terms both stages share (bytes; ``m``: micro-batches)."""

    per_layer: np.ndarray   # one layer's activations kept for the backward
    rebuilt: np.ndarray     # the layer its checkpoint rebuilds in its backward, beyond kept
    gathered: np.ndarray    # ZeRO-3's gathered layer
    context: np.ndarray     # the CUDA context and the communicators
    m: np.ndarray


def plans_memory(ctx: Any, plans, stage_params) -> np.ndarray:
    """Bytes per device of each plan: the larger of its first and last stage's (the others
    hold less).

    Parameters
    ----------
    ctx : the decoder family's context (``cfg``, ``shape``, ``s``, ``dt``, ``gdt``).
    plans : a :class:`~ddlsim.search.plans.PlanSet`.
    stage_params : ``stage_params(first) -> parameters per rank`` of the first (or last)
        stage, per plan.
    """
    shared = _shared(ctx, plans)
    return np.maximum(_stage_memory(ctx, plans, True, stage_params(True), shared),
                      _stage_memory(ctx, plans, False, stage_params(False), shared))


def plans_memory_floor(ctx: Any, plans, stage_params) -> np.ndarray:
    """A floor of :func:`plans_memory`, per plan: the model states (weights, gradients,
    optimizer) of the first and the last stage, the larger; cheap beside the activations.

    Every other term of a stage's memory is a count of bytes (activations, buffers, the
    context: none negative), added after the states in :func:`_stage_memory`, and adding a
    float that is not negative never lowers a sum: a plan over capacity here is over it in
    :func:`plans_memory`, to the last bit (``tests/test_search_memory_floor.py``). Arguments
    as :func:`plans_memory`.
    """
    return np.maximum(*(_sum_states(ctx, plans, stage_params(first)) for first in (True, False)))


def _sum_states(ctx: Any, plans, stage_params: np.ndarray) -> np.ndarray:
    """Weights + gradients + optimizer states of a stage (:func:`_states`), in the order
    :func:`_stage_memory` adds them."""
    weights, grads, opt = _states(ctx, plans, stage_params)
    return weights + grads + opt


def _states(ctx: Any, plans, stage_params: np.ndarray) -> tuple:
    """(weights, gradients, optimizer states) in bytes per device of a stage holding
    ``stage_params`` parameters (:func:`~ddlsim.workloads.memory.model_state_bytes`)."""
    cfg = ctx.cfg
    fsdp2 = framework(cfg.software.name).fsdp2 & (plans["zero"] == 3)
    return model_state_bytes(stage_params, np.maximum(plans["dp"], 1), plans["zero"],
                             compute_dtype(cfg.train.dtype), cfg.train.optimizer, ctx.gdt,
                             fsdp2)


def _shared(ctx: Any, plans) -> _Shared:
    """The stage-independent terms (:class:`_Shared`)."""
    sh, s, cfg = ctx.shape, ctx.s, ctx.cfg
    b, t = plans["mbs"].astype(float), plans["tp"].astype(float)
    dp, zero = np.maximum(plans["dp"], 1), plans["zero"]
    sp, rec = plans["sp"].astype(bool), plans["recompute"]
    sw, kinds = cfg.software, activation_kinds(cfg, "none", sh)
    per_layer = np.zeros_like(b)
    rebuilt = np.zeros_like(b)
    for spv in (False, True):
        for code, name in enumerate(RECOMPUTE):
            here = (sp == spv) & (rec == code)
            if not here.any():
                continue
            kept = layer_kept_bytes(sh, sw, b, s, t, spv, name,
                                    activation_kinds(cfg, name, sh))
            per_layer = np.where(here, kept, per_layer)
            if rebuilds_layer(sw, name):
                whole = sh.layer_activation_bytes(b, s, t, spv, "none",
                                                  **whole_layer_kinds(kinds, sw))
                rebuilt = np.where(here, rebuilt_bytes(whole, kept), rebuilt)
    gathered = np.zeros_like(b)
    for tp in np.unique(plans["tp"][zero == 3]):
        cfg_tp = piece_config(cfg, int(tp), False, 1, "none", 3)
        gathered[(zero == 3) & (plans["tp"] == tp)] = zero3_gathered_bytes(
            cfg_tp, sh.layer_params / tp * ctx.dt, sh, ctx.dt)
    context = context_bytes(cfg.system.device,   # .memory.comm_groups (CP 1, dense here)
                            (plans["tp"], plans["pp"], cfg.parallel.cp, dp * cfg.parallel.cp))
    m = plans["gbs"] // np.maximum(plans["mbs"] * dp, 1)
    return _Shared(per_layer, rebuilt, gathered, context, m)


def _stage_memory(ctx: Any, plans, first: bool, stage_params: np.ndarray,
                  shared: _Shared) -> np.ndarray:
    """Bytes per device of the first (or last) stage of each plan."""
    sh, s, cfg = ctx.shape, ctx.s, ctx.cfg
    b, t = plans["mbs"].astype(float), plans["tp"].astype(float)
    pp, v, dp, zero = plans["pp"], plans["v"], np.maximum(plans["dp"], 1), plans["zero"]
    fm = framework(cfg.software.name)
    weights, grads, opt = _states(ctx, plans, stage_params)
    stage = np.zeros_like(pp) if first else pp - 1
    chunks = np.select([plans["schedule"] == k for k in range(len(SCHEDULE))],
                       [peak_inflight(name, stage, pp, shared.m, v) for name in SCHEDULE])
    one = pp == 1
    is_first = np.full(len(plans), True) if first else one
    is_last = one if first else np.full(len(plans), True)
    acts, other = stage_activations(
        sh, b, s, t, v, shared.per_layer * (sh.layers // (pp * v)), chunks,
        shared.rebuilt, is_first, is_last, 1,
        fm.logits_at(t, cfg.software.compile, stack_cross_entropy(cfg.software)),
        step_temporaries(
            fm, zero, compute_dtype(cfg.train.dtype) == "fp16", stage_params),
        head_bytes(fm, sh.hidden, t, plans["sp"].astype(bool)),
        pipeline_held_bytes(fm, b, s, sh.hidden, sh.vocab, t, plans["sp"].astype(bool),
                            cfg.parallel.cp, pp, v, chunks, shared.m, is_last,
                            cfg.software.compile))
    buffers = stage_buffers(cfg.software, fm, sh, zero, dp, shared.gathered,
                            sh.layer_params / t, t, is_first, is_last, pp, ctx.dt, ctx.gdt,
                            stage_params) + pipeline_recv_bytes(
        fm, b, s, sh.hidden, t, plans["sp"].astype(bool), cfg.parallel.cp, pp, v, chunks,
        shared.m, is_first, is_last, ctx.dt)
    return weights + grads + opt + acts + other + buffers + shared.context
