"""The flex token dispatcher's ops in an MoE layer (Megatron-Core ``MoEFlexTokenDispatcher``
with the DeepEP or HybridEP backend): one fused dispatch and one fused combine over the
``tp_ep`` group (expert TP × EP ranks), each timed as the backend's kernel, which sends a
token once per destination node and once per destination GPU
(:mod:`ddlsim.simulator.collectives.flex`), and the permutation passes around them.

What differs from the alltoall dispatcher (docs/moe.md, "Dispatchers"):

* no permutation before the dispatch: the kernel reads the tokens where they are (DeepEP's
  ``get_dispatch_layout``; HybridEP's routing map) and no expert-TP all-gather or
  reduce-scatter (the routing map is replicated over expert TP, so each expert-TP rank
  receives the tokens itself);
* after it, one permutation of the ``R`` distinct tokens received into their ``T·k`` expert
  copies, in the local experts' order (DeepEP: ``moe_utils.permute`` over the received
  tokens, fused with ``--moe-permute-fusion``; HybridEP: ``dispatch_with_permute``); the
  un-permutation mirrors it before the combine;
* the backward of a dispatch is the combine kernel and vice versa;
* HybridEP's forward dispatch first gathers every member's routing map (its metadata
  preprocessing, :func:`hybridep_routing_map_gather`), which the published kernel rates do
  not include.

The alltoall dispatcher's own pre-process, its token counts' all-gather before the host's
wait, is here too (:func:`alltoall_counts`).

References
----------
NVIDIA/Megatron-LM d7288711 (2026-04-09) ``megatron/core/transformer/moe/token_dispatcher.py``
lines 947-1383 (``_HybridEPManager``, ``_DeepepManager``: ``get_permuted_hidden_states_by_experts``
lines 1287-1320, ``MoEFlexTokenDispatcher``), ``fused_a2a.py`` lines 69-207 and 332-440.
deepseek-ai/DeepEP hybrid-ep 7febc6e ``deep_ep/hybrid_ep_buffer.py`` (``dispatch_with_permute``:
without a handle, ``metadata_preprocessing`` first), ``csrc/hybrid_ep/hybrid_ep.cu``
``metadata_preprocessing`` and ``csrc/hybrid_ep/executor/executor.cu`` lines 22-55
(``allgather_routing_map``), ``tests/test_hybrid_ep.py`` lines 262-268 (the timed dispatch
passes the handle).
"""

from __future__ import annotations

from typing import Any

from ...simulator.collectives.flex import flex_algorithm, flex_traffic
from ..trace import Collective, Compute, Kernel

__all__ = ["INDEX_ADD", "flex_ops", "flex_received_tokens", "flex_permute_bytes",
           "hybridep_routing_map_gather", "alltoall_counts"]

#: the element-wise class of the unfused permutation's backward (index_select's gradient, an
#: index_add_ of the routed copies into their tokens' rows), which a device may time at its own
#: achieved rate (``device.elementwise_efficiency``; simulator/kernels/elementwise.py)
INDEX_ADD = "index_add"


def _group(builder: Any) -> tuple[int, str]:
    """The dispatcher's ranks ``p = etp·ep`` and its group (``tp_ep``; ``tp`` when the experts
    are not split)."""
    return builder.etp * builder.ep, "tp_ep" if builder.split_experts else "tp"


def flex_received_tokens(builder: Any) -> float:
    """``R``: distinct tokens one rank receives per dispatch: ``p·q_gpu·T`` over the
    ``p = etp·ep`` ranks of the group (:func:`~ddlsim.simulator.collectives.flex.flex_traffic`,
    node layout aside; balanced routing: check_moe_plan refuses a hot rank with flex), under
    the plan's group-limited routing where it has one (fewer ranks reached per token).

    Parameters
    ----------
    builder : the stage builder (:class:`~.moe.MoEOps`): its shape, ``etp``, ``ep``, tokens.

    Returns
    -------
    float
        Tokens.
    """
    sh, p, plan = builder.shape, builder.etp * builder.ep, builder.moe
    return flex_traffic(builder.tokens(), sh.experts, sh.top_k, builder.etp, p, p,
                        plan.groups, plan.topk_groups).nvl_bytes


def flex_permute_bytes(builder: Any, unpermute: bool) -> float:
    """Traffic of the permutation after the dispatch (or the un-permutation before the
    combine): the ``R`` received tokens into the ``E/EP`` local experts' ``n`` copies each.
    Fused (HybridEP always; DeepEP with ``permute_fusion``): one kernel reading one side and
    writing the other, ``(R + copies)·h``; unfused: a gather of the copies (read + write), and
    to un-permute the probabilities' product and a scatter-add back to ``R`` (Megatron-Core
    ``moe_utils.permute``/``unpermute``, as :meth:`~.moe.MoEOps._permute_bytes` counts them).

    Parameters
    ----------
    builder : the stage builder (:class:`~.moe.MoEOps`).
    unpermute : the pass before the combine (True) or after the dispatch (False).

    Returns
    -------
    float
        Bytes read and written.
    """
    h, dt = builder.shape.hidden, builder.dt
    R = flex_received_tokens(builder)
    copies = builder.local_experts * builder.expert_tokens()
    if builder.moe.permute_fusion or builder.moe.flex_backend == "hybridep":
        return (R + copies) * h * dt
    return (2 * copies + (2 * copies + copies + R if unpermute else 0)) * h * dt


#: bytes per routing-map entry: Megatron-Core's routing map is a boolean tensor
#: (``_HybridEPManager.setup_metadata``; HybridEP asserts ``routing_map.dtype == torch.bool``,
#: hybrid_ep_buffer.py ``dispatch_with_permute``), one byte per entry in torch
ROUTING_MAP_ENTRY_BYTES = 1


def hybridep_routing_map_gather(builder: Any, pre: str) -> list[Collective]:
    """HybridEP's routing-map all-gather before a forward dispatch: the NCCL
    ``all_gather_into_tensor`` of every member's ``[T, E]`` boolean routing map over the
    dispatcher's group, ``p·T·E`` bytes gathered (nccl-tests convention: the output).

    Megatron-Core's ``HybridEPDispatch.forward`` calls ``dispatch_with_permute`` without a
    handle, so every forward dispatch (a recomputed one too) runs HybridEP's metadata
    preprocessing: the routing maps' all-gather (NCCL across nodes, and inside one unless the
    custom all-gather is enabled, which Megatron-Core does not ask for), then a scan kernel
    over the gathered map. The backward's dispatch (the combine's gradient) passes the
    forward's handle and skips both, as does the kernel benchmark the rates of
    :data:`~ddlsim.simulator.collectives.flex.KERNELS` come from. The scan (108 SMs reading
    ``p·T·E`` bytes: microseconds) is not charged.

    Parameters
    ----------
    builder : the stage builder (:class:`~.moe.MoEOps`): its shape, ``etp``, ``ep``, tokens.
    pre : the ops' name prefix (``fwd``, ``recompute``).

    Returns
    -------
    list of Collective
        The all-gather on ``tp_ep`` (``tp`` when the experts are not split), or none for a
        group of one.

    References
    ----------
    deepseek-ai/DeepEP hybrid-ep 7febc6e ``csrc/hybrid_ep/executor/executor.cu`` lines 22-55
    (``allgather_routing_map``: ``torch.distributed.all_gather_into_tensor`` of the bool map
    into ``[T·group_size, E]``), ``deep_ep/hybrid_ep_buffer.py`` (``dispatch_with_permute``);
    NVIDIA/Megatron-LM d7288711 ``fused_a2a.py`` ``HybridEPDispatch.forward`` (no handle)
    and ``backward``/``HybridEPCombine.backward`` (the handle).
    """
    p, group = _group(builder)
    if p == 1:
        return []
    nbytes = p * builder.tokens() * builder.shape.experts * ROUTING_MAP_ENTRY_BYTES
    return [Collective(f"{pre}.dispatch.routing_map", "all_gather", group, nbytes)]


#: bytes of one token count: Megatron-Core keeps the per-expert counts as ``torch.long``
#: (d7288711 ``token_dispatcher.py`` line 513, ``routing_map.sum(dim=0).long()``)
COUNT_BYTES = 8

#: the small kernels of the alltoall dispatcher's pre-process over the gathered counts
#: (d7288711 ``token_dispatcher.py`` lines 531-563: the input splits' sum, the local experts'
#: slice made ``contiguous``, the sums per rank, per TP rank and per local expert; with the
#: routing map's sum, the six kernels counted by running that code: ``benchmarks/moe_host_ops.py``)
COUNT_KERNELS = 5


def alltoall_counts(builder: Any, pre: str) -> list:
    """The alltoall dispatcher's pre-process of one forward (or recomputed) MoE layer before
    the host's wait: the routing map's sum into per-expert token counts, their all-gather over
    the dispatcher's group and the sums that turn them into the all-to-all's splits.

    ``MoEAlltoAllTokenDispatcher.preprocess`` sums the ``[T, E]`` boolean routing map into
    ``E`` counts (``torch.long``), all-gathers them over ``tp_ep``
    (``gather_from_sequence_parallel_region``: ``p·E·8`` bytes gathered, nccl-tests
    convention), and reduces the gathered counts to the input and output splits on the device;
    the host then waits for them (``before_ep_alltoall``, :mod:`.moe_host`). With one rank in
    the group there is no gather and no split (the counts' sum only).

    Parameters
    ----------
    builder : the stage builder (:class:`~.moe.MoEOps`): its shape, ``etp``, ``ep``, tokens.
    pre : the ops' name prefix (``fwd``, ``recompute``).

    Returns
    -------
    list
        The counts' sum (a :class:`Compute`), then, for a group of more than one rank, the
        all-gather (:class:`Collective`) and the splits' sums (:class:`Compute`).

    References
    ----------
    NVIDIA/Megatron-LM d7288711 ``megatron/core/transformer/moe/token_dispatcher.py`` lines
    512-566 (``preprocess``); ``benchmarks/data/moe_host_ops/`` (the ops counted by running
    it on CPU: ``_allgather_base_``, five ``sum``s and a ``contiguous``).
    """
    (p, group), experts, dtype = _group(builder), builder.shape.experts, builder.dtype
    summed = (builder.tokens() * ROUTING_MAP_ENTRY_BYTES + COUNT_BYTES) * experts
    ops: list = [Compute(f"{pre}.dispatch.counts", 0.0, summed, kind="elementwise",
                         dtype=dtype, kernels=(Kernel("memory", bytes=summed, dtype=dtype),))]
    if p == 1:
        return ops
    gathered = p * experts * COUNT_BYTES
    ops.append(Collective(f"{pre}.dispatch.counts_gather", "all_gather", group, gathered))
    ops.append(Compute(f"{pre}.dispatch.splits", 0.0, COUNT_KERNELS * gathered,
                       kind="elementwise", dtype=dtype,
                       kernels=tuple(Kernel("memory", bytes=gathered, dtype=dtype)
                                     for _ in range(COUNT_KERNELS))))
    return ops


def flex_ops(builder: Any, pre: str, backward: bool) -> tuple[list[Collective],
                                                              list[Collective], tuple]:
    """The flex dispatcher's ``(first, second, (permute, unpermute))`` of one MoE layer:
    forward, the dispatch kernel then the combine kernel; backward (``combine`` gradient
    first), the dispatch kernel for the combine's gradient and the combine kernel for the
    dispatch's. Each is one ``all_to_all`` of the alltoall dispatcher's bytes (``T·k·h``)
    on ``tp_ep``, timed by the backend's kernel for the plan's routing (group-limited routing
    named in the algorithm: :func:`~ddlsim.simulator.collectives.flex.flex_algorithm`).
    HybridEP's forward dispatch is preceded by its routing-map all-gather
    (:func:`hybridep_routing_map_gather`).

    Parameters
    ----------
    builder : the stage builder (:class:`~.moe.MoEOps`).
    pre : the ops' name prefix (``fwd``, ``recompute``, ``bwd``).
    backward : the backward's collectives (kernels swapped, gradients' order).

    Returns
    -------
    tuple
        ``(first, second, (bytes after the first, bytes before the second))``: the
        collectives before and after the experts, and the permutation passes beside them.
    """
    sh, plan = builder.shape, builder.moe
    p, group = _group(builder)
    nbytes = builder.tokens() * sh.top_k * sh.hidden * builder.dt

    def kernel(name: str, which: str) -> list[Collective]:
        if p == 1:
            return []
        algo = flex_algorithm(plan.flex_backend, which, sh.top_k, sh.experts, builder.etp,
                              plan.groups, plan.topk_groups)
        return [Collective(name, "all_to_all", group, nbytes, algorithm=algo)]

    first = kernel(f"{pre}.{'combine' if backward else 'dispatch'}", "dispatch")
    if plan.flex_backend == "hybridep" and not backward:   # metadata preprocessing first
        first = hybridep_routing_map_gather(builder, pre) + first
    second = kernel(f"{pre}.{'dispatch' if backward else 'combine'}", "combine")
    perm = (flex_permute_bytes(builder, backward), flex_permute_bytes(builder, not backward))
    return first, second, perm
