"""The attention core (``softmax(QKᵀ/√d)·V`` with its mask and dropout) as the stack runs it.

``flash2`` / ``flash3`` (FlashAttention-2, Dao 2023, arXiv:2307.08691; FlashAttention-3, Shah
et al. 2024, arXiv:2407.08608): one kernel each way, tiled over blocks of queries and keys, so
no ``s²`` tensor is written to memory or kept for the backward (it keeps the output and the
row log-sum-exp). Its FLOPs: QKᵀ and PV are ``2·s²·d`` each per head, ``4·b·a·s²·d`` forward;
with a causal mask the kernel skips the key blocks wholly above the diagonal, so with
``n = ⌈s/128⌉`` blocks per row it computes ``n(n+1)/2`` of the ``n²`` blocks (FA2 §3.1.1,
"Causal masking": blocks entirely masked are skipped; 128 is FA2's block size for head
dimensions 64-128 on A100, §3.3). Its backward does 5 GEMMs to the forward's 2, i.e. 2.5× the
forward FLOPs, the recomputation of ``P`` included (FA2 §4.1, the FLOP count of its benchmarks).
``cudnn`` is cuDNN's fused attention (TransformerEngine's FusedAttention, sub-backend
F16_arbitrary_seqlen): the same tiled algorithm, FLOPs and traffic, its own kernels. Each
pass is one kernel whose ``shape`` is ``(s, s_k, d)``, whose ``batch`` is the ``b·heads``
(sequence, head) pairs its grid spans and whose ``variant`` names the kernel, the pass and the
mask (:func:`flash_variant`), so the device times it at the fraction of peak measured for that
kernel, pass, mask, head dim and length where its GPU has a table (:mod:`.attention_measured`),
scaled by the share of the SMs its tiles keep busy at that many pairs over that of the measured
launch (:mod:`.attention_tiles`), else at ``device.attention_efficiency``. With a sliding
window it computes only the tiles the band crosses (:mod:`.window`); the batched-GEMM kinds
below compute every score and mask the rest, so a window changes nothing for them.

``fused_softmax`` (Megatron-LM's FusedScaleMaskSoftmax) and ``unfused``: QKᵀ and PV as batched
GEMMs (``b·a`` of them) and the ``b·a·s²`` scores written, read and kept: the fused kernel does
scale + mask + softmax in one pass each way (read ``s²``, write ``s²``; backward reads the
probabilities and their gradient and writes one), dropout is its own kernel (read, write, and a
1-byte mask); unfused runs the torch ops one kernel each, in fp32 with the stack's
``softmax_in_fp32`` (:func:`.elementwise.unfused_softmax_passes`).
Both run inside Megatron's core attention, which also moves the attention's inputs and output
in torch ops (Megatron-LM 6985e58 ``megatron/model/transformer.py``; the same code in
Megatron-Core's non-flash ``DotProductAttention``, 900f1b76 lines 136-203):

* forward: the context ``[b, np, s, d]`` is copied into the ``[s, b, np·d]`` layout the output
  projection reads (``context_layer.permute(2, 0, 1, 3).contiguous()``, line 336): one read
  and one write of the ``b·s·a·d`` output;
* backward: Q, K and V are views of the fused QKV GEMM's output split along its last dimension
  (``mpu.split_tensor_along_last_dim``, ``torch.split``, line 207), so autograd concatenates
  their three gradients into one new tensor for the QKV GEMM's backward: one read and one
  write of the ``b·s·(a + 2g)·d`` QKV width.

FlashAttention runs in Megatron-Core through TransformerEngine, which takes Q, K and V in the
fused layout and returns their gradients packed (its ``SplitAlongDim``): neither copy.

Attention sinks (GPT-OSS; Megatron-Core's ``softmax_type: learnable``, one learned logit per
head added to each softmax row's denominator) decide which kernel runs (:func:`sink_kernel`,
:data:`SINK_KERNELS`): FlashAttention takes no such logit, so TransformerEngine turns it off
and runs cuDNN's fused attention where cuDNN is 9.13.1 or newer (:func:`cudnn_runs_sinks`),
else its unfused attention; Megatron-Core's own ``FusedScaleMaskSoftmax`` refuses the offset
and runs the torch softmax. Inside cuDNN's kernel the sink adds one logit to each row's
softmax (``1/s_k`` of its exponentials) and, backward, the sink's gradient, a reduction over
the ``b·heads·s`` rows' statistics beside the ``dO·O`` row sums the backward computes anyway
(cudnn-frontend ``scaled_dot_product_flash_attention.h``, the ``DSINK_TOKEN`` chain): neither
is counted, nothing published times them.

Attention dropout inside a fused kernel writes no mask: each tile draws its random numbers
(Philox) and drops probabilities in registers, forward and again in the backward. Its cost is
the measured slowdown of the kernel with dropout on (:data:`DROPOUT_SLOWDOWN`), carried in the
kernel's ``variant`` (``…/dropout``) and applied by the device to the kernel's rate; a fused
kernel with no published figure runs dropout free (none yet for ``flash2``; ``flash3`` has no
dropout).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ...workloads.trace import Kernel
from .elementwise import unfused_softmax_passes
from .window import window_fraction

__all__ = ["FLASH_BACKWARD_FACTOR", "FLASH_BLOCK", "causal_fraction", "flash_forward_flops",
           "attention_kernels", "scores_activation_bytes", "FLASH_KINDS", "flash_variant",
           "FlashVariant", "parse_flash_variant", "DROPOUT_SLOWDOWN", "SINK_KERNELS",
           "CUDNN_SINKS_MIN", "cudnn_runs_sinks", "sink_kernel", "attention_label"]

#: backward FLOPs / forward FLOPs of FlashAttention (FA2 paper §4.1: 5 GEMMs against 2)
FLASH_BACKWARD_FACTOR = 2.5
#: FlashAttention-2's key/query block (FA2 §3.3: 128×128 blocks for head dim 64-128)
FLASH_BLOCK = 128
#: the fused attention kernels (no ``s²`` tensor in memory): FlashAttention-2/3, cuDNN's
FLASH_KINDS = ("flash2", "flash3", "cudnn")
#: fused attention kernel -> its time with attention dropout on over its time without, the
#: same factor on each pass. cuDNN: NVIDIA/TransformerEngine#3312 (2026-08-04), forward +
#: backward of one TE DotProductAttention (fused backend forced, qkv_format sbhd, bf16,
#: 4,096 tokens in 4 sequences, 16 heads, head dim 128, median of 50) on an H200 (sm90, the
#: H100's SMs), TE 2.15.0: 0.594 ms at p = 0.0, 0.614 ms at p = 0.1 (the thd layout, routed
#: to cuDNN's composite engine, pays 1.26x: not what Megatron-Core's sbhd runs). Applied as
#: is to the H100 and to every stack that runs cuDNN's kernel, including the 2024 stacks'
#: older TE (7d576ed2) and cuDNN, for which no published figure was found: an assumption,
#: not a measurement of those versions
DROPOUT_SLOWDOWN = {"cudnn": 0.614 / 0.594}

#: the oldest cuDNN whose fused attention (TransformerEngine's sub-backend
#: F16_arbitrary_seqlen) takes a learnable or off-by-one softmax: TransformerEngine v2.9,
#: 5671fd36 (v2.12) and 71bbefbf (v2.14) transformer_engine/common/fused_attn/fused_attn.cpp
#: nvte_get_fused_attn_backend, "softmax type / pre-9.13.1: vanilla / 9.13.1+: vanilla,
#: off-by-one, learnable" (cudnn_runtime_version >= 91301); cudnn-frontend refuses a sink token
#: before 9.13 (scaled_dot_product_flash_attention.h)
CUDNN_SINKS_MIN = (9, 13, 1)
#: attention kernel -> the kernel that runs it with learnable sinks, and why
SINK_KERNELS = {
    "cudnn": ("cudnn", "TransformerEngine >= 2.8 passes softmax_type to cuDNN's fused "
              "attention, which adds the sink in the kernel (cuDNN >= 9.13.1)"),
    "unfused": ("unfused", "the torch softmax over the scores with the sink's column "
                "(TransformerEngine UnfusedDotProductAttention: torch.cat of softmax_offset, "
                "5671fd36 backends.py lines 536-547; Megatron-Core SoftmaxOne)"),
    "fused_softmax": ("unfused", "Megatron-Core's FusedScaleMaskSoftmax runs its fused "
                      "kernel only without an offset and the torch softmax with one "
                      "(b0cc2706 megatron/core/fusions/fused_softmax.py lines 233-236, 330-333)"),
}


def cudnn_runs_sinks(version: tuple[int, ...]) -> bool:
    """Whether cuDNN ``version`` (``(major, minor, patch)``) runs a learnable softmax in its
    fused attention (:data:`CUDNN_SINKS_MIN`); older, TransformerEngine falls back to its
    unfused attention (FlashAttention is off for any softmax but the vanilla one:
    TransformerEngine 5671fd36 ``dot_product_attention/utils.py`` lines 715-717)."""
    return tuple(version[:3]) >= CUDNN_SINKS_MIN


def sink_kernel(kind: str) -> str:
    """The attention kernel that runs the stack's ``kind`` with learnable sinks
    (:data:`SINK_KERNELS`). FlashAttention-2/3 take no sink logit: refused."""
    if kind in SINK_KERNELS:
        return SINK_KERNELS[kind][0]
    if kind in ("flash2", "flash3"):
        raise ValueError(
            f"software.kernels.attention = {kind!r} with attention sinks (learnable softmax): "
            "FlashAttention takes no sink logit, and TransformerEngine turns it off for any "
            "softmax but the vanilla one (5671fd36 dot_product_attention/utils.py lines "
            "715-717), running cuDNN's fused attention (cuDNN >= 9.13.1) or its unfused one; "
            f"allowed with sinks: {sorted(SINK_KERNELS)}")
    raise ValueError(f"attention kernel {kind!r}: expected flash2, flash3, cudnn, "
                     "fused_softmax or unfused")


def attention_label(kind: str, sinks: bool = False) -> str:
    """The attention kernel as the plan line names it: ``kind``, and with sinks the kernel
    that runs them (``cudnn (sinks in kernel)``, ``unfused (sinks: torch softmax)``)."""
    if not sinks:
        return kind
    runs = sink_kernel(kind)
    how = "sinks in kernel" if runs in FLASH_KINDS else "sinks: torch softmax"
    return f"{runs} ({how})"


class FlashVariant(NamedTuple):
    """A fused attention kernel's ``variant``, parsed: kernel, pass (``fwd``/``bwd``), mask,
    and whether it applies attention dropout."""

    kernel: str
    pass_: str
    causal: bool
    dropout: bool = False


def flash_variant(kind: str, backward: bool, causal: bool, dropout: bool = False) -> str:
    """The ``variant`` of a fused attention kernel: ``kind/pass/mask``, e.g.
    ``flash2/bwd/causal``, then ``/dropout`` where it applies attention dropout
    (:func:`parse_flash_variant` reads it back)."""
    return (f"{kind}/{'bwd' if backward else 'fwd'}/{'causal' if causal else 'full'}"
            + ("/dropout" if dropout else ""))


def parse_flash_variant(variant: str) -> FlashVariant:
    """The kernel, pass, mask and dropout of a fused attention kernel's ``variant``; a bare
    kernel name (``flash2``) reads as its causal forward without dropout."""
    kernel, _, rest = variant.partition("/")
    pass_, _, rest = rest.partition("/")
    mask, _, drop = rest.partition("/")
    return FlashVariant(kernel, pass_ or "fwd", mask != "full", drop == "dropout")


def causal_fraction(s: float, block: int = FLASH_BLOCK) -> float:
    """Fraction of the ``s × s`` score blocks a causal FlashAttention kernel computes:
    ``(n + 1) / (2n)`` with ``n = ⌈s / block⌉`` (the diagonal blocks are computed whole)."""
    n = max(1, math.ceil(s / block))
    return (n + 1) / (2 * n)


def flash_forward_flops(b: float, heads: float, s: float, d: float, causal: bool = True,
                        s_k: float | None = None, window: int | None = None,
                        window_share: float = 1.0) -> float:
    """Forward FLOPs of FlashAttention for ``b`` sequences, ``heads`` query heads of
    dimension ``d``, ``s`` queries against ``s_k`` (default ``s``) keys:
    ``4·b·heads·s·s_k·d``, times :func:`causal_fraction` with a causal mask, or with a
    sliding ``window`` on a ``window_share`` of the layers, the mean of
    :func:`.window_fraction` and the causal fraction over them. A causal mask with more
    keys than queries is aligned bottom-right (the last query sees every key; FlashAttention
    >= 2.1, TransformerEngine's ``causal_bottom_right``): each query block computes the
    ``s_k − s`` keys before the square whole and the square as causal."""
    s_k = s if s_k is None else s_k
    if causal and s_k != s:
        if s_k < s:
            raise ValueError(f"causal attention with {s_k} keys < {s} queries: expected s_k >= s")
        return 4.0 * b * heads * d * s * ((s_k - s) + s * causal_fraction(s))
    frac = causal_fraction(s) if causal else 1.0
    if window is not None and causal and s_k == s:
        frac = (window_share * window_fraction(s, window, FLASH_BLOCK)
                + (1 - window_share) * frac)
    return 4.0 * b * heads * s * s_k * d * frac


def attention_kernels(kind: str, b: float, heads: float, s: float, d: float, dtype_bytes: float,
                      dropout: bool, backward: bool, dtype: str = "bf16",
                      causal: bool = True, kv_heads: float | None = None,
                      window: int | None = None, window_share: float = 1.0,
                      softmax_fp32: bool = False, s_k: float | None = None,
                      softmax_dispatch: str = "one_pass", sinks: bool = False
                      ) -> tuple[Kernel, ...]:
    """The kernels of one attention core (forward, or ``backward``) on one rank holding
    ``heads`` query heads (``kv_heads`` key/value heads, default ``heads``) of ``b`` sequences
    of length ``s`` (module docstring); ``window``, ``window_share`` as
    :func:`flash_forward_flops`; ``softmax_fp32``: the unfused softmax runs in fp32 (the
    stack's ``softmax_in_fp32``), its kernels as ``softmax_dispatch`` launches them over rows
    of ``s`` keys (the stack's, :mod:`.softmax`); ``s_k``: keys per sequence when they differ
    from the ``s`` queries (a context-parallel step; fused kernels only); ``sinks``: one
    learned softmax logit per head (GPT-OSS), run by :func:`sink_kernel` of ``kind``."""
    if sinks:
        kind = sink_kernel(kind)
    dt = dtype_bytes
    s_k = s if s_k is None else s_k
    if kind in FLASH_KINDS:
        fwd = flash_forward_flops(b, heads, s, d, causal, s_k=s_k, window=window,
                                  window_share=window_share)
        # Q O at s, K V at s_k (backward also dO dQ at s, dK dV at s_k)
        io = (4 if backward else 2) * b * (s + s_k) * heads * d * dt
        flops = fwd * (FLASH_BACKWARD_FACTOR if backward else 1.0)
        return (Kernel("flash", (s, s_k, d), b * heads, flops=flops, bytes=io, dtype=dtype,
                       variant=flash_variant(kind, backward, causal, dropout)),)
    if s_k != s:
        raise ValueError(f"attention kernel {kind!r} with {s_k} keys against {s} queries: "
                         "only the fused kinds (flash2, flash3, cudnn) take s_k")
    if kind not in ("fused_softmax", "unfused"):
        raise ValueError(f"attention kernel {kind!r}: expected flash2, flash3, cudnn, "
                         "fused_softmax or unfused")
    batch, S = b * heads, b * heads * s * s
    drop = (2 * dt + 1) * S if dropout else 0.0          # read, write, 1-byte mask
    kv = heads if kv_heads is None else kv_heads
    if not backward:
        gemms = [(s, s, d), (s, d, s)]                   # QKᵀ, P·V
    else:
        gemms = [(s, d, s), (s, s, d), (s, d, s), (s, d, s)]   # dV=Pᵀ·dO, dP=dO·Vᵀ, dQ, dK
    if kind == "fused_softmax":                          # one kernel: read + write (backward:
        mem = [(3 if backward else 2) * dt * S]          # P, dP -> dS)
    else:
        mem = [x * S for x in unfused_softmax_passes(dt, softmax_fp32, backward, s,
                                                      softmax_dispatch)]
    # the softmax's kernels carry their class (.elementwise.ELEMENTWISE_CLASSES: a device
    # may time them at their own rate, else at its score-pass rate), dropout's the scores'
    softmax = "softmax_backward" if backward else "softmax"
    dropped = (Kernel("memory", bytes=drop, dtype=dtype, variant="scores"),) if drop else ()
    sunk = _sink_column_kernels(S, dt, dtype, backward) if sinks else ()
    layout = (b * s * heads * d if not backward           # context permute().contiguous()
              else b * s * (heads + 2 * kv) * d)          # Q, K, V gradients concatenated
    return (tuple(Kernel("gemm", g, batch, dtype=dtype, variant="scores") for g in gemms)
            + tuple(Kernel("memory", bytes=m, dtype=dtype, variant=softmax) for m in mem)
            + sunk + dropped
            + (Kernel("memory", bytes=2 * dt * layout, dtype=dtype),))   # a streaming copy


def _sink_column_kernels(S: float, dt: float, dtype: str, backward: bool) -> tuple[Kernel, ...]:
    """The torch softmax's sink column over ``S`` scores (TransformerEngine 5671fd36
    backends.py lines 536-560, Megatron-Core b0cc2706 fused_softmax.py ``SoftmaxOne``:
    ``torch.cat([scores, sink])``, the softmax, ``[..., :-1]``): forward the concatenation
    (read ``S``, write ``S``; the one column more not counted); backward the slice's
    gradient, a zeroed tensor (write ``S``) the gradient is copied into (read, write ``S``);
    the concatenation's gradient is a view."""
    if backward:
        return (Kernel("memory", bytes=dt * S, dtype=dtype, variant="scores"),
                Kernel("memory", bytes=2 * dt * S, dtype=dtype, variant="scores"))
    return (Kernel("memory", bytes=2 * dt * S, dtype=dtype, variant="scores"),)


def scores_activation_bytes(kind: str, b, heads, s, dropout: bool):
    """Bytes of the ``s²`` tensors one layer keeps for its backward (16-bit): none with
    the fused kernels (only their 4-byte log-sum-exp per query row); the softmax output,
    the 1-byte dropout mask and the dropout output otherwise (Korthikanti et al. 2022, §4.1:
    ``5·a·s²·b`` with dropout, ``2·a·s²·b`` without)."""
    if kind in FLASH_KINDS:
        return 4.0 * b * heads * s
    return (5 if dropout else 2) * heads * s * s * b
