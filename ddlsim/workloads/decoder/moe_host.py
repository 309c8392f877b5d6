"""The host's wait for the device in each forward dispatch of Megatron-Core's MoE layer.

Megatron-Core's token dispatchers size their buffers and all-to-all splits on the host from
token counts the router computed on the device, so the host waits for the device once per MoE
layer and forward pass (a recomputed forward too), unless the tokens are padded to capacity
(every size then known on the host). Read at NVIDIA/Megatron-LM d7288711 (2026-04-09, the
commit Megatron-Bridge v0.4.0 pins), ``megatron/core/transformer/moe/``:

==========  ================================================================================
dispatcher  where the host waits (forward); what it waits for
==========  ================================================================================
alltoall    ``token_dispatcher.py`` line 904 (``_maybe_dtoh_and_synchronize``:
            ``d2h_event.synchronize()``) at the sync point ``preprocess`` picks (lines
            519-587: ``before_ep_alltoall`` with EP or expert TP > 1, ``before_permutation_1``
            with a capacity factor, ``before_finish`` otherwise; none with
            ``moe_pad_expert_input_to_capacity``); the event was recorded after the token
            counts' copies at ``before_permutation_1`` (lines 446, 631): the host waits for
            the router and the counts' all-gather, not for permutation 1 issued after them
allgather   line 295 (``dispatch_postprocess``: ``local_map.sum(dim=0).long().cpu()``), after
            the hidden states' all-gather: the host waits for the gather
flex/DeepEP ``fused_a2a.py`` lines 104-125 (``buffer.dispatch``: "the CPU will wait for GPU's
            signal to arrive", the received counts): after the router and the layout kernel;
            always (DeepEP with padding is refused, ``deepep_no_pad``)
flex/Hybr.  ``fused_a2a.py`` lines 365-367 (``non_blocking`` only when
            ``num_permuted_tokens`` is given) and ``token_dispatcher.py`` lines 1007-1024
            (given only with padding to capacity): the blocking dispatch waits for the
            received counts
==========  ================================================================================

No backward pass waits: the all-to-all's backward reuses the forward's splits, already on the
host; DeepEP's and HybridEP's backward kernels reuse the forward's handle
(``FusedDispatch.backward``, ``HybridEPCombine``: ``num_permuted_tokens`` from the forward).
The experts' ``tokens_per_expert.tolist()`` (``experts.py`` lines 344, 817) reads counts already
on the host.

**In the trace** (:func:`add_dispatch_sync`): two ops on a ``host`` stream, ``*.dispatch.sync``
— the host's wait, which starts when the device op it waits for has finished and lasts the
round trip of the wake-up (:data:`SYNC_WAKE_S`) — then ``*.dispatch.issue``, the torch
operations the host runs before it launches the dispatch again (:data:`DispatchSync.issue_ops`,
timed by the device's host rule, :func:`~ddlsim.simulator.kernels.device.op_time`: ``n`` host
operations of no device time take ``n·h``); the dispatch (the op after the wait) starts only
once the issue has ended. The device idles meanwhile unless it still has work issued before the
wait (alltoall: permutation 1). What runs on the host before the wait (the router's and the
dispatcher's Python) is not counted: no published host time of it was found, and ddlsim's host
rule charges each op's launches already.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..trace import Compute, Kernel, Op

__all__ = ["DispatchSync", "DISPATCH_SYNCS", "SYNC_WAKE_S", "dispatch_sync",
           "add_dispatch_sync", "node_with_sync", "sync_ops"]

#: Seconds from the device's completion of the awaited work to the host running again after a
#: device→host copy and its event's synchronisation: a PyTorch microbenchmark of a
#: device→host round trip, 26.11 µs on bare-metal Linux with an RTX 3090
#: (jingyaogong/minimind PR #837, comment of 2026-09-03, ``scripts/bench_moe.py --mode
#: sync-probe``; 116 µs under WSL2). No Hopper figure was found; benchmarks/device measures it.
SYNC_WAKE_S = 26.11e-6


@dataclass(frozen=True)
class DispatchSync:
    """One dispatcher's host wait in a forward pass: whether the plan has it (``waits``),
    which op it waits for (``after``: ``"router"``, the last compute op before the dispatch,
    or ``"gather"``, the dispatch collective itself), how many torch operations the host runs
    after it before the next launch (``issue_ops``), and where the code says so (``source``)."""

    waits: Callable[[Any], bool]
    after: str
    issue_ops: int
    source: str


#: dispatcher (``flex`` by backend) → its host wait (Megatron-LM d7288711; module docstring)
DISPATCH_SYNCS: dict[str, DispatchSync] = {
    "alltoall": DispatchSync(
        lambda plan: not plan.pad, "router", 3,
        "token_dispatcher.py lines 519-587, 904; issue: tensor_parallel/mappings.py "
        "_AllToAll.forward lines 433-444 (contiguous, new_empty, all_to_all_single)"),
    "allgather": DispatchSync(
        lambda plan: True, "gather", 3,
        "token_dispatcher.py lines 295-302; issue: tokens_per_expert.sum().item() on the "
        "host copy, moe_utils.permute's output allocation and launch"),
    "deepep": DispatchSync(
        lambda plan: True, "router", 4,
        "fused_a2a.py lines 104-125; issue: DeepEP Buffer.dispatch allocates recv_x, "
        "recv_topk_idx, recv_topk_weights and launches the dispatch kernel"),
    "hybridep": DispatchSync(
        lambda plan: not plan.pad, "router", 4,
        "fused_a2a.py lines 365-384, token_dispatcher.py lines 1007-1024; issue: the "
        "dispatched hidden states', probabilities' and counts' allocations and the launch"),
}


def dispatch_sync(plan: Any) -> DispatchSync | None:
    """The host wait of a resolved MoE plan's forward dispatch (:data:`DISPATCH_SYNCS`), or
    None when its dispatcher does not wait (padding to capacity).

    Parameters
    ----------
    plan : MoEPlan
        the resolved MoE options (:class:`.moeplan.MoEPlan`).

    Returns
    -------
    DispatchSync or None
    """
    key = plan.flex_backend if plan.dispatcher == "flex" else plan.dispatcher
    sync = DISPATCH_SYNCS.get(key)
    return sync if sync is not None and sync.waits(plan) else None


def sync_ops(pre: str, sync: DispatchSync, dtype: str) -> tuple[Compute, Compute]:
    """The host's wait and its issue as two compute ops for the ``host`` stream: the wait
    (``seconds`` = :data:`SYNC_WAKE_S`) and the issue (``issue_ops`` operations with no
    device time, timed by the device's host rule).

    Parameters
    ----------
    pre : str
        the ops' name prefix (``fwd``, ``recompute``).
    sync : DispatchSync
        the dispatcher's wait.
    dtype : str
        the ops' dtype (no FLOPs: only labels them).

    Returns
    -------
    tuple of Compute
        ``(wait, issue)``.
    """
    wait = Compute(f"{pre}.dispatch.sync", 0.0, kind="elementwise", dtype=dtype,
                   seconds=SYNC_WAKE_S)
    issue = Compute(f"{pre}.dispatch.issue", 0.0, kind="elementwise", dtype=dtype,
                    kernels=(Kernel("memory"),) * sync.issue_ops)
    return wait, issue


def add_dispatch_sync(ops: Any, pre: str, sync: DispatchSync | None, awaited: int | None,
                      dtype: str) -> tuple[int, ...]:
    """Append the host's wait for op ``awaited`` and its issue to ``ops`` (an
    :class:`~.partition.base.OpList`) on the ``host`` stream.

    Parameters
    ----------
    ops : OpList
        the layer body being built.
    pre : str
        the ops' name prefix.
    sync : DispatchSync or None
        the dispatcher's wait (None: nothing is added).
    awaited : int or None
        index of the op the host waits for.
    dtype : str
        the ops' dtype label.

    Returns
    -------
    tuple of int
        the deps the dispatch's first op must add (the issue), or ``()`` without a wait.
    """
    if sync is None or awaited is None:
        return ()
    wait, issue = sync_ops(pre, sync, dtype)
    w = ops.add(wait, "host", (awaited,))
    return (ops.add(issue, "host", (w,)),)


def node_with_sync(pre: str, sync: DispatchSync | None, dtype: str,
                   dispatch: list[Op]) -> list[Op]:
    """A combined-1F1B forward ``dispatch`` node (:mod:`.combined`) with the host's wait and
    issue first, on the ``host`` stream: the node's first op waits for the node before it
    (the ``attn`` node, whose router gives the counts), and the dispatch's first collective
    waits for the issue. Without a wait (or an empty node), ``dispatch`` as it is.

    Parameters
    ----------
    pre : str
        the ops' name prefix.
    sync : DispatchSync or None
        the dispatcher's wait.
    dtype : str
        the ops' dtype label.
    dispatch : list of Op
        the node's collectives, with no deps.

    Returns
    -------
    list of Op
    """
    if sync is None or not dispatch:
        return dispatch
    wait, issue = sync_ops(pre, sync, dtype)
    first, *rest = dispatch
    return [Op(wait, "host"), Op(issue, "host", (0,)),
            Op(first.payload, first.stream, (1,), first.repeat), *rest]
