"""The local experts' GEMMs as Transformer Engine's ``GroupedLinear`` runs them on a stack
whose ``moe:`` section names ``grouped_gemm_streams`` (Megatron-Core's ``TEGroupedMLP`` with
``--moe-grouped-gemm``).

``GroupedLinear`` is not one grouped kernel: ``general_grouped_gemm`` → ``nvte_multi_tensor_gemm``
launches one cuBLAS GEMM per expert, expert ``i`` on TE's compute stream ``i mod S`` (``S`` = 4),
the streams joined to the caller's stream before and after; a CUTLASS grouped kernel runs only
with ``NVTE_USE_CUTLASS_GROUPED_GEMM=1`` on Hopper, which neither Megatron-Bridge's recipes nor
Megatron-MoE-ModelZoo's scripts set. The backward runs the data gradients of all experts, then
their weight gradients, each pass the same way. So ``e`` local experts' GEMMs of one pass run as
``⌈e/S⌉`` rounds of at most ``S`` concurrent GEMMs: each round is timed as one launch of its
GEMMs (``Kernel.batch`` = the round's size: their tiles share the SMs in waves, the GEMM model's
wave quantisation over the round's tiles), each GEMM of ``M`` = tokens per expert. With ``e ≤ S``
that is the single batched launch ddlsim priced before; with more local experts (EP8 of 128
experts: 16) the rounds leave the SMs partly idle where one launch of all 16 would not.

The host's launches: the op's host rule counts one launch per round (its kernels), so the
pass's real host work is added to the op's ``host_s`` (:func:`pass_host_s`): per GEMM the
device's launch (``host_launch_s``: TE's C++ loop, no Python per GEMM) and
:data:`TE_GEMM_HOST_S` (the layouts, descriptor, preference and heuristic TE makes afresh for
every GEMM, and cuBLASLt's own launch path), and per pass :data:`TE_PASS_HOST_S` (the events
that fork the four streams and join them), less the launches the rule already counts. Measured
on the lent H200's host (``benchmarks/device/te_gemm_host.cu``): a pass of 16 experts issues in
130-185 µs, while one GEMM of all their tokens runs 12-66 µs for Qwen3-30B-A3B's experts at
128-512 tokens each: such a pass is host-bound, not the device's rounds.

References
----------
NVIDIA/TransformerEngine v2.9 (2025-10-30): ``transformer_engine/common/util/multi_stream.cpp``
line 53 (``num_compute_streams = 4``); ``transformer_engine/common/gemm/cublaslt_gemm.cu``
lines 924-970 (``multi_stream_cublas_gemm``: one ``nvte_cublas_gemm_v2`` per GEMM on stream
``i % num_streams``) and 1015-1027 (``nvte_multi_tensor_gemm``: the cuBLAS path unless
``NVTE_USE_CUTLASS_GROUPED_GEMM`` on sm_90); ``transformer_engine/pytorch/module/
grouped_linear.py`` (``_GroupedLinear.forward``: ``general_grouped_gemm`` over ``m_splits``).
Measured: benchmarks/data/device_h200_2026-11-30/run14 (te_gemm_host.json; cuBLASLt 13.1.0,
one H200, its host 16 cores of an Intel Xeon under a VM).
NVIDIA/TransformerEngine#1386 (a TE developer, 2024-12-31: multi-stream cuBLAS chosen over
cuBLAS and CUTLASS grouped GEMM for MoE shapes). NVIDIA/Megatron-LM d7288711
``megatron/core/transformer/moe/experts.py`` ``TEGroupedMLP.forward`` (lines 327-398).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...simulator.kernels.host import launch_costs
from ..trace import Compute

__all__ = ["TE_GEMM_HOST_S", "TE_PASS_HOST_S", "stream_rounds", "multi_stream_gemms",
           "pass_host_s", "experts_pass_host", "te_grouped", "te_grouped_experts"]

#: Host seconds per GEMM of Transformer Engine v2.9's ``multi_stream_cublas_gemm`` beyond a
#: kernel launch: the slope of a pass's host issue time over 4, 8, 16 and 32 GEMMs, 8.39 µs per
#: GEMM (median of 24 fits: Qwen3-235B-A22B's and Qwen3-30B-A3B's fc1 and fc2, BF16 and FP8
#: with per-tensor scales, 128-2,048 tokens per expert; 7.19-10.23), less the same host's
#: launch of a tiny kernel, 6.50 µs (dgx-h200's ``host_launch_s``, measured there by
#: benchmarks/device/launch_time.py): 1.89 µs. The same run times the parts of one GEMM: TE's
#: whole sequence 8.36 µs, ``cublasLtMatmul`` alone with the descriptors and algorithm kept
#: 7.04 µs, the heuristic alone 0.73 µs (cuBLASLt's heuristic cache), the descriptors' making
#: and freeing 0.27 µs (medians of 24). benchmarks/device/te_gemm_host.cu (TE's per-GEMM
#: sequence rewritten from transformer_engine/common/gemm/cublaslt_gemm.cu lines 413-754 and
#: 924-977 at v2.9),
#: benchmarks/data/device_h200_2026-11-30/run14/te_gemm_host.json (2026-11-30).
TE_GEMM_HOST_S = 1.89e-6

#: Host seconds per pass beyond its GEMMs (the intercept of the same fits, median of 24: the
#: caller's event, the streams' waits on it, their events and the caller's waits on them).
TE_PASS_HOST_S = 6.0e-6


def stream_rounds(experts: int, streams: int) -> tuple[int, ...]:
    """GEMMs in each round of ``experts`` GEMMs issued round-robin on ``streams`` streams:
    ``⌈experts/streams⌉`` rounds of ``streams``, the last the remainder.

    Parameters
    ----------
    experts : int
        GEMMs of one pass (local experts).
    streams : int
        concurrent streams (``S`` ≥ 1).

    Returns
    -------
    tuple of int
        the rounds' sizes; they sum to ``experts``.
    """
    if streams < 1 or experts < 1:
        raise ValueError(f"stream_rounds needs experts >= 1 and streams >= 1, not "
                         f"{experts} and {streams}")
    return tuple(min(streams, experts - i) for i in range(0, experts, streams))


def multi_stream_gemms(op: Compute, experts: int, streams: int) -> Compute:
    """``op`` (one grouped launch of ``experts`` GEMMs per pass: its ``gemm`` kernels have
    ``batch = experts``, the backward's data and weight gradients alternating) with each GEMM
    kernel replaced by its rounds on ``streams`` streams (:func:`stream_rounds`), a round's
    data and weight gradients kept adjacent (so :func:`.combined._split_wgrad`'s even/odd split
    holds); the cast kernels before the GEMMs and the rescaling after are kept; FLOPs unchanged.

    Parameters
    ----------
    op : Compute
        the experts' op as :meth:`.moe.MoEOps._expert_compute` builds it.
    experts : int
        local experts (``E/EP``).
    streams : int
        Transformer Engine's compute streams.

    Returns
    -------
    Compute
        the op with ``len(rounds) × (GEMM kernels)`` GEMM kernels.
    """
    kernels = op.kernels or ()
    idx = [i for i, k in enumerate(kernels) if k.kind == "gemm"]
    if not idx:
        return op
    gemms = [kernels[i] for i in idx]
    bad = [k.batch for k in gemms if k.batch != experts]
    if bad:
        raise ValueError(f"op {op.name!r}: GEMM kernels of batch {bad[0]:g}, expected one "
                         f"grouped launch of {experts} experts")
    rounds = stream_rounds(experts, streams)
    # a GEMM's own bytes (a weight gradient into main_grad, .wgrad) are the round's share
    new = tuple(replace(g, batch=float(r), bytes=g.bytes * r / experts)
                for r in rounds for g in gemms)
    return replace(op, kernels=kernels[:idx[0]] + new + kernels[idx[-1] + 1:])


def pass_host_s(experts: int, streams: int, passes: int, launch: Any, host_dispatch: str) -> float:
    """Host seconds of ``passes`` GroupedLinear passes of ``experts`` GEMMs on ``streams``
    streams beyond what the op's host rule counts for their ``⌈experts/streams⌉`` rounds of
    kernels (module doc): per pass ``experts·(host_launch_s + TE_GEMM_HOST_S) +
    TE_PASS_HOST_S`` less the rounds at the rule's per-kernel host time. Nothing without the
    device's launch facts (no host model) or under CUDA graphs (no per-launch host work).

    Parameters
    ----------
    experts : int
        GEMMs of one pass (local experts).
    streams : int
        Transformer Engine's compute streams.
    passes : int
        passes in the op (a forward linear 1; its backward 2: data and weight gradients).
    launch, host_dispatch :
        the device's launch facts and the stack's dispatch mode, as
        :func:`~ddlsim.simulator.kernels.host.eager_unit_s` takes them.

    Returns
    -------
    float
        seconds (≥ 0).
    """
    if launch is None or host_dispatch == "cuda_graphs":
        return 0.0
    counted = len(stream_rounds(experts, streams)) * launch_costs(launch, host_dispatch).host_s
    per_pass = experts * (launch.host_launch_s + TE_GEMM_HOST_S) + TE_PASS_HOST_S
    return passes * max(per_pass - counted, 0.0)


def experts_pass_host(b: Any, passes: int) -> float:
    """Host seconds of ``passes`` of MoE builder ``b``'s local experts' GroupedLinear passes
    beyond their rounds' launches (:func:`pass_host_s`); 0 unless the experts run as TE's
    multi-stream grouped GEMM with more than one local expert.

    Parameters
    ----------
    b : MoEOps
        the MoE layer's builder (its ``moe`` options, ``local_experts``, ``plan.device`` and
        ``sw``).
    passes : int
        as :func:`pass_host_s`.
    """
    experts = te_grouped_experts(b)
    if experts <= 1:
        return 0.0
    return pass_host_s(experts, b.moe.gemm_streams, passes, b.plan.device.launch,
                       b.sw.host_dispatch)


def te_grouped_experts(b: Any) -> int:
    """MoE builder ``b``'s local experts where they run as Transformer Engine's multi-stream
    GroupedLinear (the stack's ``grouped_gemm_streams``, set only with grouped GEMM:
    :class:`.moeplan.MoEPlan`), else 0."""
    return b.local_experts if b.moe.gemm_streams else 0


def te_grouped(b: Any, op: Compute, experts: int, backward: bool) -> Compute:
    """``op`` (one grouped launch of ``experts`` GEMMs per pass, :meth:`.moe.MoEOps.
    _experts_linear`'s) as Transformer Engine's GroupedLinear runs it: its rounds on TE's
    streams (:func:`multi_stream_gemms`) and its passes' host work (:func:`experts_pass_host`:
    one pass forward, two backward)."""
    op = multi_stream_gemms(op, experts, b.moe.gemm_streams)
    host = experts_pass_host(b, 2 if backward else 1)
    return replace(op, host_s=op.host_s + host) if host else op
