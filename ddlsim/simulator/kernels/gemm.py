"""GEMM time from its shape: ``C[M,N] = A[M,K]·B[K,N]``, ``batch`` of them in one launch.

NVIDIA, "Matrix Multiplication Background User's Guide" (docs.nvidia.com/deeplearning/
performance/dl-performance-matrix-multiplication): cuBLAS splits ``C`` into thread-block tiles,
one tile per SM at a time, so

* **tile quantisation**: a dimension that is not a multiple of the tile still pays for a whole
  last tile: ``ceil(M/Tm)·ceil(N/Tn)`` tiles of ``Tm·Tn`` outputs each;
* **wave quantisation**: tiles run in waves of ``SMs`` tiles; the last, partial wave takes as
  long as a full one: ``ceil(tiles / SMs)`` waves.

The useful fraction is ``M·N·batch / (waves · SMs · Tm·Tn)``. When the output has fewer tiles
than the device has SMs, cuBLAS splits the reduction dimension (split-K, CUTLASS's "parallel
split-K"; cuBLASLt's ``CUBLASLT_MATMUL_PREF``/``SPLITK_NUM``): we split ``K`` into
``min(⌊SMs / tiles⌋, ⌈K / 128⌉)`` parts (no part shorter than 128, one main-loop stage of the
tile), each part a tile of its own, and the fraction becomes
``M·N·batch·splits / (waves · SMs · Tm·Tn)`` with ``waves = ⌈tiles·splits / SMs⌉``. The
guide's own A100 example uses
256×128 tiles (one per SM, "a wave size of 108 tiles"); we take that tile in both orientations
and keep the better one (cuBLAS's heuristic chooses among its kernels). A full wave of full
tiles runs at the device's maximum achievable matmul FLOP/s (``η_max``, a measured fraction of
peak: :mod:`.device`). The GEMM also cannot be faster than moving its operands once:
``(M·K + K·N + M·N)·batch`` elements at the achieved memory bandwidth (a roofline).
"""

from __future__ import annotations

import numpy as np

__all__ = ["GEMM_TILE", "gemm_quantisation", "gemm_time", "gemm_kernels_backward"]

#: thread-block tile (rows, columns of C): the NVIDIA guide's wave-quantisation example on A100
GEMM_TILE = (256, 128)


#: shortest K slice of a split-K GEMM
SPLIT_K_MIN = 128


def _useful(M, N, K, batch, sms, tm: int, tn: int):
    tiles = np.ceil(M / tm) * np.ceil(N / tn) * batch
    splits = np.maximum(1.0, np.minimum(np.floor(sms / tiles), np.ceil(K / SPLIT_K_MIN)))
    waves = np.ceil(tiles * splits / sms)
    return M * N * batch * splits / (waves * sms * tm * tn)


def gemm_quantisation(M, N, batch, sm_count, K=np.inf):
    """Fraction of the device's tile slots doing useful work (tile × wave quantisation), the
    better of the two tile orientations; 1 for a GEMM of whole waves of whole tiles.

    Parameters
    ----------
    M, N : rows and columns of the output (floats or arrays).
    batch : independent GEMMs in the launch (batched attention GEMMs).
    sm_count : streaming multiprocessors.
    K : the reduction dimension (bounds split-K; default: unbounded).
    """
    tm, tn = GEMM_TILE
    return np.minimum(1.0, np.maximum(_useful(M, N, K, batch, sm_count, tm, tn),
                                      _useful(M, N, K, batch, sm_count, tn, tm)))


def gemm_time(M, N, K, batch, dtype_bytes: float, peak: float, ceiling: float,
              sm_count, memory_Bps: float):
    """Seconds of ``batch`` GEMMs ``[M,K]·[K,N]``: ``max(2MNK·batch / (peak · η_max ·
    quantisation), (MK + KN + MN)·batch·bytes / achieved memory bandwidth)``.

    ``sm_count`` None: no quantisation (a device without the fact). ``memory_Bps`` is the
    achieved bandwidth (datasheet × memory efficiency).
    """
    M, N, K = (np.asarray(x, dtype=float) for x in (M, N, K))
    q = 1.0 if sm_count is None else gemm_quantisation(M, N, batch, sm_count, K)
    t_flops = 2.0 * M * N * K * batch / (peak * ceiling * q)
    t_mem = (M * K + K * N + M * N) * batch * dtype_bytes / memory_Bps
    out = np.maximum(t_flops, t_mem)
    return float(out) if out.ndim == 0 else out


def gemm_kernels_backward(M: float, N: float, K: float) -> tuple[tuple[float, float, float],
                                                                 tuple[float, float, float]]:
    """Shapes of the two backward GEMMs of ``C[M,N] = A[M,K]·B[K,N]``: the data gradient
    ``dA[M,K] = dC[M,N]·Bᵀ`` (``(M, K, N)``) and the weight gradient ``dB[K,N] = Aᵀ·dC``
    (``(K, N, M)``); each has the forward's ``2MNK`` FLOPs."""
    return (M, K, N), (K, N, M)
