"""ZeRO-3 / FSDP blocks of a decoder without pipelining: per-layer parameter all-gathers in the
forward and again in the backward, gradient reduce-scatters after each layer's backward.

Three effects, each as ZeRO-3 (DeepSpeed) and FSDP run them:

* **Prefetch limit** ``k = cfg.software.zero3_prefetch_layers``: the all-gather of layer
  ``l`` may start once layer ``l − k − 1`` has finished, i.e. while layer ``l − k`` computes
  (``k = 1``: one layer ahead, FSDP's ``backward_prefetch = BACKWARD_PRE`` with
  ``limit_all_gathers = True``; ``k = 0``: gathered on demand, fully exposed). The backward
  counts layers in backward order.
* **Stream contention**: the all-gathers and the reduce-scatters of a group share one
  communication stream (``dp``; ``edp`` for experts under EP), i.e. one NIC, in issue order —
  a layer's reduce-scatter delays the gathers issued after it.
* **Exposed first gather**: each micro-batch's forward and backward begin with a marker on
  the compute stream; the first ``k + 1`` gathers depend on it, so nothing is gathered ahead
  across micro-batches (FSDP and DeepSpeed free the gathered layers after use and start each
  pass from the root module's pre-hook). The forward's first gather overlaps only the
  embedding, the backward's only the output head's backward. Under torchtitan's FSDP2 the
  embedding and the head are units of the passes too (:mod:`.fsdp_edges`).

Every micro-batch gathers all layers twice and reduce-scatters every layer's gradients:
DeepSpeed ZeRO-3 partitions gradients at every backward (``reduce_scatter`` in its
backward hooks, gradient accumulation included; DeepSpeed docs, "ZeRO-3 Offload" and
``stage3.py``), i.e. ``3Ψ`` bytes per micro-batch (Rajbhandari et al. 2020, §7.2.2).

Memory: ``k + 1`` gathered layers are alive at once (the one computing and ``k`` prefetched);
under module hooks ``k + 1`` modules (:func:`zero3_gathered_bytes`).

**Per-tensor gathers** (``software.zero3_gather: per_tensor``, the ``deepspeed-2021`` stack):
DeepSpeed of early 2021 (v0.3.13, the first with ZeRO-3) fetched parameters from each leaf
module's hooks, one ``torch.distributed.all_gather`` per parameter tensor, and
reduce-scattered the gradients one tensor at a time (:func:`module_fetches`). Per dense
layer (Megatron's six leaf modules,
:meth:`~ddlsim.workloads.models.decoder.DecoderShape.layer_modules`):

* tensors under ``zero3_persistence_threshold`` elements stay gathered (never fetched);
* the forward gathers every other tensor; the backward gathers them again, and under full
  recomputation twice: once for the recomputed forward, and again for the backward unless the
  module is reused within ``zero3_max_reuse_distance`` elements of fetches (the modules after
  it, visited by the recomputed forward and again by the backward: twice their elements);
* every gathered tensor costs three memory passes over it: the zero-filled flat buffer, and
  the list-form all-gather's copy of each rank's chunk out of the buffer PyTorch 1.8 gathers
  into (``ProcessGroupNCCL::allgather``);
* every reduce-scattered gradient costs six: its copy into the contiguous bucket, the
  ``div_`` by the data-parallel size, and the list-form reduce-scatter's copy into a flat
  input.

**Units.** Under module hooks the passes run over *units* instead of layers: each layer's
attention and MLP ops are cut by module (:data:`.layerkernels.MODULE_PARTS`: QKV with the
attention core, the output projection, the two MLP GEMMs; other ops join the part before
them), and the prefetch counts units (``zero3_prefetch_modules``). DeepSpeed v0.3.13 fetches a
module (synchronising the device), then ``prefetch_next_sub_modules`` launches the next
parameters' gather asynchronously and the module computes: one tensor in flight behind the
compute, ``zero3_prefetch_modules: 1``. Every fetch synchronises the device, so under
``per_tensor`` a unit also waits for the reduce-scatters of the unit before it, and the
gradients' passes run on the compute stream. A gather's zero-fill comes before its issue
(``_allgather_param`` calls ``torch.cuda.synchronize()`` after ``torch.zeros``, so the host
waits for it: a pass on the ``host`` stream), its copy-out follows it on ``dp``.

**The host's issue** (``per_tensor``, on a ``host`` stream): each list-form collective costs
the host a Python view and a ``copy_`` launch per rank (:data:`GATHER_HOST_OPS`,
:data:`REDUCE_HOST_OPS`, at the stack's ``zero3_host_python_op`` and ``zero3_host_copy``
seconds; a gather also ``zero3_host_gather_call``), so its issue grows with the
data-parallel size. A gather is issued after the
synchronisation, i.e. once the unit before has ended and its reduce-scatters too, and the
next unit's compute is launched only after it: the device waits for the host. The per-rank
copy-out launches come after the NCCL launch (PyTorch 1.8's ``allgather`` post lambda,
:func:`.zero3_fetch.gather_host_split`), so the host issues them while the all-gather runs;
a unit's several gathers (the embedding's two tables) are issued together, then copied out. The
reduce-scatters are issued from the gradient hooks while the unit's backward computes (the
host launched it first); they start when both have ended.

**Per-module gathers** (``per_module``, the ``deepspeed`` stack): DeepSpeed since v0.6 fetches
the same way from the same hooks, with the same persistence and reuse rules, but gathers a
module's parameters in one coalesced ``all_gather_into_tensor`` into the parameter's own buffer
(no memory passes when the module has one gathered tensor, the usual case; the ``torch.cat``
of several is not modelled), prefetches ``stage3_prefetch_bucket_size`` = 5e7 elements (at
least the next module: ``zero3_prefetch_modules: 1``) and synchronises only the streams it
needs. Gradients are reduce-scattered per module here (DeepSpeed: per ``reduce_bucket_size``
bucket of 5e8 elements, ``reduce_scatter_coalesced``), with the same six memory passes
(bucket copy, ``torch.cat`` of the ranks' chunks, ``div_``) on the reduction stream before them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError
from ..trace import Block, Compute
from .builder import StageBuilder
from .oplists import extend_ops as _extend
from .layerkernels import MODULE_PARTS
from .zero3_fetch import (FETCH_FILL_PASSES, FETCH_PASSES, GATHER_HOST_OPS, REDUCE_HOST_OPS,
                          REDUCE_PASSES, ModuleFetch, _live_elements, gather_host_split,
                          list_host_seconds, module_fetches, reduce_host_split,
                          unit_live_elements)
from .zero3_pass import zero3_pass as _pass

__all__ = ["zero3_blocks", "zero3_shards", "gathered_layers", "zero3_gathered_bytes",
           "gathered_bytes",
           "zero3_prefetch", "zero3_phrase", "module_hook_bytes",
           "list_gather_bytes", "ModuleFetch", "module_fetches", "FETCH_PASSES",
           "FETCH_FILL_PASSES", "REDUCE_PASSES", "GATHER_HOST_OPS", "REDUCE_HOST_OPS",
           "list_host_seconds", "unit_live_elements"]

def zero3_prefetch(sw) -> int:
    """Units gathered ahead of the unit computing: layers (``zero3_prefetch_layers``) for
    per-layer gathers, modules (``zero3_prefetch_modules``) for gathers from module hooks."""
    return sw.zero3_prefetch_layers if sw.zero3_gather == "per_layer" \
        else sw.zero3_prefetch_modules


def zero3_phrase(sw) -> str:
    """``per layer, 1 layer ahead`` / ``per tensor, 1 module ahead`` / ``…, on demand``."""
    k, unit = zero3_prefetch(sw), "layer" if sw.zero3_gather == "per_layer" else "module"
    ahead = "on demand" if k == 0 else f"{k} {unit}{'s' if k > 1 else ''} ahead"
    return f"{sw.zero3_gather.replace('_', ' ')}, {ahead}"


def gathered_layers(prefetch: int) -> int:
    """Layers whose full (TP-sharded) parameters a rank holds at once under ZeRO-3: the one
    computing and ``prefetch`` gathered ahead."""
    return prefetch + 1


def zero3_gathered_bytes(cfg, layer_bytes: float, shape, dt: float) -> float:
    """:func:`gathered_bytes` under run ``cfg``'s stack and TP size."""
    return gathered_bytes(cfg.software, cfg.parallel.tp, layer_bytes, shape, dt)


def gathered_bytes(sw, tp: int, layer_bytes: float, shape, dt: float) -> float:
    """Memory of the gathered parameters in flight under stack ``sw`` on ``tp`` TP ranks:
    per layer, :func:`gathered_layers` × one layer's parameters on the rank (``layer_bytes``,
    already TP-sharded); from module hooks, :func:`module_hook_bytes` and, per tensor, the
    second flat buffer of the largest tensor (:func:`list_gather_bytes`), ``dt`` bytes per
    element."""
    if sw.zero3_gather == "per_layer":
        if sw.enable_fsdp_float8_all_gather:   # float8 weights held at 1 byte (.fsdp_float8)
            from .fsdp_float8 import float8_weights
            share = sum(float8_weights(shape)) / shape.dense_layer_params
            layer_bytes *= 1 - share + share / dt
        return gathered_layers(sw.zero3_prefetch_layers) * layer_bytes
    return module_hook_bytes(shape, tp, sw, dt) + list_gather_bytes(shape, tp, sw, dt)


def module_hook_bytes(shape, tp: int, sw, dt: float) -> float:
    """Gathered parameters held at once under module hooks: the module computing and the
    ``zero3_prefetch_modules`` gathered ahead, at most the largest such run of consecutive
    GEMM modules (counted around the layer) — bounded by one layer when the prefetch spans
    the layer's four modules — or, at the backward's start, the output layer (kept from its
    forward, :mod:`.zero3_edges`) with the backward's first modules gathered ahead of it.

    A module ``j`` ahead is held only if its prefetch was issued: the unit whose pre-hook
    issues it (``j − zero3_prefetch_modules``) held fewer than ``zero3_max_live_parameters``
    elements, as :func:`.zero3_pass.zero3_pass` refuses it (DeepSpeed v0.3.13 ``stage3.py``
    ``prefetch_next_sub_modules``); a refused one is gathered from its own pre-hook, after
    the module before it has been released.

    Parameters
    ----------
    shape : DecoderShape
        The model's shape.
    tp : int
        Tensor-parallel size (the modules' elements are TP-sharded).
    sw : the resolved software stack (its ``zero3_*`` fields).
    dt : float
        Bytes per gathered element.

    Returns
    -------
    float
        Bytes of gathered parameters held at once, at most.
    """
    from .zero3_edges import edge_fetches
    sizes = [sum(m.forward) for m in module_fetches(shape, tp, sw, False)]
    n, ahead = len(sizes), min(sw.zero3_prefetch_modules, len(sizes) - 1)
    cap = sw.zero3_max_live_parameters

    def issued(live: float, first: bool) -> bool:
        """Whether a prefetch issued by a unit holding ``live`` elements goes ahead (the
        pass's first units are gathered at its start, never refused)."""
        return first or not cap or live < cap

    runs = [sizes[i] + sum(sizes[(i + j) % n] for j in range(1, ahead + 1)
                           if issued(sizes[(i + j - ahead) % n], False)) for i in range(n)]
    head = sum(edge_fetches(shape, tp, sw, 1, False).head_forward)
    backward = sizes[::-1]
    head += sum(backward[j - 1] for j in range(1, ahead + 1) if issued(head, j < ahead))
    return max(head, *runs) * dt


def list_gather_bytes(shape, tp: int, sw, dt: float) -> float:
    """Per-tensor gathers (``zero3_gather: per_tensor``): PyTorch 1.8's list-form all-gather
    gathers into a flat buffer of its own before copying out, so the largest gathered tensor
    is held twice while it is gathered (ProcessGroupNCCL::allgather); 0 otherwise."""
    if sw.zero3_gather != "per_tensor" or shape.is_moe:
        return 0.0
    sizes = [n for m in shape.layer_modules(tp) for n in m
             if n >= sw.zero3_persistence_threshold]
    return max(sizes, default=0.0) * dt


def zero3_shards(b: StageBuilder, moe: bool) -> list[tuple[str, float]]:
    """(group, bytes) of one layer's parameters for ZeRO-3's gathers and reduce-scatters."""
    group = b.grad_group       # FSDP shards over dp × cp (torchtitan's dp_shard_cp mesh)
    if not b.shape.is_moe:
        return [(group, b.shape.layer_params / b.part.param_split * b.dt)]
    dense, expert = b.layer_rank_params(moe)
    if b.split_experts and expert:
        return [(group, dense * b.dt), ("edp", expert * b.dt)]
    return [(group, (dense + expert) * b.dt)]


@dataclass
class _Unit:
    """A stretch of compute that one set of gathers feeds: a layer (per-layer gathers) or a
    module's part of a layer (module hooks, ``module`` set). ``gathers``/``reduces``:
    (group, bytes) before it and after it; ``gather_passes``/``reduce_passes``: bytes of the
    memory passes after its gathers and before its reduce-scatters; ``host_gather``/
    ``host_reduce``: host seconds to issue its gathers and its reduce-scatters."""

    ops: list
    gathers: list
    reduces: list = field(default_factory=list)
    module: int | None = None
    gather_passes: float = 0.0
    reduce_passes: float = 0.0
    host_gather: float = 0.0
    #: host seconds after the gathers' NCCL launch (PyTorch 1.8's copy-out loop), beside them
    host_copy_out: float = 0.0
    #: bytes of the zero-fill before the host issues its gathers (``per_tensor``), on the
    #: ``host`` stream: the host waits for it (``_allgather_param``'s synchronisation)
    fill: float = 0.0
    host_reduce: float = 0.0
    #: host seconds to issue the reduce-scatters that wait for its compute to end (DeepSpeed
    #: 2021's gradients over ``zero3_reduce_bucket_size``, :func:`.zero3_fetch.reduce_host_split`)
    host_reduce_after: float = 0.0
    #: bytes of the compute stream's pass after the gathers (FSDP2's copy-out; at one rank
    #: its cast and copy in their place, :mod:`.fsdp2_passes`)
    copy_out: float = 0.0
    #: bytes of FSDP2's pass before the gathers (the shard's cast and copy-in), on its
    #: copy-in stream (:data:`.zero3_pass.COPY_IN_STREAM`)
    copy_in: float = 0.0
    #: bytes of FSDP2's cast of the parameters at one rank, on the compute stream before the
    #: copy-out
    cast: float = 0.0
    #: bytes of FSDP2's ``chunk_cat`` on the compute stream after the unit's backward
    chunk_cat: float = 0.0
    #: bytes of FSDP2's passes on ``dp`` after the reduce-scatters (or in their place at
    #: one rank: :func:`.fsdp2_passes.reduce_passes`)
    after_reduce: float = 0.0
    #: HSDP: (group, bytes) of the all-reduces over the replicas after the reduce-scatters
    replica_reduces: list = field(default_factory=list)
    #: ops on ``dp`` before its gathers, as a function of the first one's dependencies
    #: (FSDP's float8 all-gather: the shard's cast, :mod:`.fsdp_float8`); None: none
    pre_gather: Any = None
    #: module hooks: elements gathered while it computes (its module's and those kept for
    #: reuse), which gate the prefetch issued before it (:func:`_live_elements`)
    live: float = 0.0
    #: suffix of its collectives' names (``.embedding``, ``.head``, ``.root``: FSDP2's edge
    #: units, :mod:`.fsdp_edges`); empty for a layer's
    label: str = ""


def _split(op: Compute, b: StageBuilder) -> list[tuple[Compute, int]] | None:
    """A layer op cut into its modules' parts (:data:`.layerkernels.MODULE_PARTS`: the
    forward, recomputed and backward attention and MLP ops), each part with its module; None
    for other ops. FLOPs are shared out as the parts' GEMMs hold them (they only count; the
    time is the kernels')."""
    head, _, kind = op.name.partition(".")
    parts = MODULE_PARTS.get(f"bwd.{kind}" if head == "bwd" else kind)
    if parts is None or op.kernels is None:
        return None
    kernels = b.kernels
    work = [sum(2.0 * k.shape[0] * k.shape[1] * k.shape[2] * k.batch if k.kind == "gemm"
                else k.flops for k in kernels[part]) for part, _ in parts]
    total = sum(work) or 1.0
    return [(Compute(f"{op.name}.{part.rsplit('.', 1)[1]}", op.flops * w / total,
                     op.bytes * w / total, op.kind, op.dtype, kernels=kernels[part]), module)
            for (part, module), w in zip(parts, work)]


def _module_units(b: StageBuilder, ops: list, fetch: dict[int, ModuleFetch],
                  backward: bool) -> list[_Unit]:
    """One layer's ops (its forward, or its recomputation and backward) as one unit per
    module part; ops before the first part join it, later ones join the part before them.
    A unit gathers its module's forward tensors, or in the backward its recomputation's on
    the module's first visit and its backward's on the last; a module's reduce-scatters
    follow its last unit of the backward."""
    units: list[_Unit] = []
    pre: list = []
    for op in ops:
        parts = _split(op, b) if isinstance(op, Compute) else None
        if parts is None:
            (units[-1].ops if units else pre).append(op)
            continue
        for part, module in parts:
            f = fetch[module]
            first = not any(u.module == module for u in units)
            need = (f.forward if not backward else
                    f.recompute if f.recompute and first else f.backward)
            units.append(_Unit([*pre, part], [("dp", n * b.dt) for n in need], module=module))
            pre = []
    if not units:
        raise ConfigError("ZeRO-3 from module hooks (zero3_gather per_module or per_tensor) "
                          "needs a layer built of Megatron's attention and MLP GEMMs")
    if backward:
        for module, f in fetch.items():
            unit = [u for u in units if u.module == module][-1]
            unit.reduces = [("dp", n * b.gdt) for n in f.reduce]
            unit.reduce_passes = REDUCE_PASSES * sum(f.reduce) * b.gdt
    _live_elements(units, fetch, backward)
    if b.sw.zero3_gather == "per_tensor":   # PyTorch 1.8's list-form all_gather
        for u in units:
            u.fill = FETCH_FILL_PASSES * sum(n for _, n in u.gathers)
            u.gather_passes = (FETCH_PASSES - FETCH_FILL_PASSES) * sum(n for _, n in u.gathers)
            u.host_gather, u.host_copy_out = gather_host_split(b.sw, b.dp, len(u.gathers))
            u.host_reduce, u.host_reduce_after = reduce_host_split(
                b.sw, b.dp, [n / b.gdt for _, n in u.reduces])
    return units


def _units(b: StageBuilder, layers: list[list], moe: list[bool], backward: bool) -> list[_Unit]:
    """The units of a pass over ``layers`` (their ops, in pass order)."""
    if b.sw.zero3_gather == "per_layer":
        from .fsdp import layer_units
        return layer_units(b, layers, moe, backward)
    if b.shape.is_moe:
        raise ConfigError(f"system.software: zero3_gather = {b.sw.zero3_gather!r} is modelled "
                          "for dense decoder layers; this model has Mixture-of-Experts layers. "
                          "Use zero3_gather: per_layer")
    fetch = {f.module: f for f in module_fetches(b.shape, b.tp, b.sw,
                                                  b.plan.recompute == "full")}
    return [u for ops in layers for u in _module_units(b, ops, fetch, backward)]


def zero3_blocks(b: StageBuilder, prefetch: int) -> dict[str, Block]:
    """The ``F0`` and ``B0`` blocks of ZeRO-3 without pipelining (the module docstring)."""
    from .fsdp import one_layer
    n = b.split[0][0]
    moe = [b.shape.is_moe_layer(i) for i in range(n)]
    from .fsdp_edges import backward_edges, forward_edges   # FSDP2's edge units
    before, units, after = forward_edges(
        b, b.embedding_forward(),
        _units(b, [one_layer(b, False, m, i) for i, m in enumerate(moe)], moe, False),
        b.head_forward())
    fwd = _pass(b, before, units, prefetch)
    _extend(fwd, after)
    back = moe[::-1]
    from . import megatron_fsdp as mfsdp     # its edges' gradients (no-ops otherwise)
    before, units = backward_edges(
        b, mfsdp.with_head_reduce_scatter(b, b.head_backward()),
        _units(b, [one_layer(b, True, m, n - 1 - i) for i, m in enumerate(back)], back, True))
    bwd = _pass(b, before, units, prefetch)
    return {"F0": Block("F0", "forward", tuple(fwd)),
            "B0": mfsdp.with_embedding_reduce_scatter(b, Block("B0", "backward", tuple(bwd)))}
