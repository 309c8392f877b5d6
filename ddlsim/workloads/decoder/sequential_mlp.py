"""The host work of Megatron-Core's ``SequentialMLP``: the local experts as one MLP module each,
without a grouped GEMM (``parallel.moe.grouped_gemm: false``, Megatron-Core's default).

Megatron-LM d7288711 ``megatron/core/transformer/moe/experts.py`` ``SequentialMLP.forward``
(lines 783-830) splits the dispatched tokens by local expert and calls each expert's ``MLP``
in turn: its ``linear_fc1`` module, the activation, its ``linear_fc2`` module. Each linear is a
module of its own (Transformer Engine's ``TEColumnParallelLinear``/``TERowParallelLinear``
under the TE spec, Megatron's ``ColumnParallelLinear``/``RowParallelLinear`` under the local
spec), so the forward's host work grows by two linear modules per local expert, where
``TEGroupedMLP`` has two grouped linears whatever the experts. In the trace the host's chain
after the dispatcher's last wait (:class:`.moe_host_chain.HostChain`) launches the first
expert's fc1 and fc2 (one TE linear each, as for the grouped path); the other experts' linear
modules (:func:`forward_rest`) follow on the ``host`` stream right after the fc2 step, so the
step that launches the combine waits for them: the experts' span is the longer of the host's
modules and the device's GEMMs, as issuing them one expert after another gives.

Checked on one H200 (``benchmarks/moe_layer_vs_ddlsim.py``, the measurements of
``benchmarks/data/device_h200_2026-11-30/run8/moe``: Megatron-LM d7288711's local spec, EP 1):
the experts' forward took the host 0.207 ms per local expert more (least squares over the seven
cases, intercept free; 0.226 ms at Qwen3-235B's expert shape, 0.162 at 30B's), against the
two TE linear modules' 0.230 ms charged here (:data:`~.moe_host.TE_LINEAR_HOST_S` each); the
local spec's modules are Megatron's own, so the figure checks the size, not the constant.

The backward has no cited figure per module; its per-expert host seconds are the same
measurement's (:data:`BWD_HOST_PER_EXPERT_S`), charged on the ``host`` stream with no deps, as
the grouped path's per-expert backward work (:func:`.moe_host_chain.add_backward_expert_host`):
no wait stalls the backward, so it binds where the host's total outlasts the device's.
"""

from __future__ import annotations

from typing import Any

from ..trace import Compute
from .moe_host import TE_LINEAR_HOST_S

__all__ = ["BWD_HOST_PER_EXPERT_S", "forward_rest", "add_backward_host"]

#: Host seconds per local expert of ``SequentialMLP``'s backward (autograd through each expert's
#: two linears, activation and split), **fitted** (least squares, intercept free) to the
#: backward's host issue time against the local experts in
#: benchmarks/data/device_h200_2026-11-30/run8/moe/moe_layer.json (``host_issue.backward_s``,
#: seven cases, 4-16 local experts; Megatron-LM d7288711's local spec on one H200, its host an
#: Intel Xeon of family 6 model 207 under KVM, PyTorch 2.11): 0.363 ms (0.319 ms at Qwen3-235B's
#: expert shape alone, 0.551 ms at Qwen3-30B's). Two more machine starts read 0.712 ms (run9)
#: and 0.547 ms (run13): the VM's host speed varies, and run8's, the fastest, stands for a
#: bare-metal host. A microbenchmark of the layer, not an end-to-end table; taken for the TE
#: spec's modules too (no published figure for them).
BWD_HOST_PER_EXPERT_S = 0.363e-3


def forward_rest(pre: str, experts: int, dtype: str) -> Compute | None:
    """The forward's linear modules of the local experts after the first
    (``<pre>.experts.host.sequential``: ``2·(experts − 1)`` TE linear modules), or None for one
    local expert."""
    if experts <= 1:
        return None
    return Compute(f"{pre}.experts.host.sequential", 0.0, kind="elementwise", dtype=dtype,
                   seconds=2 * (experts - 1) * TE_LINEAR_HOST_S)


def add_backward_host(ops: Any, experts: int, dtype: str) -> None:
    """Append to the backward layer body ``ops`` the per-expert host work of ``experts`` local
    experts (``bwd.experts.host.sequential``, :data:`BWD_HOST_PER_EXPERT_S` each) on the
    ``host`` stream with no deps, as :func:`.moe_host_chain.add_backward_expert_host` does for
    the grouped linears."""
    ops.add(Compute("bwd.experts.host.sequential", 0.0, kind="elementwise", dtype=dtype,
                    seconds=experts * BWD_HOST_PER_EXPERT_S), "host")
