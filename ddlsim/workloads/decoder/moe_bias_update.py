"""Auxiliary-loss-free balancing's per-step bias update, as Megatron-Core runs it: after the
gradients are synchronised and before the optimizer step, every pipeline stage all-reduces
the tokens each of its MoE layers routed to each expert over the iteration (fp32, stacked
``L × E``) over TP × DP × CP, moves each expert bias by ``±rate`` towards the mean load and
zeroes the counts (docs/moe.md, "Auxiliary-loss-free balancing (expert bias)").

Counted at NVIDIA/Megatron-LM d98e8a64: ``megatron/core/distributed/finalize_model_grads.py``
(``finalize_model_grads`` calls ``_update_router_expert_bias`` at line 687, after the embedding
gradients' all-reduce, lines 677-678, then ``reset_model_temporary_tensors``, line 692;
``_update_router_expert_bias`` lines 334-371: ``torch.stack`` of the counts and of the biases,
two kernels; each bias's ``copy_``, ``L``) and ``megatron/core/transformer/moe/moe_utils.py``
(``get_updated_expert_bias`` lines 1199-1229: ``all_reduce`` over the ``tp_dp_cp`` group, then
``sum``, ``/``, ``-``, ``sign``, ``*``, ``+``: six kernels), ``reset_model_temporary_tensors``
lines 314-331 (each layer's ``local_tokens_per_expert.zero_()``, ``L``): ``8 + 2·L`` small
element-wise kernels and one all-reduce of ``4·L·E`` bytes.

ddlsim's traces have no TP × DP × CP group; the all-reduce is laid as one all-reduce over the
data-parallel ranks, then one over context parallelism and one over tensor parallelism where
they have more than one rank (the same counts, a latency-bound step each), on the compute
stream before the step, as the embedding gradients' all-reduce (:mod:`.tied_embedding`).
"""

from __future__ import annotations

from typing import Any

from ..trace import Block, Collective, Compute, Kernel, Op, insert_before
from .layerkinds import moe_layers_in_stage
from .tied_embedding import STEP_OPS

__all__ = ["OP_NAME", "bias_update_ops", "with_bias_update"]

#: the ops' name prefix
OP_NAME = "expert_bias"


def bias_update_ops(b: Any, stage: int) -> list[Op]:
    """The bias update's ops of ``stage`` (empty without the bias or MoE layers).

    Parameters
    ----------
    b : StageBuilder
        The plan's builder (``moe``, ``shape``, ``split``, ``dp``, ``cp``, ``tp``, ``dtype``).
    stage : int
        Pipeline stage index.

    Returns
    -------
    list of Op
        ``expert_bias.all_reduce.{dp,cp,tp}`` (``4·L·E`` bytes each, the groups with more than
        one rank), then ``expert_bias.update`` (``8 + 2·L`` small kernels), on the compute
        stream.
    """
    layers = moe_layers_in_stage(b.shape, b.split, stage) if b.moe is not None else 0
    if not layers or not b.moe.expert_bias:
        return []
    counts = 4.0 * layers * b.shape.experts                  # fp32 per expert and layer
    ops = [Op(Collective(f"{OP_NAME}.all_reduce.{g}", "all_reduce", g, counts))
           for g, n in (("dp", b.dp), ("cp", b.cp), ("tp", b.tp)) if n > 1]
    kernels = (Kernel("memory", dtype=b.dtype),) * (8 + 2 * layers)
    ops.append(Op(Compute(f"{OP_NAME}.update", 0.0, 0.0, kind="elementwise", dtype=b.dtype,
                          kernels=kernels)))
    return ops


def with_bias_update(b: Any, block: Block, stage: int) -> Block:
    """``block`` (a stage's ``update`` block) with :func:`bias_update_ops` inserted before the
    grad norm's sync or the optimizer step; ``block`` itself without them or without a step
    (a rank that does not step).

    Parameters
    ----------
    b : StageBuilder
        The plan's builder.
    block : Block
        The stage's update block.
    stage : int
        Pipeline stage index.

    Returns
    -------
    Block
        The block with the ops inserted, later ops' dependencies shifted past them.
    """
    return insert_before(block, STEP_OPS, bias_update_ops(b, stage))
