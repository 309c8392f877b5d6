"""FSDP (ZeRO-3 with per-layer units) as PyTorch FSDP2 runs it, within pipeline stages too.

**When parameters are gathered** follows the stack's ``zero3_reshard_after_forward``
(torchtitan's ``fully_shard(..., reshard_after_forward=…)``, docs/stacks.md):

* without pipelining, every micro-batch gathers every layer for its forward; the backward
  gathers it again unless the layer was kept gathered (``never``; ``not_with_pp_nor_last``
  keeps the last layer, whose backward comes first). Gradients are reduce-scattered after
  every micro-batch's backward of a layer (torchtitan's gradient accumulation leaves
  ``set_requires_gradient_sync`` on: ``train.py`` ``train_step``).
* with pipelining (``never``, ``not_with_pp``, ``not_with_pp_nor_last``), a stage gathers
  its parameters once per iteration, in its first forward, and keeps them until after its
  last backward: torch.distributed.pipelining turns off FSDP's resharding and gradient sync
  for every backward (``set_reshard_after_backward(False)``,
  ``set_requires_gradient_sync(False)``) and reduce-scatters every unit's gradients after
  the stage's last backward (``_PipelineStageBase._post_backward``: pytorch/pytorch
  0138610 ``torch/distributed/pipelining/stage.py``). ``always`` with pipelining is not
  modelled (refused).

**In the trace** (pipelining): the first forward of the stage (block ``F0.pg``, the
prologue of :mod:`.param_gather`) issues, once its input has arrived (the stage's forward
runs after its receive), the gather of its first layer, on which its first layer waits, then
the gather of the rest of the stage (other model chunks included) on the ``dp`` stream beside
the forward; the forward's send waits for all of it (an approximation of the one-layer-ahead
prefetch: the forward may run ahead of gathers it needs). FSDP2's copy-out of the whole
stage is one pass on the compute stream after the first gather. The update block
reduce-scatters each layer's gradients (and the stage's edge parameters', one more
collective) on ``dp`` after the last backward, exposed, then steps the optimizer on the
shard.

**Copy passes** (``zero3_copy_out``, FSDP2): the casts and copies around each unshard and
the ``chunk_cat`` and copies around each reduce-scatter, as torch's code makes them, at every
shard-group size, one rank included (:mod:`.fsdp2_passes`: no collective at one rank, the
passes still run). FSDP2 reduce-scatters every micro-batch's gradients without pipelining, so
no unsharded accumulation pass runs (:func:`reduces_every_microbatch`).

**Float8 all-gather** (``enable_fsdp_float8_all_gather``, torchao's, :mod:`.fsdp_float8`):
the float8 linears' weights are gathered at 1 byte per element, each gather after the cast of
the rank's shard (and, without precomputed scales, one amax all-reduce per weight); the
copy-out copies the gathered bytes; the update block ends with the scale precompute when
``precompute_float8_dynamic_scale_for_fsdp`` is on (:func:`with_float8_precompute`).
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError
from ..smcontention import beside
from ..trace import Block, Collective, Compute, Loop, Op, P2P, Wait
from . import fsdp_float8, param_gather
from .hsdp import check_hsdp
from .megatron_fsdp import check as check_megatron_fsdp

__all__ = ["one_layer", "layer_units", "fsdp_unit", "kept_in_backward", "per_iteration",
           "at_one_rank", "reduces_every_microbatch", "check_fsdp",
           "pipeline_prologue", "with_stage_reduce_scatters", "with_float8_precompute",
           "reshard_phrase", "vector_refusal"]


def per_iteration(sw: Any, pp: int) -> bool:
    """Whether a stage gathers its parameters once per iteration (FSDP under pipelining
    with resharding after forward off) rather than per micro-batch."""
    return pp > 1 and sw.zero3_gather == "per_layer" and sw.zero3_reshard_after_forward != "always"


def kept_in_backward(sw: Any, layer: int, layers: int) -> bool:
    """Whether layer ``layer`` of ``layers`` (forward order) stays gathered from its forward
    to its backward, without pipelining."""
    policy = sw.zero3_reshard_after_forward
    return policy == "never" or (policy == "not_with_pp_nor_last" and layer == layers - 1)


def one_layer(b: Any, backward: bool, moe: bool, index: int) -> list:
    """One layer's forward or backward ops (``index``: the layer's, from 0): for dense layers
    under per-layer units the builder's own one-layer ops (plain, a partitioner's loop, or
    the TP overlap's loop; checkpointed or not under ``recompute_every_n_layers``), else the
    payloads (MoE layers; module hooks, which cut them by module)."""
    if b.period == 1 and not b.shape.is_moe and b.sw.zero3_gather == "per_layer":
        return list(b.layer_ops(backward, 1, first=index))  # module hooks cut the payloads
    every = b.plan.recompute_every_n_layers
    if backward and every > 1:
        raise ConfigError(f"train.recompute_every_n_layers = {every} is modelled for dense "
                          "layers under FSDP's per-layer units (zero3_gather: per_layer); "
                          f"the stack {b.sw.name!r} gathers {b.sw.zero3_gather.replace('_', ' ')}"
                          ": use recompute_every_n_layers: 1")
    return b.layer_backward(moe=moe) if backward else b.layer_forward(moe=moe)


def layer_units(b: Any, layers: list[list], moe: list[bool], backward: bool) -> list:
    """The per-layer units of one pass (:class:`.zero3._Unit`): each layer's gathers (none
    in the backward for a layer kept gathered, :func:`kept_in_backward`), its gradients'
    reduce-scatters in the backward, and FSDP2's copy passes (module docstring)."""
    from .zero3 import _Unit, zero3_shards
    sw, n = b.sw, len(layers)
    float8 = fsdp_float8.active(sw)
    out = []
    for k, (ops, m) in enumerate(zip(layers, moe)):
        shards = zero3_shards(b, m)
        layer = n - 1 - k if backward else k           # forward order
        gathers = [] if backward and kept_in_backward(sw, layer, n) else shards
        if float8 and gathers:     # dense layers only (fsdp_float8.check)
            gathers = [(g, _gathered(b, x / b.dt)) for g, x in gathers]
        unit = _with_grads(b, _Unit(ops, gathers), shards, backward)
        if float8 and gathers:
            unit.pre_gather = _cast_ops(b, 1)
        out.append(unit)
    return out


def fsdp_unit(b: Any, ops: list, params: float, gather: bool, reduce: bool,
              label: str) -> Any:
    """A unit of ``params`` parameters on this rank outside the layers (an edge unit,
    :mod:`.fsdp_edges`, its collectives named with ``label``) over ``ops``, sharded over the
    gradient group as the layers are: gathered before them in 16 bits when ``gather``, its
    gradients reduce-scattered after them when ``reduce``, with the copy passes and replica
    all-reduces of :func:`layer_units`."""
    from .zero3 import _Unit
    shards = [(b.grad_group, params * b.dt)]
    unit = _Unit(ops, shards if gather else [], label=label)
    return _with_grads(b, unit, shards, reduce)


def _with_grads(b: Any, unit: Any, shards: list, backward: bool) -> Any:
    """``unit`` with, in the backward, its ``shards``' (group, 16-bit bytes) gradients
    reduce-scattered in the reduce dtype (and all-reduced over HSDP's replicas), with FSDP1's
    passes over them (:mod:`.fsdp1_passes`) or FSDP2's (:mod:`.fsdp2_passes`) over what it
    gathers and reduces. A group of one rank gathers and reduce-scatters nothing: FSDP2
    casts and copies in its place."""
    if backward:
        unit.reduces = [(g, x * b.gdt / b.dt) for g, x in shards if _size(b, g) > 1]
        if b.plan.hsdp_replicas > 1:    # HSDP (.hsdp)
            from .hsdp import replica_reduces
            unit.replica_reduces = replica_reduces(unit.reduces, b.gdp)
        if b.sw.zero3_implementation == "torch_fsdp":     # FSDP1's (.fsdp1_passes)
            from .fsdp1_passes import add_grad_passes
            add_grad_passes(b, unit, shards, lambda g: _size(b, g))
    if not b.sw.zero3_copy_out:
        return unit
    from .fsdp2_passes import reduce_passes, unshard_passes
    gathered = {g for g, _ in unit.gathers}
    for g, x in shards:
        n = _size(b, g)
        if g in gathered:
            own = [y for h, y in unit.gathers if h == g]
            passes = unshard_passes(x / b.dt, n, b.dt)
            unit.copy_in += 0.0 if fsdp_float8.active(b.sw) else passes.copy_in
            unit.cast += passes.cast
            unit.copy_out += passes.copy_out if n == 1 else 2 * sum(own)  # float8: 1 byte
        if backward:
            grads = reduce_passes(x / b.dt, n, b.dt, b.gdt, b.plan.microbatches)
            unit.chunk_cat += grads.chunk_cat
            unit.after_reduce += grads.after
    unit.gathers = [(g, x) for g, x in unit.gathers if _size(b, g) > 1]
    return unit


def _size(b: Any, group: str) -> int:
    """Ranks of FSDP's shard group ``group``: the gradient group's, or the experts' (``edp``)."""
    return b.gdp if group == b.grad_group else b.plan.edp


def at_one_rank(sw: Any, pp: int) -> bool:
    """Whether stack ``sw`` runs FSDP's units on a shard group of one rank as it does on
    more (FSDP2, ``zero3_copy_out``: ``fully_shard`` on a one-rank mesh still casts, copies
    and chunk-cats, :mod:`.fsdp2_passes`), without pipelining (FSDP inside pipeline stages
    on one rank is not modelled: such a plan builds no ZeRO-3 units)."""
    return bool(sw.zero3_copy_out) and sw.zero3_gather == "per_layer" and pp == 1


def reduces_every_microbatch(plan: Any) -> bool:
    """Whether FSDP2 reduce-scatters each micro-batch's gradients of plan ``plan`` (ZeRO-3
    under FSDP2 without pipelining: torchtitan's gradient accumulation leaves
    ``set_requires_gradient_sync`` on), so that no pass adds a micro-batch's gradients into
    unsharded ones (FSDP2's ``post_backward_accumulate`` then launches nothing; the sharded
    add is :mod:`.fsdp2_passes`'s)."""
    sw = plan.software
    return plan.zero_stage == 3 and bool(sw.zero3_copy_out) and not per_iteration(sw, plan.pp)


def _gathered(b: Any, elements: float) -> float:
    """Bytes gathered for ``elements`` 16-bit parameters of one dense layer on this rank,
    float8 weights at 1 byte (:func:`.fsdp_float8.gathered_bytes`)."""
    return fsdp_float8.gathered_bytes(b.shape, elements, b.part.param_split, b.dt)


def _cast_ops(b: Any, layers: float):
    """The pre-gather casts of ``layers`` layers' float8 weight shards, as a function of the
    first op's dependencies (:func:`.fsdp_float8.cast_ops`)."""
    def ops(deps: tuple[int, ...]) -> list:
        return fsdp_float8.cast_ops(b.sw, b.shape, b.part.param_split, b.gdp, b.grad_group,
                                    layers, b.dtype, deps)
    return ops


def check_fsdp(cfg: Any) -> None:
    """What FSDP within pipeline stages models (ValueError, one paragraph)."""
    p, sw = cfg.parallel, cfg.software
    check_hsdp(cfg)
    fsdp_float8.check(cfg)
    check_megatron_fsdp(cfg)
    if p.zero_stage != 3 or p.pp == 1:
        return
    from ...stackrules import broken_rules
    if not sw.what_if and broken_rules(cfg):
        return          # the stack cannot run the plan: its rule says so, with its source
    if sw.zero3_gather != "per_layer":
        raise ValueError(f"zero_stage = 3 with pipeline_model_parallel_size = {p.pp} is "
                         "modelled with per-layer units (FSDP, zero3_gather: per_layer); "
                         f"the stack {sw.name!r} gathers {sw.zero3_gather.replace('_', ' ')}."
                         " Use a torchtitan stack, or pipeline_model_parallel_size = 1")
    if sw.zero3_reshard_after_forward == "always":
        raise ValueError(f"zero_stage = 3 with pipeline_model_parallel_size = {p.pp} and "
                         "zero3_reshard_after_forward = 'always' is not modelled (FSDP "
                         "under torch.distributed.pipelining keeps the gathered parameters "
                         "through the backward: torchtitan's default). Set "
                         "system.software.overlap.zero3_reshard_after_forward: not_with_pp")
    if p.dp_strategy != "ddp":
        raise ValueError(f"zero_stage = 3 needs dp_strategy = 'ddp' (got {p.dp_strategy!r})")


def _stage_bytes(b: Any, stage: int) -> tuple[float, float]:
    """(bytes of one rank's first layer, bytes of the rest of the stage) on this rank, as
    gathered (float8 weights at 1 byte under the float8 all-gather)."""
    total = b.stage_params(stage) * b.dt
    first = sum(x for _, x in _shards(b))
    if fsdp_float8.active(b.sw):
        layers = sum(b.split[stage])
        fp8 = _gathered(b, first / b.dt)
        return fp8, max(total - layers * first, 0.0) + (layers - 1) * fp8
    return first, max(total - first, 0.0)


def _shards(b: Any) -> list[tuple[str, float]]:
    from .zero3 import zero3_shards
    return zero3_shards(b, b.shape.is_moe_layer(0) if b.shape.is_moe else False)


def _prologue_gathers(b: Any, stage: int, recvs: tuple[int, ...], at: int
                      ) -> tuple[list, int]:
    """The prologue's ops from index ``at`` on (module docstring): the first layer's gather,
    the rest of the stage's, each after its float8 casts under the float8 all-gather, then
    FSDP2's copy-out after the first; and the index of the op the first layer waits for."""
    head, rest = _stage_bytes(b, stage)
    layers = sum(b.split[stage])
    group = b.grad_group
    new: list = []
    first = None
    for name, nbytes, count in (("param.all_gather.first", head, 1),
                                ("params.all_gather.overlapped", rest, layers - 1)):
        deps = recvs
        if fsdp_float8.active(b.sw) and count:
            new += _cast_ops(b, count)(recvs)
            deps = (at + len(new) - 1,)
        new.append(Op(Collective(name, "all_gather", group, nbytes), "dp", deps))
        first = at + len(new) - 1 if first is None else first
    if b.sw.zero3_copy_out:
        new.append(Op(Compute("zero3.copy_out", 0.0, 2 * (head + rest), kind="elementwise",
                              dtype=b.dtype), deps=(first,)))
        return new, at + len(new) - 1
    return new, first


def pipeline_prologue(b: Any, first: Block, stage: int) -> Block:
    """The stage's first forward (``F0``) with FSDP's once-per-iteration gathers (module
    docstring). The stage's forward pre-hook runs once its input has arrived (torch
    pipelining calls the stage's forward after the receive): both gathers depend on the
    block's receives; the first layer's compute waits for the first gather (and FSDP2's
    copy-out of the stage's parameters on the compute stream); the rest of the stage is
    gathered on ``dp`` beside the forward, whose send waits for it."""
    body = list(first.ops)
    at = next(i for i, o in enumerate(body) if isinstance(o.payload, (Compute, Loop)))
    recvs = tuple(i for i, o in enumerate(body[:at])
                  if isinstance(o.payload, P2P) and o.payload.kind == "recv")
    new, ready = _prologue_gathers(b, stage, recvs, at)
    k = len(new)
    moved = [Op(o.payload, o.stream, tuple(d + k if d >= at else d for d in o.deps), o.repeat)
             for o in body[at:]]
    wait = next((j for j, o in enumerate(moved) if isinstance(o.payload, P2P)
                 and o.payload.kind == "send"), len(moved))
    moved, wait = _with_contention(b, moved, wait, new, at + k + wait)
    ops = body[:at] + new
    first_op = moved[0]
    moved[0] = Op(first_op.payload, first_op.stream, first_op.deps + (ready,),
                  first_op.repeat)
    tail = [Op(o.payload, o.stream, tuple(d + 1 if d >= at + k + wait else d for d in o.deps)
               + ((at + k + wait,) if isinstance(o.payload, P2P) and o.payload.kind == "send"
                  else ()), o.repeat) for o in moved[wait:]]
    ops += moved[:wait] + [Op(Wait("params.gather.wait", "dp"))] + tail
    return Block(param_gather.BLOCK, first.phase, tuple(ops))


def _with_contention(b: Any, moved: list, wait: int, new: list, p: int) -> tuple[list, int]:
    """``(moved, wait)`` with the contention op of the forward's GEMMs before its wait (the
    ``wait`` ops of ``moved``) beside the rest of the stage's gather
    (:func:`~ddlsim.workloads.smcontention.beside`) inserted at absolute index ``p``: the
    first layer waits for its own gather, queued before the rest on ``dp``, so the rest runs
    beside the forward's layers."""
    rest = [o.payload for o in new if isinstance(o.payload, Collective)
            and o.payload.name == "params.all_gather.overlapped"]
    extra = beside("fsdp.params.all_gather", moved[:wait], rest, b.dtype)
    if extra is None:
        return moved, wait
    later = [Op(o.payload, o.stream, tuple(d + 1 if d >= p else d for d in o.deps), o.repeat)
             for o in moved[wait:]]
    return [*moved[:wait], extra, *later], wait + 1


def with_stage_reduce_scatters(b: Any, update: Block, stage: int) -> Block:
    """``update`` with the stage's gradient reduce-scatters after its last backward: one per
    layer and one for the edge parameters (the first or last stage's embedding and head), on
    ``dp`` before the update's wait for it, each after its ``chunk_cat`` (FSDP2, on the
    compute stream: of the gradients FSDP2 accumulated unsharded in the reduce dtype while
    gradient sync was off, ``FSDPParam.to_accumulated_grad_if_needed``, so ``2g`` bytes a
    parameter), and under HSDP each followed by its all-reduce over the replicas
    (:mod:`.hsdp`)."""
    from .hsdp import replica_ops
    layer = sum(x for _, x in _shards(b)) / b.dt
    layers = sum(b.split[stage])
    edge = max(b.stage_params(stage) - layers * layer, 0.0)
    sizes = [layer] * layers + ([edge] if edge else [])
    rs: list[Op] = []
    for n in sizes:
        deps = (0,)
        if b.sw.zero3_copy_out:   # chunk_cat of the fp32 accumulated gradients (module doc)
            from .fsdp2_passes import chunk_cat_op
            rs.append(Op(chunk_cat_op(n * 2 * b.gdt, b.dtype), "compute", deps=(0,)))
            deps = (len(rs),)
        rs.append(Op(Collective("grad.reduce_scatter", "reduce_scatter", b.grad_group,
                                n * b.gdt), "dp", deps=deps))
        if b.plan.hsdp_replicas > 1:
            rs += replica_ops([n * b.gdt / b.gdp], (len(rs),))
    ops = list(update.ops)
    assert isinstance(ops[0].payload, Wait)
    k = len(rs)
    rest = [Op(o.payload, o.stream, tuple(d + k if d >= 1 else d for d in o.deps), o.repeat)
            for o in ops[1:]]
    return Block(update.name, update.phase, (ops[0], *rs, *rest))


def with_float8_precompute(b: Any, update: Block, stage: int) -> Block:
    """``update`` followed by the float8 scale precompute of the stage's weights after the
    optimizer step (:func:`.fsdp_float8.precompute_ops`), when the stack precomputes them;
    else ``update`` itself."""
    sw = b.sw
    if not (fsdp_float8.active(sw) and sw.precompute_float8_dynamic_scale_for_fsdp):
        return update
    n = len(update.ops)
    extra = fsdp_float8.precompute_ops(b.shape, b.part.param_split, b.gdp, sum(b.split[stage]),
                                       b.tp, b.grad_group, b.dtype)
    shifted = [Op(o.payload, o.stream, tuple(d + n for d in o.deps), o.repeat) for o in extra]
    return Block(update.name, update.phase, (*update.ops, *shifted))


def reshard_phrase(cfg: Any) -> str:
    """``, gathered once per iteration`` under pipelining, ``, kept for the backward`` /
    ``, last layer kept`` without; empty for the plain policy; then under HSDP ``, HSDP: R
    replicas of N-rank shards``, and the float8 all-gather when on
    (:func:`.fsdp_float8.phrase`)."""
    sw = cfg.software
    if sw.zero3_gather != "per_layer":
        return ""
    from .hsdp import active, shard_group
    hsdp = (f", HSDP: {cfg.parallel.data_parallel_replicate_size} replicas of "
            f"{shard_group(cfg)[1]}-rank shards") if active(cfg) else ""
    hsdp += fsdp_float8.phrase(sw)
    from .megatron_fsdp import phrase as megatron_fsdp_phrase
    hsdp += megatron_fsdp_phrase(sw)
    if per_iteration(sw, cfg.parallel.pp):
        return ", gathered once per iteration (pipelined)" + hsdp
    return {"never": ", kept for the backward",
            "not_with_pp_nor_last": ", last layer kept for the backward"}.get(
        sw.zero3_reshard_after_forward, "") + hsdp


def vector_refusal(sw: Any) -> str | None:
    """Why the search's vectorised tier cannot time plans of stack ``sw`` (its ZeRO-3 model
    is FSDP1's: resharded after every forward, no copy passes, never inside pipeline
    stages), or None. Such grids are searched by the exact engine."""
    if sw.selective_recompute != "attention_core":
        return (f"system.software = {sw.name!r} recomputes {sw.selective_recompute!r} under "
                "recompute: selective, which the vectorised search tier does not model; its "
                "plans are searched by the exact engine")
    if fsdp_float8.active(sw):
        return (f"system.software = {sw.name!r} gathers float8 weights "
                "(enable_fsdp_float8_all_gather), which the vectorised search tier does not "
                "model; its plans are searched by the exact engine")
    if sw.zero3_implementation == "megatron_fsdp":
        return (f"system.software = {sw.name!r} runs ZeRO-3 as Megatron-FSDP (its gradient "
                "copy into main_grad, decoder/megatron_fsdp.py), which the vectorised search "
                "tier does not model; its plans are searched by the exact engine")
    if sw.zero3_reshard_after_forward != "always" or sw.zero3_copy_out:
        return (f"system.software = {sw.name!r} runs FSDP2 (zero3_reshard_after_forward = "
                f"{sw.zero3_reshard_after_forward!r}, zero3_copy_out = {sw.zero3_copy_out}), "
                "which the vectorised search tier does not model; its plans are searched by "
                "the exact engine")
    return None
