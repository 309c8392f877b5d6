"""Element-wise ops as memory passes: each kernel reads and writes its tensors once, at the
device's achieved memory bandwidth (:mod:`.device`). Fused or not per the software stack
(``cfg.software``, ddlsim/data/software.yaml); one pass = one read or one write of a tensor.

Forward passes per dense layer, ``x`` = the ``b·s·h`` hidden states (``/t`` with sequence
parallelism), ``y`` = the ``b·s·f/t`` MLP activations, ``q``/``k`` the rotary inputs:

=====================  ==============================  ==========================================
op                     fused (one kernel)              unfused (its torch op sequence)
=====================  ==============================  ==========================================
LayerNorm (×2)         read x, write x: 2              statistics (read), normalise (read, write),
                                                       affine (read, write): 5
RMSNorm (×2)           read x, write x: 2              torch's composite RMSNorm in fp32 (below):
                                                       8 kernels, 36 bytes per element (bf16)
bias-dropout-add       read x and the residual, write  bias add 2 (with a bias), dropout 2 + 1-byte
 (×2 per layer)        the sum, 1-byte mask: 3 (+mask)  mask, residual add 3: up to 7 (+mask)
bias-GeLU / SwiGLU     read y (gate and up), write y:  bias add 2 (with a bias) + GeLU 2; SwiGLU:
                       2 (GeLU) / 3 (SwiGLU)           SiLU 2 + multiply 3: 4 / 5
squared ReLU           read y, write y: 2              bias add 2 (with a bias), ``relu`` 2,
 (``relu2``)                                           ``pow(·, 2)`` 2: 4 / 6
RoPE on q, then on k   read, write: 2                  rotate_half: ·cos 2, rotate-half (negate 1,
                                                       concatenate 2), ·sin 2, add 3: 10; complex
                                                       (torchtitan): upcast, complex multiply in
                                                       fp32, cast back: 3 kernels, 2 + 16/d;
                                                       real_matrix (fms): upcast, broadcast
                                                       multiply by 2 × 2 matrices, sum over the
                                                       pair, cast back: 4 kernels, 2 + 32/d
=====================  ==============================  ==========================================

The unfused RMSNorm is the composite torch runs in eager mode, torchtitan's
``RMSNorm._norm(x.float()).type_as(x) * weight`` (pytorch/torchtitan 9dec370
``torchtitan/models/norms.py`` line 97) and ``torch.rms_norm``'s composite path, which
``nn.RMSNorm`` takes before its fused CUDA kernel (pytorch/pytorch
``aten/src/ATen/native/layer_norm.cpp`` ``rms_norm``: ``input.to(opmath)``, ``pow(2)``,
``mean``, ``add_(eps)``, ``rsqrt``, ``mul``, ``type_as``, ``mul_(weight)``; the fused kernel
came with pytorch/pytorch#153666, 2025-05): bytes per element of ``x``, ``d`` the 16-bit
dtype's size: the upcast ``d + 4``, ``pow`` 8, ``mean`` 4, the two per-row kernels on the
row statistics (``4·2/h``), the normalising ``mul`` 8, the cast back ``4 + d``, the weight
``2d``: ``36`` bytes in bf16 where a fused kernel moves 4 (:func:`norm_passes`). The rotary
embedding's passes, widths and classes are in :mod:`.rotary`.

The backward of a fused kernel, and of an unfused norm, is taken as twice its forward traffic
(it reads the saved inputs and the incoming gradient and writes the outgoing one:
:func:`backward_kernels`); a fused norm's backward is its library's kernels and the unfused
ops' backwards are torch's autograd formulas (:mod:`.elementwise_backward`). Every decoder
layer takes these functions: the dense builder, the partition template, an MoE layer's non-MLP
ops (:meth:`~ddlsim.workloads.decoder.moe.MoEOps._attn_elementwise`) and MLA's recomputed
RoPE (:mod:`~ddlsim.workloads.decoder.recompute_modules`). Softmax, mask and dropout over the ``s²`` scores belong to
the attention core (:mod:`.attention`).

**Kernel classes.** Most of these kernels stream contiguous tensors and run at the device's
streaming bandwidth (``memory_efficiency``). Two kinds measure slower in published kernel
tables, and carry a class (``Kernel.variant``, :data:`ELEMENTWISE_CLASSES`) whose achieved
fraction of the datasheet bandwidth a device may give (``device.elementwise_efficiency``,
fitted to those tables by ``benchmarks/kernel_breakdown.py --fit``; docs/compute.md): torch's
own norm kernels, Megatron-Core's fused SwiGLU, which reads the two halves of fc1's
output as strided views, and the unfused cross-entropy's torch kernels (:func:`loss_kernels`).
The H200 measured more on itself (``dgx-h200``, docs/compute.md "The H200's measured
classes"): torch's fused norm kernels (:func:`fused_norm_class`) and torchtitan's complex
RoPE's upcast and complex multiply (:func:`.rotary.rope_classes`). A device without a class's figure
runs it at its streaming bandwidth.
"""

from __future__ import annotations

from typing import Any

from ...workloads.trace import Kernel
from .step_passes import (loss_bytes, loss_kernels, loss_passes,  # noqa: F401 (callers
                          optimizer_bytes_per_param)                # import them from here)
from .rotary import rope_bytes, rope_classes
from .softmax import unfused_softmax_passes  # noqa: F401 (callers import it from here)

__all__ = ["ELEMENTWISE_CLASSES", "layer_elementwise_kernels", "norm_kernels", "residual_bytes",
           "backward_kernels", "activation_fused", "activation_classes", "norm_passes",
           "activation_passes", "fused_norm_class", "qk_norm_kernels", "layer_elementwise_parts",
           "optimizer_bytes_per_param",
           "loss_bytes", "loss_passes", "loss_kernels", "unfused_softmax_passes"]

#: the element-wise kernel classes a device may time at their own achieved bandwidth
#: (``device.elementwise_efficiency``), class -> the kernels it names; a backward class is
#: the backward of the forward class before it (:func:`backward_kernels`)
ELEMENTWISE_CLASSES = {
    "norm": "torch's own norm kernels (a stack without a fused norm: the composite RMSNorm's "
            "8 kernels, an unfused LayerNorm's 3), forward",
    "norm_backward": "their backward",
    "gated": "Megatron-Core's fused SwiGLU (bias_swiglu_impl, a jit_fuser kernel on the two "
             "halves of fc1's output), forward",
    "gated_backward": "its backward",
    "activation": "a GeLU that is not gated, fused with its bias or not (the unfused sequence's "
                  "bias add stays a plain pass), not compiled, forward",
    "activation_backward": "its backward",
    "optimizer": "the optimizer step (optimizer_bytes_per_param's bytes, one roofline op)",
    "softmax": "the non-flash attention core's softmax over the s² scores (fused_softmax's one "
               "kernel, or the unfused scale, mask and softmax passes; dropout is not in it), "
               "forward (attention.attention_kernels)",
    "softmax_backward": "its backward",
    "loss": "the unfused vocab-parallel cross-entropy's torch kernels (Megatron's "
            "vocab_parallel_cross_entropy: cast, max, sub_, exp, sum, div_ over the fp32 "
            "logits; loss_passes), forward",
    "loss_backward": "their backward (mul_ by the loss gradient, the cast back)",
    "chunk_cat": "FSDP2's torch._chunk_cat of a unit's gradients into the reduce-scatter input, "
                 "cast to the reduce dtype (workloads/decoder/fsdp2_passes.py)",
    "fsdp_copy_in": "FSDP2's copy of a unit's shards into the all-gather input, cast to the "
                    "param dtype (foreach_all_gather: _foreach_copy_ in all_gather_copy_in; "
                    "workloads/decoder/fsdp2_passes.py)",
    "fsdp_copy_out": "FSDP2's copy of the all-gather output into the unsharded parameters "
                     "(foreach_all_gather_copy_out: split_with_sizes_copy; at one rank "
                     "wait_for_unshard's tensor.copy_; workloads/decoder/fsdp2_passes.py)",
    "batchnorm": "cuDNN's persistent NHWC batch norm (CUDNN_BATCHNORM_SPATIAL_PERSISTENT, which "
                 "PyTorch trains channels-last tensors in), forward (workloads/resnet/kernels.py)",
    "batchnorm_backward": "its backward",
    "maxpool": "PyTorch's NHWC max pooling (max_pool_forward_nhwc), forward "
               "(workloads/resnet/kernels.py)",
    "maxpool_backward": "its backward's gather (max_pool_backward_nhwc)",
    "batchnorm_nchw": "cuDNN's batch norm of contiguous (NCHW) tensors "
                      "(CUDNN_BATCHNORM_SPATIAL: bn_fw_tr_1C11_kernel_NCHW and its singleread "
                      "form), forward (workloads/resnet/kernels.py)",
    "batchnorm_nchw_backward": "its backward (bn_bw_1C11_kernel_new, singleread)",
    "maxpool_nchw": "PyTorch's NCHW max pooling (max_pool_forward_nchw), forward "
                    "(workloads/resnet/kernels.py)",
    "maxpool_nchw_backward": "its backward's scatter (max_pool_backward_nchw)",
    "fused_rmsnorm": "a fused RMSNorm of a two-kernel library (software.fused_norm_backward "
                     "two_kernels, not compiled: torch's fused rms_norm kernel, apex's), "
                     "forward (fused_norm_class)",
    "fused_rmsnorm_backward": "its backward's two kernels (input gradient, then the weight's)",
    "fused_layernorm": "a fused LayerNorm of a two-kernel library (torch's layer_norm kernel, "
                       "apex's), forward",
    "fused_layernorm_backward": "its backward's two kernels",
    "rope_upcast": "the complex and real-matrix rotary embeddings' bf16 -> fp32 copy "
                   "(xq.float(); in the backward the cast back's gradient), torch's "
                   "non-vectorised unrolled_elementwise_kernel (rope_classes)",
    "rope_complex_mul": "the complex form's multiply by the broadcast freqs_cis (forward and "
                        "backward), torch's strided elementwise_kernel",
    "repeat_kv": "K's and V's repeat to the query heads before the attention core, not "
                 "compiled: torchtitan's expand + reshape, a broadcast copy (torch's strided "
                 "direct_copy_kernel_cuda), forward (repeat_kv.repeat_kv_kernels)",
    "index_add": "the unfused MoE permutation's backward: torch's index_add_ of the routed "
                 "copies' gradients into their tokens' rows (index_select's backward; "
                 "Megatron-Core moe_utils.permute without fusion; workloads/decoder/moe.py)",
    "repeat_kv_backward": "its backward: the expand's gradient summed over the repeats "
                          "(sum_to_size, torch's reduce_kernel), read a heads, write g",
}
_BACKWARD_CLASS = {"norm": "norm_backward", "gated": "gated_backward",
                   "activation": "activation_backward", "loss": "loss_backward",
                   "fused_rmsnorm": "fused_rmsnorm_backward",
                   "fused_layernorm": "fused_layernorm_backward"}


def fused_norm_class(sw: Any, norm: str, backward: bool = False) -> str:
    """The class of a fused norm's kernels (:data:`ELEMENTWISE_CLASSES`): ``fused_rmsnorm``
    or ``fused_layernorm`` (their ``_backward`` classes for the backward) where the stack's
    fused norm is a two-kernel library's (``sw.fused_norm_backward == "two_kernels"``:
    torch's fused kernels, apex's) and not Inductor's (``sw.compile``); none for
    TransformerEngine's and Inductor's kernels, which no device has measured apart.

    Parameters
    ----------
    sw : SoftwareStack
        the resolved stack (its ``fused_norm_backward`` and ``compile``).
    norm : {"layernorm", "rmsnorm"}
        the model's norm.
    backward : bool
        the backward's class.

    Returns
    -------
    str
        the class, or ``""``.
    """
    if sw.fused_norm_backward != "two_kernels" or sw.compile:
        return ""
    return f"fused_{norm}_backward" if backward else f"fused_{norm}"


def norm_passes(fused: bool, norm: str, dtype_bytes: float, hidden: float) -> list[float]:
    """Bytes per element of the normalised tensor moved by each kernel of one norm (the
    module docstring): one fused kernel (read, write); an unfused ``layernorm`` as
    statistics, normalise, affine; an unfused ``rmsnorm`` as torch's composite in fp32
    (upcast, ``pow``, ``mean``, ``add_(eps)`` and ``rsqrt`` on the ``1/hidden`` row
    statistics, ``mul``, cast back, ``mul_(weight)``).

    Parameters
    ----------
    fused : bool
        the stack's ``fused_layernorm``.
    norm : {"layernorm", "rmsnorm"}
        the model's norm.
    dtype_bytes : float
        bytes per element of the activations (B).
    hidden : float
        elements per normalised row (the hidden size).

    Returns
    -------
    list of float
        bytes per element, one entry per kernel.

    References
    ----------
    pytorch/torchtitan 9dec370 ``torchtitan/models/norms.py`` line 97; pytorch/pytorch
    ``aten/src/ATen/native/layer_norm.cpp`` (``rms_norm``, its composite path).
    """
    d = dtype_bytes
    if fused:
        return [2 * d]
    if norm != "rmsnorm":
        return [d, 2 * d, 2 * d]
    up = [d + 4, 8.0] if d < 4 else [8.0]            # the upcast is a no-op in fp32
    down = [4 + d] if d < 4 else []
    row = 2 * 4 / hidden                             # add_(eps), rsqrt on the row means
    return up + [4.0, row, row, 8.0] + down + [2 * d]


def activation_passes(gated: bool, bias: bool, fused: bool, dtype_bytes: float,
                      squared_relu: bool = False) -> list[float]:
    """Bytes per element of the MLP activation ``y`` moved by each kernel of the activation
    (the module docstring's table): SwiGLU (``gated``) fused read gate and up, write ``y``,
    or SiLU then multiply; GeLU fused (or without a bias) read, write, or bias add then
    GeLU; squared ReLU (``squared_relu``) its bias add (a separate kernel whenever there is
    a bias: Megatron fuses a bias only into GeLU and SwiGLU, ``mlp.py`` raising "Only support
    fusion of gelu and swiglu" otherwise), then one fused kernel or ``relu`` and ``pow``.

    Parameters
    ----------
    gated : bool
        a gated MLP (SwiGLU).
    bias : bool
        the first MLP GEMM has a bias.
    fused : bool
        the activation runs as one kernel (:func:`activation_fused`: the stack's
        ``fused_bias_gelu``, or for squared ReLU its ``fused_squared_relu`` or compilation).
    dtype_bytes : float
        bytes per element (B).
    squared_relu : bool
        the non-linearity is squared ReLU (an ungated MLP).

    Returns
    -------
    list of float
        bytes per element of ``y``, one entry per kernel.
    """
    d = dtype_bytes
    if squared_relu:
        return ([2 * d] if bias else []) + ([2 * d] if fused else [2 * d, 2 * d])
    if gated:
        return [3 * d] if fused else [2 * d, 3 * d]
    return [2 * d] if fused or not bias else [2 * d, 2 * d]


def activation_fused(shape: Any, sw: Any) -> bool:
    """Whether the MLP's non-linearity runs as one kernel: squared ReLU under the stack's
    ``fused_squared_relu`` (Megatron's ``@jit_fuser`` function; ``compile: true`` sets it,
    :data:`ddlsim.software.COMPILE_FUSIONS`), the others under its ``fused_bias_gelu``."""
    if shape.squared_relu:
        return bool(sw.fused_squared_relu)
    return bool(sw.fused_bias_gelu)


def activation_classes(gated: bool, fused: bool, compiled: bool, n: int,
                       squared_relu: bool = False) -> list[str]:
    """The class of each of the ``n`` kernels :func:`activation_passes` gives
    (:data:`ELEMENTWISE_CLASSES`): Megatron's fused SwiGLU, which reads fc1's halves,
    ``gated``; a GeLU kernel ``activation`` (its unfused bias add, first, none); torch.compile's
    generated kernels (Inductor's two contiguous outputs), an unfused SwiGLU and squared
    ReLU's kernels (contiguous streams, no measured class) none."""
    if compiled or squared_relu:
        return [""] * n
    if gated:
        return ["gated" if fused else ""] * n
    return [""] * (n - 1) + ["activation"]


def qk_norm_kernels(shape: Any, b: float, s: float, t: int, dtype_bytes: float, sw: Any,
                    dtype: str = "bf16") -> tuple[Kernel, ...]:
    """The forward kernels of the RMSNorm of every query and key head (``shape.qk_norm``:
    Qwen3's ``q_norm`` and ``k_norm`` over the head size ``d``, before the rotary embedding;
    huggingface/transformers ``models/qwen3/modeling_qwen3.py`` ``Qwen3Attention.forward``)
    on one of ``t`` ranks, q's then k's: :func:`norm_passes` over the ``b·s·q_width/t`` and
    ``b·s·kv_width/t`` elements in rows of ``d``, fused or not as the layers' norms
    (``sw.fused_layernorm``), of their class; none without ``qk_norm``."""
    if not shape.qk_norm:
        return ()
    fused = bool(sw.fused_layernorm)
    cls = fused_norm_class(sw, "rmsnorm") if fused else "norm"
    return tuple(Kernel("memory", bytes=p * b * s * w / t, dtype=dtype, variant=cls)
                 for w in (shape.q_width, shape.kv_width)
                 for p in norm_passes(fused, "rmsnorm", dtype_bytes, shape.d))


def layer_elementwise_kernels(shape: Any, b: float, s: float, t: int, sp: bool,
                              dtype_bytes: float, sw: Any, dtype: str = "bf16"
                              ) -> tuple[Kernel, ...]:
    """The forward element-wise kernels of one dense layer on one tensor-parallel rank
    (``shape``: a :class:`~ddlsim.workloads.models.decoder.DecoderShape`; ``sw``: the resolved
    software stack, read for its ``fused_*`` fields): one kernel per fused op, or one per torch
    op of the unfused sequence (the table above), so each pays its launch (:mod:`.host`).
    torch's norm kernels carry the class ``norm``, a fused SwiGLU not compiled (Megatron-Core's
    jit_fuser kernel) ``gated``, a GeLU ``activation`` (:func:`activation_classes`,
    :data:`ELEMENTWISE_CLASSES`); torch.compile's generated kernels (``sw.compile``, which
    fuses the norm and the activation) none. The kernels of :func:`layer_elementwise_parts`
    in its order."""
    return sum(layer_elementwise_parts(shape, b, s, t, sp, dtype_bytes, sw, dtype).values(), ())


def layer_elementwise_parts(shape: Any, b: float, s: float, t: int, sp: bool,
                            dtype_bytes: float, sw: Any, dtype: str = "bf16"
                            ) -> dict[str, tuple[Kernel, ...]]:
    """:func:`layer_elementwise_kernels`' kernels (same arguments) by op: ``norm`` (the input
    and pre-MLP norms, then the query and key heads' norms where the model has them,
    :func:`qk_norm_kernels`), ``residual`` (the two residual connections), ``activation``,
    ``rope`` (empty without rotary positions; its kernels' classes :func:`.rotary.rope_classes`), in
    that order."""
    dt = dtype_bytes
    y = b * s * shape.ffn / t
    residual = residual_bytes(shape, b * s * shape.hidden / (t if sp else 1), dt, sw) * 2
    fused = activation_fused(shape, sw)
    act = activation_passes(shape.gated_mlp, shape.mlp_bias, fused, dt, shape.squared_relu)
    classes = activation_classes(shape.gated_mlp, fused, sw.compile, len(act),
                                 shape.squared_relu)
    rope = rope_classes(bool(sw.fused_rope), sw.rope_form, dt) * 2       # q's, then k's
    parts = {"residual": [(v, "") for v in residual],
             "activation": [(p * y, c) for p, c in zip(act, classes)],
             "rope": list(zip(rope_bytes(shape, b, s, t, dt, sw), rope))}
    norms = (norm_kernels(shape, b, s, t, sp, dt, sw, dtype) * 2      # input and pre-MLP norms
             + qk_norm_kernels(shape, b, s, t, dt, sw, dtype))
    return {"norm": norms, **{name: tuple(Kernel("memory", bytes=v, dtype=dtype, variant=c)
                                          for v, c in out if v) for name, out in parts.items()}}


def residual_bytes(shape: Any, x: float, dtype_bytes: float, sw: Any) -> list[float]:
    """Bytes of the kernels of one residual connection of a layer over ``x`` hidden-state
    elements on one rank (its bias add and dropout before the add, when the model has them;
    one fused kernel under ``sw.fused_bias_dropout_add``), in order; the layer has two
    (:func:`layer_elementwise_kernels`), and the second is the last op of its forward
    (:mod:`ddlsim.workloads.decoder.early_stop`).

    Parameters
    ----------
    shape : DecoderShape
        the model (its biases and dropout).
    x : float
        elements of the hidden states on the rank (``b·s·h``, ``/t`` under SP).
    dtype_bytes : float
        bytes per element (B).
    sw : Software
        the resolved stack (its ``fused_bias_dropout_add``).

    Returns
    -------
    list of float
        bytes (B), one entry per kernel.
    """
    dt = dtype_bytes
    mask = x if shape.dropout else 0.0                       # 1-byte dropout mask
    if sw.fused_bias_dropout_add:
        return [3 * x * dt + mask]
    residual = [2 * x * dt] if shape.out_bias or shape.mlp_bias else []
    residual += [2 * x * dt + mask] if shape.dropout else []
    return residual + [3 * x * dt]


def norm_kernels(shape: Any, b: float, s: float, t: int, sp: bool, dtype_bytes: float,
                 sw: Any, dtype: str = "bf16", fused: bool | None = None
                 ) -> tuple[Kernel, ...]:
    """The forward kernels of one of the decoder's norms over a micro-batch's hidden states
    on one tensor-parallel rank (a layer's input or pre-MLP norm, or the final norm before
    the output head): :func:`norm_passes` over the ``b·s·h`` elements (``/t`` with sequence
    parallelism), fused into one kernel (``sw.fused_layernorm``, of the class
    :func:`fused_norm_class` gives) or torch's own kernels, of class ``norm``.

    Parameters
    ----------
    shape : DecoderShape
        the model (its ``hidden`` size and ``norm``).
    b, s : float
        micro-batch size (sequences) and the rank's sequence length (tokens).
    t : int
        tensor-parallel degree.
    sp : bool
        sequence parallelism (the norm's input split over ``t``).
    dtype_bytes : float
        bytes per activation element (B).
    sw : SoftwareStack
        the resolved stack (its ``fused_layernorm``).
    dtype : str
        the kernels' dtype.
    fused : bool, optional
        whether this norm runs fused; default the stack's ``fused_layernorm``.

    Returns
    -------
    tuple of Kernel
        one memory kernel per pass, bytes in B.
    """
    fused = bool(sw.fused_layernorm) if fused is None else fused
    x = b * s * shape.hidden / (t if sp else 1)
    cls = fused_norm_class(sw, shape.norm) if fused else "norm"
    return tuple(Kernel("memory", bytes=p * x, dtype=dtype, variant=cls)
                 for p in norm_passes(fused, shape.norm, dtype_bytes, shape.hidden))


def backward_kernels(forward: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
    """The backward of element-wise ``forward`` kernels: each twice its forward traffic (the
    module docstring), in its class's backward class (``norm`` -> ``norm_backward``, ``gated``
    -> ``gated_backward``; an unclassed kernel stays unclassed).

    Parameters
    ----------
    forward : tuple of Kernel
        memory kernels, as :func:`layer_elementwise_kernels` gives them.

    Returns
    -------
    tuple of Kernel
        one memory kernel per forward kernel, bytes doubled.
    """
    return tuple(Kernel("memory", bytes=2 * k.bytes, dtype=k.dtype,
                        variant=_BACKWARD_CLASS.get(k.variant, k.variant)) for k in forward)
