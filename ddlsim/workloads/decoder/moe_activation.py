"""The routed experts' activation kernels, as Megatron-Core launches them (GPT-OSS's clamped
SwiGLU included): :func:`expert_activation_kernels`, used by the MoE layer's ops
(:mod:`.moe`) and by recomputed modules (:mod:`.recompute_modules`)."""

from __future__ import annotations

from typing import Any

from ..trace import Kernel

__all__ = ["expert_activation_kernels"]


def expert_activation_kernels(shape: Any, rows_f: float, dt: float, dtype: str,
                              backward: bool) -> tuple[Kernel, ...]:
    """The routed experts' activation over ``rows_f`` = rows × ``f`` elements of each half
    (``dt`` bytes each): one fused kernel, reading the ``(m−1)·f`` fc1 output and writing ``f``
    (``m·f`` each way, twice backward). With ``shape.glu_clamp`` (GPT-OSS), Megatron-Core clamps
    the fc1 output before it in torch ops (d7288711 ``fused_bias_geglu.py``
    ``weighted_bias_quick_geglu_impl`` lines 424-432, from ``TEGroupedMLP.bias_act_func``):
    forward the gate's ``clamp(max=c)`` and the linear half's ``clamp(−c, c)`` (read + write
    ``R`` each) and their ``torch.cat`` (read + write ``2R``); backward, autograd's
    ``clamp_backward`` (PyTorch FunctionsManual.cpp, as torch 2.13's profiler lists it):
    two-sided ``ge``, ``le`` (read ``R``, write ``R`` bytes of bool), ``logical_and_`` (read
    ``2R`` bool, write ``R``), ``where`` (read the bool and the gradient, write ``R``),
    one-sided ``le`` and ``where``, and the chunk's gradient ``cat`` (read + write ``2R``);
    the cat's gradient is two views; the scalars' own copies are not counted."""
    R = rows_f
    fused = Kernel("memory", bytes=R * shape.mlp_matrices * dt * (2 if backward else 1),
                   dtype=dtype)
    if shape.glu_clamp is None:
        return (fused,)
    if not backward:
        passes = (2 * R * dt, 2 * R * dt, 4 * R * dt)
    else:
        compare = R * dt + R               # read the input, write a bool
        where = R + 2 * R * dt             # read the bool and the gradient, write
        passes = (compare, compare, 3 * R, where, compare, where, 4 * R * dt)
    return ((fused,) if backward else ()) + tuple(
        Kernel("memory", bytes=p, dtype=dtype) for p in passes) + (() if backward else (fused,))
