"""A decoder-only transformer's training iteration → workload trace, and its memory per stage.

Rank order follows Megatron-LM (:meth:`~ddlsim.workloads.mesh.DeviceMesh.from_megatron`):
tensor-parallel innermost, then data-parallel, then pipeline: ``rank = t + T·(d + D·s)``. All
ranks of one pipeline stage run the same program, so each stage is one rank class (the
reduce-to-root strategy splits off the root, which alone updates).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...config import RunConfig
from ...errors import ConfigError
from ..allocator import context_bytes
from ..memory import MemoryBreakdown
from ..models.decoder import DecoderShape
from ..schedules import schedule_arrays
from ..trace import Block, RankClass, Program, StepTable, Workload, WorkloadMeta
from .builder import StageBuilder, with_edges
from .memory import comm_groups, stage_memory
from .mtp import mtp_model_flops, with_mtp_memory
from .plan import resolve_plan
from .split import mtp_depths
from . import (combined, fsdp, hsdp, megatron_fsdp, moe_bias_update, param_gather,
               tied_embedding)
from .zero3 import zero3_blocks, zero3_prefetch

__all__ = ["build_decoder_workload", "decoder_memory"]


def _step_tables(sched: str, pp: int, m: int, v: int, sync: bool, prologue: bool = False,
                 later_wait=False, group: int | None = None) -> list[StepTable]:
    """Each stage's steps, built for all stages at once from :func:`schedule_arrays`; the last
    backward of each chunk uses its ``.sync`` block, and ``update`` ends the iteration. With
    ``prologue`` the first step (every stage's first forward of chunk 0) runs ``F0.pg``
    (:mod:`.param_gather`); with ``later_wait`` too (interleaved; a bool, or one per stage,
    since a stage whose later chunks' parameters fit in the update's first bucket has no such
    block) the first forward of the last chunk runs ``F<v-1>.pg``, which waits for the other
    chunks' gather. ``group``: the interleaved schedule's micro-batches per group (None: PP)."""
    backward, ordinal, mb, chunk, warm = schedule_arrays(sched, pp, m, v, group)
    v = v if sched == "interleaved" else 1
    T = m * v
    names = [f"F{c}" for c in range(v)] + [f"B{c}" for c in range(v)]
    block = chunk + v * backward
    first_sync = np.full(pp, 2 * T)
    if sync:
        names += [f"B{c}.sync" for c in range(v)]
        b0, o0, c0 = backward[0], ordinal[0], chunk[0]
        last_b = np.array([o0[b0 & (c0 == c)].max() for c in range(v)])
        # where each stage runs backward last_b[c] (chunk c's last): schedule_arrays puts
        # the i-th backward at w + 2i + 1 if i < T - w, else at T + i
        w = warm[:, None]
        at = np.where(last_b < T - w, w + 2 * last_b + 1, T + last_b)
        block[np.arange(pp)[:, None], at] = 2 * v + np.arange(v)
        first_sync = at.min(axis=1)
    waits = np.zeros(pp, dtype=np.int64)
    has_wait = np.zeros(pp, dtype=bool)
    if prologue:
        names.append(param_gather.BLOCK)
        block = block.copy()
        block[:, 0] = len(names) - 1
        if v > 1:
            has_wait = np.broadcast_to(np.asarray(later_wait, dtype=bool), (pp,))
        rows = np.flatnonzero(has_wait)
        waits[rows] = np.argmax((backward == 0) & (mb == 0) & (chunk == v - 1), axis=1)[rows]
        block[rows, waits[rows]] = len(names)          # the waiting block, after the prologue
    with_wait = [*names, param_gather.waiting_block_name(v - 1), "update"]
    names.append("update")
    tail = np.zeros((pp, 1), dtype=np.int64)
    block = np.hstack([block, tail + np.where(has_wait, len(names), len(names) - 1)[:, None]])
    mb, chunk = np.hstack([mb, tail]), np.hstack([chunk, tail])
    for a in (block, mb, chunk):
        a.setflags(write=False)
    tables = []
    for s in range(pp):
        w = int(warm[s])
        if sched == "gpipe":       # the forwards: one per micro-batch, nothing in between
            steady = (0, min(T, int(first_sync[s])), 1, 1)
        elif sched == "1f1b":      # one forward and one backward per micro-batch
            steady = (w, min(2 * T - w, int(first_sync[s])), 2, 1)
        else:                      # p micro-batches of every chunk, forward and backward
            steady = (w, min(2 * T - w, int(first_sync[s])), 2 * pp * v, pp)
        if prologue:
            steady = (max(steady[0], 1, int(waits[s]) + 1), *steady[1:])
        tables.append(StepTable.trusted(with_wait if has_wait[s] else names, block[s], mb[s],
                                        chunk[s], steady))
    return tables


class _Modes(NamedTuple):
    """What the plan turns on that shapes a stage's blocks."""

    overlap: bool      # DDP's gradient sync overlapping the backward (ZeRO 0-2)
    zero3: bool        # ZeRO-3 / FSDP, sharded over dp × cp
    staged: bool       # FSDP inside pipeline stages (.fsdp.per_iteration)
    replicated: bool   # HSDP: the optimizer waits for the replicas
    combined: bool     # Megatron-Core's combined 1F1B (.combined)


def _modes(plan, b: StageBuilder, cfg: RunConfig) -> _Modes:
    """The plan's :class:`_Modes`; the combined 1F1B with ZeRO-3 is refused."""
    zero3 = plan.zero_stage == 3 and (b.gdp > 1 or fsdp.at_one_rank(b.sw, b.pp))
    staged = zero3 and fsdp.per_iteration(b.sw, b.pp)
    modes = _Modes(bool(b.sw.overlap_grad_reduce and plan.dp_strategy == "ddp"
                        and plan.zero_stage in (0, 1, 2)),
                   zero3, staged, hsdp.active(cfg), plan.combined_1f1b)
    if modes.combined and (zero3 or staged):
        raise ConfigError("parallel.moe.overlap_expert_parallel_comm = true with ZeRO-3 "
                          f"(parallel.zero_stage = {plan.zero_stage}): the combined 1F1B over "
                          "FSDP-sharded layers is not modelled; use zero_stage 0, 1 or 2")
    return modes


def _stage_ranks(mesh, b: StageBuilder) -> np.ndarray:
    """The ranks of each stage, ``[stage, …]``: ``[s, d, t]`` without context parallelism,
    else row ``s`` of the tp·cp·dp groups (pp is the other axis)."""
    if b.cp == 1:
        stage_, d_, t_ = np.meshgrid(np.arange(b.pp), np.arange(b.dp), np.arange(b.tp),
                                     indexing="ij")
        return mesh.rank_of(np.stack([t_, d_, stage_], axis=-1), ("tp", "dp", "pp"))
    return mesh.groups(("tp", "cp", "dp"))[:, None, :]


def _stage_blocks(b: StageBuilder, stage: int, modes: _Modes) -> dict[str, Block]:
    """The forward and backward blocks of ``stage`` (and the prologue beside F0)."""
    plan = b.plan
    blocks: dict[str, Block] = {}
    if modes.zero3 and not modes.staged:
        blocks.update(zero3_blocks(b, zero3_prefetch(b.sw)))
    else:
        for c in range(b.v):
            sync = b.grad_sync_ops(stage, c) if modes.overlap else None
            blocks.update(b.chunk_blocks(stage, c, sync))
        if modes.combined:
            blocks.update(combined.combined_blocks(b, stage, blocks, b.moe.delay_wgrad))
    if plan.param_gather_overlap:   # all but the first bucket (of each buffer) beside F0
        (dense, later), (expert, e_later) = _gathers(b, stage, modes.combined)
        blocks[param_gather.BLOCK] = param_gather.prologue_block(
            blocks["F0"], b.grad_group, dense, b.dtype, later, expert, e_later)
        streams = tuple(s for s, n in (("dp", later), ("edp", e_later)) if n > 0)
        if streams:
            blocks[param_gather.waiting_block_name(b.v - 1)] = param_gather.waiting_block(
                blocks[f"F{b.v - 1}"], streams)
    elif modes.staged:
        blocks[param_gather.BLOCK] = fsdp.pipeline_prologue(b, blocks["F0"], stage)
    return blocks


def _gathers(b: StageBuilder, stage: int, combined_1f1b: bool
             ) -> tuple[tuple[float, float], tuple[float, float]]:
    """Bytes of ``stage``'s parameter gather beside ``F0`` and of its later chunks', for the
    dense buffer and for the experts' own (0, 0 where the experts are not laid out apart):
    each buffer's chunk-0 share less its first bucket, which the update block leaves exposed
    (:func:`.param_gather.first_bucket`), and the later chunks' share less what that bucket
    already holds (none under the combined 1F1B)."""
    params = b.stage_params(stage)
    expert = b.stage_expert_params(stage) if b.split_experts else 0.0
    per = param_gather.gather_bytes_per_param(b.sw, b.plan.train_dtype, b.dt)
    bucket = b.plan.param_bucket_bytes
    out = []
    for nbytes, later in (
            (param_gather.stage_bytes(b, stage, params - expert),
             _later_chunks_bytes(b, stage, params, expert)),
            (expert * per, (expert - b.chunk_expert_params(stage, 0)) * per if expert else 0.0)):
        later = 0.0 if combined_1f1b else min(later, nbytes - param_gather.first_bucket(
            True, nbytes, bucket))
        first = nbytes - later       # chunk 0's parameters (the stage's, one chunk)
        out.append((first - param_gather.first_bucket(True, first, bucket), later))
    return out[0], out[1]


def _later_chunks_bytes(b: StageBuilder, stage: int, params: float,
                        expert: float = 0.0) -> float:
    """Bytes of the parameter gather of ``stage``'s model chunks after the first (the
    interleaved schedule; 0 with one chunk): the stage's ``params`` less chunk 0's, its
    layers' share of the stage's layer parameters plus the input embedding on the first
    stage (:func:`.builder.with_edges`; the head is in the last chunk), in the gathered dtype
    (:func:`.param_gather.stage_bytes`). With the routed experts laid out apart, ``expert``
    of the stage's parameters are theirs (their own buffer): the rest is the dense buffer,
    chunk 0's share of it its layers' dense parameters (attention, router, shared experts;
    a dense layer's whole) over the stage's."""
    layers = b.split[stage]
    if b.v == 1 or len(layers) < 2 or sum(layers) == 0:
        return 0.0
    params -= expert
    share = (b.chunk_nonexpert_params(stage, 0) / b.chunk_nonexpert_params(stage)
             if expert else layers[0] / sum(layers))
    first_layers = (params - with_edges(b.shape, b.part.param_split, 0.0, stage == 0,
                                        stage == b.pp - 1, b.pp))
    chunk0 = with_edges(b.shape, b.part.param_split, first_layers * share,
                        stage == 0, False, b.pp)
    return max(0.0, param_gather.stage_bytes(b, stage, params - chunk0, first=False))


def _stage_update(b: StageBuilder, stage: int, root: bool, modes: _Modes) -> Block:
    """The ``update`` block of ``stage`` (of its root rank, or the others, when they differ)."""
    block = b.update_block(stage, root, modes.overlap)
    if modes.staged:
        block = fsdp.with_stage_reduce_scatters(b, block, stage)
    if modes.replicated:          # the optimizer waits for the replicas' all-reduces
        block = hsdp.with_replica_wait(block)
    if modes.zero3:               # torchao's float8 scales after the step (.fsdp_float8)
        block = fsdp.with_float8_precompute(b, block, stage)
        block = megatron_fsdp.with_edge_gather(b, block)
    block = tied_embedding.with_grad_all_reduce(b, block, stage)   # tied, PP > 1
    return moe_bias_update.with_bias_update(b, block, stage)       # after it (Megatron's order)


def build_decoder_workload(cfg: RunConfig, shape: DecoderShape) -> Workload:
    """The trace of one training iteration of ``cfg``, a decoder of ``shape``, with the memory
    of one rank of each stage (:func:`decoder_memory`, from the same plan).

    Stages that play the same role (first, last, or in between) share their block objects,
    and every stage's steps are a :class:`StepTable`, so building a 32-stage plan with 384
    micro-batches costs a few arrays rather than 25,000 objects.
    """
    plan = resolve_plan(cfg, shape)
    b = StageBuilder(plan, mtp_depths(cfg))
    pp, m, mesh = b.pp, plan.microbatches, cfg.mesh
    groups = {**mesh.families(), **b.part.families(mesh), **hsdp.families(cfg, mesh),
              **tied_embedding.families(b, mesh)}
    modes = _modes(plan, b, cfg)
    split_root = plan.dp_strategy == "reduce_broadcast" and b.dp > 1
    ranks = _stage_ranks(mesh, b)
    classes: list[RankClass] = []
    shared: dict[tuple, dict[str, Block]] = {}
    stage_blocks = []
    for stage in range(pp):
        role = (stage == 0, stage == pp - 1, b.split[stage])
        if role not in shared:
            shared[role] = _stage_blocks(b, stage, modes)
        stage_blocks.append(shared[role])
    first = stage_blocks[0]
    args = (plan.schedule, pp, m, b.v, any(name.endswith(".sync") for name in first),
            param_gather.BLOCK in first)
    tables = combined.combined_step_tables(*args, group=plan.microbatch_group) \
        if modes.combined else _step_tables(
            *args, later_wait=[param_gather.waiting_block_name(b.v - 1) in blocks
                               for blocks in stage_blocks], group=plan.microbatch_group)
    for stage, blocks in enumerate(stage_blocks):
        role = (stage == 0, stage == pp - 1, b.split[stage])
        splits = [(True, ranks[stage, :1]), (False, ranks[stage, 1:])] if split_root \
            else [(True, ranks[stage])]
        for root, members in splits:
            key = (*role, root, "update")
            update = shared.get(key)
            if update is None:
                update = shared[key] = {"update": _stage_update(b, stage, root, modes)}
            program = Program({**blocks, **update}, tables[stage])
            name = f"stage{stage}" + ("" if len(splits) == 1 else (".root" if root else ".rest"))
            classes.append(RankClass(name, tuple(members.ravel().tolist()), program))
    label = (f"tp{b.tp}" if plan.tp_mode == "1d" else f"tp{plan.tp_mode}x{b.tp}") \
        + (f"-cp{b.cp}" if b.cp > 1 else "")
    return Workload(f"{cfg.model.name}-{label}-pp{pp}-dp{b.dp}", mesh.world_size, groups,
                    tuple(classes), _meta(cfg, shape, m), memory=tuple(_stage_memories(b)))


def _meta(cfg: RunConfig, shape: DecoderShape, microbatches: int) -> WorkloadMeta:
    """What the result reports of the run: model, FLOPs (PaLM's MFU numerator), tokens."""
    t = cfg.train
    return WorkloadMeta(
        model=cfg.model.name, architecture=cfg.model.architecture,
        parameter_count=int(shape.params),
        model_flops=float(shape.model_flops(t.global_batch_size, t.seq_length)
                          + mtp_model_flops(shape, t.global_batch_size, t.seq_length,
                                            mtp_depths(cfg))),
        tokens=t.global_batch_size * t.seq_length, samples=t.global_batch_size,
        microbatches=microbatches, dtype=t.dtype)


def decoder_memory(cfg: RunConfig, shape: DecoderShape) -> list[MemoryBreakdown]:
    """Memory of one rank of each pipeline stage (:func:`.memory.stage_memory`), the plan
    resolved once for all of them (:func:`build_decoder_workload` carries the same list)."""
    return _stage_memories(StageBuilder(resolve_plan(cfg, shape), mtp_depths(cfg)))



def _stage_memories(b: StageBuilder) -> list[MemoryBreakdown]:
    """:func:`.memory.stage_memory` of every stage of builder ``b``'s plan, with the stage's
    parameters (and routed experts') from ``b``."""
    plan = b.plan
    context = context_bytes(plan.device, comm_groups(plan))   # every stage's
    memo: dict = {}   # the model states and buffers of stages alike, once
    if not plan.shape.is_moe:
        return with_mtp_memory(b, [stage_memory(plan, s, b.stage_params(s), context=context,
                                                memo=memo) for s in range(b.pp)])
    layer_bytes = max(sum(b.layer_rank_params(m)) for m in (False, True)) * b.dt
    return with_mtp_memory(b, [stage_memory(plan, s, b.stage_params(s),
                                            b.stage_expert_params(s), layer_bytes,
                                            context=context, memo=memo) for s in range(b.pp)])
