"""The host (CPU) time of an eager torchtitan decoder block per layer op, measured: what
PyTorch's host does for a block's ATen ops and autograd nodes, beyond FSDP2's hooks.

ddlsim charges each kernel the device's eager host time per tiny op ``h = eager_op_s +
host_launch_s`` (:mod:`ddlsim.simulator.kernels.host`), inside its op (``max(Σt + n·gap,
n·h)``): each op on its own, so the host's lead cannot carry from op to op, and a block's
Python (``nn.Module.__call__``, the views, casts and rotary embedding of the attention, the
autograd engine's nodes and ``AccumulateGrad``) is not there at all. Under FSDP2 the hooks
already run on the ``host`` stream (:func:`.fsdp2_host.hook_seconds`); here the block's own
ops join them, so the host's work of a block is one chain the device follows, and a step is
host-bound where the chain outlasts the kernels (the H200's Llama 3.1 8B blocks at sequence
2048: its untraced backward 53.7 ms against 43.4 ms of kernels), device-bound where not (the
host's lead builds up and hides it, as at 8192).

**Measured.** :data:`HOST_UNITS` is each layer op's host time per block in units of the same
host's tiny op, read by ``benchmarks/decoder_host_trace.py`` from the Kineto trace of one
eager step of 8 torchtitan Llama 3.1 8B blocks under FSDP2 on one H200 (torch 2.11,
``benchmarks/device/llama_step.py``, no activation checkpointing, sequence 2048;
``benchmarks/data/device_h200_2026-11-30/run5/none_s2048``): per block, the host time of its
forward roots on the main thread (the ops between ``FSDP::pre_forward`` and
``FSDP::post_forward``) and of its backward's autograd nodes (tied to the block by their
sequence numbers), FSDP2's own ranges taken off (the hooks are charged apart), each root's
duration plus the gap since the root before it; classed as ddlsim's layer ops
(:mod:`.layerkernels`: ``attn`` the QKV, rotary embedding, attention and output projection
with their views and casts; ``mlp`` the three MLP GEMMs; ``elementwise`` the norms, residual
adds, SiLU and the gate's product); the median over the 8 blocks, divided by the median
duration of the trace's ``aten::add_`` (autograd's sums of input gradients, one launch each,
17.6 µs under the profiler), the trace's tiny op. A ratio of two profiled times, as
:mod:`ddlsim.workloads.resnet.host` takes them. The recomputation of full or selective
checkpointing re-runs the forward's ops: charged the forward's units (the full-AC trace's
backward, ``run5/full_s2048``, holds 107 units a block more than the plain one's: its forward
reads 102 in its own tiny op, the plain trace's 111).

**Op-level selective checkpointing** (:mod:`.sac`) adds the policy's Python to the same
host: each forward op's share of it and the recompute's, carried as the op's
:attr:`~ddlsim.workloads.payloads.Compute.host_s`, join the op's host op here (the device op
keeps none of it), so one host chain holds all of a block's host work. The recompute
(``recompute.sac``) re-runs every forward op of the block through the policy's mode, cache
hits included (90 ATen ops against the forward's 66), so its host op also carries the
forward's units (:data:`SPANS`): the H200 trace of that step (``run4/llama_s2048``,
selective_op, tiny op 14.0 µs) holds 397.7 units a block backward against the plain trace's
173.2; of the 224.5 more, the policy is 104.8 (90 × 16.3 µs) and the rest, 119.7, is the
forward's 110.6 within 8 % (full AC's recompute: 107).

**Charged** under eager dispatch on a GPU, under FSDP2 (``zero3_implementation:
torch_fsdp2``, the stacks the measurement is of; :func:`block_host_s` is 0 otherwise): before
each of a unit's layer ops a host op of its units × ``h``, plus the op's ``host_s``, on the
``host`` stream, which the op waits for; host ops follow one another and wait for nothing
else, so the host runs ahead of the device as far as its work allows
(:func:`issued_by_host`). A compiled block runs one graph call, no per-op Python: nothing
charged (nor any SAC policy, :func:`.sac.policy_host`). Where this host stream is not laid
(no FSDP2, a CPU device, layers built as one :class:`~ddlsim.workloads.payloads.Loop` op: the
partitioner's under context parallelism or 2-D/3-D TP, the TP-overlapped ones) an op's
``host_s`` stays its own (:mod:`ddlsim.simulator.kernels.host`: ``max(Σ t + n·g, n·h +
host_s)``). Not carried: another stack's layers (Megatron and Transformer Engine's modules
have their own host costs), MoE layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...simulator.kernels.host import eager_unit_s
from ..hoststream import lay_host_ops
from ..trace import Compute

__all__ = ["HOST_UNITS", "PASSES", "SPANS", "unit_s", "block_host_s", "issued_by_host"]

#: host time per layer op of a block in tiny-op units (module docstring), ``(pass, op)`` →
#: units: ``benchmarks/decoder_host_trace.py`` on ``run5/none_s2048`` (per block, the median
#: over its 8 blocks, µs under the profiler / 17.6 µs)
HOST_UNITS: dict[tuple[str, str], float] = {
    ("fwd", "attn"): 73.35,          # 1289.5 us: 4 linears, rotary, repeat_kv, SDPA, views
    ("fwd", "mlp"): 16.04,           # 282.0 us: w1, w3, w2
    ("fwd", "elementwise"): 21.23,   # 373.3 us: 2 rms_norm, 2 residual adds, silu, mul
    ("bwd", "attn"): 108.13,         # 1901.0 us: their nodes, with the weights' AccumulateGrad
    ("bwd", "mlp"): 42.71,           # 750.8 us
    ("bwd", "elementwise"): 22.38,   # 393.4 us
}
#: an op name's prefix → the pass whose units it takes (the recomputation: the forward's)
PASSES = {"fwd": "fwd", "bwd": "bwd", "recompute": "fwd"}
#: an op that re-runs several of the block's layer ops → those ops: op-level SAC's recompute
#: (``recompute.sac``, :func:`.sac.every_second_mm_op`) re-runs the block's whole forward
#: through the policy's mode (module docstring: ``run4/llama_s2048``'s backward, 119.7 units a
#: block beyond the plain trace's and the policy's, against the forward's 110.6)
SPANS: dict[str, tuple[str, ...]] = {"sac": ("attn", "mlp", "elementwise")}


def unit_s(launch: Any, host_dispatch: str, zero3_implementation: str | None) -> float:
    """Seconds of one unit (:func:`~ddlsim.simulator.kernels.host.eager_unit_s`, the device's
    eager host time per tiny op ``h``), charged under FSDP2 only
    (``zero3_implementation`` ``torch_fsdp2``: the stack the table was measured on); 0
    otherwise."""
    if zero3_implementation != "torch_fsdp2":
        return 0.0
    return eager_unit_s(launch, host_dispatch)


def block_host_s(name: str, unit: float) -> float | None:
    """The host seconds of the layer op ``name`` (``fwd.attn``, ``bwd.mlp``,
    ``recompute.elementwise``, ``recompute.sac``, …): its :data:`HOST_UNITS` (summed over the
    ops it re-runs, :data:`SPANS`) × ``unit``; None for an op the table has no figure for or
    when ``unit`` is 0."""
    pss, _, kind = name.partition(".")
    units = [HOST_UNITS.get((PASSES.get(pss, ""), k)) for k in SPANS.get(kind, (kind,))]
    return sum(units) * unit if None not in units and unit > 0 else None


def issued_by_host(items: list, unit: float) -> tuple[list, Mapping[int, int]]:
    """A unit's op items with the host's work laid on the ``host`` stream: before each
    compute op that :func:`block_host_s` has a figure for or that carries host work of its
    own (``host_s``: SAC's policy, :mod:`.sac`), a host op of both (``<name>.host``), which
    the op waits for; the op keeps no ``host_s``. Items are payloads or ops whose deps index
    ``items`` (:func:`.oplists.extend_ops`); the result's deps index the result.

    Parameters
    ----------
    items : list
        a unit's ops.
    unit : float
        :func:`unit_s`.

    Returns
    -------
    list
        the items with the host ops, as :class:`~ddlsim.workloads.trace.Op`.
    mapping
        the index of each of ``items`` in the result.
    """
    def seconds_of(payload: Compute) -> float | None:
        seconds = (block_host_s(payload.name, unit) or 0.0) + payload.host_s
        return seconds if seconds > 0 else None
    return lay_host_ops(items, seconds_of, clear_host_s=True)
