"""The backward kernels of a dense layer's element-wise ops
(:func:`layer_elementwise_backward_kernels`: the backward of
:func:`.elementwise.layer_elementwise_kernels`' forward, on the same tensors).

A fused kernel's backward, and an unfused norm's, is taken as twice its forward traffic (it
reads the saved inputs and the incoming gradient and writes the outgoing one:
:func:`~.elementwise.backward_kernels`). A fused norm's backward is its library's kernels
(``software.fused_norm_backward``, :data:`FUSED_NORM_BACKWARD`): the input gradient reads the
output gradient and the input and writes its own (3d), and the weight's (and bias's) gradient,
a sum over the tokens, either rides in the same pass (TransformerEngine) or reads both again
in a kernel of its own (2d: torch's fused norms, apex's, Inductor's). The unfused ops' backwards are torch's autograd
formulas (pytorch/pytorch ``tools/autograd/derivatives.yaml``), one kernel each, per element
of the op's tensor (``d`` bytes):

=====================  ==================================================================
op                     backward kernels
=====================  ==================================================================
residual add           ``add.Tensor``: the gradient passes through to both inputs (no
                       kernel); the residual stream feeds the add and the branch, so its two
                       gradients are summed (``torch/csrc/autograd/input_buffer.cpp``
                       ``InputBuffer::add``: read 2, write 1): 3d; dropout's
                       ``native_dropout_backward(grad, mask, scale)`` 2d + mask; a bias's
                       gradient, the output gradient summed over the tokens: d
SiLU, multiply         ``mul.Tensor``: ``grad * other`` and ``grad * self``, 3d each;
 (SwiGLU)              ``silu_backward(grad, self)``: 3d (in a backward without
                       ``create_graph``, GradMode off)
GeLU                   ``gelu_backward(grad, self)``: 3d; a bias's gradient: d
squared ReLU           ``pow``'s ``pow_backward(grad, self, 2)``, ``grad * (2 *
 (``relu2``)           self.pow(1))``: the copy ``pow(·, 1)`` 2d, the scalar multiply 2d,
                       the product 3d; ``relu``'s ``threshold_backward(grad, result, 0)``
                       3d; a bias's gradient d. One kernel fused (Megatron's ``@jit_fuser``
                       function, torch.compile): Inductor's backward reads the gradient and
                       the saved input and writes the input's gradient, 3d
RoPE                   a linear map of q and k with constant coefficients: its backward
                       runs the transposed map over the gradient, the forward's passes
                       again (torchtitan's complex form: the upcast, the multiply by
                       ``conj(freqs_cis)`` after a ``conj`` kernel over the frequencies, the
                       cast back, per tensor; fms's real-matrix form: the upcast, ``mul``
                       by the real matrices (``MulBackward0``: ``grad * other.conj()``, a
                       no-op conj on a real tensor) over the broadcast ``[…, 2, 2]``
                       shape, then its sum over the input's broadcast dimension (torch
                       2.13's profiler on CPU: ``aten::mul`` over ``[…, 2, 2]`` and
                       ``aten::sum`` under each ``MulBackward0``), the cast back, per
                       tensor: the forward's bytes, 2d + 32;
                       TransformerEngine's fused kernel, ``fused_rope.cu``
                       ``fused_rope_block_backward``: read the output gradient, write the
                       input's: 2d)
=====================  ==================================================================

Measured (PyTorch 2.11, one H200: the Kineto trace of
``benchmarks/data/device_h200_2026-11-30/run1/llama``, ``benchmarks/kineto_vs_ddlsim.py``): per
layer of Llama 3.1 8B at 8192 tokens one
``silu_backward_kernel`` and two ``mul`` kernels over the 8192 × 14336 activation, one ``add``
per residual connection (launched under ``FusedRmsNormBackward0``, whose input gradient it sums
with the residual's), the rotary embedding's three kernels per tensor again (a bf16 →
fp32 copy, the complex ``mul``, the fp32 → bf16 copy) and a ``conj`` of the frequencies before
each ``mul``, and two kernels per fused RMSNorm (``layer_norm_grad_input_kernel_vectorized``,
``GammaBetaBackwardCUDAKernelTemplate``).
"""

from __future__ import annotations

from typing import Any

from ...workloads.trace import Kernel
from .elementwise import (_BACKWARD_CLASS, activation_classes, activation_fused,
                          activation_passes, backward_kernels, fused_norm_class, norm_kernels,
                          qk_norm_kernels, residual_bytes)
from .rotary import rope_bytes, rope_classes

__all__ = ["layer_elementwise_backward_kernels", "layer_elementwise_backward_parts",
           "residual_backward_bytes", "activation_backward_passes", "norm_backward_kernels",
           "qk_norm_backward_kernels", "rope_backward_bytes", "rope_backward_classes",
           "FUSED_NORM_BACKWARD"]

#: ``software.fused_norm_backward`` -> the kernels of a fused norm's backward, bytes per
#: element of the normalised tensor in units of its element size ``d``, in launch order
FUSED_NORM_BACKWARD = {
    # TransformerEngine 076b995 transformer_engine/common/normalization/rmsnorm/
    # rmsnorm_bwd_semi_cuda_kernel.cu launch_rmsnorm_bwd_tuned_: rmsnorm_bwd_tuned_kernel
    # reads dz and x, writes dx and per-CTA partial sums of dgamma (ctas_per_col x cols
    # fp32), which rmsnorm_bwd_finalize_tuned_kernel reduces (that small kernel not counted);
    # LayerNorm's ln_bwd the same
    "one_kernel": (3,),
    # pytorch/pytorch 0005c53 aten/src/ATen/native/cuda/layer_norm_kernel.cu
    # LayerNormBackwardKernelImplInternal: layer_norm_grad_input_kernel(_vectorized) reads dY,
    # X (and gamma), writes dX; GammaBetaBackward*CUDAKernel reads dY and X again for dgamma
    # (dbeta); the H200 trace (benchmarks/data/device_h200_2026-11-30/run1/llama, torch 2.11):
    # layer_norm_grad_input_kernel_vectorized and GammaBetaBackwardCUDAKernelTemplate, 17 of
    # each for 17 FusedRmsNormBackward0. NVIDIA/apex 4b0ee25 csrc/layer_norm_cuda_kernel.cu
    # HostLayerNormGradient: cuComputePartGradGammaBeta (reads dout, input), cuComputeGradGammaBeta
    # on its 16 partial rows (not counted), cuComputeGradInput (reads dout, input, writes
    # grad_input); Inductor's generated backward: a reduction over each row for dx and one
    # over the tokens for dgamma, two kernels
    "two_kernels": (3, 2),
}


def layer_elementwise_backward_kernels(shape: Any, b: float, s: float, t: int, sp: bool,
                                       dtype_bytes: float, sw: Any, dtype: str = "bf16"
                                       ) -> tuple[Kernel, ...]:
    """The backward kernels of :func:`~.elementwise.layer_elementwise_kernels`' ops (same
    arguments), one per kernel autograd launches (the module docstring's table): the two
    norms' (:func:`~.elementwise.backward_kernels`), each residual connection's
    (:func:`residual_backward_bytes`), the activation's (:func:`activation_backward_passes`)
    and the rotary embedding's (its forward bytes again, :func:`~.rotary.rope_bytes`).

    Parameters
    ----------
    shape : DecoderShape
        the model.
    b, s : float
        micro-batch size (sequences) and the rank's sequence length (tokens).
    t : int
        tensor-parallel degree.
    sp : bool
        sequence parallelism (the norms' and residuals' tensors split over ``t``).
    dtype_bytes : float
        bytes per activation element (B).
    sw : SoftwareStack
        the resolved stack (its ``fused_*`` fields and ``compile``).
    dtype : str
        the kernels' dtype.

    Returns
    -------
    tuple of Kernel
        memory kernels, bytes in B, with their classes' backward classes.
    """
    parts = layer_elementwise_backward_parts(shape, b, s, t, sp, dtype_bytes, sw, dtype)
    return sum(parts.values(), ())


def layer_elementwise_backward_parts(shape: Any, b: float, s: float, t: int, sp: bool,
                                     dtype_bytes: float, sw: Any, dtype: str = "bf16"
                                     ) -> dict[str, tuple[Kernel, ...]]:
    """:func:`layer_elementwise_backward_kernels`' kernels (same arguments) by op, as
    :func:`~.elementwise.layer_elementwise_parts` names the forward's: ``norm``,
    ``residual``, ``activation``, ``rope``, in that order."""
    dt = dtype_bytes
    y = b * s * shape.ffn / t
    x = b * s * shape.hidden / (t if sp else 1)
    fused = activation_fused(shape, sw)
    act = activation_backward_passes(shape.gated_mlp, shape.mlp_bias, fused, dt,
                                     shape.squared_relu)
    classes = _activation_backward_classes(shape.gated_mlp, fused, sw.compile, len(act),
                                           shape.squared_relu)
    parts = {"residual": [(v, "") for v in residual_backward_bytes(shape, x, dt, sw) * 2],
             "activation": [(p * y, c) for p, c in zip(act, classes)],
             "rope": list(zip(rope_backward_bytes(shape, b, s, t, dt, sw),
                              rope_backward_classes(shape, dt, sw)))}
    norms = (norm_backward_kernels(shape, b, s, t, sp, dt, sw, dtype) * 2
             + qk_norm_backward_kernels(shape, b, s, t, dt, sw, dtype))
    return {"norm": norms, **{name: tuple(Kernel("memory", bytes=v, dtype=dtype, variant=c)
                                          for v, c in out if v) for name, out in parts.items()}}


def residual_backward_bytes(shape: Any, x: float, dtype_bytes: float, sw: Any) -> list[float]:
    """Bytes of the backward kernels of one residual connection over ``x`` hidden-state
    elements (:func:`~.elementwise.residual_bytes`' forward), in launch order: fused
    (``sw.fused_bias_dropout_add``), twice the forward kernel's
    (:func:`~.elementwise.backward_kernels`); unfused, torch's autograd (the module
    docstring's table): the residual stream's two gradients summed (read 2, write 1),
    dropout's backward (read the gradient and the 1-byte mask, write) and the bias
    gradient's sum over the tokens (read), where the model has them.

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

    References
    ----------
    pytorch/pytorch ``tools/autograd/derivatives.yaml`` ``add.Tensor`` (``self: grad``,
    ``other: maybe_multiply(grad, alpha)``), ``native_dropout`` (``native_dropout_backward(grad,
    result1, scale)``); ``torch/csrc/autograd/input_buffer.cpp`` ``InputBuffer::add``.
    """
    dt = dtype_bytes
    if sw.fused_bias_dropout_add:
        return [2 * v for v in residual_bytes(shape, x, dt, sw)]
    out = [3 * x * dt]
    out += [2 * x * dt + x] if shape.dropout else []
    out += [x * dt] if shape.out_bias or shape.mlp_bias else []
    return out


def activation_backward_passes(gated: bool, bias: bool, fused: bool, dtype_bytes: float,
                               squared_relu: bool = False) -> list[float]:
    """Bytes per element of the MLP activation ``y`` moved by each backward kernel of the
    activation (the module docstring's table), in launch order: fused, twice each forward
    kernel's (:func:`~.elementwise.backward_kernels`); unfused SwiGLU (``gated``) the
    multiply's two products then ``silu_backward``; unfused GeLU ``gelu_backward`` then,
    with a bias, the bias gradient's sum over the tokens; squared ReLU ``pow_backward``'s
    three kernels and ``threshold_backward`` (one kernel of 3d fused), then the bias
    gradient's sum.

    Parameters
    ----------
    gated, bias, fused, squared_relu : bool
        as :func:`~.elementwise.activation_passes`.
    dtype_bytes : float
        bytes per element (B).

    Returns
    -------
    list of float
        bytes per element of ``y``, one entry per kernel.

    References
    ----------
    pytorch/pytorch ``tools/autograd/derivatives.yaml``: ``mul.Tensor`` (``self:
    mul_tensor_backward(grad, other, ...)``, ``other: mul_tensor_backward(grad, self,
    ...)``), ``silu`` (``silu_backward(grad, self)``), ``gelu`` (``gelu_backward(grad, self,
    approximate)``), ``pow.Tensor_Scalar`` (``pow_backward(grad, self, exponent)``, in
    ``torch/csrc/autograd/FunctionsManual.cpp``: ``grad * (exponent * self.pow(exponent -
    1))``, where ``pow`` by 1 is a copy), ``relu`` (``threshold_backward(grad, result, 0)``).
    """
    d = dtype_bytes
    if squared_relu:
        return ([3 * d] if fused else [2 * d, 2 * d, 3 * d, 3 * d]) + ([d] if bias else [])
    if fused:
        return [2 * p for p in activation_passes(gated, bias, True, d)]
    if gated:
        return [3 * d, 3 * d, 3 * d]
    return [3 * d, d] if bias else [3 * d]


def _activation_backward_classes(gated: bool, fused: bool, compiled: bool,
                                 n: int, squared_relu: bool = False) -> list[str]:
    """The class of each of the ``n`` kernels :func:`activation_backward_passes` gives: each
    forward class's backward class (fused), ``activation_backward`` for an unfused GeLU's
    ``gelu_backward`` (its bias gradient's sum, after it, none); squared ReLU's none."""
    if squared_relu:
        return [""] * n
    if fused or compiled:
        fwd = activation_classes(gated, fused, compiled, n)
        return [_BACKWARD_CLASS.get(c, c) for c in fwd]
    if gated:
        return [""] * n
    return [_BACKWARD_CLASS["activation"]] + [""] * (n - 1)


def norm_backward_kernels(shape: Any, b: float, s: float, t: int, sp: bool,
                          dtype_bytes: float, sw: Any, dtype: str = "bf16",
                          fused: bool | None = None) -> tuple[Kernel, ...]:
    """The backward kernels of one norm, of :func:`~.elementwise.norm_kernels`' forward (same
    arguments): a fused norm's as its library launches them (``sw.fused_norm_backward``,
    :data:`FUSED_NORM_BACKWARD`, over the ``b·s·h`` elements, ``/t`` with sequence
    parallelism), torch's unfused norm kernels twice their forward
    (:func:`~.elementwise.backward_kernels`, class ``norm_backward``).

    Returns
    -------
    tuple of Kernel
        memory kernels, bytes in B.
    """
    fused = bool(sw.fused_layernorm) if fused is None else fused
    if not fused:
        return backward_kernels(norm_kernels(shape, b, s, t, sp, dtype_bytes, sw, dtype,
                                             fused=False))
    return _fused_norm_backward((b * s * shape.hidden / (t if sp else 1),), shape.norm,
                                dtype_bytes, sw, dtype)


def _fused_norm_backward(tensors: tuple[float, ...], norm: str, dtype_bytes: float, sw: Any,
                         dtype: str) -> tuple[Kernel, ...]:
    """A fused norm's backward kernels (:data:`FUSED_NORM_BACKWARD`, the stack's
    ``fused_norm_backward``) over each of ``tensors`` (elements) in turn, of its class."""
    cls = fused_norm_class(sw, norm, backward=True)
    return tuple(Kernel("memory", bytes=p * dtype_bytes * x, dtype=dtype, variant=cls)
                 for x in tensors for p in FUSED_NORM_BACKWARD[sw.fused_norm_backward])


def qk_norm_backward_kernels(shape: Any, b: float, s: float, t: int, dtype_bytes: float,
                             sw: Any, dtype: str = "bf16") -> tuple[Kernel, ...]:
    """The backward kernels of the query and key heads' norms
    (:func:`~.elementwise.qk_norm_kernels`' forward, same arguments), as a layer's norm's
    (:func:`norm_backward_kernels`): fused, the library's kernels
    (:data:`FUSED_NORM_BACKWARD`) over each tensor; unfused, twice the forward."""
    fwd = qk_norm_kernels(shape, b, s, t, dtype_bytes, sw, dtype)
    if not fwd or not sw.fused_layernorm:
        return backward_kernels(fwd)
    return _fused_norm_backward((b * s * shape.q_width / t, b * s * shape.kv_width / t),
                                "rmsnorm", dtype_bytes, sw, dtype)


def rope_backward_bytes(shape: Any, b: float, s: float, t: int, dtype_bytes: float,
                        sw: Any) -> list[float]:
    """Bytes of the backward kernels of the rotary embedding (:func:`~.rotary.rope_bytes`'
    forward, same arguments): a linear map, so the forward's kernels again per tensor (the
    module docstring's table), and in torchtitan's complex form (``rope_form: complex``,
    unfused) each tensor's complex multiply's backward, ``grad * freqs_cis.conj()``, first
    conjugates the frequencies in a kernel of its own (``conj_kernel_cuda`` over the ``s ×
    d/2`` complex64 ``freqs_cis``, read and written; the H200 trace of torch 2.11 launches it
    under each ``MulBackward0``); fms's real-matrix form (``real_matrix``) conjugates a
    real table, which launches nothing: the forward's kernels.

    Returns
    -------
    list of float
        bytes (B), one entry per kernel: q's, then k's.
    """
    fwd = rope_bytes(shape, b, s, t, dtype_bytes, sw)
    if not fwd or sw.fused_rope or sw.rope_form != "complex":
        return fwd
    d = shape.mla.qk_rope_head_dim if shape.mla is not None else shape.d
    return _with_conj(fwd, 2 * s * d / 2 * 8, dtype_bytes)   # complex64 freqs_cis, read, write


def rope_backward_classes(shape: Any, dtype_bytes: float, sw: Any) -> list[str]:
    """The class of each kernel :func:`rope_backward_bytes` gives: the forward's
    (:func:`~.rotary.rope_classes`: the cast back's gradient is the ``rope_upcast``, the
    multiply by ``conj(freqs_cis)`` the ``rope_complex_mul``), the ``conj`` kernel none;
    empty without rotary positions."""
    if shape.positions != "rotary":
        return []
    fwd = rope_classes(bool(sw.fused_rope), sw.rope_form, dtype_bytes) * 2
    if sw.fused_rope or sw.rope_form != "complex":
        return fwd
    return _with_conj(fwd, "", dtype_bytes)


def _with_conj(fwd: list, conj: Any, dtype_bytes: float) -> list:
    """The complex form's per-tensor kernels ``fwd`` (q's, then k's: [cast,] multiply[,
    cast]) with ``conj`` before each multiply, in the backward's launch order."""
    n = len(fwd) // 2
    mul = 1 if dtype_bytes < 4 else 0
    return [x for part in (fwd[:n], fwd[n:]) for x in (*part[:mul], conj, *part[mul:])]
