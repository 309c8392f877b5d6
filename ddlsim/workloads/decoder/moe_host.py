"""The host's waits for the device in the forward of Megatron-Core's MoE layer, and the host
work between them.

Megatron-Core's token dispatchers size their buffers and all-to-all splits on the host from
token counts computed on the device, so the host waits for the device in every MoE layer's
forward (a recomputed forward too), unless the tokens are padded to capacity (every size then
known on the host). Read at NVIDIA/Megatron-LM d7288711 (2026-04-09, the commit
Megatron-Bridge v0.4.0 pins), ``megatron/core/transformer/moe/``:

===========  =====================================================================================
dispatcher   where the host waits (forward) and for what
===========  =====================================================================================
alltoall     ``token_dispatcher.py`` line 904 (``_maybe_dtoh_and_synchronize``:
             ``d2h_event.synchronize()``) at the sync point ``preprocess`` picks (lines 519-587:
             ``before_ep_alltoall`` with EP or expert TP > 1, ``before_permutation_1`` with a
             capacity factor, ``before_finish`` otherwise; none with
             ``moe_pad_expert_input_to_capacity``); the event is recorded after the counts'
             copies at ``before_permutation_1`` (lines 446, 631): the host waits for the router
             and the counts' all-gather, not for permutation 1 issued after them
allgather    line 295 (``dispatch_postprocess``: ``local_map.sum(dim=0).long().cpu()``), after the
             hidden states' all-gather: the host waits for the gather
flex/DeepEP  ``fused_a2a.py`` lines 104-125 (``buffer.dispatch``: "the CPU will wait for GPU's
             signal to arrive", the received counts), after the router; then, once the tokens
             have arrived, three more in ``_DeepepManager._indices_to_multihot``
             (``token_dispatcher.py`` lines 1225, 1226, 1230: ``indices[mask]``,
             ``repeat_interleave`` of a device tensor, ``probs[mask]``), the path taken unless
             ``is_experimental_enabled()`` (off by default) and permute fusion (lines 1288-1295);
             always (DeepEP with padding is refused, ``deepep_no_pad``)
flex/HybrEP  ``fused_a2a.py`` lines 365-367 (``non_blocking`` only when ``num_permuted_tokens`` is
             given) and ``token_dispatcher.py`` lines 1007-1024 (given only with padding to
             capacity): the blocking dispatch waits for the received counts
===========  =====================================================================================

No backward pass waits: the all-to-all's backward reuses the forward's splits, already on the
host; DeepEP's and HybridEP's backward kernels reuse the forward's handle
(``FusedDispatch.backward``, ``HybridEPCombine``: ``num_permuted_tokens`` from the forward).
The experts' ``tokens_per_expert.tolist()`` (``experts.py`` lines 344, 817) reads counts already
on the host.

**Host operations, counted** in the same code, one per call into torch (a torch function or
tensor method, an autograd ``Function.apply``, a Transformer Engine or DeepEP entry point, a
``torch.distributed`` call, a stream or event call; not what runs inside TE or DeepEP), with the
fused router and permutation the validated runs use (the unfused router's torch fallbacks add
:func:`.moe_router.router_host_calls`; the unfused permutation's are not counted), aux-loss
balancing, no shared experts, expert TP 1 (:data:`DISPATCHER_HOST`). ``issue_ops`` are the
operations from a wait's return to the next launch, while the device has nothing left to do;
``work_ops`` the rest of the layer's forward MoE code, which the host runs ahead of the device
between one layer's last wait and the next layer's first, with the layer's Transformer Engine
linear modules at their published host time (:data:`TE_LINEAR_HOST_S`).

**In the trace** (non-overlapped layers, :meth:`.moe.MoEOps._moe_block`): on a ``host`` stream,
per wait ``*.dispatch.sync`` (from the awaited device op's end and a free host, ``wakes`` ×
:data:`SYNC_WAKE_S`) and ``*.dispatch.issue`` (``issue_ops``), before the next device op. After
the last wait the host's lead is nothing, so the work up to the combine is laid step by step
(:class:`.moe_host_chain.HostChain`, ``chain``): each step (``*.<op>.host``, its TE linear
``*.host.te``) before the device op it launches (fc1, fc2, the combine), which waits for it.
The rest of the work (``*.moe.host``, ``*.moe.host.te``: the next layer's attention, router and
dispatch pre-processing) runs ahead of the device (no deps) and binds only where it outlasts
the device's work up to the next wait. The backward, which never waits, carries the experts'
per-expert host work (``bwd.experts.host``) and, measured, the router's, dispatch's and
combine's (``bwd.moe.host``), no deps (:mod:`.moe_host_chain`). Host operations are timed by
the device's host rule (:func:`~ddlsim.simulator.kernels.device.op_time`: ``n·h``), except
the alltoall dispatcher's router, dispatch and combine calls: their seconds per call measured
in Megatron-LM's own code (``host_s``, :func:`.moe_host_measured.measured_host`); both engines
time them alike.
Under Megatron-Core's combined 1F1B (:mod:`.combined`) the waits open the forward's
``dispatch`` and ``mlp`` nodes; after a ``dispatch`` node's wait (alltoall, HybridEP) all the
work follows the last issue with no deps; DeepEP's waits in the ``mlp`` node synchronise the
compute stream, which they leave empty, so there the chain's steps gate fc1 and fc2
(:func:`.moe_host_chain.node_with_waits`); the backward nodes carry no host work.
ZeRO-3's per-layer units, which run on one stream (:meth:`.moe.MoEOps.moe_layer_payloads`),
leave the host ops out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..trace import Compute, Kernel
from .moe_host_measured import measured_host
from .moe_router import router_host_calls

__all__ = ["HostWait", "HostStep", "DispatcherHost", "DISPATCHER_HOST", "SYNC_WAKE_S",
           "TE_LINEAR_HOST_S", "TE_LINEARS_FORWARD", "dispatcher_host", "host_op", "work_op",
           "wait_ops", "layer_work", "add_waits"]

#: Seconds from the device's completion of the awaited work to the host running again after a
#: device→host copy and its synchronisation: a PyTorch microbenchmark of the round trip on a
#: Hopper GPU, 17.87 µs on the lent H200 (benchmarks/device/sync_wake.py's ``item`` probe: a
#: tiny kernel then ``.item()``, the median of 2,000 trials with the device idle before each;
#: benchmarks/data/device_h200_2026-11-30/run1/sync.json, torch 2.11, its host a KVM guest of
#: an Intel Xeon). The round trip includes one launch and the tiny kernel, charged here whole,
#: so the wake is an upper bound by about that. The same probe read 26.11 µs on bare metal
#: with an RTX 3090 (jingyaogong/minimind PR #837, comment of 2026-09-03, ``scripts/bench_moe.py
#: --mode sync-probe``), the figure used before the H200 measured it; the alltoall
#: dispatcher's own pattern (a side-stream copy, its event recorded and synchronised: the
#: ``event`` probe) read 34.73 µs there, its extra launches being host work the dispatcher's
#: counted issue operations already carry.
SYNC_WAKE_S = 17.87e-6

#: Host seconds of one Transformer Engine linear module's forward in Megatron-Core:
#: ``TEColumnParallelLinear``, BF16, TP 1, 115 µs per forward pass after the optimisations of
#: NVIDIA/TransformerEngine PR #1191 (2024-09-18; 140 µs before them, Megatron-Core's own
#: ``ColumnParallelLinear`` 74 µs). Applied to each linear module of the MoE layer's forward
#: (:data:`TE_LINEARS_FORWARD`); TE's grouped linears have extra per-GEMM host work
#: (TransformerEngine issue #1499: ``torch.split``, two ``torch.empty`` per GEMM) not counted.
TE_LINEAR_HOST_S = 115e-6

#: Transformer Engine linear modules in one MoE layer's forward (Megatron-LM d7288711
#: ``models/gpt/gpt_layer_specs.py`` lines 296-330, the TE spec with experts, and
#: ``moe_module_specs.py``: ``linear_qkv`` TELayerNormColumnParallelLinear, ``linear_proj``
#: TERowParallelLinear, the experts' ``linear_fc1``/``linear_fc2`` TE grouped linears; the core
#: attention and the norms are not linear modules and are not counted)
TE_LINEARS_FORWARD = 4

@dataclass(frozen=True)
class HostWait:
    """One wait of the host in a forward MoE layer: for what (``after``: ``"router"``, the
    last compute op before the dispatch, or ``"dispatch"``, the dispatch's collectives), how
    many wake-ups it chains (``wakes``) and how many host operations follow it before the next
    launch (``issue_ops``; ``parts``: by part of the layer, where measured host seconds exist:
    :mod:`.moe_host_chain`)."""

    after: str
    wakes: int
    issue_ops: int
    parts: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class HostStep:
    """Host work after a forward layer's last wait that ends with the launch of one device op
    of the expert path and the combine (``issues``: that op's name after its prefix, e.g.
    ``experts.fc1``): ``ops`` counted calls into torch (``parts``: by part), ``te``
    Transformer Engine linear modules (:data:`TE_LINEAR_HOST_S` each)."""

    issues: str
    ops: int
    te: int = 0
    parts: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class DispatcherHost:
    """A dispatcher's host side in one forward MoE layer: whether the plan waits at all
    (``waits_when``), its ``waits`` in order, the other counted host operations
    (``work_ops``, with the :data:`TE_LINEARS_FORWARD` linear modules besides), where each
    was read and counted (``source``), and the part of that work (``chain``, in issue order)
    the host runs between the last wait and the combine, each step before the device op it
    launches. ``work_parts``: ``work_ops`` by part of the layer (router, dispatch, experts,
    combine; empty where not split), whose parts with measured host seconds
    (``measured``, a :class:`.moe_host_measured.MeasuredHost`: the alltoall dispatcher's) are
    charged those instead of the count × host rule (:func:`work_op`)."""

    waits_when: Callable[[Any], bool]
    waits: tuple[HostWait, ...]
    work_ops: int
    source: str
    chain: tuple[HostStep, ...] = ()
    work_parts: tuple[tuple[str, int], ...] = ()
    measured: Any = None

    def __post_init__(self) -> None:
        ops, te = sum(s.ops for s in self.chain), sum(s.te for s in self.chain)
        if ops > self.work_ops or te > TE_LINEARS_FORWARD:
            raise ValueError(f"host chain of {ops} operations and {te} TE linears exceeds the "
                             f"layer's {self.work_ops} and {TE_LINEARS_FORWARD}")
        split = [(self.work_ops, self.work_parts), *((w.issue_ops, w.parts) for w in self.waits),
                 *((s.ops, s.parts) for s in self.chain)]
        if self.work_parts and any(n != sum(c for _, c in parts) for n, parts in split):
            raise ValueError(f"host operations {[n for n, _ in split]} are not the sums of their "
                             f"parts {[parts for _, parts in split]}")


def _experts(before_fc1: int) -> tuple[HostStep, HostStep]:
    """fc1's and fc2's steps after the last wait, ``before_fc1`` dispatcher calls first:
    Megatron's ``TEGroupedMLP.forward`` (``experts.py`` lines 344-380: ``tolist()`` and
    ``unsqueeze`` of the probs before fc1, ``bias_act_func`` before fc2) with the experts' two
    TE grouped linears. A step gates the ops the device could reach before the host (the
    GEMMs, the combine); the calls launching the short ops between them (sort, act, unsort)
    join the next step."""
    return (HostStep("experts.fc1", before_fc1 + 2, 1,
                     (("dispatch", before_fc1), ("experts", 2)) if before_fc1 else
                     (("experts", 2),)),
            HostStep("experts.fc2", 1, 1, (("experts", 1),)))


#: dispatcher (``flex`` by backend) → its host side (Megatron-LM d7288711; module docstring)
DISPATCHER_HOST: dict[str, DispatcherHost] = {
    "alltoall": DispatcherHost(
        lambda plan: not plan.pad, (HostWait("router", 1, 4, (("dispatch", 4),)),), 70,
        "wait: token_dispatcher.py lines 519-587, 904; issue: the tokens' all_to_all "
        "(tensor_parallel/mappings.py _AllToAll lines 422-444: apply, contiguous, new_empty, "
        "all_to_all_single); work: router 16 (router.py 681-709, 587-673; moe_utils.py "
        "227-246, 1231-1241, 1376-1393), dispatch_preprocess 36 (token_dispatcher.py 497-587, "
        "600-645, 867-907), the probs' all_to_all 4 (668-677), dispatch_postprocess 2 "
        "(680-748), experts 3 (experts.py 330-400, less the grouped linears: "
        "TE_LINEAR_HOST_S), combine_preprocess 3, token_combine 4, "
        "combine_postprocess 2 (751-854)",
        (*_experts(2), HostStep("combine", 3 + 4, 0, (("combine", 7),))),
        (("router", 16), ("dispatch", 36 + 4 + 2), ("experts", 3), ("combine", 3 + 4 + 2))),
    "allgather": DispatcherHost(
        lambda plan: True, (HostWait("dispatch", 1, 3),), 44,
        "wait: token_dispatcher.py line 295; issue: sum().item() of the host copy, permute; "
        "work: router 16, the hidden states', probs' and routing map's all-gathers 9, "
        "dispatch_postprocess 6, the local probs 5, experts 3, combine 5 (lines 180-330)",
        (*_experts(0), HostStep("scatter", 5))),
    "deepep": DispatcherHost(
        lambda plan: True, (HostWait("router", 1, 4), HostWait("dispatch", 3, 8)), 45,
        "waits: fused_a2a.py lines 104-125, token_dispatcher.py 1225, 1226, 1230; issues: "
        "Buffer.dispatch's three allocations and launch; arange, sum, repeat_interleave, "
        "index_put, masked index, index_put, bool, permute (1203-1232, 1287-1320); work: "
        "router 16, dispatch_preprocess 12 (1160-1171, 1390-1411), FusedDispatch to the wait 3, "
        "after it 2 (fused_a2a.py 73-137), multihot before its first wait 3, token counts 1, "
        "experts 3, un-permutation 1 and combine 4 (1322-1333, fused_a2a.py 163-190)",
        (*_experts(1), HostStep("combine", 1 + 4))),
    "hybridep": DispatcherHost(
        lambda plan: not plan.pad, (HostWait("router", 1, 4),), 35,
        "wait: fused_a2a.py lines 365-384, token_dispatcher.py 1007-1024; issue: the "
        "dispatched tensors' allocations and the launch; work: router 16, dispatch_preprocess "
        "11 (1007-1026, 1390-1411), HybridEPDispatch.apply 1, token count 1, experts 3, "
        "combine 3 (1063-1081, fused_a2a.py 409-440)",
        (*_experts(1), HostStep("combine", 3))),
}


def dispatcher_host(plan: Any) -> DispatcherHost | None:
    """The host side of a resolved MoE plan's forward (:data:`DISPATCHER_HOST`, its work with
    the router's torch fallbacks' calls when the router is not fused:
    :func:`.moe_router.router_host_calls`, and the measured host seconds per call where its
    work is split by part: :func:`.moe_host_measured.measured_host`), or None when its dispatcher
    does not wait (padding to capacity).

    Parameters
    ----------
    plan : MoEPlan
        the resolved MoE options (:class:`.moeplan.MoEPlan`).

    Returns
    -------
    DispatcherHost or None
    """
    key = plan.flex_backend if plan.dispatcher == "flex" else plan.dispatcher
    host = DISPATCHER_HOST.get(key)
    if host is None or not host.waits_when(plan):
        return None
    extra, parts = router_host_calls(plan), dict(host.work_parts)
    if parts:
        parts["router"] += extra
    host = replace(host, work_ops=host.work_ops + extra, work_parts=tuple(parts.items()))
    return replace(host, measured=measured_host()) if parts else host


def host_op(name: str, operations: int, dtype: str) -> Compute:
    """``operations`` host operations of no device time, timed by the device's host rule."""
    return Compute(name, 0.0, kind="elementwise", dtype=dtype,
                   kernels=(Kernel("memory"),) * operations)


def work_op(name: str, operations: int, parts: tuple[tuple[str, int], ...],
            host: DispatcherHost, dtype: str) -> Compute:
    """``operations`` host operations of the layer (``parts``: by part): the calls of the parts
    ``host.measured`` has figures for take their measured seconds per call (``host_s``), the
    rest the device's host rule (:func:`host_op`)."""
    if host.measured is None or not parts:
        return host_op(name, operations, dtype)
    seconds, ruled = host.measured.forward_seconds(parts)
    return replace(host_op(name, ruled, dtype), host_s=seconds)


def wait_ops(pre: str, wait: HostWait, host: DispatcherHost,
              dtype: str) -> tuple[Compute, Compute]:
    return (Compute(f"{pre}.dispatch.sync", 0.0, kind="elementwise", dtype=dtype,
                    seconds=wait.wakes * SYNC_WAKE_S),
            work_op(f"{pre}.dispatch.issue", wait.issue_ops, wait.parts, host, dtype))


def layer_work(pre: str, host: DispatcherHost, dtype: str,
               rest: bool = False) -> tuple[Compute, Compute]:
    """The layer's host work: the counted operations and the TE linear modules (``rest``:
    less its ``chain``)."""
    ops, te, parts = host.work_ops, TE_LINEARS_FORWARD, dict(host.work_parts)
    if rest:
        ops -= sum(s.ops for s in host.chain)
        te -= sum(s.te for s in host.chain)
        for part, n in (x for s in host.chain for x in s.parts):
            parts[part] = parts.get(part, n) - n    # 0 where not split
    return (work_op(f"{pre}.moe.host", ops, tuple((k, n) for k, n in parts.items() if n), host,
                    dtype),
            Compute(f"{pre}.moe.host.te", 0.0, kind="elementwise", dtype=dtype,
                    seconds=te * TE_LINEAR_HOST_S))


def add_waits(ops: Any, pre: str, host: DispatcherHost | None, after: str,
              awaited: int | None, dtype: str) -> tuple[int, ...]:
    """Append the host's waits of ``host`` that follow ``after`` (``"router"`` or
    ``"dispatch"``), each waiting for op ``awaited``, and their issue, on the ``host`` stream.

    Parameters
    ----------
    ops : OpList
        the layer body being built.
    pre : str
        the ops' name prefix.
    host : DispatcherHost or None
        the dispatcher's host side (None: nothing is added).
    after : str
        which waits: those after the router or after the dispatch.
    awaited : int or None
        index of the device op the host waits for.
    dtype : str
        the ops' dtype label.

    Returns
    -------
    tuple of int
        the deps the next device op must add (the last issue), or ``()`` without a wait.
    """
    issued: tuple[int, ...] = ()
    for wait in (() if host is None or awaited is None else host.waits):
        if wait.after != after:
            continue
        sync, issue = wait_ops(pre, wait, host, dtype)
        w = ops.add(sync, "host", (awaited,))
        issued = (ops.add(issue, "host", (w,)),)
    return issued
