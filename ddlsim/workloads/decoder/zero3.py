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
  embedding, the backward's only the output head's backward.

Every micro-batch gathers all layers twice and reduce-scatters every layer's gradients:
DeepSpeed ZeRO-3 partitions gradients at every backward (``reduce_scatter`` in its
backward hooks, gradient accumulation included; DeepSpeed docs, "ZeRO-3 Offload" and
``stage3.py``), i.e. ``3Ψ`` bytes per micro-batch (Rajbhandari et al. 2020, §7.2.2).

Memory: ``k + 1`` gathered layers are alive at once (the one computing and ``k`` prefetched):
:func:`gathered_layers_bytes`.

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

The gathers of a layer run one after another before it, its reduce-scatters after it
(``zero3_prefetch_layers: 0`` in that stack: every gather follows a device synchronisation).
Not modelled: the host time of those synchronisations and of the list-form collectives'
per-rank copies (one ``copy_`` per rank and tensor), which grows with the data-parallel size.

**Per-module gathers** (``per_module``, the ``deepspeed`` stack): DeepSpeed since v0.6 fetches
the same way from the same hooks, with the same persistence and reuse rules, but gathers a
module's parameters in one coalesced ``all_gather_into_tensor`` into the parameter's own buffer
(no memory passes when the module has one gathered tensor, the usual case; the ``torch.cat``
of several is not modelled), and prefetches (``zero3_prefetch_layers``). Gradients are
reduce-scattered per module here (DeepSpeed: per ``reduce_bucket_size`` bucket of 5e8
elements, ``reduce_scatter_coalesced``) with the same six memory passes (bucket copy,
``torch.cat`` of the ranks' chunks, ``div_``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ConfigError
from ..trace import Block, Collective, Compute, Op, Wait
from .builder import StageBuilder, as_ops

__all__ = ["zero3_blocks", "zero3_shards", "gathered_layers", "zero3_gathered_bytes",
           "list_gather_bytes", "TensorFetch", "module_fetches", "FETCH_PASSES",
           "REDUCE_PASSES"]

#: memory passes over a gathered tensor: zero-filled flat buffer (write), then PyTorch 1.8's
#: list all-gather copies each rank's chunk out of its own flat buffer (read + write)
#: (ProcessGroupNCCL::allgather; DeepSpeed v0.3.13 partition_parameters.py _allgather_param)
FETCH_PASSES = 3
#: memory passes over a reduce-scattered gradient: copy into the contiguous bucket, ``div_``
#: by the data-parallel size, list reduce-scatter's copy into its flat input (read + write
#: each; stage3.py reduce_independent_p_g_buckets_and_remove_grads and average_tensor,
#: ProcessGroupNCCL::reduce_scatter)
REDUCE_PASSES = 6


@dataclass(frozen=True)
class TensorFetch:
    """One dense layer's per-tensor ZeRO-3 traffic on a rank (elements, TP-sharded):
    the all-gathers of its forward and of its backward, its reduce-scatters, and the elements
    the memory passes of each touch (:data:`FETCH_PASSES` etc. already applied)."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    reduce: tuple[float, ...]
    forward_passes: float
    backward_passes: float
    reduce_passes: float


def module_fetches(shape, tp: int, sw, full_recompute: bool) -> TensorFetch:
    """DeepSpeed's fetches of one dense layer from its leaf modules' hooks (the module
    docstring): one collective per tensor (``per_tensor``, gathered with the list-form
    collective's memory passes) or per module (``per_module``: coalesced, gathered into the
    parameter's own buffer); the gradients' memory passes in both."""
    modules = shape.layer_modules(tp)
    threshold, reuse = sw.zero3_persistence_threshold, sw.zero3_max_reuse_distance
    sizes = [sum(m) for m in modules]
    forward, backward, reduce = [], [], []
    for i, module in enumerate(modules):
        # recomputation fetches the modules after i, and the backward visits them again
        times = 2 if full_recompute and not 2 * sum(sizes[i + 1:]) < reuse else 1
        fetched = [n for n in module if n >= threshold]
        if sw.zero3_gather == "per_module":
            fetched = [sum(fetched)] if fetched else []
            reduce.append(sizes[i])
        else:
            reduce += module
        forward += fetched
        backward += fetched * times
    copies = sw.zero3_gather == "per_tensor"   # PyTorch 1.8's list-form all_gather
    return TensorFetch(tuple(forward), tuple(backward), tuple(reduce),
                       copies * FETCH_PASSES * sum(forward), copies * FETCH_PASSES * sum(backward),
                       REDUCE_PASSES * sum(reduce))


def gathered_layers(prefetch: int) -> int:
    """Layers whose full (TP-sharded) parameters a rank holds at once under ZeRO-3: the one
    computing and ``prefetch`` gathered ahead."""
    return prefetch + 1


def zero3_gathered_bytes(cfg, layer_bytes: float, shape=None, dt: float = 0.0) -> float:
    """Memory of the gathered layers in flight: :func:`gathered_layers` × one layer's
    parameters on the rank (``layer_bytes``, already TP-sharded), and with per-tensor gathers
    the second flat buffer of the largest tensor of ``dt`` bytes per element
    (:func:`list_gather_bytes`; needs ``shape``)."""
    extra = (list_gather_bytes(shape, cfg.parallel.tp, cfg.software, dt)
             if shape is not None else 0.0)
    return gathered_layers(cfg.software.zero3_prefetch_layers) * layer_bytes + extra


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
    if not b.shape.is_moe:
        return [("dp", b.shape.layer_params / b.tp * b.dt)]
    dense, expert = b.layer_rank_params(moe)
    if b.split_experts and expert:
        return [("dp", dense * b.dt), ("edp", expert * b.dt)]
    return [("dp", (dense + expert) * b.dt)]


def _tensors(b: StageBuilder) -> TensorFetch | None:
    """The module-hook fetches of the stage's layers, or None for per-layer gathers."""
    if b.sw.zero3_gather == "per_layer":
        return None
    if b.shape.is_moe:
        raise ConfigError(f"system.software: zero3_gather = {b.sw.zero3_gather!r} is modelled "
                          "for dense decoder layers; this model has Mixture-of-Experts layers. "
                          "Use zero3_gather: per_layer")
    return module_fetches(b.shape, b.tp, b.sw, b.cfg.train.recompute == "full")


def _pass(b: StageBuilder, head: list, bodies: list[list], moe: list[bool], backward: bool,
          prefetch: int) -> list[Op]:
    """One pass (forward or backward) over the layers ``bodies`` (in pass order) after the
    ``head`` ops, with its gathers, prefetch limit and (backward) reduce-scatters."""
    ops: list[Op] = [Op(Wait("zero3.start", "compute"))]
    pending: dict[int, tuple[int, ...]] = {}
    fetch = _tensors(b)
    passes = 0.0 if fetch is None else fetch.backward_passes if backward else fetch.forward_passes
    if passes:
        bodies = [[Compute("zero3.fetch_passes", 0.0, passes * b.dt, kind="elementwise",
                           dtype=b.dtype), *body] for body in bodies]
    # the gradients' memory passes: before their reduce-scatters, on the reduction stream
    # (today's DeepSpeed), or after the layer's backward on the compute stream (2021: every
    # gather waits for a device synchronisation anyway)
    reduce_passes = (Compute("zero3.reduce_passes", 0.0, fetch.reduce_passes * b.gdt,
                             kind="elementwise", dtype=b.dtype)
                     if fetch is not None and backward and fetch.reduce_passes else None)
    if reduce_passes is not None and b.sw.zero3_gather == "per_tensor":
        bodies, reduce_passes = [[*body, reduce_passes] for body in bodies], None

    def shards(j: int, grads: bool) -> list[tuple[str, float]]:
        if fetch is None:
            return zero3_shards(b, moe[j])
        elems = fetch.reduce if grads else fetch.backward if backward else fetch.forward
        return [("dp", n * b.dt) for n in elems]

    def gather(j: int, dep: int) -> None:
        idx = []
        for group, n in shards(j, False):
            ops.append(Op(Collective("param.all_gather", "all_gather", group, n), group,
                          deps=(dep,)))
            idx.append(len(ops) - 1)
        pending[j] = tuple(idx)

    for j in range(min(prefetch + 1, len(bodies))):
        gather(j, 0)
    ops += as_ops(head)
    for j, body in enumerate(bodies):
        ops += [Op(x, deps=pending.pop(j) if i == 0 else ()) for i, x in enumerate(body)]
        last = len(ops) - 1
        if reduce_passes is not None:
            ops.append(Op(reduce_passes, "dp", deps=(last,)))
        if backward:
            for group, n in shards(j, True):
                ops.append(Op(Collective("grad.reduce_scatter", "reduce_scatter", group,
                                         n * b.gdt / b.dt), group, deps=(last,)))
        if j + prefetch + 1 < len(bodies):
            gather(j + prefetch + 1, last)
    return ops


def zero3_blocks(b: StageBuilder, prefetch: int) -> dict[str, Block]:
    """The ``F0`` and ``B0`` blocks of ZeRO-3 without pipelining (the module docstring)."""
    moe = [b.shape.is_moe_layer(i) for i in range(b.split[0][0])]
    fwd = _pass(b, b.embedding_forward(), [b.layer_forward(moe=m) for m in moe], moe, False,
                prefetch)
    fwd += as_ops(b.head_forward())
    back = moe[::-1]
    bwd = _pass(b, b.head_backward(), [b.layer_backward(moe=m) for m in back], back, True,
                prefetch)
    return {"F0": Block("F0", "forward", tuple(fwd)), "B0": Block("B0", "backward", tuple(bwd))}
