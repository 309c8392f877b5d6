"""The kernels of one dense decoder layer on one tensor-parallel rank (docs/compute.md):
per-GEMM shapes forward and backward, the attention core as ``cfg.software.attention`` runs
it, the element-wise passes fused or not, and FP8's casts.

Shared by the trace builder (:class:`~.builder.StageBuilder` attaches them to its ops) and the
vectorised search tier (which times them per distinct micro-batch size, TP degree and sequence
parallelism), so both time the same kernels.

FP8 (``train.dtype: fp8``, Transformer Engine's recipe, docs.nvidia.com/deeplearning/
transformer-engine, "Using FP8 with Transformer Engine"): only the linear layers' GEMMs run in
FP8; attention, element-wise ops, communication and the weights stay 16-bit (bf16). Delayed
scaling takes each tensor's scale from an amax history, so the overhead is the cast of every
GEMM input: the activation is read in bf16 and written in FP8 together with its transpose
(TE's ``cast_transpose``: 2 + 1 + 1 bytes per element), the weight is read and written once
in FP8 (2 + 1), and in the backward the output gradient is cast the same way (2 + 1 + 1).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ...config import DTYPE_BYTES
from ...software import grad_dtype_bytes
from ...simulator.kernels.attention import FLASH_KINDS, attention_kernels
from ...simulator.kernels.autograd import input_grad_sum_kernels
from ...simulator.kernels.dtensor import keeps_gathered_input, sp_layout_copies
from ...simulator.kernels.elementwise import (layer_elementwise_kernels, loss_bytes,
                                                 loss_kernels, norm_kernels)
from ...simulator.kernels.elementwise_backward import (layer_elementwise_backward_kernels,
                                                          norm_backward_kernels)
from ...simulator.kernels.fp8recipe import (FP8_RECIPES, fp8_cast_kernels, fp8_gemm_variants,
                                               fp8_rescale_kernels)
from ...simulator.kernels.gemm import gemm_kernels_backward
from ...simulator.kernels.repeat_kv import expands_kv, repeat_kv_kernels
from ..trace import Compute, Kernel
from .fp8linear import fp8_sp_gather, weights_in_fp8
from .wgrad import into_main_grad, main_grad_bytes

__all__ = ["layer_kernels", "MODULE_PARTS", "compute_dtype", "grad_bytes", "linear_gemms",
           "activation_kinds", "logits_kernels", "loss_op", "final_norm_fused", "final_norm_op",
           "recompute_op", "qkv_bias_kernels"]


def compute_dtype(train_dtype: str) -> str:
    """The dtype of everything but the linear GEMMs: bf16 under FP8, else the training dtype."""
    return "bf16" if train_dtype == "fp8" else train_dtype


def grad_bytes(cfg: Any) -> int:
    """Bytes per gradient element of the run: the stack's ``grad_reduce_dtype`` applied to its
    parameters' dtype (:func:`compute_dtype`; fp32 main grads for bf16 under Megatron)."""
    return grad_dtype_bytes(cfg.software.grad_reduce_dtype, compute_dtype(cfg.train.dtype))


def activation_kinds(cfg: Any, recompute: str | None = None, shape: Any = None
                     ) -> dict[str, bool]:
    """Keywords of :meth:`DecoderShape.layer_activation_bytes` the run's stack and dtype set:
    ``flash`` (FlashAttention keeps no ``s²`` tensor), ``fp8`` (1-byte GEMM inputs),
    ``gathered_input`` (sequence-parallel linears keep their gathered inputs:
    :func:`~ddlsim.simulator.kernels.dtensor.keeps_gathered_input` under ``recompute``) and
    ``repeat_kv`` (the core saves K and V repeated to the query heads:
    :func:`~ddlsim.simulator.kernels.repeat_kv.expands_kv` of the run's model).

    Parameters
    ----------
    cfg : RunConfig
        the validated run config (its ``software`` and ``train``).
    recompute : str, optional
        the ``train.recompute`` whose layers the keywords describe (the search tier asks per
        plan); default the run's.
    shape : DecoderShape, optional
        the run's model's ``cfg.model.shape()``, where the caller has it (a model's shape is
        built anew on every call); default built here.

    Returns
    -------
    dict of str to bool
        ``flash``, ``fp8``, ``gathered_input`` and ``repeat_kv``.
    """
    return {"flash": cfg.software.attention in FLASH_KINDS,
            "fp8": cfg.train.dtype == "fp8",
            "gathered_input": keeps_gathered_input(cfg.software,
                                                   recompute or cfg.train.recompute),
            "repeat_kv": expands_kv(cfg.software,
                                    cfg.model.shape() if shape is None else shape),
            "moe_output_kept": bool(cfg.software.moe_saves_expert_output)}


def linear_gemms(shape: Any, M: float, t: int, per_module: bool = False, sp: bool = False
                 ) -> dict[str, tuple[float, float, float]]:
    """``(M, N, K)`` of the layer's four linear GEMMs on one of ``t`` Megatron 1-D ranks:
    ``qkv`` and ``fc1`` split by columns, ``proj`` and ``fc2`` by rows. MLA: ``qkv`` is the
    tuple of its four projections (:func:`.variants.mla_linear_gemms`; ``sp``: its replicated
    down projections on the rank's ``M/t`` tokens). ``per_module``: the
    projections as separate modules (torchtitan's ``wq``, ``wk``, ``wv``; ``w1``, ``w3``),
    ``qkv`` and a gated ``fc1`` then tuples of their modules' GEMMs (an FP8 recipe that
    casts per module, :mod:`~ddlsim.simulator.kernels.fp8recipe`)."""
    if shape.mla is not None:
        from .variants import mla_linear_gemms
        return mla_linear_gemms(shape, M, t, sp)
    h = shape.hidden
    q, kv, f = shape.q_width / t, shape.kv_width / t, shape.ffn / t
    if per_module:
        return {"qkv": ((M, q, h), (M, kv, h), (M, kv, h)), "proj": (M, h, q),
                "fc1": ((M, f, h),) * (shape.mlp_matrices - 1), "fc2": (M, h, f)}
    return {"qkv": (M, q + 2 * kv, h), "proj": (M, h, q),
            "fc1": (M, (shape.mlp_matrices - 1) * f, h), "fc2": (M, h, f)}


def _linear(shape3: tuple, dtype: str, backward: bool, recipe: str = "te_delayed",
            compiled: bool = False, shared_input: bool = False,
            input_cast: bool = True, weight_fp8: bool = False,
            norm_amax: bool = False, gathered: str = "",
            shards: int = 1, main_grad: int = 0, microbatches: int = 1) -> tuple[Kernel, ...]:
    """Kernels of one linear ``(M, N, K)``, or of a tuple of them in a row; ``shared_input``:
    the tuple's modules read one input, which a compiled block casts to FP8 once
    (:mod:`~ddlsim.simulator.kernels.fp8recipe`, ``per_module``); ``weight_fp8``: FSDP
    gathered the weights in FP8 (:mod:`.fsdp_float8`); ``norm_amax``: the input's amax comes
    from the normalisation before it (TE's ``LayerNormLinear``, :mod:`~ddlsim.simulator.
    kernels.fp8_current`); ``gathered``, ``shards``: the tensor (``x`` or ``g``) gathered
    over ``shards`` sequence shards under SP, which Transformer Engine quantizes per shard
    (:func:`~ddlsim.simulator.kernels.fp8recipe.fp8_cast_kernels`); ``main_grad``: bytes per
    element of the buffer the weight gradient accumulates into (:mod:`.wgrad`; 0: none);
    ``microbatches``: forwards per optimizer step, over which Transformer Engine's one weight
    cast is spread (:func:`~ddlsim.simulator.kernels.fp8recipe.fp8_weight_share`)."""
    if isinstance(shape3[0], tuple):   # several GEMMs in a row (MLA's, per-module projections)
        # the input gathered in FP8 is cast once, before its gather (torchao's
        # PrepareFloat8ModuleInput: fp8_gathered.torchao_gathered_passes), eager or compiled
        once = shared_input and (compiled or (gathered == "x" and not backward))
        return sum((_linear(x, dtype, backward, recipe, compiled, input_cast=not (once and i),
                            weight_fp8=weight_fp8, norm_amax=norm_amax, gathered=gathered,
                            shards=shards, main_grad=main_grad, microbatches=microbatches)
                    for i, x in enumerate(shape3)), ())
    M, N, K = shape3
    shapes = gemm_kernels_backward(M, N, K) if backward else ((M, N, K),)
    if dtype != "fp8":
        out = tuple(Kernel("gemm", g, dtype=dtype) for g in shapes)
        return into_main_grad(out, main_grad) if backward else out
    # the stack's FP8 recipe as run (simulator/kernels/fp8recipe.py): its scaling and cast
    # passes, its GEMM kernels, and the passes rescaling its backward outputs
    out = tuple(Kernel("gemm", g, dtype=dtype, variant=v)
                for g, v in zip(shapes, fp8_gemm_variants(recipe, backward)))
    out = into_main_grad(out, main_grad) if backward else out
    rescale = fp8_rescale_kernels(recipe, M, N, K) if backward else ()
    return fp8_cast_kernels(recipe, M, N, K, backward, compiled, input_cast,
                            weight_fp8, norm_amax, gathered, shards, microbatches) + out + rescale


#: The GEMM ops of a dense layer split by the module whose parameters each part uses, in
#: execution order: op name → ((part key of :func:`layer_kernels`, module), …); modules index
#: :meth:`~ddlsim.workloads.models.decoder.DecoderShape.layer_modules` (1 QKV, 2 output
#: projection, 4 first MLP GEMM, 5 second).
MODULE_PARTS = {
    "attn": (("attn.qkv", 1), ("attn.proj", 2)),
    "mlp": (("mlp.fc1", 4), ("mlp.fc2", 5)),
    "bwd.mlp": (("bwd.mlp.fc2", 5), ("bwd.mlp.fc1", 4)),
    "bwd.attn": (("bwd.attn.proj", 2), ("bwd.attn.qkv", 1)),
}


@lru_cache(maxsize=512)
def layer_kernels(shape: Any, sw: Any, b: int, s: int, t: int, sp: bool,
                  train_dtype: str, regather: bool = True,
                  microbatches: int = 1) -> dict[str, tuple[Kernel, ...]]:
    """Kernels of one dense layer on one TP rank: ``attn`` (qkv, core, proj), ``mlp``
    (fc1, fc2), ``ew`` (element-wise), their backwards ``bwd.attn``, ``bwd.mlp``, ``bwd.ew``
    (:func:`~ddlsim.simulator.kernels.elementwise_backward.layer_elementwise_backward_kernels`),
    ``recompute`` (what selective recomputation redoes: the attention core's forward,
    Korthikanti et al. 2022 §5, with K/V's repeat where the stack repeats them),
    ``repeat_kv`` (that repeat's kernels, :mod:`~ddlsim.simulator.kernels.repeat_kv`; also
    in ``attn.qkv`` before the core) and ``bwd.repeat_kv`` (the sums of their gradients, also
    in ``bwd.attn.proj`` after the core's backward), and the GEMM ops' parts by module
    (``attn.qkv``, ``attn.proj``, ``mlp.fc1``, …, ``bwd.attn.qkv``: :data:`MODULE_PARTS`);
    ``regather``: the backward gathers the linears' sequence-parallel inputs again
    (:func:`~ddlsim.simulator.kernels.dtensor.regathers_input`); ``microbatches``: forwards
    per optimizer step (Transformer Engine's weight casts, one per step:
    :func:`~ddlsim.simulator.kernels.fp8recipe.fp8_weight_share`)."""
    gd = train_dtype                      # linear GEMMs (fp8 under FP8)
    od = compute_dtype(train_dtype)       # attention and element-wise
    dt = DTYPE_BYTES[od]
    separate = bool(sw.separate_projections)     # torchtitan's wq/wk/wv, w1/w3 (autograd.py)
    per_module = separate or (gd == "fp8" and FP8_RECIPES[sw.fp8_recipe].per_module)
    g = linear_gemms(shape, b * s, t, per_module, sp)
    core = [attention_kernels(sw.attention, b, shape.heads / t, s, shape.d, dt, shape.dropout,
                              bwd, od, kv_heads=shape.g / t, window=shape.sliding_window,
                              window_share=shape.window_share, softmax_fp32=sw.softmax_in_fp32,
                              softmax_dispatch=sw.softmax_dispatch, sinks=shape.attention_sinks)
            for bwd in (False, True)]
    ew = layer_elementwise_kernels(shape, b, s, t, sp, dt, sw, od)
    # K and V repeated to the query heads before the core, their gradients summed after it
    rep = rep_bwd = ()
    if expands_kv(sw, shape):
        rep, rep_bwd = (repeat_kv_kernels(b * s, shape.heads / t, shape.g / t, shape.d, dt,
                                          od, bool(sw.compile), backward)
                        for backward in (False, True))
    mg = main_grad_bytes(sw, train_dtype)     # weight gradients into main_grad (.wgrad)
    fp8_gather = fp8_sp_gather(sw, gd, t, sp, shape)

    # each op's kernels by the module whose parameters they use (ZeRO-3's module hooks,
    # .zero3): the attention core runs between the QKV and output projections' hooks
    def lin(shape3, backward, norm_fed=False, gathered=""):
        return _linear(shape3, gd, backward, sw.fp8_recipe, bool(sw.compile), per_module,
                       weight_fp8=weights_in_fp8(sw), norm_amax=norm_fed,
                       gathered=gathered if fp8_gather else "", shards=t, main_grad=mg,
                       microbatches=microbatches)

    # the sums of the input gradients of separate projections reading one input
    summed = [len(g[m]) if separate and shape.mla is None and isinstance(g[m][0], tuple)
              else 1 for m in ("qkv", "fc1")]
    sums = [input_grad_sum_kernels(n, b * s * shape.hidden, dt, od, bool(sw.compile))
            for n in summed]
    bias = qkv_bias_kernels(shape, sw, b * s, t, dt, od)
    parts = {
        # qkv and fc1 follow a norm (Megatron-Core's TELayerNormColumnParallelLinear); under
        # SP their inputs, and proj's and fc2's output gradients, are all-gathered (in FP8
        # under Transformer Engine: fp8recipe.fp8_cast_kernels)
        "attn.qkv": lin(g["qkv"], False, True, "x") + bias[0] + rep + core[0],
        "attn.proj": lin(g["proj"], False),
        "mlp.fc1": lin(g["fc1"], False, True, "x"),
        "mlp.fc2": lin(g["fc2"], False),
        "bwd.mlp.fc2": lin(g["fc2"], True, gathered="g"),
        "bwd.mlp.fc1": lin(g["fc1"], True, gathered="x") + sums[1],
        "bwd.attn.proj": lin(g["proj"], True, gathered="g") + core[1] + rep_bwd,
        "bwd.attn.qkv": bias[1] + lin(g["qkv"], True, gathered="x") + sums[0],
    }
    # DTensor's layout copies around the sequence-parallel collectives (kernels/dtensor.py)
    copies = sp_layout_copies(sw, t, sp, b * s * shape.hidden, dt, od, fp8_gather,
                              {"bwd.attn.qkv": summed[0] > 1, "bwd.mlp.fc1": summed[1] > 1},
                              regather, gd == "fp8")
    for part, (before, after) in copies.items():
        parts[part] = before + parts[part] + after
    return {
        "attn": parts["attn.qkv"] + parts["attn.proj"],
        "mlp": parts["mlp.fc1"] + parts["mlp.fc2"],
        "ew": ew,
        "bwd.mlp": parts["bwd.mlp.fc2"] + parts["bwd.mlp.fc1"],
        "bwd.attn": parts["bwd.attn.proj"] + parts["bwd.attn.qkv"],
        "bwd.ew": layer_elementwise_backward_kernels(shape, b, s, t, sp, dt, sw, od),
        "recompute": rep + core[0],
        "repeat_kv": rep,
        "bwd.repeat_kv": rep_bwd,
        **parts,
    }


def qkv_bias_kernels(shape: Any, sw: Any, tokens: float, t: int, dt: int, dtype: str
                     ) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """The QKV projection's bias as passes of their own, where the stack adds it apart from
    the GEMM (``sw.qkv_bias_pass``; numpy's ``qkv += b`` and ``dqkv.sum(axis=0)``,
    ddlsim/reference/gpt2.py), over its ``tokens × (q + 2·kv)/t`` output on one of ``t``
    ranks: forward the add (read, write), backward the gradient's sum over the tokens (read;
    the ``(q + 2·kv)/t`` sums written are not counted). ``((), ())`` otherwise: in the
    GEMM's epilogue, or no bias."""
    if not (sw.qkv_bias_pass and shape.qkv_bias) or shape.mla is not None:
        return (), ()
    n = tokens * (shape.q_width + 2 * shape.kv_width) / t
    return ((Kernel("memory", bytes=2 * dt * n, dtype=dtype),),
            (Kernel("memory", bytes=dt * n, dtype=dtype),))


@lru_cache(maxsize=1024, typed=True)
def logits_kernels(tokens: float, vocab_local: float, hidden: float, dtype: str,
                   backward: bool, main_grad: int = 0) -> tuple[Kernel, ...]:
    """The output head's GEMM ``[tokens, h]·[h, V/t]`` (16-bit: Megatron's output layer is
    not a Transformer Engine module), or its two backward GEMMs, the weight gradient
    accumulating into a ``main_grad`` of ``main_grad`` bytes per element (:mod:`.wgrad`;
    Megatron's ``ColumnParallelLinear`` under ``gradient_accumulation_fusion``; 0: none).
    Memoised (typed: an int and a float argument stay apart), like :func:`loss_op`: the
    search builds the head of every plan signature, and plans of one micro-batch size and TP
    degree share it."""
    g = (tokens, vocab_local, hidden)
    if not backward:
        return (Kernel("gemm", g, dtype=dtype),)
    return into_main_grad(tuple(Kernel("gemm", x, dtype=dtype)
                                for x in gemm_kernels_backward(*g)), main_grad)


@lru_cache(maxsize=1024, typed=True)
def loss_op(tokens: float, vocab_local: float, dt: int, dtype: str, fused: bool,
            backward: bool) -> Compute:
    """The vocab-parallel cross-entropy over ``tokens × vocab_local`` logits, forward
    (``loss``) or backward (``bwd.loss``): its memory passes (:func:`.loss_bytes`), one
    kernel each (:func:`.loss_kernels`: their launches count, their class)."""
    kernels = loss_kernels(tokens * vocab_local, dt, fused, backward, dtype)
    return Compute("bwd.loss" if backward else "loss", 0.0,
                   loss_bytes(tokens, vocab_local, dt, fused, backward), kind="elementwise",
                   dtype=dtype, kernels=kernels)


def final_norm_fused(sw: Any) -> bool:
    """Whether the final norm runs as one fused kernel: as the layers' norms
    (``fused_layernorm``), except where only ``compile: true`` fuses those: torchtitan
    compiles each ``TransformerBlock`` (9dec370 ``parallelize_llama.py`` ``apply_compile``),
    not the model's final norm, which stays eager (:data:`~ddlsim.software.COMPILE_FUSIONS`;
    a ``fused_layernorm`` the config sets itself holds for both)."""
    inductor = sw.compile and not sw.sources["fused_layernorm"].startswith("system.software")
    return bool(sw.fused_layernorm) and not inductor


@lru_cache(maxsize=1024, typed=True)
def final_norm_op(shape: Any, sw: Any, b: int, s: float, t: int, sp: bool, dt: int,
                  dtype: str, backward: bool) -> Compute:
    """The final norm before the output head (Megatron-Core ``TransformerBlock.
    final_layernorm``, torchtitan ``Transformer.norm``, HF ``model.norm``), forward
    (``final_norm``) or backward (``bwd.final_norm``): the kernels of a layer's input norm
    on the same ``b·s`` tokens (``s`` the rank's sequence length; ``/t`` under sequence
    parallelism) and stack (:func:`~ddlsim.simulator.kernels.elementwise.norm_kernels`,
    :func:`final_norm_fused`), the backward as a layer's norm's
    (:func:`~ddlsim.simulator.kernels.elementwise_backward.norm_backward_kernels`). Memoised
    like :func:`loss_op`."""
    make = norm_backward_kernels if backward else norm_kernels
    k = make(shape, b, s, t, sp, dt, sw, dtype, fused=final_norm_fused(sw))
    return Compute("bwd.final_norm" if backward else "final_norm", 0.0,
                   sum(x.bytes for x in k), kind="elementwise", dtype=dtype, kernels=k)


def recompute_op(shape: Any, kernels: dict, core_flops: float, b: int, s: int, t: int,
                 dt: int, dtype: str) -> Compute:
    """Selective recomputation's op: the attention core's forward again (QKᵀ, softmax, dropout,
    PV; with FlashAttention its forward kernel, as Megatron-Core still checkpoints core
    attention), the same kernels in an MoE layer as in a dense one (its attention is the
    same module)."""
    k = kernels["recompute"]
    flops = sum(x.flops for x in k if x.kind == "flash") or core_flops
    return Compute("recompute.attn_core", flops, sum(x.bytes for x in k), dtype=dtype, kernels=k)
