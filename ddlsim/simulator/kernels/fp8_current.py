"""Transformer Engine's FP8 current scaling (``Float8CurrentScaling``, Megatron-Core's
``--fp8-recipe tensorwise``, Megatron-Bridge's ``fp8_cs`` presets): the recipe ``te_current``
of :data:`~ddlsim.simulator.kernels.fp8recipe.FP8_RECIPES`, and the amax all-reduce it runs
over the tensor-parallel group (docs/compute.md, "FP8").

Each tensor a linear casts to FP8 is scaled by its own ``max(abs)``, computed in the same
step, where delayed scaling (``te_delayed``) takes the scale from an amax history and runs
no such pass. ``Float8CurrentScalingQuantizer::quantize_impl`` (TransformerEngine
``transformer_engine/pytorch/csrc/quantizer.cpp``, the same at v2.7, v2.9 and v2.12, the TE
of the NeMo 25.09 to 26.02 containers) runs three kernels per tensor, on the compute stream:

1. ``nvte_compute_amax``: ``zero_amax_kernel`` (one thread writes the fp32 amax: 4 B,
   :data:`ZERO_KERNEL_BYTES`), then the amax kernel, a read of the bf16 tensor (2 bytes per
   element; ``common/recipe/current_scaling.cu`` ``launch_amax_kernel``);
2. with ``with_amax_reduction``: an all-reduce (MAX) of the fp32 amax over
   ``amax_reduction_group``, waited for on the compute stream (``->wait()``);
3. ``nvte_compute_scale_from_amax``: the scale from the amax, one thread (reads 4 B,
   writes 4 B: :data:`SCALE_KERNEL_BYTES`, a launch; the cast writes the inverse);
4. ``nvte_quantize_v2``: the cast (and transpose) itself, the bytes ``te_delayed`` moves.

What differs from ``te_delayed``, per linear ``[M, K] · [K, N]``:

* the input ``x``: zero + amax ``2MK`` + scale, unless a TE normalisation before it computed
  the amax (``LayerNormLinear``: ``layernorm_fwd``/``rmsnorm_fwd`` zero the amax
  (``create_unquantized_tensor_with_amax``: ``amax.zero_()``), write the bf16 output and its
  amax in one kernel, ``FUSED_NORM_AMAX_FP8`` (v2.9; ``create_hp_tensor_with_amax`` at
  v2.7), then quantize with that amax; Megatron-Core's ``TELayerNormColumnParallelLinear``,
  i.e. ``qkv`` and a dense layer's ``fc1``): zero + scale only (``norm_amax`` of
  :func:`~.fp8recipe.fp8_cast_kernels`);
* the weight ``w``: nothing more. TE quantizes a weight on the first micro-batch of a step
  only: Megatron-Core's TE wrappers pass ``is_first_microbatch`` (``TELinear.forward`` and
  ``TEGroupedLinear.forward``, ``disable_parameter_transpose_cache`` off by default) and TE
  keeps the FP8 weight for the later micro-batches; ddlsim charges the cast once per step,
  spread over its micro-batches, for both TE recipes (``Fp8Recipe.weight_cached``,
  :func:`~.fp8recipe.fp8_weight_share`), and adds no amax to it. Megatron-Bridge's
  current-scaling preset also sets ``fp8_param_gather``
  (``bf16_with_fp8_current_scaling_mixed``), where the weights are FP8 parameters that the
  optimizer quantizes after its step (the master shard's amax read, its all-reduce over the
  data-parallel group and the cast) and no forward casts, the gathered weight transposed
  once per step instead: the stack's ``fp8_param_gather`` (:mod:`.fp8_weights`);
* the output gradient ``g``: zero + amax ``2MN`` + scale.

The amax all-reduce: ``_customize_quantizers_float8_current_scaling`` of ``Linear`` and
``LayerNormLinear`` (``module/linear.py``, ``module/layernorm_linear.py``) sets
``with_amax_reduction`` over the TP group where the tensor is all-gathered in FP8 under
sequence parallelism (``distributed.py`` ``gather_along_first_dim`` → ``_all_gather_fp8``
quantizes the rank's shard and gathers FP8 data with one scale): the input of a
column-parallel linear in the forward and the output gradient of a row-parallel linear in
the backward. Without sequence parallelism, or with one TP rank, there is none
(:func:`amax_allreduce`).

Grouped linears (``GroupedLinear``, Megatron-Core's ``TEGroupedMLP``): ``tex.split_quantize``
quantizes the ``E/EP`` problems' inputs and output gradients in one fused
``nvte_multi_cast_transpose`` only when every quantizer is a delayed-scaling one
(``cast.cpp`` ``multi_tensor_quantize_impl``: "Currently only have fused kernel for FP8
delayed scaling", unchanged from v2.7 to v2.12); with current scaling each problem's
quantizer runs its own kernels above (``Fp8Recipe.per_problem``); each expert's weight is
quantized on its own too (``grouped_linear.py`` forward, a loop over ``num_gemms``, either
recipe). ``split_quantize`` also creates each problem's FP8 output on the host with its
quantizer's ``create_tensor`` (data, transpose and ``scale_inv`` on Hopper, either TE recipe:
only blockwise, MXFP8 and NVFP4 quantizers bulk-allocate), so the host's share grows with the
local experts (``Fp8Recipe.host_tensors``, :func:`.fp8recipe.fp8_quantize_host_s`; still so at
TransformerEngine 71bbefbf, 2026-03-24, the commit Megatron-Bridge v0.4.0 pins for the NeMo
26.04 container: ``cast.cpp`` ``split_quantize`` and ``multi_tensor_quantize_impl``).

The GEMMs are the same cuBLASLt per-tensor-scaled kernels as delayed scaling's, with the
same accumulation: ``Float8CurrentScaling`` ``fp8_gemm_fprop = MMParams(use_split_accumulator
=False)``, ``fp8_gemm_dgrad``/``fp8_gemm_wgrad`` ``True`` (``common/recipe/__init__.py``).
"""

from __future__ import annotations

from typing import Any

from ...workloads.trace import Collective
from .fp8recipe import FP8_RECIPES, TE_QUANTIZED_TENSORS, Fp8Recipe

__all__ = ["ZERO_KERNEL_BYTES", "SCALE_KERNEL_BYTES", "AMAX_BYTES", "amax_allreduce"]

#: bytes of the kernel zeroing a tensor's fp32 amax before it is computed (TransformerEngine
#: v2.9 ``common/recipe/current_scaling.cu`` ``zero_amax_kernel<<<1, 1>>>``, or
#: ``amax.zero_()`` before a fused normalisation): one launch writing 4 B
ZERO_KERNEL_BYTES = 4.0
#: bytes of ``nvte_compute_scale_from_amax`` per tensor (``compute_scale_from_amax_kernel
#: <<<1, 1>>>``, same file): reads the fp32 amax, writes the fp32 scale (4 + 4 B); a kernel
#: timed by its launch
SCALE_KERNEL_BYTES = 8.0
#: bytes of one amax all-reduce: the quantizer's one fp32 ``amax`` tensor (quantizer.cpp
#: ``std::vector<at::Tensor> tensors = {amax}``)
AMAX_BYTES = 4.0


def _quantize(role: str, n: float, cast_bytes: float, amax: bool) -> tuple:
    """The passes of one current-scaling quantize of ``n`` elements: the amax zeroed
    (``role`` + ``.zero``), its read (``.amax``; left out where ``amax`` is False), the scale
    kernel (``.scale``) and the cast moving ``cast_bytes`` per element in all (``role``)."""
    head = role.rstrip("T")
    out = ((f"{head}.zero", ZERO_KERNEL_BYTES),)
    out += ((f"{head}.amax", 2 * n),) if amax else ()
    return out + ((f"{head}.scale", SCALE_KERNEL_BYTES), (role, cast_bytes * n))


def _te_current(M, N, K, backward, compiled):
    """The passes of one linear ``[M, K] · [K, N]``: ``te_delayed``'s casts, the input's and
    the output gradient's after their amax kernels (module docstring)."""
    if backward:
        return _quantize("gT", M * N, 4, True)
    return _quantize("xT", M * K, 4, True) + (("w", 3 * K * N),)


FP8_RECIPES["te_current"] = Fp8Recipe(
    _te_current, ("cublas_fast", "cublas_split", "cublas_split"), (False, False),
    per_module=False, inductor=False, per_problem=True, sp_gather=True,
    sp_amax_allreduce=True, host_tensors=TE_QUANTIZED_TENSORS, weight_cached=True)


def amax_allreduce(name: str, sw: Any, train_dtype: str, tp: int,
                   sp: bool) -> list[Collective]:
    """The amax all-reduce of a tensor that a sequence-parallel linear all-gathers in FP8
    under current scaling (module docstring; torchao's tensorwise recipe alike, whose DTensor
    amax is reduced over TP: ``Fp8Recipe.sp_amax_allreduce``), before that all-gather.

    Parameters
    ----------
    name : str
        the all-gather's op name (the collective is ``name + ".amax"``).
    sw : Software
        the resolved software stack (``fp8_recipe``).
    train_dtype : str
        ``train.dtype``; only ``fp8`` casts.
    tp : int
        tensor-parallel ranks.
    sp : bool
        sequence parallelism (the input or gradient is gathered along the sequence).

    Returns
    -------
    list of Collective
        one ``all_reduce`` of :data:`AMAX_BYTES` bytes over ``tp``, or none (another recipe,
        no FP8, one TP rank or no sequence parallelism).
    """
    if (train_dtype != "fp8" or tp == 1 or not sp
            or not FP8_RECIPES[sw.fp8_recipe].sp_amax_allreduce):
        return []
    return [Collective(f"{name}.amax", "all_reduce", "tp", AMAX_BYTES)]
