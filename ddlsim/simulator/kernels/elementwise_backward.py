"""The backward kernels of a dense layer's element-wise ops
(:func:`layer_elementwise_backward_kernels`: the backward of
:func:`.elementwise.layer_elementwise_kernels`' forward, on the same tensors).

A fused kernel's backward, and a norm's, is taken as twice its forward traffic (it reads
the saved inputs and the incoming gradient and writes the outgoing one:
:func:`~.elementwise.backward_kernels`). The unfused ops' backwards are torch's autograd
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
RoPE                   a linear map of q and k with constant coefficients: its backward
                       runs the transposed map over the gradient, the forward's passes
                       again (torchtitan's complex form: the upcast, the multiply by
                       ``conj(freqs_cis)``, the cast back; TransformerEngine's fused kernel,
                       ``fused_rope.cu`` ``fused_rope_block_backward``: read the output
                       gradient, write the input's: 2d)
=====================  ==================================================================

Measured (PyTorch 2.11, one H200: the Kineto trace of
``benchmarks/data/device_h200_2026-11-30/run1/llama``, ``benchmarks/kineto_vs_ddlsim.py``): per
layer of Llama 3.1 8B at 8192 tokens one
``silu_backward_kernel`` and two ``mul`` kernels over the 8192 × 14336 activation, one ``add``
per residual connection (launched under ``FusedRmsNormBackward0``, whose input gradient it sums
with the residual's), and the rotary embedding's three kernels per tensor again (a bf16 →
fp32 copy, the complex ``mul``, the fp32 → bf16 copy).
"""

from __future__ import annotations

from typing import Any

from ...workloads.trace import Kernel
from .elementwise import (_BACKWARD_CLASS, activation_classes, activation_passes,
                          backward_kernels, norm_kernels, residual_bytes, rope_bytes)

__all__ = ["layer_elementwise_backward_kernels", "layer_elementwise_backward_parts",
           "residual_backward_bytes", "activation_backward_passes"]


def layer_elementwise_backward_kernels(shape: Any, b: float, s: float, t: int, sp: bool,
                                       dtype_bytes: float, sw: Any, dtype: str = "bf16"
                                       ) -> tuple[Kernel, ...]:
    """The backward kernels of :func:`~.elementwise.layer_elementwise_kernels`' ops (same
    arguments), one per kernel autograd launches (the module docstring's table): the two
    norms' (:func:`~.elementwise.backward_kernels`), each residual connection's
    (:func:`residual_backward_bytes`), the activation's (:func:`activation_backward_passes`)
    and the rotary embedding's (its forward bytes again, :func:`~.elementwise.rope_bytes`).

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
    act = activation_backward_passes(shape.gated_mlp, shape.mlp_bias, sw.fused_bias_gelu, dt)
    classes = _activation_backward_classes(shape.gated_mlp, sw.fused_bias_gelu, sw.compile,
                                           len(act))
    parts = {"residual": [(v, "") for v in residual_backward_bytes(shape, x, dt, sw) * 2],
             "activation": [(p * y, c) for p, c in zip(act, classes)],
             "rope": [(v, "") for v in rope_bytes(shape, b, s, t, dt, sw)]}
    norms = backward_kernels(norm_kernels(shape, b, s, t, sp, dt, sw, dtype)) * 2
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


def activation_backward_passes(gated: bool, bias: bool, fused: bool, dtype_bytes: float
                               ) -> list[float]:
    """Bytes per element of the MLP activation ``y`` moved by each backward kernel of the
    activation (the module docstring's table), in launch order: fused, twice each forward
    kernel's (:func:`~.elementwise.backward_kernels`); unfused SwiGLU (``gated``) the
    multiply's two products then ``silu_backward``; unfused GeLU ``gelu_backward`` then,
    with a bias, the bias gradient's sum over the tokens.

    Parameters
    ----------
    gated, bias, fused : bool
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
    approximate)``).
    """
    d = dtype_bytes
    if fused:
        return [2 * p for p in activation_passes(gated, bias, True, d)]
    if gated:
        return [3 * d, 3 * d, 3 * d]
    return [3 * d, d] if bias else [3 * d]


def _activation_backward_classes(gated: bool, fused: bool, compiled: bool,
                                 n: int) -> list[str]:
    """The class of each of the ``n`` kernels :func:`activation_backward_passes` gives: each
    forward class's backward class (fused), ``activation_backward`` for an unfused GeLU's
    ``gelu_backward`` (its bias gradient's sum, after it, none)."""
    if fused or compiled:
        fwd = activation_classes(gated, fused, compiled, n)
        return [_BACKWARD_CLASS.get(c, c) for c in fwd]
    if gated:
        return [""] * n
    return [_BACKWARD_CLASS["activation"]] + [""] * (n - 1)
