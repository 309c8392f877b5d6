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

**Fixed costs** (:class:`GemmOverhead`, a device fact where it was measured): a GEMM kernel
also pays time that no FLOP count sees, which the measured kernel tables show plainly (the
XLA sm_90 table, ``ddlsim/data/gemm_measured.csv``: a 256³ bf16 GEMM takes 5.2 µs of device
time on H100 where its arithmetic needs 0.03 µs; over ``m = n = 4096`` the time grows
linearly in ``K`` from an intercept of 12 µs):

* ``floor_s`` once per GEMM: the first tiles' operand loads and the last wave's epilogue
  that nothing overlaps, the kernel's start and drain;
* ``wave_s`` once per wave: each tile's prologue (filling the software pipeline's stages
  before the first MMA) and epilogue (converting and storing its ``Tm×Tn`` outputs), which a
  one-tile-per-SM kernel does not overlap with its main loop.

``t = floor_s + waves·wave_s + max(2MNK·batch / (peak·η_main·q), bytes / bandwidth)``. The
measured ceiling ``η_max`` keeps its meaning, the whole-GEMM efficiency at the reference
shape :data:`GEMM_REFERENCE` (8192³, where the ceilings were measured or, for a best-shape
search, near it): ``η_main`` is the main loop's efficiency that gives exactly ``η_max`` there
once the fixed costs are added (:func:`main_loop_efficiency`), so the fixed costs are not
counted twice. A device without the fact pays none (``t`` as above without the two terms).

**The epilogue of a GEMM that accumulates** (``D = A·B + C``, ``β = 1``: Megatron's fused
weight gradient into an fp32 ``main_grad``, :mod:`ddlsim.workloads.decoder.wgrad`) reads
``C`` and writes ``D`` in the buffer's dtype: ``2·c`` bytes per output (8 for fp32) where a
plain GEMM stores ``max(b, 2)`` (2 for bf16). On a device whose GEMM kernels run each tile's
main loop and then its epilogue in the same thread block, one tile per SM at a time
(``epilogue_serialized``: CUTLASS's sm80 kernel, ``include/cutlass/gemm/kernel/gemm.h``,
calls ``mma(...)`` then ``epilogue(..., iterator_C)``, which loads ``C`` only when
``β ≠ 0``; the A100's ``256×128×64``, 3-stage tile, cuBLAS's
``ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3``, holds
``(256 + 128)·64·2 B·3 = 144 KiB`` of shared memory, so one block fits an SM's 164 KiB),
every wave's epilogues move ``SMs·Tm·Tn·(2·c − max(b, 2))`` bytes more than the plain
GEMM's, at the device's memory bandwidth (each SM's share), and nothing overlaps them: the
compute side of the roofline grows by that much per wave. Only the increment over a 16-bit
store is charged: the plain store is inside ``η_max`` (and ``wave_s``) already. A device
whose kernels overlap the epilogue with the next tile's main loop (Hopper's persistent
warp-specialized kernels: CUTLASS ``media/docs/efficient_gemm.md``, "Warp-Specialized
Persistent Ping-Pong": "*epilogue* of one *consumer* warp group [is] overlapped with the
math operations of the other") pays the buffer's bytes in the memory roofline only.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["GEMM_TILE", "GEMM_REFERENCE", "GemmOverhead", "gemm_quantisation", "gemm_time",
           "gemm_bytes", "gemm_kernels_backward", "main_loop_efficiency",
           "epilogue_increment_bytes"]

#: thread-block tile (rows, columns of C): the NVIDIA guide's wave-quantisation example on A100
GEMM_TILE = (256, 128)

#: the GEMM (M, N, K) at which a device's matmul ceiling is taken to hold whole: the shape of
#: the A100's cuBLAS 11 measurement (n = 8192 squares) and of the square GEMMs of MAMF tables
GEMM_REFERENCE = (8192.0, 8192.0, 8192.0)

#: shortest K slice of a split-K GEMM
SPLIT_K_MIN = 128


class GemmOverhead(NamedTuple):
    """A GEMM kernel's fixed device time, in seconds: ``floor_s`` once per GEMM, ``wave_s``
    once per wave of tiles (module docstring)."""

    floor_s: float
    wave_s: float


def _tiling(M, N, K, batch, sms, tm: int, tn: int):
    """(useful fraction, waves) of one tile orientation, split-K included."""
    tiles = np.ceil(M / tm) * np.ceil(N / tn) * batch
    splits = np.maximum(1.0, np.minimum(np.floor(sms / tiles), np.ceil(K / SPLIT_K_MIN)))
    waves = np.ceil(tiles * splits / sms)
    return M * N * batch * splits / (waves * sms * tm * tn), waves


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
    return np.minimum(1.0, np.maximum(_tiling(M, N, K, batch, sm_count, tm, tn)[0],
                                      _tiling(M, N, K, batch, sm_count, tn, tm)[0]))


def main_loop_efficiency(ceiling: float, peak: float, sm_count: int,
                         overhead: GemmOverhead) -> float:
    """The main loop's fraction of peak ``η_main`` that makes the reference GEMM
    (:data:`GEMM_REFERENCE`) run at exactly ``ceiling`` once its fixed costs are added:
    ``η_main = ceiling · t_ref / (t_ref − floor_s − waves_ref·wave_s)``, ``t_ref`` the
    reference's time at ``ceiling``.

    Parameters
    ----------
    ceiling : the measured whole-GEMM efficiency ``η_max`` (fraction of peak).
    peak : dense peak FLOP/s at the dtype.
    sm_count : streaming multiprocessors.
    overhead : the device's fixed GEMM costs.

    Returns
    -------
    float : ``η_main`` (fraction of peak).
    """
    M, N, K = GEMM_REFERENCE
    q, waves = _tiling(M, N, K, 1.0, sm_count, *GEMM_TILE)
    t_ref = 2.0 * M * N * K / (peak * ceiling * q)
    fixed = overhead.floor_s + waves * overhead.wave_s
    if fixed >= t_ref:
        raise ValueError(f"device.gemm_overhead ({overhead.floor_s:g} s + {overhead.wave_s:g} "
                         f"s per wave) exceeds the whole time of the reference 8192³ GEMM at "
                         f"its matmul ceiling ({t_ref:g} s)")
    return float(ceiling * t_ref / (t_ref - fixed))


def gemm_time(M, N, K, batch, dtype_bytes: float, peak: float, ceiling: float,
              sm_count, memory_Bps: float, overhead: GemmOverhead | None = None,
              operand_bytes: float | None = None, epilogue_bytes: float = 0.0):
    """Seconds of ``batch`` GEMMs ``[M,K]·[K,N]``.

    ``max(2MNK·batch / (peak · η_max · q), bytes moved / bandwidth)``, the bytes
    ``((MK + KN)·b + MN·max(b, 2))·batch`` (an 8-bit GEMM writes 16-bit outputs), plus,
    on a device with measured fixed costs, ``floor_s + waves·wave_s`` with the main loop at
    ``η_main`` (module docstring); the tile orientation giving the shorter time is kept.

    Parameters
    ----------
    M, N, K : GEMM dimensions (floats or arrays).
    batch : independent GEMMs in the launch.
    dtype_bytes : bytes per element.
    peak : dense peak FLOP/s at the dtype.
    ceiling : ``η_max``, the whole-GEMM matmul ceiling (fraction of peak).
    sm_count : SMs, or None: no quantisation and no fixed costs (a device without the fact).
    memory_Bps : achieved memory bandwidth (datasheet × memory efficiency), B/s.
    overhead : the device's fixed GEMM costs, or None.
    operand_bytes : the bytes the kernel moves, where they are not its operands' (an
        implicit-GEMM convolution reads its input tensor once, not the ``M×K`` im2col matrix
        its shape names); None: the operands' bytes above.
    epilogue_bytes : bytes per output element that the epilogue moves beyond a 16-bit
        store and that nothing overlaps (:func:`epilogue_increment_bytes`; module
        docstring), charged per wave at ``memory_Bps``; 0: none.

    Returns
    -------
    float or array : seconds.

    References
    ----------
    NVIDIA, Matrix Multiplication Background User's Guide (tile and wave quantisation).
    """
    M, N, K = (np.asarray(x, dtype=float) for x in (M, N, K))
    t_mem = (gemm_bytes(M, N, K, batch, dtype_bytes) if operand_bytes is None
             else operand_bytes) / memory_Bps
    flops = 2.0 * M * N * K * batch
    if sm_count is None:
        out = np.maximum(flops / (peak * ceiling), t_mem)
    elif overhead is None and not epilogue_bytes:
        q = gemm_quantisation(M, N, batch, sm_count, K)
        out = np.maximum(flops / (peak * ceiling * q), t_mem)
    else:
        eta = ceiling if overhead is None else main_loop_efficiency(ceiling, peak, sm_count,
                                                                    overhead)
        fixed = overhead or GemmOverhead(0.0, 0.0)
        times = []
        for tm, tn in (GEMM_TILE, GEMM_TILE[::-1]):
            q, waves = _tiling(M, N, K, batch, sm_count, tm, tn)
            epilogue_s = waves * sm_count * tm * tn * epilogue_bytes / memory_Bps
            times.append(fixed.floor_s + waves * fixed.wave_s
                         + np.maximum(flops / (peak * eta * np.minimum(q, 1.0)) + epilogue_s,
                                      t_mem))
        out = np.minimum(*times)
    return float(out) if out.ndim == 0 else out


def gemm_bytes(M, N, K, batch, dtype_bytes: float, accumulate_bytes: float = 0.0):
    """Bytes ``batch`` GEMMs ``D[M,N] = A[M,K]·B[K,N] (+ C)`` move at least once: ``A`` and
    ``B`` in ``dtype_bytes``; ``D`` written in 16 bits at least (an fp8 GEMM writes bf16:
    Transformer Engine, ``torch._scaled_mm``) or, for a GEMM that accumulates into a buffer
    (``β = 1``: ``C`` read and ``D = C`` written), ``2·accumulate_bytes`` per output element.

    Parameters
    ----------
    M, N, K : float or array
        the GEMM's shape (elements).
    batch : float
        GEMMs in the launch.
    dtype_bytes : float
        bytes per element of ``A`` and ``B``.
    accumulate_bytes : float
        bytes per element of the buffer the GEMM accumulates into (4: Megatron's fp32
        ``main_grad`` under ``gradient_accumulation_fusion``); 0: no accumulation.

    Returns
    -------
    float or array : bytes.
    """
    out = 2.0 * accumulate_bytes if accumulate_bytes else max(dtype_bytes, 2.0)
    return ((M * K + K * N) * dtype_bytes + M * N * out) * batch


def epilogue_increment_bytes(dtype_bytes: float, accumulate_bytes: float) -> float:
    """Bytes per output element a GEMM accumulating into a buffer of ``accumulate_bytes``
    (``β = 1``: ``C`` read, ``D`` written) moves in its epilogue beyond the 16-bit store of a
    plain GEMM (which the measured ceiling already holds): ``2·c − max(b, 2)``; 0 for a GEMM
    that does not accumulate.

    Parameters
    ----------
    dtype_bytes : float
        bytes per element of ``A`` and ``B``.
    accumulate_bytes : float
        bytes per element of the buffer (4: an fp32 ``main_grad``); 0: none.

    Returns
    -------
    float : bytes per output element (6 for bf16 operands into fp32).
    """
    if not accumulate_bytes:
        return 0.0
    return max(0.0, 2.0 * accumulate_bytes - max(dtype_bytes, 2.0))


def gemm_kernels_backward(M: float, N: float, K: float) -> tuple[tuple[float, float, float],
                                                                 tuple[float, float, float]]:
    """Shapes of the two backward GEMMs of ``C[M,N] = A[M,K]·B[K,N]``: the data gradient
    ``dA[M,K] = dC[M,N]·Bᵀ`` (``(M, K, N)``) and the weight gradient ``dB[K,N] = Aᵀ·dC``
    (``(K, N, M)``); each has the forward's ``2MNK`` FLOPs."""
    return (M, K, N), (K, N, M)
