"""The step's element-wise passes outside the layers: the vocab-parallel cross-entropy's
(:func:`loss_bytes`, :func:`loss_passes`, :func:`loss_kernels`) and the optimizer step's
(:func:`optimizer_bytes_per_param`), as memory passes at the device's bandwidth (their
classes :data:`.elementwise.ELEMENTWISE_CLASSES` ``loss``, ``loss_backward``, ``optimizer``).
Re-exported by :mod:`.elementwise`, where they were."""

from __future__ import annotations

from ...workloads.trace import Kernel

__all__ = ["loss_bytes", "loss_passes", "loss_kernels", "cross_entropy_impl",
           "stack_cross_entropy", "CROSS_ENTROPY_IMPLS", "optimizer_bytes_per_param"]

#: which fused cross-entropy runs under ``fused_cross_entropy`` (Megatron-Core's
#: ``--cross-entropy-fusion-impl``, ``model_parallel_config.py`` ``cross_entropy_fusion_impl:
#: Literal['native', 'te'] = 'native'`` at d7288711): Megatron-Core's own ``jit_fuser``
#: kernels or Transformer Engine's Triton ``parallel_cross_entropy``
CROSS_ENTROPY_IMPLS = ("native", "te")


def cross_entropy_impl(fused: bool, impl: str = "native") -> str:
    """The cross-entropy that runs: ``unfused`` (Megatron's torch ops) unless ``fused``
    (``--cross-entropy-loss-fusion``), else ``impl`` (``--cross-entropy-fusion-impl``, read
    only under the fusion: Megatron-LM d7288711 ``language_module.py``
    ``compute_language_model_loss`` lines 141-167)."""
    if impl not in CROSS_ENTROPY_IMPLS:
        raise ValueError(f"cross_entropy_fusion_impl = {impl!r} is not a fused cross-entropy; "
                         f"allowed: {', '.join(CROSS_ENTROPY_IMPLS)}")
    return impl if fused else "unfused"


def stack_cross_entropy(sw) -> str:
    """The cross-entropy a resolved stack ``sw`` (:class:`~ddlsim.software.Software`) runs:
    :func:`cross_entropy_impl` of its ``fused_cross_entropy`` and
    ``cross_entropy_fusion_impl``."""
    return cross_entropy_impl(sw.fused_cross_entropy, sw.cross_entropy_fusion_impl)


def _impl(fused: bool | str) -> str:
    """``fused`` as :func:`cross_entropy_impl` names it (False: unfused, True: native)."""
    if isinstance(fused, str):
        if fused not in ("unfused", *CROSS_ENTROPY_IMPLS):
            raise ValueError(f"cross-entropy {fused!r} is not known; allowed: unfused, "
                             f"{', '.join(CROSS_ENTROPY_IMPLS)}")
        return fused
    return "native" if fused else "unfused"


def loss_bytes(tokens: float, vocab_local: float, dtype_bytes: float, fused: bool | str,
               backward: bool = False) -> float:
    """Memory traffic of the vocab-parallel cross-entropy over ``tokens × vocab_local``
    16-bit logits, forward (or its ``backward``), in bytes. ``fused``: False or
    ``"unfused"``, True or ``"native"`` (Megatron-Core's fusion), ``"te"`` (Transformer
    Engine's): :func:`cross_entropy_impl`'s names. Megatron's own two paths work on an fp32
    copy of the logits and keep the fp32 softmax for the backward (per logit, ``d`` =
    ``dtype_bytes``):

    * unfused, Megatron-LM's torch ops (6985e58 ``megatron/mpu/cross_entropy.py`` lines
      28-105, called on ``output.float()`` by ``megatron/model/gpt_model.py`` line 56;
      Megatron-Core 900f1b76 ``tensor_parallel/cross_entropy.py`` casts inside,
      ``calculate_logits_max``): forward: the cast (read ``d``, write 4), ``max`` (read 4),
      ``sub_`` (read + write 4), ``exp`` (read + write 4), ``sum`` (read 4), ``div_`` (read +
      write 4): ``d + 36``. Backward: ``mul_`` by the loss gradient (read + write 4) and the
      autograd cast back to 16 bits (read 4, write ``d``): ``d + 12``;
    * fused (``--cross-entropy-loss-fusion``, Megatron-Core ``fusions/fused_cross_entropy.py``:
      three ``jit_fuser`` kernels forward, one backward): cast + max (read ``d``, write 4),
      subtract + exp + sum (read + write 4), divide (read + write 4): ``d + 20``; backward:
      gradient and cast (read 4, write ``d``): ``d + 4``;
    * Transformer Engine's (``fused`` = ``"te"``: ``--cross-entropy-fusion-impl te``; TE
      v2.7 fedd9ddc ``pytorch/triton/cross_entropy.py``, the same passes at c6a9e261, the
      TE of ``megatron-core-2025``'s date, and through v2.14 f031cf87, the newest container
      of the Bridge tables; v2.18, 01bbe3ee of 2026-07, writes an fp32 gradient instead and
      is not modelled): no fp32 copy.
      Forward: ``online_softmax_kernel`` reads each row once for its running max and sum
      (``d``), ``cross_entropy_kernel`` reads it again and writes the softmax gradient into
      the 16-bit logits in place (``2d``): ``3d``. Backward: ``element_mul_kernel`` scales
      that gradient in place by the loss's gradient (read + write ``d``: ``2d``), skipped
      only when the gradient is the scalar 1.0 (``cross_entropy_backward``); Megatron's loss
      is per token, masked and summed by the loss function, so its gradient is a tensor and
      the multiply runs. The fp32 max, sum and target logit per row (12 B, all-gathered
      over TP in place of Megatron's all-reduces) are per token: not counted.

    The target-logit gather and the one-hot subtraction touch one logit per token: not counted.
    With fp32 logits (``d`` = 4) the casts are no-ops: their passes drop out (the fused
    forward's max still reads the logits). The sum of :func:`loss_passes`."""
    return tokens * vocab_local * sum(loss_passes(dtype_bytes, fused, backward))


def loss_passes(dtype_bytes: float, fused: bool | str, backward: bool = False) -> list[float]:
    """Bytes per logit of each kernel of the cross-entropy (:func:`loss_bytes`, whose passes
    these are, one kernel each): unfused forward cast, ``max``, ``sub_``, ``exp``, ``sum``,
    ``div_``, backward ``mul_`` and the cast back; fused forward cast + max, subtract + exp
    + sum, divide, backward one kernel; Transformer Engine's (``fused`` = ``"te"``) forward
    online softmax and gradient, backward the in-place multiply."""
    d, impl = dtype_bytes, _impl(fused)
    if impl == "te":
        return [2 * d] if backward else [d, 2 * d]
    cast = [d + 4] if d < 4 else []
    if impl == "native":
        return [4 + d] if backward else [max(d + 4 if d < 4 else 0.0, 4.0), 8.0, 8.0]
    if backward:
        return [8.0] + ([4 + d] if d < 4 else [])
    return cast + [4.0, 8.0, 8.0, 4.0, 8.0]


def loss_kernels(logits: float, dtype_bytes: float, fused: bool | str, backward: bool = False,
                 dtype: str = "bf16") -> tuple[Kernel, ...]:
    """The cross-entropy's kernels over ``logits`` logits, forward (or its ``backward``): one
    memory kernel per pass of :func:`loss_passes`, bytes in B. The unfused passes carry the
    class ``loss`` (``loss_backward``): torch's eager kernels over ``[tokens, V/t]`` fp32
    rows, row reductions among them, run below the streaming bandwidth in published H100
    times (Liger-Kernel's Megatron-Core cross-entropy rows, ``benchmarks/data/
    liger_h100_kernels.csv``); the fused stacks' kernels (Megatron-Core's, Transformer
    Engine's) stay unclassed."""
    cls = "" if _impl(fused) != "unfused" else "loss_backward" if backward else "loss"
    return tuple(Kernel("memory", bytes=logits * x, dtype=dtype, variant=cls)
                 for x in loss_passes(dtype_bytes, fused, backward))


def optimizer_bytes_per_param(optimizer: str, fused: bool, param_bytes: float = 2,
                              grad_bytes: float = 4, loss_scaling: bool = False) -> float:
    """Bytes one optimizer step moves per parameter: the mixed-precision wrapper's passes
    around the update itself, as Megatron-LM's ``MixedPrecisionOptimizer.step`` runs them
    (6985e58 ``megatron/optimizer/optimizer.py`` lines 398-445; DeepSpeed's ZeRO-1/2 step does
    the same passes on its partition):

    1. gradients into fp32 (``main_param.grad = model_param.grad.float()``) when they are kept
       in 16 bits (``grad_bytes`` < 4): read ``grad_bytes``, write 4;
    2. with a loss scaler (fp16): unscale and check for inf/nan
       (``torch._amp_foreach_non_finite_check_and_unscale_``): read + write 4;
    3. the gradient norm for clipping (``clip_grad_norm_fp32``, ``--clip-grad`` 1.0 by
       default; apex ``multi_tensor_l2norm``): read 4 (the clip itself only when the norm
       exceeds it: not counted);
    4. the update on fp32 weight, gradient, momentum and variance. Fused multi-tensor Adam
       (apex/TE FusedAdam): read 16, write 12 = 28 B. Unfused (``torch.optim.Adam`` per
       tensor, foreach off): momentum ``mul_``, ``add_`` (5 fp32 passes), variance ``mul_``,
       ``addcmul_`` (6), ``sqrt``, ``add_(eps)`` (4), ``addcdiv_`` (4): 19 passes = 76 B.
       SGD with momentum: weight and momentum read + write, gradient read: 20 B;
    5. the fp32 master weights copied to the ``param_bytes`` model weights
       (``_copy_main_params_to_model_params``): read 4, write ``param_bytes``.

    ``param_bytes`` 4 (fp32 training): no master copy, no steps 1, 2 and 5.
    """
    mixed = param_bytes < 4
    to_fp32 = grad_bytes + 4 if grad_bytes < 4 else 0.0
    unscale = 2 * 4 if loss_scaling else 0.0
    norm = 4
    if optimizer != "adam":
        update = 2 * 4 + 2 * 4 + 4
    else:
        update = 4 * 4 + 3 * 4 if fused else 19 * 4
    master = 4 + param_bytes if mixed else 0.0
    return to_fp32 + unscale + norm + update + master
