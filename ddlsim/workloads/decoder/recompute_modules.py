"""Megatron-Core's selective recomputation by module (``train.recompute_modules``).

``--recompute-granularity selective --recompute-modules …`` (NVIDIA/Megatron-LM d7288711,
2026-04-09, the commit Megatron-Bridge v0.4.0 pins; ``megatron/core/transformer/
transformer_config.py`` lines 483-497 list the choices, lines 1360-1378 check them): each named
submodule of a transformer layer is checkpointed, its activations freed after the forward and
rebuilt in the backward. Two kinds of checkpoint (the config's docstring):

* **output-discarding** (``tensor_parallel.CheckpointWithoutOutput``: ``moe_act``,
  ``layernorm``, ``mla_up_proj``): the module's *output* is freed once the next module has
  read it, and the module is run again from its saved input just before the backward needs it;
* **normal** (``tensor_parallel.checkpoint``: ``core_attn``, ``mlp``, ``moe``,
  ``shared_experts``): only the module's input is kept; its whole forward runs again in the
  backward.

What each registered module frees per layer and rank (in the terms of
:meth:`~ddlsim.workloads.models.decoder_traffic.DecoderTraffic.layer_activation_bytes`, 16-bit,
``sb`` tokens of the micro-batch, ``t`` the TP size, replicated tensors ``/t`` only with
sequence parallelism) and what its backward runs again:

==============  =================================================  ==============================
module          frees                                              runs again
==============  =================================================  ==============================
core_attn       the attention core's ``s²`` tensors (Korthikanti   the core's forward (as
                et al. 2022 §5: ``train.recompute: selective``)    ``selective`` always has)
layernorm       each norm's output that is a module of its own:    each such norm's forward
                ``2sbh`` (the pre-MLP norm of an MoE layer; the
                input norm only when the stack does not fuse it
                into the QKV GEMM, ``kernels.fused_layernorm``)
moe_act         the routed experts' activation output, fc2's       the experts' activation
                input: ``2sb·k·f_e/t`` (FP8: the 1-byte copy fc2   (SwiGLU/GeLU) forward
                would keep; fc2 saves the original instead)
mlp             a dense layer's MLP input and intermediates:       fc1, the activation, fc2
                ``2sbh`` + ``(4|6)·sb·f/t``                        (TP 1 only, below)
shared_experts  the shared experts' intermediates                  their fc1, activation, fc2
                ``(4|6)·sb·n_s·f_s/t``                             (TP 1 only, below)
moe             the MoE block's tensors but its input           the MoE block's forward, its
                (:meth:`~ddlsim.workloads.models.decoder_traffic.  dispatch and combine
                DecoderTraffic.moe_block_bytes`: the dispatched    collectives included, as
                copies (and outputs), router logits, the experts'  ops before the layer's
                and shared experts' intermediates; ``moe_act``,    backward (:func:`moe_block_ops`)
                ``shared_experts`` inside it add nothing)
mla_up_proj     MLA's query, key and value after the up            q_up, kv_up, RoPE, the query
                projections: ``2sb·(2·a(d_n+d_r) + a·d_v)/t``      and key concatenations (TP 1)
==============  =================================================  ==============================

Sources, d7288711: ``transformer_layer.py`` lines 404-473 (``layernorm``: only a norm that is
not ``IdentityOp``; ``gpt_layer_specs.py`` lines 286-330 make the TE layer's input norm part of
``linear_qkv``, TELayerNormColumnParallelLinear, and give a separate pre-MLP norm to MoE layers
only; ``mlp``: dense layers only, line 472), lines 580-634 and 716-866 (the norms'
CheckpointWithoutOutput), 781-800 (the MLP's checkpoint); ``attention.py`` lines 328-331 and
1143 (``core_attn``); ``moe/experts.py`` lines 230-234 and 379-390 (``moe_act`` in
TEGroupedMLP; config lines 1380-1383: grouped GEMM only); ``moe/moe_layer.py`` lines 230-232
and 450-465 (``shared_experts``), 599-620 (``moe``; lines 234-237: under FP8 ``moe_act``
sets ``set_save_original_input`` on fc2, whose 16-bit input the checkpoint then discards);
``multi_latent_attention.py`` lines
134-138 and 856-870 (``mla_up_proj``: the up projections, RoPE and the query/key
concatenations; config lines 1385-1389: MLA only). Not modelled: ``mlp``, ``shared_experts``
and ``mla_up_proj`` under tensor parallelism (their recomputed forward re-runs TP
collectives, which a one-op recomputation cannot carry), ``moe`` under the combined 1F1B,
``mlp`` and ``mla_up_proj`` under context parallelism: such a plan is refused with that
reason (:func:`.recompute_checks.check_modules`). Under context parallelism (Megatron 1-D;
Megatron-Core checks nothing of CP for these modules) a rank rebuilds its ``s/cp`` tokens: an
MoE layer's modules as above, a dense layer's (built by the 1-D partitioner) its separate
norms (:func:`cp_norms_op`) and its attention core as ``selective`` under CP.

The freed bytes come off the layer's activations in the memory model (:func:`layer_bytes`);
the backward's extra work is one op of the modules' kernels (:func:`recompute_op`), the same
op in the analytical and the event-driven engine and in the search's exact tier. The short
copy of a module's rebuilt output, live only during its layer's backward, is not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...simulator.kernels.elementwise import (activation_fused, activation_passes,
                                              norm_kernels)
from ...simulator.kernels.rotary import rope_bytes, rope_classes
from ..trace import Compute, Kernel

__all__ = ["RecomputeModule", "RECOMPUTE_MODULES", "recompute_module", "module_names",
           "layer_bytes", "recompute_op", "moe_block_ops", "moe_extra_ops",
           "separate_norms", "cp_norms_op"]


@dataclass(frozen=True)
class RecomputeModule:
    """One of Megatron-Core's ``--recompute-modules``: which layers it applies to
    (``dense``, ``moe`` or ``any``), ``freed(shape, ctx)`` the activation bytes it frees per
    layer and rank (``ctx``: a :class:`LayerContext`), and ``kernels(builder, ctx)`` what its
    backward runs again (``moe``: none, its ops are :func:`moe_block_ops`)."""

    name: str
    layers: str
    freed: Callable[[Any, "LayerContext"], float]
    kernels: Callable[[Any, "LayerContext"], tuple[Kernel, ...]]


@dataclass(frozen=True)
class LayerContext:
    """One layer on one rank as the modules read it: ``b`` sequences of ``s`` tokens, TP
    size ``t``, sequence parallelism ``sp``, a MoE layer or not, FP8 GEMM inputs, and the
    norms that are modules of their own (:func:`separate_norms`)."""

    b: int
    s: int
    t: int
    sp: bool
    moe: bool
    fp8: bool
    norms: int
    dt: int = 2
    moe_output_kept: bool = True


#: Megatron-Core's recompute modules, by the name users give (:func:`recompute_module`)
RECOMPUTE_MODULES: dict[str, RecomputeModule] = {}


def recompute_module(name: str, layers: str, kernels):
    """Decorator: register ``freed(shape, ctx)`` as the module ``name``."""
    def wrap(freed):
        RECOMPUTE_MODULES[name] = RecomputeModule(name, layers, freed, kernels)
        return freed
    return wrap


def module_names() -> tuple[str, ...]:
    """The names ``train.recompute_modules`` accepts (Megatron-Core's choices at d7288711)."""
    return tuple(RECOMPUTE_MODULES)


def separate_norms(shape: Any, sw: Any, moe: bool) -> int:
    """Norms of a layer that are modules of their own, which ``layernorm`` recomputes: the
    input norm unless the stack fuses it into the QKV GEMM (``fused_layernorm``, TE's
    LayerNormColumnParallelLinear) or the model has MLA (its input norm is a TENorm), and
    the pre-MLP norm in an MoE layer (the router reads it) or when not fused."""
    fused = bool(sw.fused_layernorm)
    return int(not fused or shape.mla is not None) + int(moe or not fused)


def _replicated(ctx: LayerContext) -> int:
    return ctx.t if ctx.sp else 1


def _core_kernels(b: Any, ctx: LayerContext) -> tuple[Kernel, ...]:
    return tuple(b.kernels["recompute"])


def _norm_kernels(b: Any, ctx: LayerContext) -> tuple[Kernel, ...]:
    return norm_kernels(b.shape, ctx.b, ctx.s, ctx.t, ctx.sp, ctx.dt, b.sw, b.dtype) * ctx.norms


def _act_kernels(b: Any, ctx: LayerContext) -> tuple[Kernel, ...]:
    """The routed experts' activation forward, as the MoE layer's ``experts.act`` op moves
    it (:meth:`.moe.MoEOps._expert_compute`)."""
    from .moe_activation import expert_activation_kernels
    return expert_activation_kernels(b.shape, b.local_experts * b.expert_tokens()
                                     * b.shape.f_e / b.etp, ctx.dt, b.dtype, False)


def _activation(b: Any, ctx: LayerContext, y: float, cls: str = "") -> tuple[Kernel, ...]:
    """The MLP activation's kernels over ``y`` elements, each of class ``cls``."""
    sh = b.shape
    return tuple(Kernel("memory", bytes=p * y, dtype=b.dtype, variant=cls) for p in
                 activation_passes(sh.gated_mlp, sh.mlp_bias, activation_fused(sh, b.sw),
                                   ctx.dt, sh.squared_relu))


def _mlp_kernels(b: Any, ctx: LayerContext) -> tuple[Kernel, ...]:
    sh, sw = b.shape, b.sw
    y = ctx.b * ctx.s * sh.ffn / ctx.t
    cls = "gated" if sh.gated_mlp and sw.fused_bias_gelu and not sw.compile else ""
    return tuple(b.kernels["mlp.fc1"]) + _activation(b, ctx, y, cls) + tuple(b.kernels["mlp.fc2"])


def _shared_kernels(b: Any, ctx: LayerContext) -> tuple[Kernel, ...]:
    sh = b.shape
    ops = [c for c in b._shared("recompute", False) if isinstance(c, Compute)]
    y = ctx.b * ctx.s * sh.shared_experts * sh.f_s / ctx.t
    return tuple(ops[0].kernels) + _activation(b, ctx, y) + tuple(ops[1].kernels)


def _per_token(shape: Any) -> int:
    """MLP bytes kept per token and intermediate column (16-bit): gate ‖ up and the down
    projection's input (6), or the GeLU input and output (4)."""
    return 6 if shape.gated_mlp else 4


@recompute_module("core_attn", "any", _core_kernels)
def _core_attn(shape: Any, ctx: LayerContext) -> float:
    """Taken by the selective formula itself (its ``s²`` term): nothing more here."""
    return 0.0


@recompute_module("layernorm", "any", _norm_kernels)
def _layernorm(shape: Any, ctx: LayerContext) -> float:
    # a dense layer's norm output under FP8 is the GEMM's 1-byte input (decoder_traffic)
    per = 1 if ctx.fp8 and not ctx.moe else ctx.dt
    return ctx.norms * per * ctx.b * ctx.s * shape.hidden / _replicated(ctx)


@recompute_module("moe_act", "moe", _act_kernels)
def _moe_act(shape: Any, ctx: LayerContext) -> float:
    per = 1 if ctx.fp8 else ctx.dt     # what fc2 keeps of its input without moe_act
    return per * ctx.b * ctx.s * shape.top_k * shape.f_e / ctx.t


@recompute_module("mlp", "dense", _mlp_kernels)
def _mlp(shape: Any, ctx: LayerContext) -> float:
    sb = ctx.b * ctx.s
    inputs = (1 if ctx.fp8 else ctx.dt) * sb * shape.hidden / _replicated(ctx)
    inner = _per_token(shape) * sb * shape.ffn - (sb * shape.ffn if ctx.fp8 else 0.0)
    return inputs + inner / ctx.t


@recompute_module("shared_experts", "moe", _shared_kernels)
def _shared_experts(shape: Any, ctx: LayerContext) -> float:
    return _per_token(shape) * ctx.b * ctx.s * shape.shared_experts * shape.f_s / ctx.t


def _no_kernels(b: Any, ctx: LayerContext) -> tuple[Kernel, ...]:
    """``moe``'s recomputation is ops of their own (:func:`moe_block_ops`), not kernels."""
    return ()


@recompute_module("moe", "moe", _no_kernels)
def _moe(shape: Any, ctx: LayerContext) -> float:
    """The MoE block's tensors (its input, the pre-MLP norm's output, is the checkpoint's):
    :meth:`~ddlsim.workloads.models.decoder_traffic.DecoderTraffic.moe_block_bytes`."""
    return shape.moe_block_bytes(ctx.b, ctx.s, ctx.t, ctx.sp, fp8=ctx.fp8,
                                 moe_output_kept=ctx.moe_output_kept)


def _mla_kernels(b: Any, ctx: LayerContext) -> tuple[Kernel, ...]:
    """MLA's up projections (``q_up``, ``kv_up``), RoPE on the rotary query and key parts (the
    forward's kernels, :func:`~ddlsim.simulator.kernels.rotary.rope_bytes` and
    :func:`~ddlsim.simulator.kernels.rotary.rope_classes`: the stack's fused or unfused
    form on q_pe and the shared k_pe) and the two concatenations into query and key
    (d7288711 multi_latent_attention.py ``qkv_up_proj_and_rope_apply``)."""
    from .layerkernels import _linear
    sh, sw, m = b.shape, b.sw, b.shape.mla
    M = ctx.b * ctx.s
    g = m.gemms(M, sh.hidden, sh.heads, ctx.t)
    gemms = sum((_linear(g[name], b.plan.train_dtype, False, sw.fp8_recipe, bool(sw.compile))
                 for name in ("q_up", "kv_up")), ())
    classes = rope_classes(bool(sw.fused_rope), sw.rope_form, ctx.dt) * 2   # q_pe, k_pe
    rope = tuple(Kernel("memory", bytes=v, dtype=b.dtype, variant=c) for v, c in
                 zip(rope_bytes(sh, ctx.b, ctx.s, ctx.t, ctx.dt, sw), classes))
    copies = 2 * M * sh.heads / ctx.t * m.qk_head_dim                  # query and key cat
    return gemms + rope + (Kernel("memory", bytes=2 * copies * ctx.dt, dtype=b.dtype),)


@recompute_module("mla_up_proj", "any", _mla_kernels)
def _mla_up_proj(shape: Any, ctx: LayerContext) -> float:
    """The up projections' outputs after RoPE, the attention core's inputs: query and key
    ``a·(d_n + d_r)`` wide, value ``a·d_v`` (``q_width``, ``q_width``, ``kv_width``)."""
    return ctx.dt * ctx.b * ctx.s * (2 * shape.q_width + shape.kv_width) / ctx.t


def layer_bytes(shape: Any, modules: tuple[str, ...], sw: Any, b: int, s: int, t: int,
                sp: bool, moe: bool, **kinds: bool) -> float:
    """Activation bytes one layer keeps for its backward on one TP rank when ``modules``
    are recomputed (module docstring): the layer's bytes without recomputation (or with the
    attention core's, ``core_attn``) less what each other module frees.

    Parameters
    ----------
    shape : DecoderShape
        The model's closed-form counts.
    modules : tuple of str
        ``train.recompute_modules``.
    sw : Software
        The resolved stack (its ``fused_layernorm``).
    b, s, t : int
        Sequences per micro-batch, tokens per sequence on the rank, TP size.
    sp : bool
        Sequence parallelism.
    moe : bool
        An MoE layer (else a dense one).
    **kinds : bool
        :func:`.layerkernels.activation_kinds` (``flash``, ``fp8``, ``gathered_input``,
        ``repeat_kv``, ``moe_output_kept``).

    Returns
    -------
    float
        Bytes.
    """
    base = "selective" if "core_attn" in modules else "none"
    kept = shape.layer_activation_bytes(b, s, t, sp, base, moe=moe, **kinds)
    ctx = LayerContext(b, s, t, sp, moe, bool(kinds.get("fp8")), separate_norms(shape, sw, moe),
                       moe_output_kept=kinds.get("moe_output_kept", True))
    return kept - sum(_applied(name, moe, modules) and RECOMPUTE_MODULES[name].freed(shape, ctx)
                      for name in modules)


#: modules that run inside ``moe``'s checkpoint: recomputing the MoE block covers them
INSIDE_MOE = ("moe_act", "shared_experts")


def _applied(name: str, moe: bool, modules: tuple[str, ...] = ()) -> bool:
    layers = RECOMPUTE_MODULES[name].layers
    if moe and name in INSIDE_MOE and "moe" in modules:
        return False
    return layers == "any" or (layers == "moe") == moe


def moe_block_ops(b: Any) -> list:
    """``moe``'s recomputation in an MoE layer's backward: the MoE block's forward again
    (router, permutation, dispatch, experts, combine, shared experts: Megatron-Core's
    ``tensor_parallel.checkpoint`` of MoELayer.forward, d7288711 ``moe/moe_layer.py`` lines
    599-620), as ops named ``recompute.*`` (:meth:`.moe.MoEOps._moe_block`), before the
    layer's backward; none without ``moe`` in ``plan.recompute_modules``."""
    if "moe" not in (b.plan.recompute_modules or ()):
        return []
    from .partition.base import OpList
    ops = OpList()
    b._moe_block(ops, "recompute", False)
    return ops.ops


def recompute_op(b: Any, g: dict, moe: bool) -> Compute:
    """The backward's recomputation of builder ``b``'s layer under ``plan.recompute_modules``:
    one op of the modules' kernels in Megatron's order (norms, attention core, MLP parts).
    With ``core_attn`` in an MoE layer the op is the attention core's as ``selective`` builds
    it (:func:`.layerkernels.recompute_op`, bit for bit), and the other modules' kernels are
    their own op (:func:`moe_extra_ops`); ``["core_attn"]`` alone is that op on any layer."""
    modules = b.plan.recompute_modules
    if modules == ("core_attn",) or (moe and "core_attn" in modules):
        return b._plain_recompute_core(g, moe)
    return _kernels_op(b, modules, moe)


def _kernels_op(b: Any, modules: tuple[str, ...], moe: bool) -> Compute:
    """One op of the kernels of ``modules`` on builder ``b``'s layer (an MoE layer or not),
    over the rank's ``s/cp`` tokens (context parallelism: :func:`cp_modules_op`)."""
    ctx = LayerContext(b.b, b.s // b.cp, b.tp, b.sp, moe, b.plan.train_dtype == "fp8",
                       separate_norms(b.shape, b.sw, moe), b.dt)
    order = ("layernorm", "mla_up_proj", "core_attn", "mlp", "shared_experts", "moe_act")
    kernels = tuple(k for name in order if name in modules and _applied(name, moe, modules)
                    for k in RECOMPUTE_MODULES[name].kernels(b, ctx))
    flops = sum(k.flops if k.kind == "flash" else 2.0 * k.shape[0] * k.shape[1] * k.shape[2]
                * k.batch if k.kind == "gemm" else 0.0 for k in kernels)
    nbytes = sum(k.bytes for k in kernels if k.kind == "memory")
    if not kernels:   # e.g. moe_act alone on a dense layer of an MoE model
        return Compute("recompute.modules", 0.0, 0.0, kind="elementwise", dtype=b.dtype,
                       seconds=0.0)
    return Compute("recompute.modules", flops, nbytes, dtype=b.dtype, kernels=kernels)


def moe_extra_ops(b: Any) -> list:
    """Ops an MoE layer's backward opens with under ``plan.recompute_modules``: the MoE
    block's forward again with ``moe`` (:func:`moe_block_ops`), then
    :func:`beside_core_attn`'s."""
    from ..trace import Op
    return moe_block_ops(b) + [Op(x) for x in beside_core_attn(b)]


def beside_core_attn(b: Any) -> list:
    """What an MoE layer recomputes beyond the op :func:`recompute_op` gives it: beside
    ``core_attn`` (whose op is ``selective``'s), one op of the other modules' kernels; and
    the modules' TP collectives (:mod:`.recompute_comms`). The combined 1F1B's attention
    node carries them too (:mod:`.combined_nodes`)."""
    from .recompute_comms import module_collectives
    modules = b.plan.recompute_modules or ()
    rest = tuple(m for m in modules if m != "core_attn")
    out: list = []
    if "core_attn" in modules and any(_applied(m, True, modules) and m != "moe" for m in rest):
        out.append(_kernels_op(b, rest, True))
    return out + module_collectives(b, True)


def cp_norms_op(part: Any) -> Compute | None:
    """``layernorm``'s recomputation in a dense layer that the 1-D partitioner ``part``
    builds under context parallelism (:meth:`.partition.base.LayerPartitioner.
    layer_backward`): each norm that is a module of its own run again over the rank's
    ``s/cp`` tokens, the kernels :func:`_kernels_op` gives a layer without CP; None when
    ``layernorm`` is not recomputed or the layer has no such norm (the attention core is
    the partitioner's op; ``mlp`` and ``mla_up_proj`` are refused under CP,
    :func:`.recompute_checks.check_modules`)."""
    norms = separate_norms(part.shape, part.sw, False)
    if "layernorm" not in (part.plan.recompute_modules or ()) or not norms:
        return None
    t, sp = part.ew_split()
    kernels = norm_kernels(part.shape, part.b, part.s // part.cp, t, sp, part.dt, part.sw,
                           part.dtype) * norms
    return Compute("recompute.modules", 0.0, sum(k.bytes for k in kernels), dtype=part.dtype,
                   kernels=kernels)
