"""The FP8 recipe's scaling and cast kernels around the linear GEMMs that an MoE layer builds
itself (the routed experts' grouped GEMMs), as a dense layer's linears have them
(:func:`.layerkernels.layer_kernels`); the passes per recipe are
:mod:`ddlsim.simulator.kernels.fp8recipe`'s.

Transformer Engine's ``GroupedLinear`` (what Megatron-Core's ``TEGroupedMLP`` runs with
``--moe-grouped-gemm``) quantizes the inputs of all its GEMMs in one call
(``tex.split_quantize`` of the concatenated tokens, ``grouped_linear.py`` forward; the output
gradient likewise in the backward), so the casts of ``E/EP`` problems are one kernel per pass
over all their tokens; without grouped GEMM each expert is a ``TELinear`` of its own and casts
its own tensors.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...simulator.kernels.fp8recipe import fp8_cast_kernels
from ..trace import Compute, Kernel

__all__ = ["fp8_linear_casts", "with_fp8_casts"]


def fp8_linear_casts(sw: Any, dtype: str, M: float, N: float, K: float, backward: bool,
                     batch: float = 1.0) -> tuple[Kernel, ...]:
    """The cast kernels of ``batch`` FP8 linears ``[M, K]·[K, N]`` quantized together.

    Parameters
    ----------
    sw : Software
        the resolved software stack (``fp8_recipe``, ``compile``).
    dtype : str
        the linears' dtype; anything but ``fp8`` has no casts.
    M, N, K : float
        one problem's GEMM shape (elements).
    backward : bool
        the backward's casts (output gradient) instead of the forward's (input, weight).
    batch : float
        problems quantized in one call (their bytes add up in one kernel per pass).

    Returns
    -------
    tuple of Kernel
        ``memory`` kernels, bytes read + written each (B); empty for a 16-bit linear.
    """
    if dtype != "fp8":
        return ()
    return tuple(Kernel("memory", bytes=k.bytes * batch, dtype=k.dtype)
                 for k in fp8_cast_kernels(sw.fp8_recipe, M, N, K, backward, bool(sw.compile)))


def with_fp8_casts(op: Compute, sw: Any, M: float, N: float, K: float, backward: bool,
                   batch: float = 1.0, launches: int = 1) -> Compute:
    """``op`` (``launches`` launches of ``batch`` GEMMs ``[M,K]·[K,N]`` in its kernels' dtype,
    :meth:`.moe.MoEOps._gemm`) with its FP8 casts before each launch's GEMMs; ``op`` itself
    when its GEMMs are not FP8."""
    kernels = op.kernels or ()
    casts = fp8_linear_casts(sw, kernels[0].dtype if kernels else "", M, N, K, backward,
                             batch)
    if not casts:
        return op
    per = len(kernels) // launches
    out: tuple[Kernel, ...] = ()
    for i in range(launches):
        out += casts + kernels[i * per:(i + 1) * per]
    return replace(op, kernels=out)
