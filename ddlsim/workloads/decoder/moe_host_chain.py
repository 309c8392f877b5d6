"""The host's work after a forward MoE layer's last wait, step by step before the device ops
it launches, and the experts' per-expert host work in the backward (docs/moe.md, "The
dispatcher's host synchronisation"; the waits and the counts are :mod:`.moe_host`'s)."""

from __future__ import annotations

from typing import Any

from ..trace import Compute
from . import moe_host
from .moe_host import DispatcherHost, HostStep, host_op, layer_work

__all__ = ["GROUPED_LINEAR_BWD_OPS", "HostChain", "add_backward_expert_host",
           "step_ops"]

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


def step_ops(pre: str, step: HostStep, dtype: str) -> list[Compute]:
    """The host ops of one chain step: its counted calls into torch (``*.<op>.host``) and its
    TE linear modules (``*.<op>.host.te``)."""
    name = f"{pre}.{step.issues}.host"
    out = [host_op(name, step.ops, dtype)] if step.ops else []
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
            for op in step_ops(self.pre, step, self.dtype):
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
