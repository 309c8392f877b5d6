"""The decoder families (``gpt``, ``llama``) on arrays of plans.

Every count comes from the same place as the trace builder's
(:class:`~ddlsim.workloads.decoder.builder.StageBuilder`): the
:class:`~ddlsim.workloads.models.decoder.DecoderShape` methods, called with arrays of
micro-batch sizes and TP degrees (their formulas are arithmetic in both), once per value of
the boolean and categorical fields (sequence parallelism, recomputation). The op list of a
layer, the embedding, the head, the scatter-gather of pipeline messages and the update are
those of the builder, summed op by op; ``tests/test_search_costs.py`` compares them with the
builder's blocks timed by :class:`~ddlsim.simulator.costs.CostModel` on samples.

Dense decoders with ``dp_strategy: ddp`` (ZeRO 0-3, overlapped or not) are covered; a
Mixture-of-Experts model or another data-parallel strategy is refused with a message that
points to ``ddlsim sweep``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..config import DTYPE_BYTES
from ..errors import ConfigError
from ..software import grad_dtype_bytes
from ..simulator.kernels import kernel_device, op_time
from ..simulator.kernels.host import NO_LAUNCH
from ..workloads.decoder.layerkernels import compute_dtype
from .family import StageCosts, register_vector_family
from .netcost import collective_seconds, mesh_networks
from .smtaken import nccl_ctas, sm_taken
from .blocks import stage_pieces
from ..workloads.decoder.builder import StageBuilder
from .decodermemory import plans_memory, plans_memory_floor
from .decoder_dp import DataParallelTerms
from .decoder_zero3 import zero3_seconds

__all__ = ["DecoderVectors"]


@dataclass(frozen=True)
class _Context:
    cfg: object
    shape: object
    s: int
    dt: int
    gdt: int             # bytes per gradient element (the stack's grad_reduce_dtype)
    dev: object          # the kernel model's device (ddlsim.simulator.kernels.KernelDevice)
    step_s: float        # the optimizer step's seconds per parameter
    capacity: float


@register_vector_family("gpt", "llama", "nemotron")
class DecoderVectors(DataParallelTerms):
    """:class:`~ddlsim.search.family.VectorFamily` of the decoder-only transformers (the
    update blocks and data-parallel tails: :class:`.decoder_dp.DataParallelTerms`)."""

    def prepare(self, cfg) -> _Context:
        shape = cfg.model.shape()
        if shape.is_moe:
            raise ConfigError(f"model {cfg.model.name!r} is a Mixture-of-Experts model; the "
                              "vectorised search tier covers dense decoders only. Use ddlsim "
                              "sweep (the exact engine) to compare its plans")
        if shape.mla is not None:   # its down projections whole on every TP rank
            raise ConfigError(f"model {cfg.model.name!r} has Multi-head Latent Attention, "
                              "whose replicated weights the vectorised tier's parameter terms "
                              "do not split; its plans go to the exact engine")
        if cfg.parallel.cp > 1:
            raise ConfigError(f"parallel.context_parallel_size = {cfg.parallel.cp}: the "
                              "vectorised search tier covers plans without context "
                              "parallelism; use ddlsim sweep (the exact engine) for such plans")
        from ..workloads.decoder.split import UNEVEN_FIELDS, is_uneven, mtp_depths
        if mtp_depths(cfg):
            raise ConfigError(f"model.mtp_num_layers = {cfg.model.mtp_num_layers}: the "
                              "vectorised search tier does not model multi-token prediction; "
                              "use ddlsim sweep (the exact engine) to compare such plans")
        if is_uneven(cfg.parallel):
            given = ", ".join(f"parallel.{f} = {getattr(cfg.parallel, f)!r}" for f in UNEVEN_FIELDS
                              if getattr(cfg.parallel, f) not in (None, False))
            raise ConfigError(f"{given}: the vectorised search tier assumes L/(PP·VPP) layers "
                              "per model chunk and does not model Megatron-Core's uneven "
                              "pipeline splits; use ddlsim sweep (the exact engine) to compare "
                              "such plans, or remove the option to search even splits")
        if cfg.software.pipeline_split.startswith("torchtitan"):   # searched exactly
            raise ConfigError(f"system.software = {cfg.software.name!r} splits the layers "
                              f"over pipeline stages by {cfg.software.pipeline_split}'s own "
                              "(uneven) rule, which the vectorised search tier does not "
                              "model; its plans are searched by the exact engine")
        group = cfg.parallel.microbatch_group_size_per_vp_stage
        if group is not None:   # torch's rounds other than PP: :meth:`beyond`
            raise ConfigError(f"parallel.microbatch_group_size_per_vp_stage = {group}: the "
                              "vectorised search tier's closed form of the interleaved "
                              "schedule has groups of PP; such plans are searched by the "
                              "exact engine")
        if cfg.parallel.tp_mode != "1d":
            raise ConfigError(f"parallel.tensor_parallel.mode = {cfg.parallel.tp_mode!r}: the "
                              "vectorised search tier covers Megatron's 1-D tensor parallelism; "
                              "such plans are searched by the exact engine")
        from ..simulator.hostcollectives import shares_cores
        if shares_cores(cfg.system):
            raise ConfigError("system.device.spare_cores = 0: the ranks' collectives run on "
                              "their compute's cores (ddlsim.simulator.hostcollectives), "
                              "which the vectorised search tier does not model; such plans "
                              "are searched by the exact engine")
        if cfg.parallel.dp_strategy != "ddp":
            raise ConfigError(f"parallel.dp_strategy = {cfg.parallel.dp_strategy!r}: the "
                              "vectorised search tier covers dp_strategy 'ddp' (with ZeRO "
                              "0-3) only; use ddlsim sweep for the others")
        if cfg.train.recompute_modules is not None:
            raise ConfigError(f"train.recompute_modules = {list(cfg.train.recompute_modules)!r}"
                              ": the vectorised search tier times the stack's selective "
                              "recomputation only; such plans are searched by the exact engine")
        from ..workloads.decoder.fsdp import vector_refusal
        if vector_refusal(cfg.software):
            raise ConfigError(vector_refusal(cfg.software))
        t, sw = cfg.train, cfg.software
        dtype = compute_dtype(t.dtype)
        dt, gdt = DTYPE_BYTES[dtype], grad_dtype_bytes(sw.grad_reduce_dtype, dtype)
        dev = kernel_device(cfg.system)
        step = StageBuilder.from_config(cfg, shape).optimizer_op(1.0).payload
        # the step's device seconds per parameter; its one launch is added per stage
        per_param = op_time(step, replace(dev, launch=NO_LAUNCH))
        return _Context(cfg, shape, t.seq_length, dt, gdt, dev, per_param,
                        cfg.system.device.memory_bytes)

    @staticmethod
    def beyond(cfgs: list, plans) -> bool:
        """Whether a plan the rules passed needs what the closed forms do not cover: the
        interleaved schedule in groups other than PP (torch pipelining's rounds where PP does
        not divide the micro-batches: :func:`~ddlsim.workloads.schedules.microbatch_group`;
        :func:`.pipeline.interleaved_ends` has groups of PP), or DeepSpeed's uneven split of
        layers PP does not divide (:mod:`~ddlsim.workloads.decoder.ds_split`; the tier has
        L/PP layers a stage); ``cfgs``: each context's config (None where it failed). The
        grid is then searched by the exact engine."""
        from .plans import SCHEDULE, microbatches
        pp = np.maximum(plans["pp"], 1)
        inter = plans["schedule"] == SCHEDULE.index("interleaved")
        rounds = inter & (microbatches(plans) % pp != 0)
        for i, cfg in enumerate(cfgs):
            if cfg is None:
                continue
            sw, here = cfg.software, plans["context"] == i
            uneven = (pp > 1) & (cfg.model.num_hidden_layers % (pp * plans["v"]) != 0)
            if ((sw.interleaved_groups == "torch_rounds" and (rounds & here).any())
                    or (sw.pipeline_split == "deepspeed" and (uneven & here).any())):
                return True
        return False

    # ------------------------------------------------------------------ costs
    def costs(self, ctx: _Context, plans, nets) -> StageCosts:
        """:class:`~.family.StageCosts` of ``plans``: the stages' blocks from the builder's
        pieces (:func:`.blocks.stage_pieces`), the pipeline messages, the update blocks and
        data-parallel tails (:meth:`_updates`) and ZeRO-3's whole stage
        (:func:`.decoder_zero3.zero3_seconds`), on each plan's mesh's networks (``nets``:
        ``nets(meshes)`` → those networks, or None for :func:`.netcost.mesh_networks`)."""
        pp, v = plans["pp"], plans["v"]
        coll = _Collectives(ctx, plans, nets)
        pieces = stage_pieces(ctx, plans, coll.at, coll.net.backend, coll.mi)
        lc = ctx.shape.layers // (pp * v)
        emb = np.where(pp == 1, pieces.emb1, pieces.emb)   # after the batch's loading
        blocks = _stage_blocks(plans, pieces, lc, emb)
        net, mi = coll.net, coll.mi
        p2p = net.hop_alpha_s[mi] + pieces.p2p_bytes * net.hop_s_per_byte[mi]
        wrap = net.wrap_alpha_s[mi] + pieces.p2p_bytes * net.wrap_s_per_byte[mi]
        # the hops each stage receives over (.netcost._stage_hops' rows)
        hops = net.stage_alpha_s[mi] + pieces.p2p_bytes[:, None, None] * net.stage_s_per_byte[mi]
        # Megatron turns overlap_p2p_comm off without the interleaved schedule
        blocking = (v == 1) | (not ctx.cfg.software.overlap_p2p_comm)
        each = _hops_in_order(net, mi, pieces.p2p_bytes, (v > 1) & blocking)
        ctas = nccl_ctas(ctx.cfg, net, mi)
        first_params = self.stage_params(ctx, plans, True)
        upd_f, upd_l, tail_f, tail_l = self._updates(ctx, plans, pieces, coll, ctas, lc, emb,
                                                     first_params)
        whole = zero3_seconds(ctx, plans, (emb, pieces.fwd, pieces.head_f, pieces.head_b,
                                           pieces.bwd, pieces.emb_b1), coll, first_params,
                              (pieces.fwd_gemm, pieces.bwd_gemm, ctas))
        return StageCosts(*blocks, lc * pieces.bwd + pieces.gather, p2p, wrap, tail_f, tail_l,
                          upd_f, upd_l, whole, blocking, self._tied_sync(ctx, plans, coll),
                          hops, lc * pieces.fwd + pieces.gather, each)

    def _updates(self, ctx: _Context, plans, pieces, coll, ctas, lc, emb, first_params):
        """(first stage's update block, last stage's, first stage's data-parallel tail,
        last stage's) per plan: :meth:`_update` of each, both delayed by the rest of the
        overlapped parameter gather (:meth:`_gather_delay`); the first stage's tail also
        carries what the later stages' overlapped buckets add to its last backward's start
        (:meth:`_later_gained`)."""
        one = plans["pp"] == 1
        # the buckets' SMs, on every stage whose chunk the stack buckets (grad_bucket_bytes)
        sm = sm_taken(ctx, pieces.fwd_gemm, pieces.bwd_gemm, ctas)[1]
        active = self._gather_active(ctx, plans)   # asked once for the three gathers below
        emb_b = np.where(one, pieces.emb_b1, pieces.emb_b)   # before the last bucket's sync
        tied = _tied_on(ctx, plans)
        upd_f, tail_f, _ = self._update(ctx, plans, first_params, pieces.bwd, coll, sm, active,
                                        emb=emb_b, tied=tied)
        upd_l, tail_l, gained_l = self._update(ctx, plans, self.stage_params(ctx, plans, False),
                                               pieces.bwd, coll, sm, active, first=False,
                                               emb=np.where(one, emb_b, 0.0), tied=tied)
        tail_f = tail_f + self._later_gained(ctx, plans, coll, sm, gained_l)
        first_bytes = self._gather_bytes(ctx, plans, first_params, True)
        overlapped = self._gathered(ctx, plans, first_bytes, active)[1]
        # the later chunks' share, less what the update block's first bucket already holds
        later = np.minimum(np.where(active & (plans["v"] > 1), self._gather_bytes(
            ctx, plans, first_params - self._chunk0_params(ctx, plans), None), 0.0), overlapped)
        rest = self._gathered(ctx, plans, first_bytes - later, active)[1]
        delay = self._gather_delay(ctx, plans, pieces, coll, ctas, lc, emb, rest, later)
        return upd_f + delay, upd_l + delay, tail_f, tail_l

    @staticmethod
    def _tied_sync(ctx: _Context, plans, coll) -> np.ndarray:
        """Seconds of the tied embedding's gradient all-reduce over the first and last
        stages, per plan (0 where untied or PP = 1): the builder's op
        (:func:`ddlsim.workloads.decoder.tied_embedding.with_grad_all_reduce`), of the
        builder's bytes (:func:`~ddlsim.workloads.decoder.tied_embedding.embedding_grad_bytes`),
        on the compute stream before the step, where the first and last stages meet
        (:attr:`.family.StageCosts.tied_sync`)."""
        from ..workloads.decoder.tied_embedding import GROUP, embedding_grad_bytes
        on = _tied_on(ctx, plans)
        if not on.any():
            return np.zeros(len(plans))
        nbytes = embedding_grad_bytes(ctx.shape.vocab, ctx.shape.hidden, plans["tp"], ctx.gdt,
                                      plans["zero"], plans["dp"])
        return coll("all_reduce", GROUP, nbytes, on) * on

    # ------------------------------------------------------------------ memory
    def memory(self, ctx: _Context, plans) -> tuple[np.ndarray, np.ndarray]:
        """:func:`ddlsim.workloads.decoder.memory.stage_memory` of the first and last stages
        (the others hold less), the larger per plan (:func:`.decodermemory.plans_memory`)."""
        used = plans_memory(ctx, plans, lambda first: self.stage_params(ctx, plans, first))
        return used, np.full(len(plans), ctx.capacity)

    def memory_floor(self, ctx: _Context, plans) -> tuple[np.ndarray, np.ndarray]:
        """(a floor of :meth:`memory`'s bytes, the capacity) per plan: the first and last
        stages' model states (:func:`.decodermemory.plans_memory_floor`)."""
        floor = plans_memory_floor(ctx, plans, lambda first: self.stage_params(ctx, plans, first))
        return floor, np.full(len(plans), ctx.capacity)



def _tied_on(ctx: _Context, plans) -> np.ndarray:
    """Per plan, whether the tied embedding's copies sit on two stages (tied, PP > 1)."""
    from ..workloads.decoder.tied_embedding import charged
    return charged(ctx.shape, 2) & (plans["pp"] > 1)


class _Collectives:
    """Seconds of the plans' collectives on their meshes' networks
    (:func:`.collforms.collective_seconds`), each asked once: call it as ``coll(op, family,
    nbytes, where=None)`` (per plan; with ``where``, a mask, at those plans only and 0
    elsewhere, their networks' forms only), or :meth:`at` for the plans ``index``."""

    def __init__(self, ctx: _Context, plans, nets):
        meshes, self.mi = _unique_meshes(plans["tp"], plans["pp"], plans["dp"])
        self.net = mesh_networks(ctx.cfg, meshes) if nets is None else nets(meshes)
        self.algos = ctx.cfg.parallel.collective_algorithm
        self.shape = plans["pp"].shape
        self.memo: dict = {}
        self.memos: dict = {}
        self.done: dict = {}

    def __call__(self, op: str, family: str, nbytes, where=None) -> np.ndarray:
        # the same array asked again (act, grad bytes)
        key = (op, family, id(nbytes), None if where is None else id(where))
        if key not in self.done:
            size = np.broadcast_to(nbytes, self.shape)
            if where is None:
                t = collective_seconds(op, family, size, self.mi, self.net.nets, self.algos,
                                       self.memo, self.net.backend)
            else:
                index = np.flatnonzero(where)
                t = np.zeros(self.shape[0])
                t[index] = _on_meshes(op, family, size[index], self.mi[index], self.net,
                                      self.algos, self.memos)
            self.done[key] = (nbytes, where, t)   # the arrays kept: their ids stay theirs
        return self.done[key][-1]

    def at(self, op: str, family: str, nbytes: np.ndarray, index: np.ndarray) -> np.ndarray:
        """Seconds of one ``op`` of ``nbytes`` (per plan of ``index``) on those plans."""
        return collective_seconds(op, family, nbytes, self.mi[index], self.net.nets,
                                  self.algos, self.memo, self.net.backend)


def _stage_blocks(plans, pieces, lc, emb) -> tuple[np.ndarray, ...]:
    """(forward of the first, middle and last stages, backward of the same) per plan: ``lc``
    layers per chunk of the builder's pieces, the embedding ``emb`` (after the batch's
    loading), the head and the scatter-gather of pipeline messages where each stage runs
    them."""
    pp, v, gather = plans["pp"], plans["v"], pieces.gather
    F, B = v * lc * pieces.fwd, v * lc * pieces.bwd
    one, mid = pp == 1, pp >= 3
    fwd_first = F + emb + np.where(one, pieces.head_f, (v - 1) * gather)
    bwd_first = B + np.where(one, pieces.head_b + pieces.emb_b1, v * gather + pieces.emb_b)
    fwd_last = np.where(one, fwd_first, F + v * gather + pieces.load_l + pieces.head_f)
    bwd_last = np.where(one, bwd_first, B + (v - 1) * gather + pieces.head_b)
    fwd_mid = np.where(mid, F + v * gather, fwd_first)
    bwd_mid = np.where(mid, B + v * gather, bwd_first)
    return fwd_first, fwd_mid, fwd_last, bwd_first, bwd_mid, bwd_last


def _hops_in_order(net, mi, nbytes, where) -> np.ndarray | None:
    """Seconds of each hop s → s + 1 in order (``StageCosts.stage_hop_s``) of the plans
    ``where`` (the interleaved schedule with blocking P2P, the one use), 0 elsewhere; None
    when no plan needs them."""
    rows = np.flatnonzero(where)
    if not len(rows):
        return None
    out = np.zeros((len(mi), net.each_alpha_s.shape[1]))
    out[rows] = (net.each_alpha_s[mi[rows]]
                 + nbytes[rows, None] * net.each_s_per_byte[mi[rows]])
    return out


def _on_meshes(op: str, family: str, nbytes: np.ndarray, mesh_index: np.ndarray, net,
               algos, memos: dict) -> np.ndarray:
    """:func:`collective_seconds` of plans on the meshes ``mesh_index`` (into ``net.nets``)
    with the forms of those meshes' networks only (kept in ``memos`` per set of meshes): the
    same seconds, element by element, as over every mesh."""
    used, sub = np.unique(mesh_index, return_inverse=True)
    memo = memos.setdefault(used.tobytes(), {})
    return collective_seconds(op, family, nbytes, sub.reshape(-1), [net.nets[u] for u in used],
                              algos, memo, net.backend)


def _unique_meshes(tp, pp, dp) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (TP, PP, DP) rows and each plan's index into them (one integer key per
    plan: sorting it is much faster than ``np.unique(axis=0)``)."""
    k = int(max(tp.max(), pp.max(), dp.max())) + 1
    keys, index = np.unique((tp * k + pp) * k + dp, return_inverse=True)
    meshes = np.stack([keys // (k * k), keys // k % k, keys % k], axis=1)
    return meshes, index.ravel()
