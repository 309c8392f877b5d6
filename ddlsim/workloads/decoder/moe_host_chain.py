"""The host's work after a forward MoE layer's last wait, step by step before the device ops
it launches, the combined 1F1B's forward nodes opened by the host's waits, the experts'
per-expert host work in the backward and the router's, dispatch's and combine's measured one
(docs/moe.md, "The dispatcher's host synchronisation"; the waits and the counts are
:mod:`.moe_host`'s, the measured host seconds :mod:`.moe_host_measured`'s).
"""

from __future__ import annotations

from typing import Any

from ..trace import Compute, Op, Wait
from . import moe_host
from .moe_host import DispatcherHost, HostStep, host_op, layer_work, wait_ops, work_op

__all__ = ["GROUPED_LINEAR_BWD_OPS", "GROUPED_LINEAR_BWD_S", "GROUPED_LINEAR_FWD_S", "HostChain",
           "add_backward_expert_host", "add_backward_dispatcher_host", "node_with_waits",
           "step_ops", "gated"]

#: Calls into torch per local expert in one Transformer Engine ``GroupedLinear``'s backward
#: under Megatron-Core's DDP with gradient-accumulation fusion (the weight gradient written
#: into ``main_grad`` by the GEMM). Read at NVIDIA/TransformerEngine v2.9
#: ``pytorch/module/grouped_linear.py`` ``_GroupedLinear.backward`` lines 449-472
#: (``handle_custom_ddp_from_mcore``, per weight: ``torch.cuda.current_device()`` and
#: ``torch.empty`` of the dummy gradient returned to autograd, the weight carrying Megatron's
#: ``grad_added_to_main_grad``) and NVIDIA/Megatron-LM d7288711
#: ``megatron/core/distributed/distributed_data_parallel.py`` lines 431-450 (the hook autograd
#: runs per parameter after accumulating that dummy: ``param.grad`` read twice, set to None;
#: ``register_grad_ready`` is Python and returns at once before the last micro-batch): 2 + 3.
#: The same code's forward (lines 61-281, 818-858) has no per-expert call into torch in BF16,
#: nor in FP8 after a step's first micro-batch (the weights' FP8 workspaces cached): its
#: per-expert loops are Python over lists (weights, quantizer usages, saved tensors,
#: ``main_grad`` lambdas), not timed by the host rule; ``torch.split``,
#: ``tex.split_quantize`` and ``general_grouped_gemm`` are one call per pass each (the C++
#: per-GEMM launches are the GEMM op's own, :mod:`.grouped_linear`; in FP8 the tensors
#: ``split_quantize`` creates per expert are the GEMM op's ``host_s``,
#: :func:`.fp8linear.with_fp8_casts`). Counted again by running the code
#: (benchmarks/te_grouped_host.py: 1 call into torch, 1 CUDA call, 4 reads and writes of
#: ``param.grad`` under ``overlap_grad_reduce``, 3 more tensor attributes, per expert and
#: linear); no longer what ddlsim charges: :data:`GROUPED_LINEAR_BWD_S` is, measured.
GROUPED_LINEAR_BWD_OPS = 5

#: Host seconds per local expert of one Transformer Engine ``GroupedLinear``'s forward and
#: backward as Megatron-Core's ``TEGroupedMLP`` runs it (BF16, ``fuse_wgrad_accumulation`` with
#: Megatron's ``main_grad``, Megatron's DDP hook on every expert weight), measured by running
#: TE v2.9's own Python (70f53666) and Megatron-LM d7288711's hook on CPU with the compiled
#: extension and the CUDA calls stood in for (benchmarks/te_grouped_host.py; the result
#: benchmarks/data/te_grouped_host/te_v2.9_bf16_h64_f32.json, 2026-11-30): the thread CPU time's
#: slope over 4, 8 and 16 local experts of fc1 and fc2 together, forward 10.18 µs per expert
#: (the rounds 8.4-10.6), backward 21.89 µs (19.5-22.3; of it ``_GroupedLinear.backward`` 11.1,
#: Megatron's hooks 4.7, the autograd engine's ``AccumulateGrad`` and the function's inputs the
#: rest), halved here: per expert and linear. The GEMMs' own host work (the extension's C++, the launches) is taken out: the GEMM
#: ops' host rule carries it. This CPU (a KVM guest of an AMD EPYC, Zen 4) is taken to run a
#: thread as fast as the validated runs' Xeon 8480C, as :mod:`.moe_host_measured` does.
GROUPED_LINEAR_FWD_S = 5.09e-6
GROUPED_LINEAR_BWD_S = 10.95e-6


def step_ops(pre: str, step: HostStep, dtype: str, host: DispatcherHost | None = None,
             experts: int = 0) -> list[Compute]:
    """The host ops of one chain step of ``host``: its counted calls into torch
    (``*.<op>.host``, :func:`.moe_host.work_op`) and its TE linear modules
    (``*.<op>.host.te``: :data:`.moe_host.TE_LINEAR_HOST_S` each, a one-GEMM module's, and
    where they are TE grouped linears over ``experts`` local experts, the ``experts − 1``
    further experts' :data:`GROUPED_LINEAR_FWD_S` each; the chain's TE modules are the
    experts' fc1 and fc2)."""
    name = f"{pre}.{step.issues}.host"
    out = [] if not step.ops else [host_op(name, step.ops, dtype) if host is None else
                                   work_op(name, step.ops, step.parts, host, dtype)]
    if step.te:
        per = moe_host.TE_LINEAR_HOST_S + max(experts - 1, 0) * GROUPED_LINEAR_FWD_S
        out.append(Compute(f"{name}.te", 0.0, kind="elementwise", dtype=dtype,
                           seconds=step.te * per))
    return out


class HostChain:
    """The host's work after a forward layer's last wait (:attr:`DispatcherHost.chain`), laid
    on the ``host`` stream step by step as the layer body is built: the host's lead over the
    device is nothing after a wait, so each device op of the expert path and the combine
    starts only once the host has reached its launch. :meth:`issue` before adding such an op;
    :meth:`finish` after the layer's last, which lays the steps left and the rest of the
    layer's work (the next layer's attention, router and dispatch pre-processing, run ahead
    of the device, no deps).

    Parameters
    ----------
    ops : OpList
        the layer body being built.
    pre : str
        the ops' name prefix (``fwd``, ``recompute``).
    host : DispatcherHost or None
        the dispatcher's host side (None: nothing is added).
    dtype : str
        the ops' dtype label (no FLOPs).
    experts : int
        local experts where the experts are TE grouped linears (their per-expert forward host
        time, :func:`step_ops`); 0 otherwise.
    """

    def __init__(self, ops: Any, pre: str, host: DispatcherHost | None, dtype: str,
                 experts: int = 0) -> None:
        self.ops, self.pre, self.host, self.dtype = ops, pre, host, dtype
        self.steps = list(host.chain) if host is not None else []
        self.experts = experts

    def _lay(self, steps: list[HostStep]) -> tuple[int, ...]:
        last: tuple[int, ...] = ()
        for step in steps:
            for op in step_ops(self.pre, step, self.dtype, self.host, self.experts):
                last = (self.ops.add(op, "host"),)
        return last

    def issue(self, name: str) -> tuple[int, ...]:
        """Lay the steps up to the one that launches device op ``name`` (those of ops the
        layer lacks, e.g. no sort with one local expert, come with it).

        Returns
        -------
        tuple of int
            the dep for op ``name``: the last host op laid, or ``()`` when no step launches it.
        """
        key = name[len(self.pre) + 1:] if name.startswith(f"{self.pre}.") else None
        hit = next((i for i, s in enumerate(self.steps)
                    if key == s.issues or (key or "").startswith(f"{s.issues}.")), None)
        if hit is None:
            return ()
        done, self.steps = self.steps[:hit + 1], self.steps[hit + 1:]
        return self._lay(done)

    def finish(self) -> None:
        """Lay the steps left and the layer's other host work (no deps)."""
        if self.host is None:
            return
        self._lay(self.steps)
        self.steps = []
        for op in layer_work(self.pre, self.host, self.dtype, rest=True):
            self.ops.add(op, "host")


def add_backward_expert_host(ops: Any, experts: int, dtype: str) -> None:
    """Append the per-expert host work of the experts' two TE grouped linears' backward
    (:data:`GROUPED_LINEAR_BWD_S` per local expert and linear, measured; no kernel) on the
    ``host`` stream with no deps: no wait stalls the backward, so it binds only where the
    host's total outlasts the device's (at the next forward's wait, or the step's end).

    Parameters
    ----------
    ops : OpList
        the backward layer body being built.
    experts : int
        local experts (``E/EP``).
    dtype : str
        the ops' dtype label.
    """
    ops.add(Compute("bwd.experts.host", 0.0, kind="elementwise", dtype=dtype, kernels=(),
                    host_s=2 * experts * GROUPED_LINEAR_BWD_S), "host")


def add_backward_dispatcher_host(ops: Any, plan: Any, dtype: str) -> None:
    """Append the backward's host work of the router, dispatch and combine
    (``bwd.moe.host``): the measured backward seconds per forward call of each part
    (:class:`.moe_host_measured.MeasuredHost`) times the part's counted forward calls
    (:func:`.moe_host.dispatcher_host`), on the ``host`` stream with no deps, as
    :func:`add_backward_expert_host`. Nothing for a dispatcher without measured figures or
    without waits (padded to capacity: its forward has no host op either).

    Parameters
    ----------
    ops : OpList
        the backward layer body being built.
    plan : MoEPlan
        the resolved MoE options.
    dtype : str
        the ops' dtype label.
    """
    host = moe_host.dispatcher_host(plan)
    if host is None or host.measured is None:
        return
    parts = [*host.work_parts, *(x for w in host.waits for x in w.parts)]
    seconds = sum(n * host.measured.bwd[p] for p, n in parts if p in host.measured.bwd)
    ops.add(Compute("bwd.moe.host", 0.0, kind="elementwise", dtype=dtype, kernels=(),
                    host_s=seconds), "host")


def gated(pre: str, host: DispatcherHost, dtype: str, head: list[Op], node: list[Op],
           issued: int, experts: int = 0) -> list[Op]:
    """``head`` then ``node`` with the host's chain laid before the ops it launches (each
    launched op waits for its step), the steps left and the rest of the layer's work on the
    ``host`` stream before the node's last op (no deps: the node still ends on the device);
    ``experts`` as :class:`HostChain`'s."""
    out, where, steps = list(head), {}, list(host.chain)
    for i, op in enumerate(node):
        key = op.payload.name[len(pre) + 1:]
        hit = next((j for j, s in enumerate(steps)
                    if key == s.issues or key.startswith(f"{s.issues}.")), None)
        gate: tuple[int, ...] = ()
        if hit is not None:
            for step in steps[:hit + 1]:
                out += [Op(x, "host") for x in step_ops(pre, step, dtype, host, experts)]
            steps, gate = steps[hit + 1:], (len(out) - 1,)
        if i == len(node) - 1:
            for step in steps:
                out += [Op(x, "host") for x in step_ops(pre, step, dtype, host, experts)]
            out += [Op(x, "host") for x in layer_work(pre, host, dtype, rest=True)]
        deps = {*(where[d] for d in op.deps), *gate, *((issued,) if i == 0 else ())}
        where[i] = len(out)
        out.append(Op(op.payload, op.stream, tuple(sorted(deps)), op.repeat))
    return out


def node_with_waits(pre: str, host: DispatcherHost | None, after: str, dtype: str,
                    node: list[Op], experts: int = 0) -> list[Op]:
    """A combined-1F1B forward node (:mod:`.combined`: ``dispatch`` for the waits after the
    router, ``mlp`` for those after the dispatch) opened by the host's waits and issues on the
    ``host`` stream: the node's first op waits for the node before it on its side (the
    ``attn`` node, or the dispatch), and the node's own first op waits for the last issue.
    After the layer's last wait comes the layer's host work: in the ``dispatch`` node
    (alltoall, HybridEP: one wait, after the router) all of it with no deps; in the ``mlp``
    node (DeepEP's waits after the dispatch) the chain's steps before the ops they launch,
    as :class:`HostChain` lays them outside the combined schedule, then the
    rest with no deps. Without such a wait (or an empty node), ``node`` as it is.

    **The mlp node's waits drain the compute stream.** DeepEP's waits after the dispatch are
    ``_indices_to_multihot``'s (Megatron-LM d7288711 ``token_dispatcher.py`` lines 1225-1230:
    ``indices[mask]``, ``repeat_interleave`` of a device tensor, ``probs[mask]``), called from
    ``get_permuted_hidden_states_by_experts`` in the ``mlp`` node
    (``fine_grained_callables.py`` ``submodule_moe_forward``, line 544:
    ``routed_experts_compute``), which runs on the compute stream (``ScheduleNode``'s
    ``stream_acquire_context``, ``pipeline_parallel/utils.py``). Each is a device-to-host copy
    that synchronises the current stream, so the host waits for everything issued on the
    compute stream before it, the paired backward's expert data and weight gradients
    (``mlp`` bwd, ``backward_dw``, issued before ``mlp`` fwd by
    ``TransformerLayerSchedulePlan.run``, ``model_chunk_schedule_plan.py`` lines 189-255),
    besides the dispatch. When it returns the compute stream has nothing queued: the
    backward's next compute (``attn`` bwd) is issued only after this node and the combine.
    So the node opens with a :class:`~ddlsim.workloads.trace.Wait` for the compute stream on
    the ``host`` stream, and fc1 and fc2 wait for the host's steps that launch them, as
    outside the combined schedule.

    Parameters
    ----------
    pre : str
        the ops' name prefix.
    host : DispatcherHost or None
        the dispatcher's host side.
    after : str
        ``"router"`` or ``"dispatch"``.
    dtype : str
        the ops' dtype label.
    node : list of Op
        the node's ops, their deps indexing it.
    experts : int
        as :class:`HostChain`'s (the gated steps' TE grouped linears).

    Returns
    -------
    list of Op
    """
    waits = [w for w in (host.waits if host is not None else ()) if w.after == after]
    if not waits or not node:
        return node
    head: list[Op] = []
    if after == "dispatch":     # the multihot waits synchronise the compute stream
        head.append(Op(Wait(f"{pre}.dispatch.drain", "compute"), "host"))
    for wait in waits:
        sync, issue = wait_ops(pre, wait, host, dtype)
        head += [Op(sync, "host", (len(head) - 1,) if head else ()),
                 Op(issue, "host", (len(head),))]
    issued = len(head) - 1
    if host.waits[-1].after != after:
        return _shifted(head, node, issued)
    if after != "dispatch":     # the work runs ahead: the paired backward fills the device
        head += [Op(op, "host") for op in layer_work(pre, host, dtype)]
        return _shifted(head, node, issued)
    return gated(pre, host, dtype, head, node, issued, experts)


def _shifted(head: list[Op], node: list[Op], issued: int) -> list[Op]:
    """``head`` then ``node``, its deps shifted past the head, its first op after ``issued``."""
    n = len(head)
    first, *rest = node
    return [*head, Op(first.payload, first.stream, (*(d + n for d in first.deps), issued),
                      first.repeat),
            *(Op(o.payload, o.stream, tuple(d + n for d in o.deps), o.repeat) for o in rest)]
