"""K and V repeated to the query heads before the attention core (``software.kernels.repeat_kv``).

Under grouped-query attention (``g`` key/value heads for ``a`` query heads) some stacks hand
the attention core K and V at the query heads' width rather than the groups':

* torchtitan's Llama (9dec370 ``torchtitan/models/llama/model.py`` lines 116-125 and
  200-209; 07c00d9 ``models/llama3/model/model.py`` lines 98-107 and 184-192) calls
  ``repeat_kv(xk, n_rep)`` and ``repeat_kv(xv, n_rep)``: ``unsqueeze``, ``expand`` (a view),
  then ``reshape`` to ``(b, s, a, d)``, which cannot be a view of the expanded tensor and so
  copies it; ``F.scaled_dot_product_attention`` then gets, and its flash kernel saves for the
  backward, the ``a``-head K and V. Eager, each copy is one kernel reading the ``g``-head
  tensor and writing the ``a``-head one. In the backward the expand's gradient is a sum over
  the ``n_rep`` copies (``sum_to_size``): one reduction per K and V, reading the ``a``-head
  gradient and writing the ``g``-head one. The two are different kernels (torch's strided
  ``direct_copy_kernel_cuda`` through ``elementwise_kernel``, and ``reduce_kernel`` with a
  ``sum_functor``), each with its class: ``repeat_kv`` and ``repeat_kv_backward``
  (:data:`~.elementwise.ELEMENTWISE_CLASSES`, which a device may time at its own rate).
* Megatron-Core's local ``DotProductAttention`` (the unfused kernels) does the same with
  ``repeat_interleave`` (900f1b76 ``transformer/dot_product_attention.py`` lines 115-118);
  its Transformer Engine path passes ``num_gqa_groups`` and repeats nothing.

Compiled (``compile: true``, torchtitan's per-block ``torch.compile``): the flash attention
op is an Inductor fallback whose inputs are realised into buffers of the stride order it
requires (``torch/_inductor/lowering.py``: ``make_fallback(aten._scaled_dot_product_flash_
attention, sdpa_constraint)``, ``sdpa_constraint`` → ``ExternKernel.require_stride_order``),
so the repeated K and V are still written to memory. ddlsim takes Inductor to write K's
repeat from the rotary embedding's kernel (the ``a``-head output in place of the ``g``-head
one: ``(a − g)·d`` more bytes per token, no kernel of its own) and V's as one kernel
(``g·d`` read, ``a·d`` written); in the backward, dV's sum as one reduction and dK's folded
into the rotary backward (``(a − g)·d`` more read). That fusion is our reading of Inductor's
scheduler (a pointwise consumer fused with its producer), not a measurement. Inductor's
kernels carry no class (no device measured them apart): they stream.

References
----------
pytorch/pytorch ``tools/autograd/derivatives.yaml``: ``expand`` -> ``self: at::sum_to(grad,
self.sym_sizes())`` (the expand's gradient, summed over the expanded dimension); the reshape
of the expanded tensor is ``_unsafe_view(clone(...))`` (``aten/src/ATen/native/
TensorShape.cpp`` ``reshape``: the forward's copy), whose backward is a view of the
gradient (no kernel under it in the H200 step's trace, benchmarks/kineto_vs_ddlsim.py).
"""

from __future__ import annotations

from typing import Any

from ...workloads.trace import Kernel
from .attention import FLASH_KINDS

__all__ = ["expands_kv", "repeat_kv_kernels", "expanded_kv_extra_width"]


def expands_kv(sw: Any, shape: Any) -> bool:
    """Whether the attention core gets K and V repeated to the query heads.

    Parameters
    ----------
    sw : Software
        The resolved stack (its ``repeat_kv`` and ``attention``).
    shape : DecoderShape
        The model: grouped-query attention (``g < a``) without MLA.

    Returns
    -------
    bool
        ``repeat_kv`` is ``always``, or ``unfused_kernels`` with an unfused attention kind
        (``fused_softmax``, ``unfused``), and the model has fewer K/V heads than query heads.
    """
    if getattr(shape, "mla", None) is not None or shape.g >= shape.heads:
        return False
    mode = sw.repeat_kv
    return mode == "always" or (mode == "unfused_kernels" and sw.attention not in FLASH_KINDS)


def expanded_kv_extra_width(sw: Any, shape: Any) -> float:
    """Width per token the core's saved K and V gain over ``kv_width`` when repeated:
    ``2·(a − g)·d`` (K and V), else 0.

    Parameters
    ----------
    sw : Software
        The resolved stack (as :func:`expands_kv` reads it).
    shape : DecoderShape
        The model (its ``q_width`` ``a·d`` and ``kv_width`` ``g·d``).

    Returns
    -------
    float
        Extra elements per token (multiply by the bytes per element for bytes): ``2·(a − g)·d``
        where :func:`expands_kv` holds, else 0.
    """
    return 2.0 * (shape.q_width - shape.kv_width) if expands_kv(sw, shape) else 0.0


def repeat_kv_kernels(tokens: float, heads: float, kv_heads: float, d: float, dt: float,
                      dtype: str, compiled: bool, backward: bool = False
                      ) -> tuple[Kernel, ...]:
    """The memory-bound kernels that repeat K and V to the query heads in the forward or, with
    ``backward``, that sum their gradients back (module docstring), on one rank.

    Parameters
    ----------
    tokens : float
        Tokens of the rank's micro-batch (``b·s``, the sequence the rank holds).
    heads, kv_heads : float
        Query and key/value heads on the rank (``a/t``, ``g/t``).
    d : float
        Head size.
    dt : float
        Bytes per element of the attention's dtype.
    dtype : str
        That dtype's name.
    compiled : bool
        Inductor's fusion (one kernel, K's part riding on the rotary embedding's).
    backward : bool
        The backward's kernels: the expand's gradient, ``sum_to_size`` over the ``n_rep``
        copies (read the ``a``-head gradient, write the ``g``-head one), in place of the
        forward's broadcast copy (read ``g``, write ``a`` heads).

    Returns
    -------
    tuple of Kernel
        Eager: two kernels (K, V) of ``tokens·(a + g)·d·dt`` bytes each, the same bytes each
        way, of class ``repeat_kv`` (forward) or ``repeat_kv_backward``; compiled: one of
        ``tokens·2a·d·dt`` (V's ``(a + g)`` and K's extra ``(a − g)``), unclassed.
    """
    per_head = tokens * d * dt     # streaming passes: the device's memory bandwidth
    if compiled:
        return (Kernel("memory", bytes=per_head * 2 * heads, dtype=dtype),)
    one = per_head * (heads + kv_heads)     # read g, write a heads; backward read a, write g
    cls = "repeat_kv_backward" if backward else "repeat_kv"
    return tuple(Kernel("memory", bytes=one, dtype=dtype, variant=cls) for _ in range(2))
