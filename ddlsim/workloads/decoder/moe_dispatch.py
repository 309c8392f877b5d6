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
* the backward of a dispatch is the combine kernel and vice versa.

References
----------
NVIDIA/Megatron-LM d7288711 (2026-04-09) ``megatron/core/transformer/moe/token_dispatcher.py``
lines 947-1383 (``_HybridEPManager``, ``_DeepepManager``: ``get_permuted_hidden_states_by_experts``
lines 1287-1320, ``MoEFlexTokenDispatcher``), ``fused_a2a.py`` lines 69-207 and 332-440.
"""

from __future__ import annotations

from typing import Any

from ...simulator.collectives.flex import flex_algorithm, flex_traffic
from ..trace import Collective

__all__ = ["flex_ops", "flex_received_tokens", "flex_permute_bytes"]


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


def flex_ops(builder: Any, pre: str, backward: bool) -> tuple[list[Collective],
                                                              list[Collective], tuple]:
    """The flex dispatcher's ``(first, second, (permute, unpermute))`` of one MoE layer:
    forward, the dispatch kernel then the combine kernel; backward (``combine`` gradient
    first), the dispatch kernel for the combine's gradient and the combine kernel for the
    dispatch's. Each is one ``all_to_all`` of the alltoall dispatcher's bytes (``T·k·h``)
    on ``tp_ep``, timed by the backend's kernel for the plan's routing (group-limited routing
    named in the algorithm: :func:`~ddlsim.simulator.collectives.flex.flex_algorithm`).

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
    group = "tp_ep" if builder.split_experts else "tp"
    nbytes = builder.tokens() * sh.top_k * sh.hidden * builder.dt

    def kernel(name: str, which: str) -> list[Collective]:
        if builder.etp * builder.ep == 1:
            return []
        algo = flex_algorithm(plan.flex_backend, which, sh.top_k, sh.experts, builder.etp,
                              plan.groups, plan.topk_groups)
        return [Collective(name, "all_to_all", group, nbytes, algorithm=algo)]

    first = kernel(f"{pre}.{'combine' if backward else 'dispatch'}", "dispatch")
    second = kernel(f"{pre}.{'dispatch' if backward else 'combine'}", "combine")
    perm = (flex_permute_bytes(builder, backward), flex_permute_bytes(builder, not backward))
    return first, second, perm
