"""The host's work after a forward MoE layer's last wait, step by step before the device ops
it launches, the experts' per-expert host work in the backward, and the measured host seconds
of the router, dispatch and combine (docs/moe.md, "The dispatcher's host synchronisation"; the
waits and the counts are :mod:`.moe_host`'s).

**Measured host seconds** (:func:`measured_host`, ddlsim/data/moe_host_measured.yaml, written by
benchmarks/moe_host_ops.py): Megatron-LM's own ``MoELayer`` run on CPU, each part's thread CPU
time per pass less the time inside ``torch.distributed`` calls (gloo's transport; on a GPU
NCCL launches, which ddlsim's collectives carry) and less the CPU kernels' own execution: the
host's glue (Python, argument handling, autograd plumbing, the dispatcher), which the per-op
rule's ``eager_op_s`` (2 µs) stands for. ddlsim charges it per counted call: each part's
seconds over its measured calls (unfused router and permutation: the per-call glue is taken to
hold for the fused paths' fewer calls) times the calls :data:`.moe_host.DISPATCHER_HOST`
counts, as the op's ``host_s`` with no kernel, so no launch is charged twice (the device ops
carry their kernels' launches). The backward's (``bwd.moe.host``): its autograd nodes' time
per forward call of the part, the same way. This CPU (a KVM guest of an AMD EPYC, Zen 4) is
taken to run a thread as fast as the validated runs' hosts (DGX H100: Xeon Platinum 8480C):
no published single-thread comparison was found, ratio 1, not scaled.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..trace import Compute, Op
from . import moe_host
from .moe_host import DispatcherHost, HostStep, host_op, layer_work, work_op

__all__ = ["GROUPED_LINEAR_BWD_OPS", "MEASURED_CODE", "MeasuredHost", "HostChain",
           "add_backward_expert_host", "add_backward_dispatcher_host", "measured_host",
           "step_ops", "gated"]

#: the Megatron-LM code whose measured host seconds ddlsim charges
#: (ddlsim/data/moe_host_measured.yaml): d7288711, the commit DISPATCHER_HOST was counted at
#: and Megatron-Bridge v0.4.0 pins. The plan names no code revision, so the ModelZoo rows'
#: 1e057005 (measured too) is not selected.
MEASURED_CODE = "d7288711"


@dataclass(frozen=True)
class MeasuredHost:
    """Measured host seconds per counted forward call of each part of a Megatron-Core MoE
    layer (``fwd``: the forward's, ``bwd``: its autograd nodes' backward, per forward call of
    the part), from ddlsim/data/moe_host_measured.yaml (:func:`measured_host`); ``code`` the
    Megatron-LM commit measured."""

    code: str
    fwd: dict
    bwd: dict

    def forward_seconds(self, parts: tuple[tuple[str, int], ...]) -> tuple[float, int]:
        """The measured seconds of ``parts``' calls and the count of the calls of parts without
        a figure (left to the host rule)."""
        return (sum(n * self.fwd[p] for p, n in parts if p in self.fwd),
                sum(n for p, n in parts if p not in self.fwd))


@lru_cache(maxsize=None)
def measured_host(code: str = MEASURED_CODE) -> MeasuredHost:
    """The measured host seconds per call of Megatron-LM ``code``'s MoE layer parts: each
    part's host seconds over its measured forward calls, pooled over the measured local
    expert counts (ddlsim/data/moe_host_measured.yaml, benchmarks/moe_host_ops.py).

    Parameters
    ----------
    code : str
        a Megatron-LM commit the data file has (``d7288711``, ``1e057005``).

    Returns
    -------
    MeasuredHost

    Raises
    ------
    ValueError
        for a commit the file does not have.
    """
    from importlib import resources

    import yaml
    data = yaml.safe_load(resources.files("ddlsim.data").joinpath(
        "moe_host_measured.yaml").read_text())["code"]
    if code not in data:
        raise ValueError(f"moe_host_measured.yaml has no Megatron-LM code {code!r}; it has "
                         f"{sorted(data)}")
    runs = data[code]["local_experts"].values()
    per_call = {}
    for pss in ("fwd", "bwd"):
        per_call[pss] = {
            part: sum(r["host_s"][pss][part] for r in runs) / sum(r["calls"][part] for r in runs)
            for part in next(iter(runs))["calls"]}
    return MeasuredHost(code, per_call["fwd"], per_call["bwd"])

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
#: :func:`.fp8linear.with_fp8_casts`).
GROUPED_LINEAR_BWD_OPS = 5


def step_ops(pre: str, step: HostStep, dtype: str,
             host: DispatcherHost | None = None) -> list[Compute]:
    """The host ops of one chain step of ``host``: its counted calls into torch
    (``*.<op>.host``, :func:`.moe_host.work_op`) and its TE linear modules
    (``*.<op>.host.te``)."""
    name = f"{pre}.{step.issues}.host"
    out = [] if not step.ops else [host_op(name, step.ops, dtype) if host is None else
                                   work_op(name, step.ops, step.parts, host, dtype)]
    if step.te:
        out.append(Compute(f"{name}.te", 0.0, kind="elementwise", dtype=dtype,
                           seconds=step.te * moe_host.TE_LINEAR_HOST_S))
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
    """

    def __init__(self, ops: Any, pre: str, host: DispatcherHost | None, dtype: str) -> None:
        self.ops, self.pre, self.host, self.dtype = ops, pre, host, dtype
        self.steps = list(host.chain) if host is not None else []

    def _lay(self, steps: list[HostStep]) -> tuple[int, ...]:
        last: tuple[int, ...] = ()
        for step in steps:
            for op in step_ops(self.pre, step, self.dtype, self.host):
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
    (:data:`GROUPED_LINEAR_BWD_OPS` per local expert and linear) on the ``host`` stream with
    no deps: no wait stalls the backward, so it binds only where the host's total outlasts the
    device's (at the next forward's wait, or the step's end).

    Parameters
    ----------
    ops : OpList
        the backward layer body being built.
    experts : int
        local experts (``E/EP``).
    dtype : str
        the ops' dtype label.
    """
    ops.add(host_op("bwd.experts.host", 2 * experts * GROUPED_LINEAR_BWD_OPS, dtype), "host")


def add_backward_dispatcher_host(ops: Any, plan: Any, dtype: str) -> None:
    """Append the backward's host work of the router, dispatch and combine
    (``bwd.moe.host``): the measured backward seconds per forward call of each part
    (:class:`MeasuredHost`) times the part's counted forward calls (:func:`.moe_host
    .dispatcher_host`), on the ``host`` stream with no deps, as
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
           issued: int) -> list[Op]:
    """``head`` then ``node`` with the host's chain laid before the ops it launches (each
    launched op waits for its step), the steps left and the rest of the layer's work on the
    ``host`` stream before the node's last op (no deps: the node still ends on the device)."""
    out, where, steps = list(head), {}, list(host.chain)
    for i, op in enumerate(node):
        key = op.payload.name[len(pre) + 1:]
        hit = next((j for j, s in enumerate(steps)
                    if key == s.issues or key.startswith(f"{s.issues}.")), None)
        gate: tuple[int, ...] = ()
        if hit is not None:
            for step in steps[:hit + 1]:
                out += [Op(x, "host") for x in step_ops(pre, step, dtype, host)]
            steps, gate = steps[hit + 1:], (len(out) - 1,)
        if i == len(node) - 1:
            for step in steps:
                out += [Op(x, "host") for x in step_ops(pre, step, dtype, host)]
            out += [Op(x, "host") for x in layer_work(pre, host, dtype, rest=True)]
        deps = {*(where[d] for d in op.deps), *gate, *((issued,) if i == 0 else ())}
        where[i] = len(out)
        out.append(Op(op.payload, op.stream, tuple(sorted(deps)), op.repeat))
    return out
