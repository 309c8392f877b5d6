"""FP8 training recipes: the memory passes that scale and cast each linear layer's GEMM
inputs to FP8, per recipe (``software.kernels.fp8_recipe``; docs/compute.md).

For a linear ``[M, K] · [K, N]`` (input ``x``, weight ``w``, output gradient ``g``), bytes
moved per element (bf16 in, FP8 out) by the recipe's kernels, forward and backward:

``te_delayed`` (Transformer Engine, delayed scaling: the scale comes from an amax history, so
no pass computes it; "Using FP8 with Transformer Engine", docs.nvidia.com)
    forward: ``x`` cast and transposed in one kernel (read 2, write 1 + 1: 4), ``w`` cast
    (read 2, write 1: 3); backward: ``g`` cast and transposed (4).
``tensorwise`` (torchao ``Float8Linear``, dynamic per-tensor scaling: torchtitan's float8)
    each tensor's ``max(abs)`` is a read (2, skipped for ``x`` and ``g`` when compiled: fused
    with the op before), then a cast writing the row-major and column-major FP8 copies:
    ``x``: 2 + (2 + 1 + 1), ``g`` the same, in the backward; ``w``: 2 + (2 + 1) forward and
    (2 + 1) again backward.
``rowwise`` (torchao, per-row scales, ``Float8LinearRecipeName.ROWWISE``)
    ``x`` and ``g``: a kernel writing the FP8 copy and the bf16 transpose (2 + 1 + 2; 1 + 2
    when compiled), then the transpose's cast (2 + 1); ``w``: cast (2 + 1) forward, transpose
    (2 + 2) and its cast (2 + 1) backward.

References
----------
pytorch/ao 6243040 (2025-06-13) ``torchao/testing/float8/roofline_utils.py``
``get_tensor_memory_traffic_ovhd_s`` (lines 72-205): the kernels and bytes above for
``tensorwise`` and ``rowwise``, with ``fuse_with_prev`` for the input and the output gradient
under compilation (``get_float8_mem_sympy``, lines 306-334). The recipes' GEMMs themselves
(rowwise-scaled ``_scaled_mm``) are timed by the device's FP8 ceiling (docs/compute.md).
"""

from __future__ import annotations

from collections.abc import Callable

from ...workloads.trace import Kernel

__all__ = ["FP8_RECIPES", "fp8_recipe", "fp8_cast_kernels"]

#: recipe name → ``bytes(M, N, K, backward, compiled)``: the passes' bytes, in launch order
FP8_RECIPES: dict[str, Callable[..., tuple[float, ...]]] = {}


def fp8_recipe(name: str):
    """Decorator: register a recipe's cast passes under ``name``."""
    def wrap(fn):
        FP8_RECIPES[name] = fn
        return fn
    return wrap


@fp8_recipe("te_delayed")
def _te_delayed(M, N, K, backward, compiled):
    return (4 * M * N,) if backward else (4 * M * K, 3 * K * N)


@fp8_recipe("tensorwise")
def _tensorwise(M, N, K, backward, compiled):
    amax = 0 if compiled else 2
    if backward:
        return tuple(x for x in (amax * M * N, 4 * M * N, 3 * K * N) if x)
    return tuple(x for x in (amax * M * K, 4 * M * K, 2 * K * N, 3 * K * N) if x)


@fp8_recipe("rowwise")
def _rowwise(M, N, K, backward, compiled):
    first = 3 if compiled else 5
    if backward:
        return (first * M * N, 3 * M * N, 3 * M * K, 4 * K * N, 3 * K * N)
    return (first * M * K, 3 * K * N)


def fp8_cast_kernels(recipe: str, M: float, N: float, K: float, backward: bool,
                     compiled: bool = False) -> tuple[Kernel, ...]:
    """The memory kernels of ``recipe`` around one FP8 linear ``[M, K] · [K, N]``, forward
    or ``backward`` (module docstring); ``compiled``: torch.compile fuses the first read of
    the input and the output gradient with the op before.

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
    return tuple(Kernel("memory", bytes=b, dtype="bf16")
                 for b in FP8_RECIPES[recipe](M, N, K, backward, compiled))
