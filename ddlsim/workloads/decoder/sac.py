"""Selective activation checkpointing as the stack runs it (``software.selective_recompute``).

``attention_core`` (Megatron-LM, Korthikanti et al. 2022 §5): the backward recomputes the
attention core's forward (:func:`.layerkernels.recompute_op`).

``every_second_mm`` (torchtitan's op-level selective AC, ``selective_ac_option = 'op'``:
torchtitan 9dec370 ``torchtitan/parallelisms/parallelize_llama.py`` lines 213-276, 07c00d9
``torchtitan/distributed/activation_checkpoint.py`` lines 22-31 and 85-101): inside each
checkpointed transformer block the policy saves the outputs of ``aten.mm`` except every
second one (counted per block and pass), of the SDPA kernels, of TP's reduce-scatters and of
``max``; every other op is recomputed in the backward. For torchtitan's Llama block the
``mm`` calls are, in order, ``wq wk wv wo w1 w3 w2`` (a gated MLP; ``w1 w2`` otherwise), so
the backward recomputes ``wk``, ``wo`` and ``w3`` and every element-wise op of the forward
(norms, rotary embedding, SiLU and product, residual adds). FP8 linears (torchao) run
``aten._scaled_mm``, which is not on the save list: every FP8 GEMM and its casts are
recomputed. MoE layers keep the attention-core form.
"""

from __future__ import annotations

from typing import Any

from ..trace import Compute, Kernel

__all__ = ["layer_mms", "every_second_mm_op"]


def layer_mms(shape: Any, M: float, t: int) -> list[tuple[float, float, float]]:
    """``(M, N, K)`` of a layer's ``aten.mm`` calls in forward order on one of ``t`` TP
    ranks: ``wq wk wv wo`` then ``w1 [w3] w2`` (torchtitan's Llama ``Attention`` and
    ``FeedForward``)."""
    h, f = shape.hidden, shape.ffn
    attn = [(M, shape.q_width / t, h), (M, shape.kv_width / t, h), (M, shape.kv_width / t, h),
            (M, h, shape.q_width / t)]
    mlp = [(M, f / t, h)] * (shape.mlp_matrices - 1) + [(M, h, f / t)]
    return attn + mlp


def every_second_mm_op(shape: Any, kernels: dict, b: int, s: int, t: int, dtype: str,
                       train_dtype: str, sw: Any = None) -> Compute:
    """The recomputation of torchtitan's op-level selective AC for one dense layer on one
    TP rank (module docstring): the forward's element-wise kernels (``kernels['ew']``) and
    its every-second ``mm`` (all linear GEMMs and the stack ``sw``'s FP8 casts under FP8)."""
    if train_dtype == "fp8":
        from .layerkernels import _linear, linear_gemms
        recipe = sw.fp8_recipe if sw is not None else "te_delayed"
        compiled = bool(sw.compile) if sw is not None else False
        gemms = tuple(k for g in linear_gemms(shape, b * s, t).values()
                      for k in _linear(g, train_dtype, False, recipe, compiled))
    else:
        mms = layer_mms(shape, b * s, t)[1::2]
        gemms = tuple(Kernel("gemm", g, dtype=train_dtype) for g in mms)
    ew = tuple(kernels["ew"])
    flops = sum(2.0 * k.shape[0] * k.shape[1] * k.shape[2] * k.batch
                for k in gemms if k.kind == "gemm")
    nbytes = sum(k.bytes for k in ew + gemms if k.kind == "memory")
    return Compute("recompute.sac", flops, nbytes, dtype=dtype, kernels=gemms + ew)
