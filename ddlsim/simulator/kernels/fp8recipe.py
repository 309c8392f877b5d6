"""FP8 training recipes as run: the memory passes that scale and cast each linear layer's GEMM
inputs to FP8, the GEMM kernel each of its three GEMMs runs, and the passes after them, per
recipe (``software.kernels.fp8_recipe``; docs/compute.md).

For a linear ``[M, K] · [K, N]`` (input ``x``, weight ``w``, output gradient ``g``), bytes
moved per element (bf16 in, FP8 out) by the recipe's cast kernels, forward and backward:

``te_delayed`` (Transformer Engine, delayed scaling: the scale comes from an amax history, so
no pass computes it; "Using FP8 with Transformer Engine", docs.nvidia.com)
    forward: ``x`` cast and transposed in one kernel (read 2, write 1 + 1: 4), ``w`` cast
    (read 2, write 1: 3); backward: ``g`` cast and transposed (4).
``te_current`` (Transformer Engine, current scaling: :mod:`.fp8_current`)
    ``te_delayed``'s casts, those of ``x`` and ``g`` after their amax read (2; not for an
    input whose normalisation computed it) and two one-thread kernels (amax zeroed, scale).
``tensorwise`` (torchao ``Float8Linear``, dynamic per-tensor scaling: torchtitan's float8)
    each tensor's ``max(abs)`` is a read (2, skipped for ``x`` and ``g`` when compiled: fused
    with the op before), then a cast writing the row-major and column-major FP8 copies:
    ``x``: 2 + (2 + 1 + 1), ``g`` the same, in the backward; ``w``: 2 + (2 + 1) forward and
    (2 + 1) again backward.
``rowwise`` (torchao, per-row scales, ``Float8LinearRecipeName.ROWWISE``)
    ``x`` and ``g``: a kernel writing the FP8 copy and the bf16 transpose (2 + 1 + 2; 1 + 2
    when compiled), then the transpose's cast (2 + 1); ``w``: cast (2 + 1) forward, transpose
    (2 + 2) and its cast (2 + 1) backward.

The GEMMs (:data:`FP8_GEMM_KERNELS`), output, grad_input and grad_weight in that order:

``te_delayed``
    cuBLASLt, fast accumulation in the forward and the split (promoted) accumulator in both
    backward GEMMs (TransformerEngine ``module/base.py``: ``_2X_ACC_FPROP = False``,
    ``_2X_ACC_DGRAD = _2X_ACC_WGRAD = True``).
``tensorwise``
    ``torch._scaled_mm`` with per-tensor scales, i.e. cuBLASLt: ``use_fast_accum`` in the
    forward only (torchao 6243040 ``config.py`` lines 174-176: ``gemm_config_output`` fast,
    ``gemm_config_grad_input``/``grad_weight`` default, slow; the same at eab345c, the 2024
    runs' torchao).
``rowwise``
    the forward (fast accumulation, per-row scales) in PyTorch's CUTLASS row-wise kernel;
    the backward GEMMs slow-accumulated, which torchao does not send to that kernel ("so
    slow without fast-accum"): it runs cuBLAS's per-tensor kernel with unit scales and
    multiplies the bf16 output by the outer product of the scales afterwards (torchao
    6243040 ``float8_ops.py`` ``addmm_float8_unwrapped`` lines 46-75, pytorch/ao#1325),
    "hoping Inductor will be able to fuse it". Each rescale is kept as a pass of its own
    (read 2 + write 2 bytes per element), compiled or not: torchao's compiled per-linear
    measurement (``benchmarks/validate_fp8_linear.py``) agreed better with the grad_input's
    rescale as a pass than fused into the next op (20.0 against 24.8 % mean |error| when
    that was chosen); the grad_weight leaves the compiled graph (to the optimizer or FSDP's
    reduce-scatter) in any case. Compiled, the input and output-gradient passes and the
    rescales run at a FITTED share of the bandwidth (:data:`ROWWISE_PASS_SHARE`; docs/compute.md,
    "FP8").

The weight's cast, per optimizer step (``Fp8Recipe.weight_cached``, :func:`fp8_weight_share`;
Transformer Engine's host time and weight functions live in :mod:`.fp8_weights`, imported here):
Transformer Engine casts a weight once per step and keeps the FP8 copy, its transpose included,
for the step's other micro-batches; torchao casts it in every forward and again in every
backward (6243040 ``float8_linear.py`` lines 99-108 and 156-182: only a weight that arrives in
FP8, FSDP's float8 all-gather, is not cast).

Under torch.compile torchao's casts are kernels Inductor generates; those that also write a
transposed copy (``x`` and ``g`` to both layouts, the weight's backward copy; rowwise's bf16
transposes) move their bytes at Inductor's measured bandwidth for that pattern
(:data:`FP8_PASS_KERNELS`), the others at the device's streaming bandwidth. Transformer
Engine's ``cast_transpose`` is its own CUDA kernel: no such share.

``per_module``: torchao swaps every ``nn.Linear`` for a ``Float8Linear``, so a model whose
projections are separate modules (torchtitan's Llama: ``wq``, ``wk``, ``wv``; ``w1``, ``w3``)
runs one FP8 GEMM per module (a ``k``/``v`` projection is ``kv_width / t`` columns wide: 128
on Llama 3 70B with TP 8) with its own weight and output-gradient casts; torchtitan#1207
(2025-06-18) found ``attention.wk`` and ``attention.wv`` about 40 % slower under rowwise FP8
than in bf16. The modules' casts of their common input are the same computation on the same
tensor; under torch.compile AOTAutograd's common-subexpression pass (``fx_graph_cse``,
functorch ``config.cse``, on by default) keeps one of them, so a compiled block casts that
input once, an eager one once per module.

References
----------
pytorch/ao 6243040 (2025-06-13) ``torchao/testing/float8/roofline_utils.py``
``get_tensor_memory_traffic_ovhd_s`` (lines 72-205): the cast kernels and bytes above for
``tensorwise`` and ``rowwise``, with ``fuse_with_prev`` for the input and the output gradient
under compilation (``get_float8_mem_sympy``, lines 306-334). The GEMM kernels: module text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ...workloads.trace import Kernel
from .fp8_gathered import te_gathered_passes, torchao_gathered_passes
from .fp8_weights import (TE_QUANTIZED_TENSORS, TE_TENSOR_CREATE_S, fp8_quantize_host_s,
                          fp8_weight_share)

__all__ = ["FP8_RECIPES", "FP8_GEMM_KERNELS", "FP8_PASS_KERNELS", "Fp8Recipe", "fp8_recipe",
           "fp8_cast_kernels", "fp8_gemm_variants", "fp8_rescale_kernels",
           "fp8_gemm_efficiency", "fp8_pass_efficiency", "TE_TENSOR_CREATE_S",
           "TE_QUANTIZED_TENSORS", "fp8_quantize_host_s", "fp8_weight_share"]

#: FP8 GEMM kernel (``Kernel.variant`` of an ``fp8`` GEMM) → its throughput as a fraction of
#: the device's FP8 matmul ceiling. That ceiling is MAMF's (stas00/ml-engineering
#: ``mamf-finder.py``: ``torch._scaled_mm(A, B, scale, scale, out=C)``, per-tensor scales and
#: ``use_fast_accum`` left False), i.e. cuBLASLt with the split accumulator: 1 by definition.
FP8_GEMM_KERNELS: dict[str, float] = {
    "cublas_split": 1.0,
    # cuBLASLt with fast accumulation: no published H100 kernel table of fast vs split
    # accumulation by shape was found (pytorch/ao#1325 and #2377 show theirs as images only),
    # so its gain over the measured ceiling is not modelled
    "cublas_fast": 1.0,
    # PyTorch's CUTLASS row-wise kernel, fast accumulation: "most shapes are within 90-100% of
    # tensor-wise efficiency, but there's a long tail going down to 50%" (pytorch/pytorch#147971,
    # 2025-02-26, H100, after the tile heuristics of #134781): the middle of that range, 0.95
    # (derived from the stated range, not fitted)
    "cutlass_rowwise": 0.95,
}


#: memory-pass kernel (``Kernel.variant`` of a cast pass) → its bandwidth as a fraction of the
#: device's streaming bandwidth. ``inductor_transpose``: a kernel torch.compile generates to
#: write a tensor cast to FP8 and its transposed copy (torchao's casts of ``x``, ``w`` and
#: ``g`` that feed a GEMM in the other layout): "the maximum bandwidth I can achieve with
#: the cast to float8 + transpose of grad_output ... is ~1.4 [TB/s] on an H100, while other
#: float8 overhead kernels top out at ~2.2" (V. Kuznetsov, pytorch/pytorch#133242,
#: 2024-08-12: Inductor reads the input twice and writes the transpose uncoalesced; the
#: kernel pattern of pytorch/pytorch#130015, still open): 1.4 / 2.2 = 0.64 of the streaming
#: bandwidth, which ddlsim's H100 presets put at 2.16 TB/s (0.90 × 2.4) for the others
#: ``inductor_rowwise``: the compiled rowwise recipe's passes over the input and the output
#: gradient (their per-row and per-column amax reductions and casts, which Inductor generates
#: beside the ops before them) and its backward rescales. FITTED, not measured: the one
#: fraction that best reproduces torchao's per-linear table (``LayerNorm → Linear →
#: Sigmoid`` fwd + bwd, compiled, H100: ``benchmarks/data/torchao_fp8_rowwise_linear.csv``)
#: on its 108 shapes with M = 1024, 4096, 16384 (mean |error| 33.5 → 8.0 %); its other 108
#: shapes (M = 2048, 8192, 32768) are held out (30.3 → 8.9 %). Reproduced by
#: ``benchmarks/fit_fp8_rowwise_passes.py``. torchao's own linear-only timings of four Llama
#: 70B shapes (pytorch/ao#2185, no LayerNorm or sigmoid beside the linear) are faster than
#: ddlsim even without it: the cost sits in the neighbouring fusions, which the table has and
#: a torchtitan block has too (RMSNorm before wq/wk/wv and w1/w3). ``_transpose``: the same
#: passes writing the transposed copy, at the transposing share as well.
ROWWISE_PASS_SHARE = 0.39
FP8_PASS_KERNELS: dict[str, float] = {
    "inductor_transpose": 1.4 / 2.2,
    "inductor_rowwise": ROWWISE_PASS_SHARE,
    "inductor_rowwise_transpose": ROWWISE_PASS_SHARE * 1.4 / 2.2,
}


def fp8_pass_efficiency(variant: str) -> float:
    """Fraction of the device's streaming bandwidth a memory pass of kernel ``variant``
    moves its bytes at (:data:`FP8_PASS_KERNELS`; 1 for any other pass)."""
    return FP8_PASS_KERNELS.get(variant, 1.0)


class Fp8Recipe(NamedTuple):
    """One FP8 recipe as run (module docstring)."""

    #: ``passes(M, N, K, backward, compiled)``: the cast passes in launch order, each
    #: ``(tensor, bytes)``, the tensor ``x`` (input), ``w`` (weight) or ``g`` (output
    #: gradient), ``T`` appended where the pass also writes a transposed copy
    passes: Callable[..., tuple[float, ...]]
    #: GEMM kernel (:data:`FP8_GEMM_KERNELS`) of the output, grad_input and grad_weight GEMMs
    gemms: tuple[str, str, str]
    #: backward GEMMs (grad_input, grad_weight) whose output is rescaled by a separate pass
    rescaled: tuple[bool, bool]
    #: each ``nn.Linear`` casts its own input (torchao), not one fused projection
    per_module: bool
    #: its casts are torch ops whose kernels torch.compile generates (torchao), not the
    #: framework's own CUDA kernels (Transformer Engine)
    inductor: bool
    #: per-row/per-column scales: compiled, its input and output-gradient passes and its
    #: rescales run at the ``inductor_rowwise`` share (:data:`FP8_PASS_KERNELS`)
    axiswise: bool = False
    #: a grouped linear quantizes each problem with its own kernels (TE current scaling:
    #: :mod:`.fp8_current`), not all problems in one kernel per pass
    per_problem: bool = False
    #: under sequence parallelism the tensor a linear all-gathers (a column-parallel input, a
    #: row-parallel output gradient) is quantized on the rank's sequence shard and gathered in
    #: FP8 (Transformer Engine, torchao's tensorwise recipe: :func:`fp8_cast_kernels`,
    #: ``gathered``)
    sp_gather: bool = False
    #: ``gathered_passes(passes, tensor, n, shards, backward)``: the recipe's own cast passes
    #: of a tensor gathered in FP8 (:func:`.fp8_gathered.torchao_gathered_passes`); None:
    #: Transformer Engine's (:func:`.fp8_gathered.te_gathered_passes`)
    gathered_passes: Callable[..., tuple] | None = None
    #: the scale of a tensor gathered in FP8 comes from the whole tensor's amax, all-reduced
    #: over the TP group before the gather (:func:`.fp8_current.amax_allreduce`)
    sp_amax_allreduce: bool = False
    #: tensors the framework's C++ quantizer creates on the host per quantized tensor
    #: (Transformer Engine: :data:`TE_QUANTIZED_TENSORS`, :func:`fp8_quantize_host_s`); 0: a
    #: recipe whose casts are torch ops, whose host time is their kernels' launches
    host_tensors: int = 0
    #: the weight's FP8 copy is kept across the micro-batches of an optimizer step, so the
    #: weight is cast once per step (Transformer Engine: :func:`fp8_weight_share`); False:
    #: every forward casts it (torchao)
    weight_cached: bool = False


#: recipe name → :class:`Fp8Recipe`
FP8_RECIPES: dict[str, Fp8Recipe] = {}


def fp8_recipe(name: str, gemms: tuple[str, str, str], rescaled: tuple[bool, bool] = (False,
               False), torchao: bool = False, axiswise: bool = False, sp_gather: bool = False,
               gathered_passes: Callable[..., tuple] | None = None,
               sp_amax_allreduce: bool = False, host_tensors: int = 0,
               weight_cached: bool = False):
    """Decorator: register a recipe's cast passes (the decorated function) under ``name``,
    with its GEMM kernels and rescaled backward outputs; ``torchao``: per-module casting by
    torch ops (``per_module`` and ``inductor``); ``axiswise``: per-row/column scales;
    ``sp_gather``: sequence-parallel gathers in FP8 (``Fp8Recipe.sp_gather``), with the
    recipe's own ``gathered_passes`` where given and ``sp_amax_allreduce``, ``host_tensors``,
    ``weight_cached`` (as there)."""
    def wrap(fn):
        FP8_RECIPES[name] = Fp8Recipe(fn, gemms, rescaled, torchao, torchao, axiswise,
                                      sp_gather=sp_gather, gathered_passes=gathered_passes,
                                      sp_amax_allreduce=sp_amax_allreduce,
                                      host_tensors=host_tensors, weight_cached=weight_cached)
        return fn
    return wrap


@fp8_recipe("te_delayed", ("cublas_fast", "cublas_split", "cublas_split"), sp_gather=True,
            host_tensors=TE_QUANTIZED_TENSORS, weight_cached=True)
def _te_delayed(M, N, K, backward, compiled):
    return (("gT", 4 * M * N),) if backward else (("xT", 4 * M * K), ("w", 3 * K * N))


@fp8_recipe("tensorwise", ("cublas_fast", "cublas_split", "cublas_split"), torchao=True,
            sp_gather=True, gathered_passes=torchao_gathered_passes, sp_amax_allreduce=True)
def _tensorwise(M, N, K, backward, compiled):
    amax = 0 if compiled else 2
    if backward:
        return (("g", amax * M * N), ("gT", 4 * M * N), ("wT", 3 * K * N))
    return (("x", amax * M * K), ("xT", 4 * M * K), ("w", 2 * K * N), ("w", 3 * K * N))


@fp8_recipe("rowwise", ("cutlass_rowwise", "cublas_split", "cublas_split"), (True, True),
            torchao=True, axiswise=True)
def _rowwise(M, N, K, backward, compiled):
    first = 3 if compiled else 5
    if backward:
        return (("gT", first * M * N), ("g", 3 * M * N), ("x", 3 * M * K), ("wT", 4 * K * N),
                ("w", 3 * K * N))
    return (("xT", first * M * K), ("w", 3 * K * N))


def fp8_cast_kernels(recipe: str, M: float, N: float, K: float, backward: bool,
                     compiled: bool = False, input_cast: bool = True,
                     weight_fp8: bool = False, norm_amax: bool = False,
                     gathered: str = "", shards: int = 1,
                     microbatches: int = 1) -> tuple[Kernel, ...]:
    """The memory kernels of ``recipe`` around one FP8 linear ``[M, K] · [K, N]``, forward
    or ``backward`` (module docstring); ``compiled``: torch.compile fuses the first read of
    the input and the output gradient with the op before; ``input_cast`` False: the input's
    passes are left out (another module's cast of the same input serves this one);
    ``weight_fp8``: the weight arrives in FP8 (FSDP's float8 all-gather,
    :mod:`ddlsim.workloads.decoder.fsdp_float8`): no weight pass in the forward
    (``cast_weight_to_float8_t`` returns the gathered ``Float8Tensor`` as it is), and the
    backward's weight pass is the FP8 copy into the other layout (read 1 + write 1 bytes per
    element: torchao eab345c ``float8_ops.py`` ``preprocess_addmm`` line 253,
    ``b_data.t().contiguous().t()``) instead of a cast from bf16; under Transformer Engine
    (``Fp8Recipe.weight_cached``) the weight is an FP8 parameter (Megatron's
    ``--fp8-param-gather``, :mod:`.fp8_weights`): no cast, the forward's weight pass is the
    transpose made after the parameter all-gather (read 1 + write 1 bytes per element, once
    per step: ``microbatches`` spreads it). ``norm_amax``: the input comes from a
    normalisation that computed its amax (TE's ``LayerNormLinear`` under ``te_current``,
    :mod:`.fp8_current`): the input's amax pass (``x.amax``) is left out.

    ``gathered`` (``"x"`` or ``"g"``) and ``shards``: under sequence parallelism the linear
    all-gathers that tensor from ``shards`` sequence shards (a column-parallel input, forward
    and again for the backward's weight gradient; a row-parallel output gradient). A recipe
    with ``Fp8Recipe.sp_gather`` (Transformer Engine) quantizes the rank's shard before the
    gather, row-wise only, and transposes the gathered FP8 tensor where the weight-gradient
    GEMM needs it (TransformerEngine v2.9 ``distributed.py`` ``_all_gather_fp8``: "we cannot
    directly gather the transposed fp8 tensor", ``_create_transpose`` after the gather on
    Hopper; ``layernorm_linear.py`` backward ``update_usage(columnwise_usage=True)`` of the
    re-gathered input; v1.8 ``base.py`` ``grad_output_preprocess``: ``cast_to_fp8``, gather,
    ``fp8_transpose``): the cast (and its amax read) covers ``1/shards`` of the tensor
    (read 2 + write 1 bytes per element), the transpose the whole of it (read 1 + write 1),
    in the backward. torchao's tensorwise recipe under torchtitan's float8 TP: its own
    passes (``Fp8Recipe.gathered_passes``: :func:`.fp8_gathered.torchao_gathered_passes`).
    Other recipes (rowwise: gathered in bf16): no effect.

    ``microbatches``: the forwards of one optimizer step that share the weight's FP8 copy;
    a recipe that keeps it (``Fp8Recipe.weight_cached``) has each forward's weight passes
    carry :func:`fp8_weight_share` of their bytes (one cast per step, spread over its
    micro-batches); 1: the whole cast in this forward.

    Returns
    -------
    tuple of Kernel
        ``memory`` kernels, bytes read + written each.

    Raises
    ------
    KeyError
        for a recipe that is not registered (the software schema allows only registered
        names).
    """
    spec = FP8_RECIPES[recipe]
    passes = spec.passes(M, N, K, backward, compiled)
    if norm_amax:
        passes = tuple(p for p in passes if p[0] != "x.amax")
    if gathered and shards > 1 and spec.sp_gather:
        regather = spec.gathered_passes or te_gathered_passes
        passes = regather(passes, gathered, M * (K if gathered == "x" else N), shards,
                          backward)
    if weight_fp8 and spec.weight_cached:   # TE's FP8 parameters: the gathered weight's
        passes = tuple(("wT", 0 if backward else 2 * K * N) if r[0] == "w" else (r, b)
                       for r, b in passes)   # transpose, once per step (.fp8_weights)
    elif weight_fp8:
        passes = tuple((r, 2 * K * N if backward else 0) if r[0] == "w" else (r, b)
                       for r, b in passes)
    share = fp8_weight_share(recipe, microbatches)
    if share != 1 and not backward:
        passes = tuple((r, b * share) if r[0] == "w" else (r, b) for r, b in passes)
    return tuple(Kernel("memory", bytes=b, dtype="bf16", variant=_pass_kernel(spec, role,
                                                                                compiled))
                 for role, b in passes if b and (input_cast or role[0] != "x"))


def _pass_kernel(spec: Fp8Recipe, role: str, compiled: bool) -> str:
    """The :data:`FP8_PASS_KERNELS` kernel of a cast pass of ``role`` (``x``, ``w``, ``g``,
    ``T`` appended when it writes a transposed copy); ``""``: the streaming bandwidth."""
    if not (compiled and spec.inductor):
        return ""
    transposed = role[-1] == "T"
    if spec.axiswise and role[0] in "xg":
        return "inductor_rowwise_transpose" if transposed else "inductor_rowwise"
    return "inductor_transpose" if transposed else ""


def fp8_gemm_variants(recipe: str, backward: bool) -> tuple[str, ...]:
    """The GEMM kernels (:data:`FP8_GEMM_KERNELS`) of ``recipe``'s forward GEMM, or of its
    two backward GEMMs (grad_input, grad_weight)."""
    gemms = FP8_RECIPES[recipe].gemms
    return gemms[1:] if backward else gemms[:1]


def fp8_rescale_kernels(recipe: str, M: float, N: float, K: float) -> tuple[Kernel, ...]:
    """The passes that rescale ``recipe``'s backward GEMM outputs of one linear
    ``[M, K] · [K, N]`` (grad_input ``M·K``, grad_weight ``K·N`` elements, bf16 read and
    written: 4 bytes each); none for a recipe whose GEMMs apply the scales themselves. An
    axiswise torchao recipe's rescales run at the ``inductor_rowwise`` share
    (:data:`FP8_PASS_KERNELS`), compiled or not: eager, torchao's ``output *=
    post_inverse_scale`` first writes the fp32 outer product of the scales (about 12 bytes per
    element in all, 4 / 0.39 = 10.3 at the share), not modelled apart."""
    spec = FP8_RECIPES[recipe]
    kernel = "inductor_rowwise" if spec.axiswise and spec.inductor else ""
    sizes = (M * K, K * N)
    return tuple(Kernel("memory", bytes=4 * n, dtype="bf16", variant=kernel)
                 for n, on in zip(sizes, spec.rescaled) if on)


def fp8_gemm_efficiency(variant: str) -> float:
    """Fraction of the device's FP8 matmul ceiling an FP8 GEMM of kernel ``variant`` runs at
    (:data:`FP8_GEMM_KERNELS`; 1 for an unnamed variant: the ceiling's own kernel)."""
    return FP8_GEMM_KERNELS.get(variant, 1.0)
