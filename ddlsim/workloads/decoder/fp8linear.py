"""The kernels of the linear layers that a layer partitioner or an MoE layer builds itself (the
attention projections of 1-D tensor parallelism, the routed experts' grouped GEMMs): in FP8
the recipe's scaling and cast passes, GEMM kernels and rescaling passes, as a dense layer's
linears have them (:func:`.layerkernels.layer_kernels`); the passes per recipe are
:mod:`ddlsim.simulator.kernels.fp8recipe`'s.

Transformer Engine's ``GroupedLinear`` (what Megatron-Core's ``TEGroupedMLP`` runs with
``--moe-grouped-gemm``) quantizes the inputs of all its GEMMs in one call
(``tex.split_quantize`` of the concatenated tokens, ``grouped_linear.py`` forward; the output
gradient likewise in the backward), so the casts of ``E/EP`` problems are one kernel per pass
over all their tokens; without grouped GEMM each expert is a ``TELinear`` of its own and casts
its own tensors. Under current scaling (``te_current``) ``split_quantize`` falls back to each
problem's own quantize kernels (:mod:`ddlsim.simulator.kernels.fp8_current`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...simulator.kernels.fp8recipe import (FP8_RECIPES, fp8_cast_kernels, fp8_gemm_variants,
                                            fp8_quantize_host_s, fp8_rescale_kernels)
from ...simulator.kernels.gemm import gemm_kernels_backward
from ..trace import Compute, Kernel
from .wgrad import into_main_grad

__all__ = ["linear_kernels", "with_fp8_casts", "fp8_sp_gather", "weight_cast_microbatches",
           "weights_in_fp8"]


def _times(kernels: tuple[Kernel, ...], batch: float) -> tuple[Kernel, ...]:
    return tuple(replace(k, bytes=k.bytes * batch) for k in kernels)


def linear_kernels(sw: Any, dtype: str, M: float, N: float, K: float, backward: bool,
                   batch: float = 1.0, norm_amax: bool = False, gathered: str = "",
                   shards: int = 1, main_grad: int = 0,
                   microbatches: int = 1) -> tuple[Kernel, ...]:
    """The kernels of ``batch`` linears ``[M, K]·[K, N]`` launched as one (a grouped GEMM):
    the GEMMs (backward: data and weight gradients); in FP8, the recipe's cast passes before
    them over all ``batch`` problems at once (a recipe that quantizes each problem on its
    own, ``Fp8Recipe.per_problem``: ``batch`` times each problem's passes), its GEMM kernels
    and its rescaling passes.

    Parameters
    ----------
    sw : Software
        the resolved software stack (``fp8_recipe``, ``compile``; the weights arrive in FP8
        under ``enable_fsdp_float8_all_gather`` or ``fp8_param_gather``: :func:`weights_in_fp8`).
    dtype : str
        the linears' dtype (``train.dtype``); only ``fp8`` has casts.
    M, N, K : float
        one problem's GEMM shape (elements).
    backward : bool
        the backward's kernels instead of the forward's.
    batch : float
        problems in the launch (``Kernel.batch``; their cast bytes add up in one kernel per
        pass).
    norm_amax : bool
        the input comes from a normalisation that computed its amax
        (:func:`~ddlsim.simulator.kernels.fp8recipe.fp8_cast_kernels`).
    gathered : str
        ``"x"`` (the input) or ``"g"`` (the output gradient): the tensor the linear
        all-gathers over the sequence, quantized on the rank's shard first under Transformer
        Engine (same function); ``""``: none.
    shards : int
        sequence shards ``gathered`` is all-gathered from.
    main_grad : int
        bytes per element of the buffer the weight gradients accumulate into
        (:mod:`.wgrad`); 0: none.
    microbatches : int
        forwards per optimizer step (``num_microbatches``): a recipe that casts each weight
        once per step (Transformer Engine) spreads that cast over them
        (:func:`~ddlsim.simulator.kernels.fp8recipe.fp8_weight_share`); 1: the whole cast
        in this forward.

    Returns
    -------
    tuple of Kernel
        ``memory`` kernels (bytes read + written, B) and ``gemm`` kernels, in launch order.
    """
    shapes = gemm_kernels_backward(M, N, K) if backward else ((M, N, K),)
    if dtype != "fp8":
        gemms = tuple(Kernel("gemm", g, batch=batch, dtype=dtype) for g in shapes)
        return into_main_grad(gemms, main_grad) if backward else gemms
    recipe, compiled = sw.fp8_recipe, bool(sw.compile)
    gemms = tuple(Kernel("gemm", g, batch=batch, dtype=dtype, variant=v)
                  for g, v in zip(shapes, fp8_gemm_variants(recipe, backward)))
    gemms = into_main_grad(gemms, main_grad) if backward else gemms
    rescale = fp8_rescale_kernels(recipe, M, N, K) if backward else ()
    casts = fp8_cast_kernels(recipe, M, N, K, backward, compiled,
                             weight_fp8=weights_in_fp8(sw), norm_amax=norm_amax,
                             gathered=gathered, shards=shards, microbatches=microbatches)
    casts = casts * int(batch) if FP8_RECIPES[recipe].per_problem else _times(casts, batch)
    return casts + gemms + _times(rescale, batch)


def with_fp8_casts(op: Compute, sw: Any, M: float, N: float, K: float, backward: bool,
                   batch: float = 1.0, launches: int = 1, main_grad: int = 0,
                   microbatches: int = 1) -> Compute:
    """``op`` (``launches`` launches of ``batch`` GEMMs ``[M,K]·[K,N]`` in its kernels' dtype,
    :meth:`.moe.MoEOps._gemm`) with each launch's kernels as :func:`linear_kernels` gives
    them (``main_grad``, ``microbatches``: as there); ``op`` itself when its GEMMs are not
    FP8.

    The host's work of the quantized tensors is added to the op's ``host_s``: each problem's
    input (forward) or output gradient (backward) is quantized into tensors created one by one
    on the host (:func:`~ddlsim.simulator.kernels.fp8recipe.fp8_quantize_host_s`: Transformer
    Engine's ``split_quantize`` allocates every problem's FP8 output with its quantizer's
    ``create_tensor`` unless all quantizers are blockwise, MXFP8 or NVFP4, which bulk-allocate:
    TransformerEngine 71bbefbf ``pytorch/csrc/extensions/cast.cpp`` ``split_quantize``,
    ``AllocationMethod::UNFUSED``, delayed and current scaling alike). The weights' FP8 copies
    are cached across micro-batches (``get_weight_workspace``) or are FP8 parameters: none
    created per micro-batch (their cast kernels: one per step, spread over the step's
    ``microbatches``, :func:`~ddlsim.simulator.kernels.fp8recipe.fp8_weight_share`). The
    op's time is ``max(Σ t + n·g, n·h + host_s)``
    (:func:`~ddlsim.simulator.kernels.host.stream_time`)."""
    kernels = op.kernels or ()
    if not kernels or kernels[0].dtype != "fp8":
        return op
    host_s = fp8_quantize_host_s(sw.fp8_recipe, batch * launches)
    return replace(op, kernels=linear_kernels(sw, "fp8", M, N, K, backward, batch,
                                              main_grad=main_grad,
                                              microbatches=microbatches) * launches,
                   host_s=op.host_s + host_s)


def weights_in_fp8(sw: Any) -> bool:
    """Whether the FP8 linears' weights arrive in FP8, so that no forward casts them: torchao's
    FSDP2 float8 all-gather (``enable_fsdp_float8_all_gather``,
    :mod:`.fsdp_float8`) or Megatron's FP8 parameters (``fp8_param_gather``,
    :mod:`ddlsim.simulator.kernels.fp8_weights`; checked in :func:`.param_gather.check_fp8`).
    Only FP8 GEMMs read it."""
    return bool(sw.enable_fsdp_float8_all_gather or sw.fp8_param_gather)


def fp8_sp_gather(sw: Any, train_dtype: str, tp: int, sp: bool, shape: Any) -> bool:
    """Whether a dense layer's sequence-parallel all-gathers carry FP8 (1 byte per element):
    FP8 training under a recipe that quantizes before the gather (``Fp8Recipe.sp_gather``,
    Transformer Engine: the inputs of ``TELayerNormColumnParallelLinear``, ``qkv`` and
    ``fc1``, and the output gradients of the row-parallel ``proj`` and ``fc2``), with more
    than one TP rank and sequence parallelism. Not for MLA (its down projections' inputs
    are not gathered by a Transformer Engine module: not modelled, the casts stay whole).

    Parameters
    ----------
    sw : Software
        the resolved software stack (``fp8_recipe``).
    train_dtype : str
        ``train.dtype``.
    tp : int
        tensor-parallel ranks.
    sp : bool
        sequence parallelism.
    shape : DecoderShape
        the model (``mla``).

    Returns
    -------
    bool
    """
    return (train_dtype == "fp8" and tp > 1 and sp and shape.mla is None
            and FP8_RECIPES[sw.fp8_recipe].sp_gather)


def weight_cast_microbatches(sw: Any, train_dtype: str, microbatches: Any) -> Any:
    """The ``microbatches`` argument a layer's kernels take for a run with ``microbatches``
    forwards per optimizer step: ``microbatches`` itself where the weights' FP8 cast is
    spread over them (FP8 training under a recipe that keeps the cast weight,
    ``Fp8Recipe.weight_cached``: Transformer Engine,
    :func:`~ddlsim.simulator.kernels.fp8recipe.fp8_weight_share`), else 0: the kernels do
    not depend on it (a caller that groups runs by their kernels, the search tier, need not
    tell them apart).

    Parameters
    ----------
    sw : Software
        the resolved software stack (``fp8_recipe``).
    train_dtype : str
        ``train.dtype``.
    microbatches : int or numpy.ndarray
        forwards per optimizer step (``num_microbatches``), per plan where an array.

    Returns
    -------
    int or numpy.ndarray
        ``microbatches``, or 0 (zeros of its shape).
    """
    if train_dtype == "fp8" and FP8_RECIPES[sw.fp8_recipe].weight_cached:
        return microbatches
    return microbatches * 0

