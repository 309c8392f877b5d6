"""Memory per device of a decoder-only transformer's pipeline stage: model states by ZeRO stage
(:func:`~ddlsim.workloads.memory.model_state_bytes`), activations per layer after Korthikanti
et al. 2022 (:meth:`DecoderShape.layer_activation_bytes`), the loss's logits on the last stage,
the embedding output on the first, and the framework's communication buffers and the CUDA
context (:mod:`ddlsim.workloads.allocator`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...config import DTYPE_BYTES
from ...simulator.kernels.step_passes import stack_cross_entropy
from ..allocator import (comm_buffer_bytes, context_bytes, head_bytes, loss_bytes,
                         pipeline_held_bytes, step_temporaries)
from ..framework_memory import framework
from ..memory import MemoryBreakdown, model_state_bytes
from ..pipeline_recv import pipeline_recv_bytes
from ..models.decoder import DecoderShape
from ..schedules import combined_extra_layer, peak_inflight
from .layer_memory import layer_kept_bytes, rebuilds_layer, rebuilt_bytes, whole_layer_kinds
from .sac import op_level, sac_activation_bytes

if TYPE_CHECKING:
    from .plan import DecoderPlan

__all__ = ["stage_memory", "stage_activations", "stage_buffers", "sac_activation_bytes",
           "layer_kept_bytes", "rebuilt_bytes", "rebuilds_layer", "op_level",
           "whole_layer_kinds", "comm_groups"]


def stage_memory(plan: DecoderPlan, stage: int, params: float, expert_params: float = 0.0,
                 layer_bytes: float | None = None,
                 context: float | None = None, memo: dict | None = None) -> MemoryBreakdown:
    """Memory of one rank of pipeline ``stage``.

    Parameters
    ----------
    plan : DecoderPlan
        The run's resolved plan (:func:`.plan.resolve_plan`), resolved once for all stages;
        a dense model's activations take its layer partitioner's split (and ``1/cp``), the
        ZeRO shards are over its gradient group (``dp·cp``, or HSDP's shard group).
    stage : int
        Pipeline stage, from 0.
    params : float
        Parameters on the rank, of which ``expert_params`` are routed experts (already split
        by EP × expert TP; their ZeRO shards are over the expert-data-parallel group).
    expert_params : float
        Routed-expert parameters on the rank.
    layer_bytes : float, optional
        The largest layer's parameters on one rank, bytes (ZeRO-3's gathered buffers;
        default ``layer_params/t`` in the parameter dtype).
    context : float, optional
        The CUDA context and communicators, bytes, when the caller has them (the same on
        every stage; default :func:`~ddlsim.workloads.allocator.context_bytes` of
        :func:`comm_groups`).
    memo : dict, optional
        Shared by the calls for the stages of one ``plan``: the model states and buffers of
        the stages with the same parameters (and edges) are computed once (same values).

    Returns
    -------
    MemoryBreakdown
        Model states, activations, other buffers and communication buffers, bytes.
    """
    shape, fm, gb = plan.shape, framework(plan.software.name), plan.grad_dtype_bytes
    memo = {} if memo is None else memo
    states = memo.get(("states", params, expert_params))
    if states is None:
        states = memo[("states", params, expert_params)] = _model_states(plan, fm, params,
                                                                         expert_params)
    weights, grads, opt = states
    part = None if shape.is_moe else plan.partitioner
    per_chunk = _chunk_activations(plan, part, stage)
    chunks = peak_inflight(plan.schedule, stage, plan.pp, plan.microbatches, plan.vpp,
                           plan.combined_1f1b, plan.microbatch_group)   # as ..memory's
    rebuilt = (_rebuilt_layer(plan, part, stage) + _ring_buffers(plan, part)
               + _combined_layer(plan, stage, per_chunk))
    # FP8 (Transformer Engine) keeps 16-bit weights and grads: the plan's ``dtype``; FP8
    # parameters (fp8_param_gather) are 1 byte per element and their transpose, kept after the
    # gather on Hopper, 1 more: the same 2 (simulator/kernels/fp8_weights.py)
    pb = DTYPE_BYTES[plan.dtype]
    unit_bytes = layer_bytes if layer_bytes is not None else shape.layer_params / plan.tp * pb
    gathered = _gathered(plan, unit_bytes, pb)
    first, last = stage == 0, stage == plan.pp - 1
    split = part.param_split if part is not None else plan.tp
    sw, b, tp, cp = plan.software, plan.micro_batch, plan.tp, plan.cp
    # the final norm's and the head's tensors split as the scheme splits a layer's (the 2-D
    # family over its whole grid)
    head_t, head_sp = part.ew_split() if part is not None else (tp, plan.sp)
    acts, other = stage_activations(shape, b, plan.seq_length, tp * cp, plan.vpp, per_chunk,
                                    chunks, rebuilt, first, last,
                                    part.embedding_split if part is not None else 1,
                                    fm.logits_at(tp, sw.compile, stack_cross_entropy(sw)),
                                    step_temporaries(fm, plan.zero_stage, plan.dtype == "fp16",
                                                     params),
                                    head_bytes(fm, shape.hidden, head_t, head_sp) / cp,
                                    pipeline_held_bytes(fm, b, plan.seq_length, shape.hidden,
                                                        shape.vocab, tp, plan.sp, cp, plan.pp,
                                                        plan.vpp, chunks, plan.microbatches,
                                                        last, sw.compile))
    buffers = memo.get(("buffers", params, unit_bytes, first, last))
    if buffers is None:
        buffers = memo[("buffers", params, unit_bytes, first, last)] = stage_buffers(
            sw, fm, shape, plan.zero_stage, plan.dp, gathered, unit_bytes / pb, split, first,
            last, plan.pp, pb, gb, params)
    buffers = buffers + pipeline_recv_bytes(fm, b, plan.seq_length, shape.hidden, tp, plan.sp,
                                            cp, plan.pp, plan.vpp, chunks, plan.microbatches,
                                            first, last, plan.dtype_bytes)
    return MemoryBreakdown(weights, grads, opt, acts, other, plan.device.memory_bytes, stage,
                           buffers, context if context is not None else
                           context_bytes(plan.device, comm_groups(plan)))


def _combined_layer(plan: DecoderPlan, stage: int, per_chunk: float) -> float:
    """Bytes of the one layer the combined 1F1B holds beyond its chunks at the peak
    (:func:`..schedules.combined_extra_layer`): a layer of the stage's chunk, ``per_chunk``
    over its layers (their mean under an uneven split); 0 without the combined 1F1B."""
    if not plan.combined_1f1b or not combined_extra_layer(
            plan.schedule, stage, plan.pp, plan.microbatches, plan.vpp,
            plan.microbatch_group):
        return 0.0
    row = plan.split[stage]
    layers = sum(row) / len(row)
    return per_chunk / layers if layers else 0.0


def _ring_buffers(plan: DecoderPlan, part) -> float:
    """Bytes torch's ring attention adds to a stage's peak (``software.cp_attention: torch``,
    CP > 1; 0 otherwise, and for MoE layers, whose partitioner is not the ring's): its
    backward's buffers (:func:`.partition.torch_cp.backward_buffer_bytes`) less one layer's
    MLP tensors (``4`` or, gated, ``6`` bytes per token and FFN unit over the split), which
    the layer's backward has freed by then: its MLP backward runs before its attention's."""
    if part is None or plan.cp == 1:
        return 0.0
    from .partition.context import torch_ring
    from .partition.torch_cp import backward_buffer_bytes
    if not torch_ring(part):
        return 0.0
    sh, (t, _) = plan.shape, part.ew_split()
    mlp = (6 if sh.gated_mlp else 4) * part.tokens * sh.ffn / t
    return max(0.0, backward_buffer_bytes(part) - mlp)


def _rebuilt_layer(plan: DecoderPlan, part, stage: int) -> float:
    """Bytes of the layer a checkpoint rebuilds in its backward beyond what it kept
    (:func:`rebuilt_bytes`), on one rank of ``stage``: full recomputation's (with the
    partitioner ``part``'s split; an MoE model's layer whole) and op-level selective
    checkpointing's (a dense model on 1-D ranks, ``s/cp`` tokens); 0 otherwise, and on a
    stage none of whose layers is checkpointed (``recompute_every_n_layers``, :mod:`.sac`)."""
    shape, sw, rec = plan.shape, plan.software, plan.recompute
    if plan.recompute_modules is not None or not rebuilds_layer(sw, rec, shape.is_moe):
        return 0.0
    if plan.recompute_every_n_layers > 1:
        from .sac import checkpointed_share
        if checkpointed_share(plan, stage) == 0:
            return 0.0
    if part is not None and rec == "full":
        return rebuilt_bytes(part.activation_bytes("none"), part.activation_bytes("full"))
    b, s, t, sp = _layer_args(plan)     # an MoE layer as _chunk_activations counts it
    s, moe = (s, True) if part is None else (s // plan.cp, None)
    whole = shape.layer_activation_bytes(b, s, t, sp, "none", moe=moe,
                                         **whole_layer_kinds(plan.activation_kinds, sw))
    kept = layer_kept_bytes(shape, sw, b, s, t, sp, rec, plan.activation_kinds, moe)
    cp = plan.cp if part is None else 1      # an MoE layer's 1/cp of the queries (as below)
    return rebuilt_bytes(whole / cp, kept / cp)


def _layer_args(plan: DecoderPlan) -> tuple:
    """``(b, s, t, sp)`` of :meth:`DecoderShape.layer_activation_bytes` on a 1-D rank."""
    return plan.micro_batch, plan.seq_length, plan.tp, plan.sp


def _chunk_activations(plan: DecoderPlan, part, stage: int) -> float:
    """Activation bytes one model chunk of ``stage`` keeps for one micro-batch: its layers
    per chunk (``L/(PP·VPP)``, or their mean under an uneven split) times one layer's
    (Korthikanti et al. 2022; a dense model's with the partitioner ``part``'s split)."""
    shape, row, kinds = plan.shape, plan.split[stage], plan.activation_kinds
    lpc = row[0] if len(set(row)) == 1 else sum(row) / len(row)
    args = _layer_args(plan)

    def layer(moe: bool) -> float:   # one layer's bytes, of Megatron-Core's modules if given;
        # under CP every term, the s² scores included, holds 1/cp of the queries (as
        # :meth:`.partition.base.LayerPartitioner.activation_bytes`)
        if plan.recompute_modules is not None:
            from .recompute_modules import layer_bytes
            return layer_bytes(shape, plan.recompute_modules, plan.software, *args, moe=moe,
                               **kinds) / plan.cp
        return layer_kept_bytes(shape, plan.software, *args, plan.recompute, kinds,
                                moe) / plan.cp
    if shape.is_moe:    # MoE layers per chunk, in model order (.layerkinds: dense first layers)
        from .layerkinds import moe_layers_in_stage
        n_moe = moe_layers_in_stage(shape, plan.split, stage) / len(row)
        return n_moe * layer(True) + (lpc - n_moe) * (layer(False) if n_moe < lpc else 0.0)
    if plan.recompute_modules is not None:
        return layer(False) * lpc
    if op_level(plan.software, plan.recompute):
        return layer_kept_bytes(shape, plan.software, plan.micro_batch,
                                plan.seq_length // plan.cp, plan.tp, plan.sp, plan.recompute,
                                kinds) * lpc
    if plan.recompute_every_n_layers > 1:     # every n-th layer checkpointed (.sac)
        from .sac import checkpointed_share
        share = checkpointed_share(plan, stage)
        return (share * part.activation_bytes("full")
                + (1 - share) * part.activation_bytes("none")) * lpc
    return part.activation_bytes(plan.recompute) * lpc


def _model_states(plan: DecoderPlan, fm, params: float, expert_params: float) -> tuple:
    """(weights, gradients, optimizer) of a rank (:func:`~ddlsim.workloads.memory.
    model_state_bytes`): dense shards over the gradient group (DP·CP, or HSDP's shard
    group), routed experts' over the expert-data-parallel group; FSDP2's sharded fp32
    parameters are the optimizer's master."""
    zero, state, opt, gb = plan.zero_stage, plan.dtype, plan.optimizer, plan.grad_dtype_bytes
    fp32 = fm.fsdp2 and zero == 3
    if not expert_params:
        return model_state_bytes(params, plan.grad_group_size, zero, state, opt, gb, fp32)
    dense = model_state_bytes(params - expert_params, plan.dp, zero, state, opt, gb, fp32)
    expert = model_state_bytes(expert_params, plan.edp, zero, state, opt, gb, fp32)
    return tuple(a + b for a, b in zip(dense, expert))


def _gathered(plan: DecoderPlan, unit_bytes: float, pb: float) -> float:
    """ZeRO-3's gathered parameters in flight (:func:`.zero3.gathered_bytes`), else 0."""
    if plan.zero_stage != 3:
        return 0.0
    from .zero3 import gathered_bytes
    return gathered_bytes(plan.software, plan.tp, unit_bytes, plan.shape, pb)


def comm_groups(plan: DecoderPlan) -> tuple[int, ...]:
    """Sizes of the process groups a rank communicates over, one NCCL communicator each.

    Parameters
    ----------
    plan : DecoderPlan
        The run's resolved plan.

    Returns
    -------
    tuple of int
        Ranks of TP, PP (its sends and receives), CP and the data-parallel gradient group
        (DP·CP); under HSDP the shard group and the replicas; for MoE models EP and the
        expert-data-parallel group.
    """
    groups = (plan.tp, plan.pp, plan.cp, plan.dp * plan.cp)
    if plan.hsdp_replicas > 1:     # HSDP: the shard group and the replicas (.hsdp)
        groups += (plan.grad_group_size, plan.hsdp_replicas)
    if plan.shape.is_moe:
        groups += (plan.ep, plan.edp)
    return groups


def stage_buffers(sw, fm, shape: DecoderShape, zero_stage, dp, gathered, unit_params,
                  param_split, first, last, pp, param_bytes: float, reduce_bytes: float,
                  stage_params):
    """Communication buffers on one rank of a stage, in bytes
    (:func:`~ddlsim.workloads.allocator.comm_buffer_bytes`) under the software stack ``sw``
    and its framework's rules ``fm``: the edges FSDP2 keeps gathered are the stage's embedding
    and head, or its head alone (:func:`.builder.with_edges` of no layer). Every argument but
    ``sw``, ``fm``, ``shape`` and the two byte counts may be an array over plans.

    Parameters
    ----------
    sw : Software
        The resolved software stack.
    fm : FrameworkMemory
        The framework's memory rules (:func:`~ddlsim.workloads.framework_memory.framework`).
    shape : DecoderShape
    zero_stage, dp : the plan's ZeRO stage and data-parallel size.
    gathered : ZeRO-3's gathered parameters in flight (bytes; 0 outside ZeRO-3).
    unit_params : parameters of the largest ZeRO-3 unit (a layer) on the rank.
    param_split : ranks the edges' parameters are split over (as
        :func:`.builder.with_edges` takes it).
    first, last, pp : the stage holds the embedding / the head; pipeline stages.
    param_bytes, reduce_bytes : bytes per unsharded parameter and per reduced gradient.
    stage_params : parameters on the rank before sharding.

    Returns
    -------
    float or ndarray
        Bytes.
    """
    from .builder import with_edges
    from .fsdp import per_iteration
    from .fsdp_edges import layout
    from .megatron_fsdp import memory_rules
    fm = memory_rules(sw, fm)
    kept, held = 0.0, 0.0
    if fm.kept_root != "none":
        kept = with_edges(shape, param_split, 0.0, first if fm.kept_root == "edges"
                          else first & False, last, pp)
    if fm.fsdp2 and layout(sw) in ("edges", "head"):     # FSDP2's edge units, pp 1
        kept, unit_params, held = _edge_units(sw, shape, param_split, first, last, pp, kept,
                                              unit_params)
    whole = per_iteration(sw, 2) & (np.asarray(pp) > 1)
    return comm_buffer_bytes(fm, zero_stage, dp, gathered, unit_params, kept, param_bytes,
                             reduce_bytes, stage_params, sw.overlap_grad_reduce,
                             whole) + _on(~whole & (np.asarray(zero_stage) == 3),
                                          held * param_bytes)


def _edge_units(sw, shape: DecoderShape, param_split, first, last, pp, kept, unit_params):
    """(kept edge parameters, parameters of the unit whose gradients count, edge parameters
    whose 16-bit gradients are held through the backward) on one rank under FSDP2's edge units
    (:mod:`.fsdp_edges`), at the backward's start: the [norm, output] unit (``head``) is kept
    gathered unless resharded (``always``), the embedding's too under ``never``, and its
    gradients and their reduce-scatter input are the head's backward's unit
    (``_fsdp_collectives.py`` ``foreach_reduce``) when larger than a layer's; the root unit
    (``edges``) is kept, and its output layer's 16-bit gradients wait for the root's
    reduce-scatter at the end of the backward (a tied output layer's too: the embedding's
    weight, whose gradient the head's backward starts). Arrays over plans allowed."""
    from .builder import with_edges
    from .fsdp_edges import layout
    head = with_edges(shape, param_split, 0.0, np.asarray(first) & False, last, pp)
    if layout(sw) == "edges":
        vh = shape.vocab * shape.hidden / param_split
        return kept, unit_params, _on(last, shape.norm_params + vh)
    policy = sw.zero3_reshard_after_forward
    kept = 0.0 if policy == "always" else with_edges(
        shape, param_split, 0.0, np.asarray(first) & (policy == "never"), last, pp)
    return kept, np.maximum(unit_params, head), 0.0


def stage_activations(shape: DecoderShape, b, s: int, tp_cp, vpp, per_chunk, chunks, rebuilt,
                      first, last, embedding_split, logit_bytes, step,
                      head, held=0.0) -> tuple:
    """(activations, other buffers) in bytes on one rank of a stage; every argument but
    ``shape`` and ``s`` may be an array over plans (the search tier's memory is this rule).

    Parameters
    ----------
    b, s : micro-batch size, sequence length.
    tp_cp : the ranks the vocabulary-parallel logits are split over (TP·CP).
    vpp : model chunks per stage.
    per_chunk : activation bytes one chunk's layers keep for one micro-batch.
    chunks : (micro-batch, chunk) forwards in flight at the peak.
    rebuilt : the layer its checkpoint rebuilds during its backward, beyond what it kept
        (:func:`rebuilt_bytes`: full recomputation, op-level selective checkpointing), else 0.
    first, last : the stage holds the embedding / the head.
    embedding_split : ranks the embedding output is split over.
    logit_bytes : bytes per logit the loss holds at its peak (the framework's,
        :meth:`~ddlsim.workloads.framework_memory.FrameworkMemory.logits_at`).
    head : bytes per token of the micro-batch that the final norm and the head keep on the
        last stage (:func:`~ddlsim.workloads.allocator.head_bytes`, already over CP).
    step : bytes the optimizer step allocates after the backward
        (:func:`~ddlsim.workloads.allocator.step_temporaries`): the temporaries are the larger
        of the two phases' beside the kept activations, ``max(other, step − activations)``.
    held : bytes the pipeline schedule holds for the backward, counted with the activations
        (:func:`~ddlsim.workloads.allocator.pipeline_held_bytes`).

    Returns
    -------
    tuple
        (activations, other buffers), bytes each (floats, or arrays over plans).
    """
    acts = per_chunk * chunks + rebuilt + held
    sbh = b * s * shape.hidden
    # the loss's logits and their fp32 temporaries on the last stage; on the first, the
    # embedding dropout's 1-byte mask (Korthikanti et al. 2022 §4.3), where the model has
    # dropout: without it none is drawn (PyTorch's dropout returns its input at p = 0,
    # torchtitan's Llama has no dropout module), and the output itself is the first layer's
    # input, counted with the layers
    mask = sbh * chunks / vpp / embedding_split if shape.dropout else 0.0
    other = (_on(last, loss_bytes(logit_bytes, b, s, shape.vocab, tp_cp) + b * s * head)
             + _on(first, mask))
    if np.any(step):
        other = np.maximum(other, step - acts)
        other = float(other) if np.ndim(other) == 0 else other
    return acts, other


def _on(flag, x):
    """``x`` where ``flag``, else 0 (element-wise for arrays of plans)."""
    if isinstance(flag, (bool, np.bool_)):
        return x if flag else 0.0
    return np.where(flag, x, 0.0)
