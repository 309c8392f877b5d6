"""How a fused attention kernel's tiles fill the GPU: the share of its SMs' time it uses.

A fused attention kernel (FlashAttention-2/3, cuDNN's) splits each (sequence, head) pair's
work into tiles, one CTA's work each: forward, a tile of ``B_q`` query rows walking the key
blocks of ``B_k`` rows it sees; backward, a tile of ``B_k`` key rows walking the query blocks
that see it. With a causal mask the tiles are unequal: query tile ``i`` of a forward visits
``⌈min(s_k, s_k − s + (i+1)·B_q) / B_k⌉`` key blocks (bottom-right aligned, as
:func:`.attention.flash_forward_flops`), key tile ``j`` of a backward the
``n_q − ⌊max(0, j·B_k − (s_k − s)) / B_q⌋`` query blocks at or after it. The kernel ends when
its last tile does, so its time is the *makespan* of a schedule of those tiles on the GPU's
CTA slots, not total work / rate. Its utilisation

    U = (Σ tile work / slots) / makespan

is ≈ 1 with many tiles a slot and falls when few, unequal tiles share the SMs (a causal
kernel at batch 1 and a few heads: 16 heads of 2,048 tokens are 256 tiles of 128 rows).

A :class:`TileSchedule` is what decides the makespan, read from each kernel's source:

* ``slots``: ``ctas_per_sm × sm_count`` CTAs resident at once, each at ``1/ctas_per_sm`` of
  its SM's rate whether or not its neighbour is busy. Only FlashAttention-2's forward holds
  2 CTAs an SM (the rest hold one, where this is exact), and for it this is a bound: a CTA
  alone on its SM is taken to run no faster. The kernel's sources choose 2 CTAs an SM for
  speed ("the fastest for non-causal since we get 2 CTAs per SM"), so a lone 4-warp CTA
  runs well below its SM's rate; by how much is not published. The other bound (an SM's
  rate shared by whatever CTAs it holds, a lone CTA at the full rate) gives ``U`` 0.01-0.07
  higher for FlashAttention-2's causal forward at head dim 128 (0.873-0.946 against
  0.860-0.882 at the curves' own launches; 0.589 against 0.515 at 256 tiles);
* ``order``: ``grid`` — each pair's tiles in block order, pair after pair (a grid
  ``(blocks, b, h)`` whose ``blockIdx.x`` varies fastest: FlashAttention-2's), or
  ``heaviest_first`` — the heaviest tile of every pair, then the next (FlashAttention-3's
  longest-processing-time-first order);
* ``dispatch``: ``greedy`` — the next tile goes to the first slot that frees (the
  hardware's block dispatcher for a plain grid; FlashAttention-3's persistent kernel taking
  tiles from an atomic counter), or ``static`` — a persistent grid of one CTA a slot, CTA
  ``c`` taking tiles ``c, c + slots, …`` (CUTLASS's and FlashAttention-3's
  ``StaticPersistentTileScheduler``).

Not modelled: a sliding window (the kernel's ``variant`` does not carry it: its launch is
scheduled as the causal one), dropout's other tile widths (FlashAttention-2 at head dim 128
with dropout: 128×32; the query tiles, and so the work's shape, are the same), split-KV
(FlashAttention-2 splits the keys only where ``b·h·⌈s/64⌉ < 0.8 × 2 × SMs``,
``csrc/flash_attn/flash_api.cpp`` ``num_splits_heuristic``: 211 on 132 SMs, below the
shapes of training).

The tables (by head dim, rounded up to the kernels' 32, 64, 96, 128, 160, 192, 224, 256):

* ``flash2`` — FlashAttention-2 as PyTorch vendors it (PyTorch 04ff5be
  ``aten/src/ATen/native/transformers/cuda/flash_attn/flash_fwd_launch_template.h``,
  08e43ed ``flash_bwd_launch_template.h``; Dao-AILab/flash-attention 0251105 the same):
  forward ``run_mha_fwd_hdim*`` on sm90 (neither sm86 nor sm89) without dropout, grid
  ``(⌈s/B_q⌉, b, h)``, tiles 128×128 (d ≤ 64), 128×64 (96, 128), 128×32 (160), 128×64 with
  8 warps (192, 224), 64×64 (256 with ≥ 192 KiB of shared memory an SM: H100); backward
  ``run_mha_bwd_hdim*`` with ≥ 144 KiB a block (H100), grid ``(⌈s_k/B_k⌉, b, h)``, B_q×B_k
  128×128 (≤ 64), 64×128 (96, 128), 64×64 (160-256), 8 warps. CTAs an SM: 2 for the 4-warp
  forward (``ptxas``: 255 registers for ``Flash_fwd_kernel_traits<128, 128, 64, 4>``,
  Dao-AILab/flash-attention#1630; 128 threads × 256 allocated = 32,768 of the SM's 65,536
  registers, NVIDIA H100 Tensor Core GPU Architecture whitepaper, 2022, Table 3; the source's
  own comments count "2 CTAs per SM" at these sizes), 1 for the 8-warp kernels (256 × 255
  registers);
* ``flash3`` — FlashAttention-3 on sm90 (Dao-AILab/flash-attention 0251105
  ``hopper/tile_size.h`` ``tile_size_fwd_sm90``, ``hopper/flash_bwd_launch_template.h``,
  ``hopper/tile_scheduler.hpp``): causal forward a persistent grid of one CTA an SM taking
  tiles longest-first from an atomic counter (``DynamicPersistentTileScheduler``), tiles
  192×128 (≤ 64), 192×144 (96), 128×128 (128, 160), 128×112 (192), 128×80 (256); backward
  ``SingleTileBwdLPTScheduler``, a plain grid in longest-first order, B_q×B_k 128×128 (≤ 64),
  64×128 (96, 128), 64×96 (160, 192), 64×80 (256); one CTA an SM (a producer and two
  consumer warpgroups in most of the shared memory);
* ``cudnn`` — cuDNN's fused attention on sm90 (closed source). What a Kineto trace shows
  (``benchmarks/data/device_h200_2026-11-30/run1/llama/llama_step_trace.json.gz``, cuDNN
  9.19 through PyTorch 2.11 on an H200): forward
  ``cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1``
  and backward ``…_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1``, each a grid of 132 CTAs
  (the H200's SM count) of 384 threads with 232,448 and 216,064 bytes of shared memory: a
  persistent kernel, one CTA an SM, three warpgroups (FlashAttention-3's layout: one
  producer, two consumers of 64 rows). Not shown: the tile order and how tiles are handed
  out. Taken: FlashAttention-3's tiles for d = 128 (128×128 forward, 64×128 backward, for
  every head dim), its longest-first order, and the static hand-out of a persistent grid
  (CUTLASS's default for sm90 persistent kernels). In the same trace the forward at 512
  tiles (b 1, 32 heads of 2,048 tokens) takes 82 us, 0.88 of the rate of the measured curve
  at that length (taken at 2,048 tiles), which a greedy hand-out (U 0.97 against 1.00 there)
  cannot give and the static one (0.82 against 0.97) comes near: an inference from one
  shape, not a documented property.
"""

from __future__ import annotations

import heapq
import math
from functools import lru_cache
from typing import Literal, NamedTuple

__all__ = ["TileSchedule", "tile_schedule", "tile_works", "schedule_utilisation",
           "tile_utilisation", "SCHEDULED_KERNELS"]

Order = Literal["grid", "heaviest_first"]
Dispatch = Literal["greedy", "static"]

#: head dims the kernels are compiled for; a head dim is rounded up to the next
#: (FlashAttention-2 ``flash_api.cpp``: ``round_multiple(head_size, 32)``)
HEAD_DIMS = (32, 64, 96, 128, 160, 192, 224, 256)


class TileSchedule(NamedTuple):
    """How one fused attention kernel tiles and schedules its work (module docstring)."""

    block_q: int        # query rows of a block
    block_k: int        # key rows of a block
    ctas_per_sm: int    # CTAs resident on one SM
    order: Order
    dispatch: Dispatch


def _by_head_dim(rows: dict[int, tuple[int, int, int]], order: Order, dispatch: Dispatch
                 ) -> dict[int, TileSchedule]:
    return {d: TileSchedule(q, k, c, order, dispatch) for d, (q, k, c) in rows.items()}


#: (kernel, pass) -> rounded head dim -> schedule (module docstring, its sources);
#: rows are (B_q, B_k, CTAs an SM)
_SCHEDULES: dict[tuple[str, str], dict[int, TileSchedule]] = {
    ("flash2", "fwd"): _by_head_dim(
        {32: (128, 128, 2), 64: (128, 128, 2), 96: (128, 64, 2), 128: (128, 64, 2),
         160: (128, 32, 2), 192: (128, 64, 1), 224: (128, 64, 1), 256: (64, 64, 2)},
        "grid", "greedy"),
    ("flash2", "bwd"): _by_head_dim(
        {32: (128, 128, 1), 64: (128, 128, 1), 96: (64, 128, 1), 128: (64, 128, 1),
         160: (64, 64, 1), 192: (64, 64, 1), 224: (64, 64, 1), 256: (64, 64, 1)},
        "grid", "greedy"),
    ("flash3", "fwd"): _by_head_dim(
        {32: (192, 128, 1), 64: (192, 128, 1), 96: (192, 144, 1), 128: (128, 128, 1),
         160: (128, 128, 1), 192: (128, 112, 1), 224: (128, 80, 1), 256: (128, 80, 1)},
        "heaviest_first", "greedy"),
    ("flash3", "bwd"): _by_head_dim(
        {32: (128, 128, 1), 64: (128, 128, 1), 96: (64, 128, 1), 128: (64, 128, 1),
         160: (64, 96, 1), 192: (64, 96, 1), 224: (64, 80, 1), 256: (64, 80, 1)},
        "heaviest_first", "greedy"),
    ("cudnn", "fwd"): {d: TileSchedule(128, 128, 1, "heaviest_first", "static")
                       for d in HEAD_DIMS},
    ("cudnn", "bwd"): {d: TileSchedule(64, 128, 1, "heaviest_first", "static")
                       for d in HEAD_DIMS},
}
#: the kernels with a schedule (the fused kinds of :mod:`.attention`)
SCHEDULED_KERNELS = frozenset(k for k, _ in _SCHEDULES)


def tile_schedule(kernel: str, pass_: str, d: float) -> TileSchedule:
    """The :class:`TileSchedule` of ``kernel``'s ``pass_`` (``fwd``/``bwd``) at head dim
    ``d`` (rounded up to :data:`HEAD_DIMS`; above 256, 256's)."""
    table = _SCHEDULES.get((kernel, pass_))
    if table is None:
        raise ValueError(f"no tile schedule for kernel {kernel!r} pass {pass_!r}: expected "
                         f"kernel in {sorted(SCHEDULED_KERNELS)} and pass fwd or bwd")
    if not d > 0:
        raise ValueError(f"head dim d = {d!r} must be > 0")
    return table[next((h for h in HEAD_DIMS if h >= d), HEAD_DIMS[-1])]


def tile_works(sched: TileSchedule, pass_: str, s: float, s_k: float, causal: bool
               ) -> tuple[int, ...]:
    """Work of one (sequence, head) pair's tiles in block order, in ``B_q × B_k`` blocks:
    forward per query tile, the key blocks it visits; backward per key tile, the query
    blocks it visits (module docstring)."""
    n_q, n_k = max(1, math.ceil(s / sched.block_q)), max(1, math.ceil(s_k / sched.block_k))
    if not causal:
        return (n_k,) * n_q if pass_ == "fwd" else (n_q,) * n_k
    shift = s_k - s                 # keys before the square (bottom-right alignment)
    if pass_ == "fwd":
        return tuple(math.ceil(min(s_k, shift + (i + 1) * sched.block_q) / sched.block_k)
                     for i in range(n_q))
    return tuple(n_q - int(max(0.0, j * sched.block_k - shift) // sched.block_q)
                 for j in range(n_k))


def _ordered(works: tuple[int, ...], pairs: int, order: Order) -> list[int]:
    """All tiles of ``pairs`` pairs in the order the kernel hands them out."""
    if order == "grid":
        return list(works) * pairs
    return [w for w in sorted(works, reverse=True) for _ in range(pairs)]


def schedule_utilisation(works: list[int], slots: int, dispatch: Dispatch) -> float:
    """``(Σ works / slots) / makespan`` of ``works`` handed out in order to ``slots``
    identical slots: ``greedy`` (each to the first slot free) or ``static`` (slot ``c``
    takes ``c, c + slots, …``)."""
    if slots < 1:
        raise ValueError(f"slots = {slots!r} must be >= 1")
    total = sum(works)
    if total == 0:
        return 1.0
    if dispatch == "static":
        span = max(sum(works[c::slots]) for c in range(min(slots, len(works))))
    else:
        free = [0] * min(slots, len(works))
        for w in works:
            heapq.heapreplace(free, free[0] + w)
        span = max(free)
    return total / slots / span


@lru_cache(maxsize=4096)
def tile_utilisation(kernel: str, pass_: str, causal: bool, d: float, pairs: float,
                     s: float, s_k: float, sm_count: int) -> float:
    """Utilisation ``U`` of ``kernel``'s ``pass_`` over ``pairs`` (sequence, head) pairs of
    ``s`` queries against ``s_k`` keys at head dim ``d`` on ``sm_count`` SMs.

    Parameters
    ----------
    kernel : str
        ``flash2``, ``flash3`` or ``cudnn``.
    pass_ : str
        ``fwd`` or ``bwd``.
    causal : bool
        With a causal mask (bottom-right aligned where ``s_k > s``).
    d : float
        Head dimension.
    pairs : float
        Sequences × query heads of the launch (rounded; at least 1).
    s, s_k : float
        Queries and keys per sequence, tokens.
    sm_count : int
        SMs of the GPU.

    Returns
    -------
    float
        ``(Σ tile work / slots) / makespan``, in (0, 1].

    References
    ----------
    Graham 1969, "Bounds on multiprocessing timing anomalies" (list scheduling; the
    longest-processing-time-first order); the kernels' sources in the module docstring.
    """
    if sm_count < 1:
        raise ValueError(f"sm_count = {sm_count!r} must be >= 1")
    sched = tile_schedule(kernel, pass_, d)
    works = _ordered(tile_works(sched, pass_, s, s_k, causal), max(1, round(pairs)),
                     sched.order)
    return schedule_utilisation(works, sched.ctas_per_sm * sm_count, sched.dispatch)
