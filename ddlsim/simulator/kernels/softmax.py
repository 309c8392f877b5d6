"""The kernels PyTorch's CUDA softmax launches over the last dimension (``torch.softmax``
forward, ``_softmax_backward_data`` backward), as memory passes per element, by the dispatch
of the stack's PyTorch (``software.softmax_dispatch``, :data:`SOFTMAX_DISPATCH`).

``host_softmax`` and ``host_softmax_backward`` (pytorch/pytorch
``aten/src/ATen/native/cuda/SoftMax.cu``) launch one block of threads per row and pick the
kernel by the row's length ``n`` and element size ``e``:

* a row short enough for one warp (``n`` and ``n·e`` under the version's limits) runs the
  persistent warp kernel (``softmax_warp_forward``/``_backward``,
  ``PersistentSoftmax.cuh``): the row is read once into registers and the result written
  once;
* a longer row that the version caches on chip (``cunn_SoftMaxForwardReg`` in registers,
  ``cunn_SoftMaxForwardSmem``/``cunn_SoftMaxBackwardSmem`` in shared memory, when the row
  fits a block's :data:`SHARED_MEMORY_PER_BLOCK_B`, is a whole number of 16-byte vectors and
  aligned) is also read once;
* otherwise ``cunn_SoftMaxForward`` reads the row three times (``ilpReduce`` for the
  maximum, ``ilpReduce`` for the sum of exponentials, then the epilogue that writes the
  output: ``WriteFpropResults``) and ``cunn_SoftMaxBackward`` reads its gradient twice
  (``ilpReduce`` for the sum, then the epilogue with the output: ``WriteBpropResults``).

The backward first forms ``tmp = grad * output`` (``softmax_backward_cuda``: one
element-wise ``mul``, read 2, write 1) and hands ``tmp`` and the output to those kernels
(pytorch/pytorch#145866, 2025-01-28: "there is an elementwise kernel that runs before this").

Per element of ``e`` bytes: forward ``2e`` (read once, write) or ``4e`` (read three times,
write); backward the ``mul``'s ``3e``, then ``3e`` (read ``tmp`` and the output once, write)
or ``4e`` (``tmp`` twice). Counted as memory traffic: a re-read row may come from L2 (a
row of 2,048 fp32 scores is 8 KB), which these passes do not tell apart.
"""

from __future__ import annotations

import math
from typing import NamedTuple

__all__ = ["SOFTMAX_DISPATCH", "SHARED_MEMORY_PER_BLOCK_B", "SoftmaxDispatch",
           "softmax_passes", "unfused_softmax_passes"]

#: shared memory one thread block may use without opting in, what
#: ``at::cuda::getCurrentDeviceProperties()->sharedMemPerBlock`` reads in ``host_softmax``
#: (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": 48 KB
#: per thread block for every compute capability from 3.0 on)
SHARED_MEMORY_PER_BLOCK_B = 48 * 1024
#: bytes of one vectorised load (``ILP = sizeof(float4) / sizeof(scalar_t)`` in SoftMax.cu)
_VECTOR_B = 16
#: threads per block of the cached kernels on long rows (``max_threads`` in SoftMax.cu),
#: whose per-warp partial sums share the block's shared memory (``smem_reduction_sz``)
_BLOCK_THREADS, _WARP = 1024, 32


class SoftmaxDispatch(NamedTuple):
    """How one PyTorch picks its softmax kernels (module docstring).

    ``forward_warp``/``backward_warp``: the (elements, bytes) of a row up to which the
    persistent warp kernel runs; ``forward_registers``: the row length up to which the
    forward caches the row in registers (0: no such kernel); ``forward_smem``,
    ``backward_smem``: longer rows that fit are cached in shared memory; ``product``: the
    backward forms ``grad * output`` in a kernel of its own first."""

    forward_warp: tuple[float, float]
    backward_warp: tuple[float, float]
    forward_registers: int
    forward_smem: bool
    backward_smem: bool
    product: bool = True


#: ``software.softmax_dispatch`` -> the softmax dispatch it names
SOFTMAX_DISPATCH = {
    # one kernel each way reading its row once, the backward's product in it: the numpy
    # reference's own softmax (ddlsim/reference/gpt2.py _softmax, _softmax_back), whose
    # measured rates are of this count (ddlsim/reference/kernels.py)
    "one_pass": SoftmaxDispatch((math.inf, math.inf), (math.inf, math.inf), 0, False, False,
                                product=False),
    # PyTorch 1.2 to early 2024: the persistent warp kernels up to 1,024 elements and 4 KB
    # a row both ways (pytorch/pytorch#20827, 2019-05-22); longer rows re-read (the
    # shared-memory forward came with pytorch/pytorch#122970, which #145866 cites, the
    # backward's with #145866). SoftMax.cu of that generation: yunoJ/pytorch d28f679,
    # czen/pytorch 2d3c136 host_softmax (cunn_SoftMaxForward, cunn_SoftMaxBackward only)
    "torch-1.8": SoftmaxDispatch((1024, 4096), (1024, 4096), 0, False, False),
    # the forward caches longer rows in shared memory (pytorch/pytorch 000cace host_softmax:
    # can_use_smem -> cunn_SoftMaxForwardSmem; in the build log of pytorch/pytorch#128468,
    # 2024-06); the backward as before
    "torch-2.5": SoftmaxDispatch((1024, 4096), (1024, 4096), 0, True, False),
    # pytorch/pytorch#144679 (2025-01, commit 1e32842324c): the forward's warp kernel up
    # to 2,048 elements and 8 KB, then cunn_SoftMaxForwardReg while ceil(n/1024) < 10;
    # pytorch/pytorch#145866 (2025-01-28): cunn_SoftMaxBackwardSmem. host_softmax of v2.10.0
    # ("dim_size <= 2048 && dim_size*sizeof(scalar_t) <= 8192"; the backward's warp kernel
    # still "dim_size <= 1024 && dim_size*sizeof(scalar_t) <= 4096")
    "torch-2.10": SoftmaxDispatch((2048, 8192), (1024, 4096), 9 * _BLOCK_THREADS, True, True),
}


def softmax_passes(row: float, elem_bytes: float, dispatch: str, backward: bool
                   ) -> list[float]:
    """Bytes per element of each kernel PyTorch launches for a softmax over rows of ``row``
    elements of ``elem_bytes`` bytes (forward, or its ``backward``), by ``dispatch``
    (:data:`SOFTMAX_DISPATCH`; the module docstring).

    Parameters
    ----------
    row : float
        elements per softmax row (the keys a query attends to).
    elem_bytes : float
        bytes per element of the softmax's input and output (B).
    dispatch : str
        a key of :data:`SOFTMAX_DISPATCH`.
    backward : bool
        the backward's kernels (``grad * output``, then the softmax's own).

    Returns
    -------
    list of float
        bytes per element, one entry per kernel.

    Raises
    ------
    ValueError
        for an unknown ``dispatch``, naming the known ones.
    """
    if dispatch not in SOFTMAX_DISPATCH:
        raise ValueError(f"softmax_dispatch {dispatch!r}: expected one of "
                         f"{', '.join(SOFTMAX_DISPATCH)}")
    rule, e = SOFTMAX_DISPATCH[dispatch], elem_bytes
    if not backward:
        once = (_in_warp(row, e, rule.forward_warp) or row <= rule.forward_registers
                or (rule.forward_smem and _fits_shared_memory(row, e)))
        return [2 * e if once else 4 * e]
    once = _in_warp(row, e, rule.backward_warp) or (rule.backward_smem
                                                     and _fits_shared_memory(row, e))
    return ([3 * e] if rule.product else []) + [3 * e if once else 4 * e]


def _in_warp(row: float, e: float, limit: tuple[float, float]) -> bool:
    """Whether a row runs the persistent warp kernel (``dim_size <= n && dim_size *
    sizeof(scalar_t) <= bytes``)."""
    return row <= limit[0] and row * e <= limit[1]


def _fits_shared_memory(row: float, e: float) -> bool:
    """``can_use_smem`` of SoftMax.cu for a row of ``row`` elements of ``e`` bytes: it fits
    the block's shared memory beside the per-warp partial sums (fp32) and is a whole number
    of vectorised loads (aligned tensors assumed)."""
    reduction = math.ceil(min(row, _BLOCK_THREADS) / _WARP) * 4
    return row * e < SHARED_MEMORY_PER_BLOCK_B - reduction and row % (_VECTOR_B // e) == 0


def unfused_softmax_passes(dtype_bytes: float, in_fp32: bool, backward: bool,
                           row: float = 0.0, dispatch: str = "one_pass") -> list[float]:
    """Bytes per score element of each kernel of the non-fused softmax over the ``s²``
    scores (Megatron's ``FusedScaleMaskSoftmax`` with the fusion off: its torch path, Megatron-LM
    6985e58 ``megatron/model/fused_softmax.py`` ``forward``, the ``else`` branch), forward (or
    its autograd ``backward``); ``d`` = ``dtype_bytes``; the softmax itself as ``dispatch``
    runs it over rows of ``row`` elements (:func:`softmax_passes`, the stack's
    ``softmax_dispatch``: PyTorch's kernels by version, e.g. ``4e`` forward where
    ``cunn_SoftMaxForward`` reads a row three times, ``3e + 4e`` backward; the default
    ``one_pass`` is one kernel each way reading the row once, ``2e`` and ``3e``), ``e`` the
    softmax's element size:

    * ``in_fp32`` (``softmax_in_fp32``: Megatron-LM turns it on with query-key layer scaling,
      on by default in 2021, 6985e58 ``megatron/model/transformer.py`` lines 119-122, and then
      scales by the layer number): ``input.float()`` (read ``d``, write 4), ``* scale`` (read
      + write 4), ``masked_fill_`` (read + write 4), softmax (``e`` = 4), ``.half()`` (read 4,
      write ``d``). Backward: the cast's (read ``d``, write 4), softmax's, the mask's and the
      scale's (read + write 4 each), the cast back (read 4, write ``d``);
    * otherwise (Megatron-Core: no layer scaling, the ``1/√d`` applied in the QKᵀ GEMM):
      ``masked_fill_`` (read + write ``d``) and softmax (``e`` = ``d``); backward: softmax's
      and the mask's (``2d``).

    The boolean mask is ``[b, 1, s, s]``, broadcast over the heads: a ``1/heads`` share of a
    byte per element, not counted. With ``d`` = 4 (fp32 training) the casts are no-ops: they
    drop out."""
    d = dtype_bytes
    e = 4.0 if in_fp32 else d
    soft = softmax_passes(row, e, dispatch, backward)
    if not in_fp32:
        return soft + [2 * d] if backward else [2 * d, *soft]
    middle = soft + [8.0, 8.0] if backward else [8.0, 8.0, *soft]
    if d >= 4:
        return middle
    return [d + 4, *middle, 4 + d]
