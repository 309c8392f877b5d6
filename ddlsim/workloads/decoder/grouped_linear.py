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

The host's launches: the op's host rule counts one launch per round, not per GEMM (the C++
loop issues each GEMM at ``host_launch_s``, no Python per GEMM): ``(e − ⌈e/S⌉)·host_launch_s``
per pass less host time than the code spends (46 µs for 16 experts at 3.8 µs, against the
pass's hundreds of µs of device time, so it never binds).

References
----------
NVIDIA/TransformerEngine v2.9 (2025-10-30): ``transformer_engine/common/util/multi_stream.cpp``
line 53 (``num_compute_streams = 4``); ``transformer_engine/common/gemm/cublaslt_gemm.cu``
lines 924-970 (``multi_stream_cublas_gemm``: one ``nvte_cublas_gemm_v2`` per GEMM on stream
``i % num_streams``) and 1015-1027 (``nvte_multi_tensor_gemm``: the cuBLAS path unless
``NVTE_USE_CUTLASS_GROUPED_GEMM`` on sm_90); ``transformer_engine/pytorch/module/
grouped_linear.py`` (``_GroupedLinear.forward``: ``general_grouped_gemm`` over ``m_splits``).
NVIDIA/TransformerEngine#1386 (a TE developer, 2024-12-31: multi-stream cuBLAS chosen over
cuBLAS and CUTLASS grouped GEMM for MoE shapes). NVIDIA/Megatron-LM d7288711
``megatron/core/transformer/moe/experts.py`` ``TEGroupedMLP.forward`` (lines 327-398).
"""

from __future__ import annotations

from dataclasses import replace

from ..trace import Compute

__all__ = ["stream_rounds", "multi_stream_gemms"]


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
