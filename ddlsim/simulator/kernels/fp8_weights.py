"""Transformer Engine's FP8 weights as they live across an optimizer step: the host's work of
its quantized tensors, the weight cast once per step (cached for the step's other
micro-batches), and FP8 parameters (Megatron's ``--fp8-param-gather``, the stack's
``software.kernels.fp8_param_gather``), which the optimizer step quantizes instead
(docs/compute.md, "FP8").

**FP8 parameters.** Megatron-Core keeps each TE linear's weight as a ``Float8Tensor`` (Megatron-LM
d7288711 ``training/arguments.py`` line 1666, ``kw_args['fp8_param'] = args.fp8_param_gather``;
"Keep the compute param in fp8 ... and perform the param all-gather in fp8", line 1733). Then:

* no forward casts the weight (TE 71bbefbf ``module/base.py`` 1435-1446: ``get_weight_workspace``
  returns a ``QuantizedTensor`` weight as it is);
* the distributed optimizer's step casts the rank's fp32 master shard into its FP8 parameter
  shard (d7288711 ``core/optimizer/distrib_optimizer.py`` line 2462 ``quantize_param_shard``,
  ``core/fp8_utils.py`` lines 233-265: TE's ``cast_master_weights_to_fp8`` with
  ``manual_post_all_gather_processing``): delayed scaling casts with the scale of the amax
  history (``tensor/utils.py`` 253-342: ``quantizer.update_quantized`` per shard, read 4 +
  write 1 bytes per element, the amax taken in that kernel, then one all-reduce of the packed
  fp32 amaxes over the data-parallel group); current scaling first reads the shard for its
  amax (``tex.compute_amax``, lines 403-405: 4 bytes per element), all-reduces the packed
  amaxes over the group (line 410), computes the scales (one multi-tensor kernel) and casts
  (read 4 + write 1): :func:`fp8_param_update_kernels`, :func:`fp8_param_amax_bytes`;
* the parameter all-gather moves 1 byte per element (the FP8 ``_data``);
* after it, ``post_all_gather_processing`` (d7288711 ``fp8_utils.py`` lines 499-506; TE
  ``tensor/utils.py`` 981-1001) makes each ``Float8Tensor``'s transpose where the GPU has no
  non-TN FP8 GEMM (Hopper: ``_create_transpose``, read 1 + write 1 byte per element of the
  whole weight), once per step: the weight pass of
  :func:`~ddlsim.simulator.kernels.fp8recipe.fp8_cast_kernels` (``weight_fp8``), spread over
  the step's micro-batches as the cached cast is (:func:`fp8_weight_share`);
* memory: the weight is 1 byte per element and its kept transpose 1 more on Hopper: 2 bytes,
  what the 16-bit weights count (the param-gather buffer is the weights' own storage,
  ``param_and_grad_buffer.py``); the fp32 master parameters and the gradients unchanged.
"""

from __future__ import annotations

import numpy as np

from ...workloads.trace import Kernel

__all__ = ["TE_TENSOR_CREATE_S", "TE_QUANTIZED_TENSORS", "fp8_quantize_host_s",
           "fp8_weight_share", "fp8_param_update_kernels", "fp8_param_amax_bytes",
           "FP8_PARAM_BYTES", "MASTER_CAST_BYTES", "MASTER_AMAX_BYTES"]

#: bytes per element of an FP8 parameter as gathered (the ``Float8Tensor``'s ``_data``, uint8)
FP8_PARAM_BYTES = 1.0
#: bytes per element of the step's cast of the fp32 master shard into the FP8 parameter shard
#: (TE 71bbefbf ``tensor/utils.py`` ``quantizer.update_quantized(master_weight, ...)``: read the
#: fp32 master, 4, write the FP8 shard, 1)
MASTER_CAST_BYTES = 4.0 + 1.0
#: bytes per element of current scaling's amax read of the fp32 master shard (same file, lines
#: 403-405, ``tex.compute_amax(master_weight, amax)``)
MASTER_AMAX_BYTES = 4.0
#: bytes of one weight's fp32 amax in the packed all-reduce over the data-parallel group (same
#: file, ``packed_amaxes``: one float32 per weight, lines 318-326 and 369-410)
_AMAX_ENTRY_BYTES = 4.0


#: Host seconds to create one PyTorch tensor in Transformer Engine's C++ extensions: "It
#: takes a ~5 us on CPU to create each PyTorch tensor, and this can become significant when
#: GEMM kernels take ~100 us on GPU" (T. Moon, a TE maintainer, NVIDIA/TransformerEngine PR
#: #865, 2024-05-24, profiling ``te.Linear`` in FP8)
TE_TENSOR_CREATE_S = 5e-6
#: tensors a Transformer Engine FP8 quantizer creates for each tensor it quantizes on Hopper
#: with both usages (TransformerEngine 71bbefbf, the commit Megatron-Bridge v0.4.0 pins:
#: ``pytorch/csrc/quantizer.cpp`` ``Float8Quantizer::create_tensor`` and
#: ``Float8CurrentScalingQuantizer::create_tensor``: ``at::empty`` of the row-wise data, of
#: the transpose (``columnwise_usage`` where ``nvte_is_non_tn_fp8_gemm_supported()`` is
#: false, i.e. sm_90) and of the fp32 ``scale_inv``, each ``py::cast`` to a Python tensor for
#: the ``Float8TensorStorage`` built from them): a grouped linear's input in the forward (row-wise
#: for the GEMM, the transpose for the weight gradient) and its output gradient in the
#: backward (data gradient, weight gradient) each need both
TE_QUANTIZED_TENSORS = 3


def fp8_quantize_host_s(recipe: str, tensors: float) -> float:
    """Host seconds ``recipe``'s quantizers spend creating the outputs of ``tensors`` quantized
    tensors: :attr:`.fp8recipe.Fp8Recipe.host_tensors` × :data:`TE_TENSOR_CREATE_S` each
    (Transformer Engine's ``create_tensor``); 0 for a recipe without (torchao's).

    Parameters
    ----------
    recipe : str
        a registered recipe (:data:`.fp8recipe.FP8_RECIPES`).
    tensors : float
        tensors quantized, e.g. one input per local expert of a grouped linear's forward.

    Returns
    -------
    float
        seconds, host only (the op's ``host_s``).
    """
    if tensors < 0:
        raise ValueError(f"fp8_quantize_host_s: tensors = {tensors!r}; allowed: >= 0")
    from .fp8recipe import FP8_RECIPES
    return tensors * FP8_RECIPES[recipe].host_tensors * TE_TENSOR_CREATE_S


def fp8_weight_share(recipe: str, microbatches: int) -> float:
    """The share of a weight's FP8 cast that one forward of ``recipe`` carries when an
    optimizer step runs ``microbatches`` forwards of it: ``1 / microbatches`` for a recipe
    that casts each weight once per step and keeps the copy (``Fp8Recipe.weight_cached``),
    1 for one that casts it in every forward.

    Transformer Engine (TransformerEngine 71bbefbf, the commit Megatron-Bridge v0.4.0 pins):
    ``Linear``, ``LayerNormLinear`` and ``GroupedLinear`` quantize their weight through
    ``get_weight_workspace`` with ``update_workspace = is_first_microbatch is None or
    is_first_microbatch`` and ``cache_name="weight"`` (``f"weight{i}"`` per expert) whenever
    ``is_first_microbatch`` is given (``module/linear.py`` lines 267-274,
    ``layernorm_linear.py`` 301-305, ``grouped_linear.py`` 172-177): the step's first
    micro-batch quantizes it into the cached workspace (``module/base.py`` 1448-1522), the
    others take the cached FP8 tensor as it is. With gradients on, the forward asks for the
    column-wise copy too (``weight_quantizer.set_usage(rowwise=True, columnwise=...)``,
    ``linear.py`` 255-262), so on Hopper the cached tensor holds the transpose the data
    gradient needs; the backward's ``update_usage(columnwise_usage=True)`` (``linear.py``
    695, ``layernorm_linear.py`` 706, ``grouped_linear.py`` 410) creates it only where it is
    missing (``tensor/storage/float8_tensor_storage.py`` 234-265). Megatron-Core's TE
    wrappers pass ``is_first_microbatch`` (``extensions/transformer_engine.py`` at d7288711:
    ``TELinear`` lines 712, 870-877; ``TELayerNormColumnParallelLinear`` 959, 1091-1099;
    ``TEGroupedLinear`` 1706, 1895-1902; set True again by ``model.set_is_first_microbatch()``
    on each step's first micro-batch, ``pipeline_parallel/schedules.py`` 409-410), unless
    ``disable_parameter_transpose_cache`` (``transformer_config.py`` 881, default False).

    ddlsim's trace shares one forward block among a step's micro-batches, so the one cast is
    spread over them rather than charged to the first: the step's total is the same; the
    pipeline's warm-up carries ``1/microbatches`` of each stage's cast, where the first
    micro-batch's would carry all of it (a stage's weight elements × 3 bytes at the device's
    memory bandwidth: about 2 ms for 2.2e9 elements on an H100). Each forward still launches
    the cast kernel (its bytes scaled): a launch per micro-batch left in. Parameters kept in
    FP8 (Megatron's ``--fp8-param-gather``) are not cast at all (``get_weight_workspace``
    returns a ``QuantizedTensor`` weight as it is, ``base.py`` 1435-1446): the stack's
    ``fp8_param_gather`` (:func:`fp8_param_update_kernels`,
    :func:`~ddlsim.simulator.kernels.fp8recipe.fp8_cast_kernels`' ``weight_fp8``).

    Parameters
    ----------
    recipe : str
        a registered recipe (:data:`.fp8recipe.FP8_RECIPES`).
    microbatches : int
        forwards of the layer per optimizer step (Megatron's ``num_microbatches``), >= 1.

    Returns
    -------
    float
        in ``(0, 1]``.

    Raises
    ------
    ValueError
        for ``microbatches`` below 1.
    """
    if microbatches < 1:
        raise ValueError(f"fp8_weight_share: microbatches = {microbatches!r}; allowed: an "
                         "integer >= 1 (forwards per optimizer step)")
    from .fp8recipe import FP8_RECIPES
    return 1.0 / microbatches if FP8_RECIPES[recipe].weight_cached else 1.0


def fp8_param_update_kernels(recipe: str, elements: float) -> tuple[Kernel, ...]:
    """The memory kernels by which the optimizer step turns ``elements`` fp32 master parameters
    (the rank's shard) into its FP8 parameter shard (module docstring): current scaling's
    amax read (:data:`MASTER_AMAX_BYTES` per element) and the cast
    (:data:`MASTER_CAST_BYTES`); delayed scaling's cast alone.

    Parameters
    ----------
    recipe : str
        ``te_delayed`` or ``te_current`` (a Transformer Engine recipe: FP8 parameters are
        Transformer Engine's ``Float8Tensor``).
    elements : float
        master parameters of the rank's shard, >= 0.

    Returns
    -------
    tuple of Kernel
        ``memory`` kernels, bytes read + written each.

    Raises
    ------
    ValueError
        for another recipe or a negative ``elements``.
    """
    if recipe not in ("te_delayed", "te_current"):
        raise ValueError(f"fp8_param_update_kernels: recipe = {recipe!r}; allowed: te_delayed, "
                         "te_current (FP8 parameters are Transformer Engine's)")
    if elements < 0:
        raise ValueError(f"fp8_param_update_kernels: elements = {elements!r}; allowed: >= 0")
    amax = (MASTER_AMAX_BYTES * elements,) if recipe == "te_current" else ()
    return tuple(Kernel("memory", bytes=b, dtype="fp32") for b in (*amax,
                                                                   MASTER_CAST_BYTES * elements))


def fp8_param_amax_bytes(weights):
    """Bytes of the step's all-reduce (max) of the FP8 parameters' amaxes over the data-parallel
    group: one fp32 per weight tensor, packed (module docstring); element-wise on an array of
    plans (the search tier's)."""
    if np.any(np.asarray(weights) < 0):
        raise ValueError(f"fp8_param_amax_bytes: weights = {weights!r}; allowed: >= 0")
    return _AMAX_ENTRY_BYTES * weights
