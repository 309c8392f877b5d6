"""Memory per device of a decoder-only transformer's pipeline stage: model states by ZeRO stage
(:func:`~ddlsim.workloads.memory.model_state_bytes`), activations per layer after Korthikanti
et al. 2022 (:meth:`DecoderShape.layer_activation_bytes`), the loss's logits on the last stage,
the embedding output on the first, and the framework's communication buffers and the CUDA
context (:mod:`ddlsim.workloads.allocator`)."""

from __future__ import annotations

import numpy as np

from ...config import DTYPE_BYTES, RunConfig
from ..allocator import (comm_buffer_bytes, context_bytes, framework, head_bytes,
                         loss_bytes, step_temporaries)
from ..memory import MemoryBreakdown, inflight_chunks, model_state_bytes
from ..models.decoder import DecoderShape
from .layerkernels import activation_kinds, compute_dtype, grad_bytes

__all__ = ["stage_memory", "stage_activations", "stage_buffers", "sac_activation_bytes",
           "comm_groups"]


def stage_memory(cfg: RunConfig, shape: DecoderShape, stage: int, params: float,
                 expert_params: float = 0.0, layer_bytes: float | None = None,
                 part=None, context: float | None = None) -> MemoryBreakdown:
    """Memory of one rank of pipeline ``stage`` holding ``params`` parameters, of which
    ``expert_params`` are routed experts (already split by EP × expert TP; their ZeRO shards
    are taken over the expert-data-parallel group). ``layer_bytes``: the largest layer's
    parameters on one rank in bytes (ZeRO-3's gathered buffers; default ``layer_params/t``).
    ``part``: the layer partitioner of a dense model (default: the plan's), whose split of
    the activations (and ``1/cp``) applies; the ZeRO shards are over ``dp·cp``.
    ``context``: the CUDA context and communicators' bytes when the caller has them
    (the same on every stage; default :func:`~ddlsim.workloads.allocator.context_bytes` of
    :func:`comm_groups`)."""
    p, t = cfg.parallel, cfg.train
    state = compute_dtype(t.dtype)   # FP8 (Transformer Engine) keeps 16-bit weights and grads
    gb = grad_bytes(cfg)             # fp32 main grads with bf16 under Megatron
    fm = framework(cfg.software.name)
    weights, grads, opt = _model_states(cfg, fm, params, expert_params, state, gb)
    # the stage's layers per model chunk: L/(PP·VPP), or their mean under an uneven split
    from .split import chunk_layers
    row = chunk_layers(cfg)[stage]
    lpc = row[0] if len(set(row)) == 1 else sum(row) / len(row)
    args = (t.micro_batch_size, t.seq_length, p.tp, p.sequence_parallel)
    kinds = activation_kinds(cfg)
    if shape.is_moe:    # MoE layers per chunk, in model order (.layerkinds: dense first layers)
        from .layerkinds import moe_layers_in_stage
        n_moe = moe_layers_in_stage(shape, chunk_layers(cfg), stage) / len(row)
        per_chunk = (n_moe * shape.layer_activation_bytes(*args, t.recompute, moe=True, **kinds)
                     + (lpc - n_moe) * (shape.layer_activation_bytes(
                         *args, t.recompute, moe=False, **kinds)
                         if n_moe < lpc else 0.0))
    else:
        if part is None:
            from .partition import make_partitioner
            part = make_partitioner(cfg, shape)
        if t.recompute == "selective" and cfg.software.selective_recompute == "every_second_mm":
            per_chunk = sac_activation_bytes(shape, t.micro_batch_size, t.seq_length // p.cp,
                                             p.tp, p.sequence_parallel) * lpc
        elif t.recompute_every_n_layers > 1:     # every n-th layer checkpointed (.sac)
            from .sac import checkpointed_share
            share = checkpointed_share(cfg, stage)
            per_chunk = (share * part.activation_bytes("full")
                         + (1 - share) * part.activation_bytes("none")) * lpc
        else:
            per_chunk = part.activation_bytes(t.recompute) * lpc
    chunks = inflight_chunks(cfg, stage)
    rebuilt = 0.0
    if t.recompute == "full":  # one layer's full activations are rebuilt during its backward
        rebuilt = (part.activation_bytes("none") if part is not None else
                   shape.layer_activation_bytes(*args, "none", moe=shape.is_moe or None,
                                                 **kinds))
    pb = DTYPE_BYTES[state]
    unit_bytes = layer_bytes if layer_bytes is not None else shape.layer_params / p.tp * pb
    gathered = _gathered(cfg, shape, unit_bytes, pb)
    first, last = stage == 0, stage == p.pp - 1
    split = part.param_split if part is not None else p.tp
    acts, other = stage_activations(shape, t.micro_batch_size, t.seq_length, p.tp * p.cp,
                                    p.vpp, per_chunk, chunks, rebuilt, first, last,
                                    part.embedding_split if part is not None else 1,
                                    fm.logits_at(p.tp, cfg.software.compile),
                                    step_temporaries(fm, p.zero_stage, state == "fp16", params),
                                    head_bytes(fm, shape.hidden, p.tp, p.sequence_parallel) / p.cp)
    buffers = stage_buffers(cfg.software, fm, shape, p.zero_stage, cfg.dp, gathered,
                            unit_bytes / pb, split, first, last, p.pp, pb, gb, params)
    return MemoryBreakdown(weights, grads, opt, acts, other, cfg.system.device.memory_bytes, stage,
                           buffers, context if context is not None else
                           context_bytes(cfg.system.device, comm_groups(cfg, shape)))


def _model_states(cfg: RunConfig, fm, params: float, expert_params: float, state: str,
                  gb: float) -> tuple:
    """(weights, gradients, optimizer) of a rank (:func:`~ddlsim.workloads.memory.
    model_state_bytes`): dense shards over DP·CP, routed experts' over the expert-data-parallel
    group; FSDP2's sharded fp32 parameters are the optimizer's master."""
    p, t = cfg.parallel, cfg.train
    fp32 = fm.fsdp2 and p.zero_stage == 3
    if not expert_params:     # shards over DP·CP, or HSDP's shard group (.hsdp)
        from .hsdp import shard_group
        return model_state_bytes(params, shard_group(cfg)[1], p.zero_stage, state,
                                 t.optimizer, gb, fp32)
    dense = model_state_bytes(params - expert_params, cfg.dp, p.zero_stage, state,
                              t.optimizer, gb, fp32)
    expert = model_state_bytes(expert_params, cfg.mesh.size("edp"), p.zero_stage, state,
                               t.optimizer, gb, fp32)
    return tuple(a + b for a, b in zip(dense, expert))


def _gathered(cfg: RunConfig, shape: DecoderShape, unit_bytes: float, pb: float) -> float:
    """ZeRO-3's gathered parameters in flight (:func:`.zero3.zero3_gathered_bytes`), else 0."""
    if cfg.parallel.zero_stage != 3:
        return 0.0
    from .zero3 import zero3_gathered_bytes
    return zero3_gathered_bytes(cfg, unit_bytes, shape, pb)


def comm_groups(cfg: RunConfig, shape: DecoderShape) -> tuple[int, ...]:
    """Sizes of the process groups a rank communicates over, one NCCL communicator each:
    TP, PP (its sends and receives), CP, the data-parallel gradient group (DP·CP), and for
    MoE models EP and the expert-data-parallel group."""
    p = cfg.parallel
    groups = (p.tp, p.pp, p.cp, cfg.dp * p.cp)
    if p.data_parallel_replicate_size > 1:     # HSDP: the shard group and the replicas
        from .hsdp import shard_group
        groups += (shard_group(cfg)[1], p.data_parallel_replicate_size)
    if shape.is_moe:    # the mesh only here: building it costs more than the rest
        mesh = cfg.mesh
        groups += (mesh.size("ep"), mesh.size("edp"))
    return groups


def sac_activation_bytes(shape: DecoderShape, b: int, s: int, t: int, sp: bool) -> float:
    """Bytes one dense layer keeps for its backward on one of ``t`` 1-D TP ranks under
    torchtitan's op-level selective checkpointing (:mod:`.sac`): what the policy saves, 16-bit
    unless said.

    * the block's input, which the checkpoint keeps (``h``, ``h/t`` with sequence
      parallelism);
    * the outputs of every second ``aten.mm`` from the first (``wq wv w1 w2`` of a gated
      MLP, :func:`.sac.layer_mms`: column-parallel outputs are ``N/t`` wide, row-parallel ones
      the whole ``h`` before their reduction), FP8 runs too: ``aten._scaled_mm`` is not on the
      save list, so the policy alone would keep none, yet torchtitan's published FP8 runs hold
      as much as its BF16 ones (benchmarks/llama3_h100_202412_torchtitan.md Tables 1 and 3:
      76.8 vs 77.0 and 61.8 vs 62.0 GiB); the larger count is kept, so that a plan said to fit
      is not one the policy's reading alone would fit;
    * SDPA's output (``q/t``) and its fp32 log-sum-exp (one per head and token);
    * with sequence parallelism, the outputs of the attention's and the MLP's
      reduce-scatters (``h/t`` each, ``c10d.reduce_scatter_tensor`` is on the save list).

    ``s`` is the rank's sequence (``s/cp``), ``b`` the micro-batch.

    References
    ----------
    torchtitan 9dec370 ``torchtitan/parallelisms/parallelize_llama.py`` lines 213-276
    (``_save_list`` and the every-other-mm policy).
    """
    from .sac import layer_mms
    M = b * s
    widths = shape.hidden / t if sp else shape.hidden           # the block's input
    widths += sum(n for _, n, _ in layer_mms(shape, M, t)[0::2])
    widths += shape.q_width / t                                  # SDPA's output
    if sp and t > 1:
        widths += 2 * shape.hidden / t                           # the two reduce-scatters
    return 2.0 * M * widths + 4.0 * M * shape.heads / t         # + fp32 log-sum-exp


def stage_buffers(sw, fm, shape: DecoderShape, zero_stage, dp, gathered, unit_params,
                  param_split, first, last, pp, param_bytes: float, reduce_bytes: float,
                  stage_params):
    """Communication buffers on one rank of a stage, in bytes
    (:func:`~ddlsim.workloads.allocator.comm_buffer_bytes`) under the software stack ``sw``
    and its framework's rules ``fm``: the edges FSDP2 keeps gathered are the stage's embedding
    and head, or its head alone (:func:`.builder.with_edges` of no layer). Every argument but
    ``sw``, ``fm``, ``shape`` and the two byte counts may be an array over plans."""
    from .builder import with_edges
    from .fsdp import per_iteration
    kept = 0.0
    if fm.kept_root != "none":
        kept = with_edges(shape, param_split, 0.0, first if fm.kept_root == "edges"
                          else first & False, last, pp)
    whole = per_iteration(sw, 2) & (np.asarray(pp) > 1)
    return comm_buffer_bytes(fm, zero_stage, dp, gathered, unit_params, kept, param_bytes,
                             reduce_bytes, stage_params, sw.overlap_grad_reduce, whole)


def stage_activations(shape: DecoderShape, b, s: int, tp_cp, vpp, per_chunk, chunks, rebuilt,
                      first, last, embedding_split, logit_bytes, step,
                      head) -> tuple:
    """(activations, other buffers) in bytes on one rank of a stage; every argument but
    ``shape`` and ``s`` may be an array over plans (the search tier's memory is this rule).

    Parameters
    ----------
    b, s : micro-batch size, sequence length.
    tp_cp : the ranks the vocabulary-parallel logits are split over (TP·CP).
    vpp : model chunks per stage.
    per_chunk : activation bytes one chunk's layers keep for one micro-batch.
    chunks : (micro-batch, chunk) forwards in flight at the peak.
    rebuilt : a layer's activations rebuilt during its backward (full recomputation), else 0.
    first, last : the stage holds the embedding / the head.
    embedding_split : ranks the embedding output is split over.
    logit_bytes : bytes per logit the loss holds at its peak (the framework's,
        :meth:`~ddlsim.workloads.allocator.FrameworkMemory.logits_at`).
    head : bytes per token of the micro-batch that the final norm and the head keep on the
        last stage (:func:`~ddlsim.workloads.allocator.head_bytes`, already over CP).
    step : bytes the optimizer step allocates after the backward
        (:func:`~ddlsim.workloads.allocator.step_temporaries`): the temporaries are the larger
        of the two phases' beside the kept activations, ``max(other, step − activations)``.
    """
    acts = per_chunk * chunks + rebuilt
    sbh = b * s * shape.hidden
    # the loss's logits and their fp32 temporaries on the last stage; the embedding output
    # kept for dropout on the first
    other = (_on(last, loss_bytes(logit_bytes, b, s, shape.vocab, tp_cp) + b * s * head)
             + _on(first, sbh * chunks / vpp / embedding_split))
    if np.any(step):
        other = np.maximum(other, step - acts)
        other = float(other) if np.ndim(other) == 0 else other
    return acts, other


def _on(flag, x):
    """``x`` where ``flag``, else 0 (element-wise for arrays of plans)."""
    if isinstance(flag, (bool, np.bool_)):
        return x if flag else 0.0
    return np.where(flag, x, 0.0)
