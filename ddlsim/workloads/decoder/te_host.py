"""The host (CPU) time of Megatron-Core's dense layers in eager mode: the Transformer Engine
(TE) linear modules' forward, as host work of the layer ops that run them.

A Megatron-Core GPT layer with the TE spec (``gpt_layer_specs.py``: Megatron-LM 900f1b76 and
d7288711 alike) runs four TE linear modules in its forward: ``linear_qkv``
(``TELayerNormColumnParallelLinear``) and ``linear_proj`` (``TERowParallelLinear``) in the
attention, ``linear_fc1`` (``TELayerNormColumnParallelLinear``) and ``linear_fc2``
(``TERowParallelLinear``) in the MLP. Each module's forward costs the host a measured time
(NVIDIA/TransformerEngine PR #1191: ``TEColumnParallelLinear`` in Megatron-Core, BF16, TP 1,
the CPU time of one forward pass: 140 µs before the PR, 115 µs after, a 1.22x speedup;
Megatron-Core's own ``ColumnParallelLinear`` 74 µs). The PR was merged on 2024-10-03 (TE
commit 9d976bcd) and first released in TE v1.12 (2024-11-18); the stacks' TE versions are
in :data:`STACK_TE`.

**Charged** (:func:`with_te_host`, from the builder's
:meth:`~.builder.StageBuilder.layer_forward`: Megatron 1-D layers, plain or TP-overlapped,
and ZeRO-3's per-layer units; not the partitioner's own layers under context parallelism or
2-D/3-D TP), for the named Megatron-Core stacks of :data:`STACK_TE` under eager dispatch
(``host_dispatch: eager``; CUDA graphs or a compiled step run no per-module Python), on the
layers of dense models (MoE layers carry their own host chain, :mod:`.moe_host`, whose
``TE_LINEARS_FORWARD`` already counts the layer's qkv and proj): each forward layer op carries
its modules' time as host work of its own (:attr:`~ddlsim.workloads.payloads.Compute.host_s`;
``fwd.attn``: qkv and proj, 2 modules; ``fwd.mlp``: fc1 and fc2, 2 modules), and a full
recomputation's forward (``recompute.attn``, ``recompute.mlp``) re-runs the same modules and
carries the same. The device's host rule (:mod:`ddlsim.simulator.kernels.host`) times such an
op ``max(Σ t + n·g, n·h + host_s)``: an op is host-bound where its modules' Python outlasts
its kernels, each op on its own. Double counts left: the modules' time includes their GEMMs'
launches, which the op's ``n·h`` counts too (2 launches an op); under FSDP2's per-layer units
(megatron-core-2025 with ZeRO-3) :mod:`.eager_host` lays ``host_s`` on its ``host`` stream
beside the units measured on torchtitan's blocks, whose linears' ATen host work the modules'
time repeats (no validated row runs either).

**Why not the host stream.** The mechanism :mod:`.eager_host` uses for FSDP2's blocks (a host
op before each layer op on the ``host`` stream, :func:`~ddlsim.workloads.hoststream.
lay_host_ops`, the host's lead carried from layer to layer) was built and set aside: it needs
the layers as a :class:`~ddlsim.workloads.trace.Loop` of one layer an iteration, while the
search tier times one layer's ops and multiplies (``ddlsim/search/blocks.py``: its
``fwd``/``bwd`` pieces are ``layer_ops(..., 1)``), so a chain that runs ahead across layers is
not derived there (``tests/search/test_interleaved_exact.py``, the tier equal to the exact
engine to 1e-9, failed on 19 plans); one host op a layer run with a wait before its last op
(the chain in aggregate) failed 12 of the tier's tests. The in-op rule is the one both tiers
time alike. Where it differs from a chain: a layer op whose kernels are shorter than its
modules' host time pays the excess here even where the layer's other ops would give the host
the lead to hide it (GPT-3 1.3B at TP 2 on an A100, sequence 2048: ``fwd.attn`` 210 µs of
kernels against 297 µs of host, ``fwd.mlp`` 376 against 292; a chain would hide both).

**Not charged** (no published figure found): the backward's autograd Functions of the TE
modules, ``TEDotProductAttention``'s host work, the norms TE fuses into its linears (inside the
modules' time), and Megatron-Core's own layer Python (``TransformerLayer.forward``,
bias-dropout-add, rotary embedding). The figure applies the measured
``TEColumnParallelLinear`` to the LayerNorm and row-parallel variants as well: a lower bound for
``TELayerNormColumnParallelLinear``, whose forward also runs the norm. PR #1191 names neither
the CPU nor the GPU it measured on; the figure is taken as the host time on the validated
systems' x86 hosts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..trace import Compute
from .moe_host import TE_LINEAR_HOST_S

__all__ = ["TEVersion", "STACK_TE", "TE_LINEAR_HOST_BEFORE_1191_S", "TE_LINEAR_HOST_S",
           "TE_MODULES_FORWARD", "stack_te", "module_host_s", "with_te_host"]

#: Host seconds of one TE linear module's forward before NVIDIA/TransformerEngine PR #1191
#: (2024-09-18 description: Megatron-core ``TEColumnParallelLinear``, BF16, TP 1, "140 us per
#: forward pass"; the PR's 1.22x speedup gives 115 µs, :data:`TE_LINEAR_HOST_S`). Released in
#: TE v1.12 (``git tag --contains 9d976bcd``: v1.12 is the first)
TE_LINEAR_HOST_BEFORE_1191_S = 140e-6

#: TE linear modules in one dense Megatron-Core layer's forward op (``gpt_layer_specs.py``
#: ``get_gpt_layer_with_transformer_engine_spec``: linear_qkv and linear_proj in the attention,
#: linear_fc1 and linear_fc2 in the MLP), by ddlsim's layer op
TE_MODULES_FORWARD: dict[str, int] = {"attn": 2, "mlp": 2}

#: an op name's prefix → whether it runs the layer's forward modules (full recomputation
#: re-runs the forward)
FORWARD_PASSES = frozenset({"fwd", "recompute"})


@dataclass(frozen=True)
class TEVersion:
    """The Transformer Engine a stack runs (``version``, as its build states it), the host
    seconds of one linear module's forward in it (``linear_host_s``) and where both were read
    (``source``)."""

    version: str
    linear_host_s: float
    source: str

    def __post_init__(self) -> None:
        if not self.linear_host_s > 0:
            raise ValueError(f"TEVersion {self.version!r}: linear_host_s must be > 0 s, got "
                             f"{self.linear_host_s!r}")


#: named stack → the TE it runs. A stack not named here (Megatron-LM of 2021: no TE;
#: torchtitan, DeepSpeed, fms-fsdp: no TE modules) is charged nothing.
STACK_TE: dict[str, TEVersion] = {
    "megatron-core-2024": TEVersion(
        "1.8.0.dev0", TE_LINEAR_HOST_BEFORE_1191_S,
        "TE 7d576ed2 (2024-06-13), the TE_TAG of NVIDIA/NeMo 8e3d65dc Dockerfile.ci line 39 "
        "(the stack's attention source; build_tools/VERSION.txt 1.8.0.dev0): before PR #1191 "
        "(first in v1.12), so 140 us a module. Megatron-LM's README names no container for "
        "the core_r0.8.0 H100 table; every TE release before v1.12 (tagged 2024-11-18, after "
        "core_r0.8.0) predates #1191 too"),
    "megatron-core-2025": TEVersion(
        "2.5.0.dev0", TE_LINEAR_HOST_S,
        "TE c6a9e261 (2025-05-30, main at Megatron-LM 9c1a5351's date; the stack's attention "
        "source; build_tools/VERSION.txt 2.5.0.dev0): after PR #1191, so its 115 us, an "
        "assumption: TE 2.x's modules (v2.0, 2025) were not timed by the PR; its later "
        "CPU-overhead work (PRs #2377, #2400 of 2025-11) is after this version"),
}


def stack_te(sw: Any) -> TEVersion | None:
    """The TE of resolved software ``sw`` whose modules' host time is charged: its stack's
    (:data:`STACK_TE`) under eager dispatch, else None."""
    if getattr(sw, "host_dispatch", None) != "eager":
        return None
    return STACK_TE.get(sw.name)


def module_host_s(name: str, te: TEVersion) -> float | None:
    """Host seconds of the TE modules layer op ``name`` runs (``fwd.attn``,
    ``recompute.mlp``, …): :data:`TE_MODULES_FORWARD` × the module's time; None for a
    backward op or an op with no TE module."""
    pss, _, kind = name.partition(".")
    modules = TE_MODULES_FORWARD.get(kind) if pss in FORWARD_PASSES else None
    return modules * te.linear_host_s if modules else None


def with_te_host(ops: list, te: TEVersion | None) -> list:
    """One layer's payloads with each forward layer op's TE modules' host time added to its
    own host work (``host_s``; module docstring); ``ops`` as they are where ``te`` is None.

    Parameters
    ----------
    ops : list
        one layer's payloads (:class:`~ddlsim.workloads.trace.Compute`,
        :class:`~ddlsim.workloads.trace.Collective`), in issue order.
    te : TEVersion or None
        :func:`stack_te`.

    Returns
    -------
    list
    """
    if te is None:
        return ops
    out = []
    for op in ops:
        seconds = module_host_s(op.name, te) if isinstance(op, Compute) else None
        out.append(replace(op, host_s=op.host_s + seconds) if seconds else op)
    return out
