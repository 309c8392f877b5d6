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
from typing import NamedTuple

import numpy as np

from ..config import DTYPE_BYTES
from ..errors import ConfigError
from ..software import grad_dtype_bytes
from ..simulator.kernels import kernel_device, op_time
from ..simulator.kernels.fp8_weights import fp8_param_amax_bytes
from ..simulator.kernels.host import NO_LAUNCH, stream_times
from ..workloads.decoder.layerkernels import compute_dtype
from .family import StageCosts, register_vector_family
from .netcost import collective_seconds, mesh_networks
from .pipeline import earlier_chunks, flow_shop_last, flow_shop_tail
from .smtaken import extra_seconds, nccl_ctas, sm_taken
from .blocks import piece_config, stage_pieces
from ..workloads.decoder import param_gather
from ..workloads.decoder.builder import StageBuilder, with_edges
from ..workloads.decoder.host_sync import host_sync_times, site_seconds
from ..workloads.decoder.dpsync import (bucket_run_times, bucket_runs, buckets,
                                        ddp_pass_times, grad_bucket_bytes)
from .decodermemory import plans_memory, plans_memory_floor
from .decoder_zero3 import optimizer_seconds, zero3_seconds

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


@register_vector_family("gpt", "llama")
class DecoderVectors:
    """:class:`~ddlsim.search.family.VectorFamily` of the decoder-only transformers."""

    def prepare(self, cfg) -> _Context:
        shape = cfg.model.shape()
        if shape.is_moe:
            raise ConfigError(f"model {cfg.model.name!r} is a Mixture-of-Experts model; the "
                              "vectorised search tier covers dense decoders only. Use ddlsim "
                              "sweep (the exact engine) to compare its plans")
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

    # ------------------------------------------------------------------ costs
    def costs(self, ctx: _Context, plans, nets) -> StageCosts:
        """:class:`~.family.StageCosts` of ``plans``: the stages' blocks from the builder's
        pieces (:func:`.blocks.stage_pieces`), the pipeline messages, the update blocks and
        data-parallel tails (:meth:`_updates`) and ZeRO-3's whole stage
        (:func:`.decoder_zero3.zero3_seconds`), on each plan's mesh's networks (``nets``:
        ``nets(meshes)`` → those networks, or None for :func:`.netcost.mesh_networks`)."""
        pp, v = plans["pp"], plans["v"]
        coll = _Collectives(ctx, plans, nets)
        pieces = stage_pieces(ctx, plans, coll.at, coll.net.backend)
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

    def _later_gained(self, ctx: _Context, plans, coll, sm, gained_last) -> np.ndarray:
        """Seconds by which the later stages' overlapped buckets delay the first stage's last
        backward, per plan (0 at PP = 1). A later stage's last backward (chunk 0's ``.sync``
        block) loses SMs to the buckets before each of its runs of layers, then sends its
        input gradient (:meth:`~ddlsim.workloads.decoder.dpsync.GradSyncOps._segments`): the
        last micro-batch's gradient crosses every stage, so the delays add up, the last
        stage's ``gained_last`` (from :meth:`_update`) and each middle stage's (its layers'
        gradients alone). All 0 where later stages hold one bucket
        (:func:`grad_bucket_bytes`: Megatron-Core's). With VPP > 1 the ``.sync`` blocks of
        the chunks after the first lose SMs too, on every stage; the interleaved closed form
        does not charge them (it is approximate there, with or without overlap)."""
        pp = plans["pp"]
        later = np.where(pp > 1, gained_last, 0.0)
        mid = (pp >= 3) & (plans["dp"] > 1) & (plans["zero"] < 3)
        if not (ctx.cfg.software.overlap_grad_reduce and mid.any()
                and np.isfinite(grad_bucket_bytes(ctx.cfg, plans["dp"], ctx.gdt, 1)).any()):
            return later
        grad = self.stage_params(ctx, plans, None) * ctx.gdt
        r = self._bucket_runs(ctx, plans, grad, coll, sm, True, mid)
        return later + np.where(mid, (pp - 2) * flow_shop_last(r.layers, r.segments, 0.0,
                                                               r.extra), 0.0)

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

    @staticmethod
    def _gather_delay(ctx: _Context, plans, pieces, coll, ctas, lc, emb, rest,
                      later=0.0) -> np.ndarray:
        """overlap_param_gather: seconds by which stage 0's first forward block waits for
        the ``rest`` bytes of the parameter gather (chunk 0's), or by which NCCL's SMs slow
        it (:func:`.smtaken.extra_seconds`) while the gather runs, per plan; plus, with model
        chunks, by which the first forward of the last chunk waits for the ``later`` chunks'
        gather, issued after it (:mod:`ddlsim.workloads.decoder.param_gather`): the
        ``(v-1)·pp - 1`` forwards of the warm-up between them hide it."""
        pp, v = plans["pp"], plans["v"]
        one = pp == 1
        first_block = lc * pieces.fwd + emb + np.where(one & (v == 1), pieces.head_f, 0.0)
        late = rest > 0
        # its compute pays NCCL's SMs while the gather runs (.workloads.smcontention)
        g = coll("all_gather", "dp", rest, late)
        first_gemm = lc * pieces.fwd_gemm + pieces.emb_gemm + np.where(
            one & (v == 1), pieces.head_gemm, 0.0)
        taken = extra_seconds(ctx, first_gemm, g, ctas)
        delay = np.maximum(g - first_block, taken) * late
        more = np.asarray(later, dtype=float) > 0
        if not more.any():
            return delay
        g_later = coll("all_gather", "dp", later, more)
        warm_up = ((v - 1) * pp - 1) * lc * pieces.fwd
        return delay + np.maximum(g + g_later - np.maximum(g, first_block) - warm_up,
                                  0.0) * more

    def stage_params(self, ctx: _Context, plans, first: bool | None) -> np.ndarray:
        """:meth:`StageBuilder.stage_params` of the first (or last; None: a middle) stage,
        per plan: its layers (an even split, ``L/(PP·VPP)`` per chunk) and the builder's own
        :func:`~ddlsim.workloads.decoder.builder.with_edges`."""
        sh = ctx.shape
        t, pp, v = plans["tp"].astype(float), plans["pp"], plans["v"]
        layers = (sh.layers // (pp * v)) * v * sh.layer_params / t
        if first is None:
            return with_edges(sh, t, layers, False, False, pp)
        one, every = pp == 1, np.full(len(plans), True)
        return with_edges(sh, t, layers, every if first else one, one if first else every, pp)

    def _chunk0_params(self, ctx: _Context, plans) -> np.ndarray:
        """Parameters of the first stage's chunk 0 per plan: its ``L/(PP·VPP)`` layers and
        the input embedding (:func:`~ddlsim.workloads.decoder.builder.with_edges`; the head
        is in the last chunk)."""
        sh = ctx.shape
        t, pp, v = plans["tp"].astype(float), plans["pp"], plans["v"]
        layers = (sh.layers // (pp * v)) * sh.layer_params / t
        return with_edges(sh, t, layers, np.full(len(plans), True), pp == 1, pp)

    def _gather_active(self, ctx: _Context, plans) -> np.ndarray:
        """Per plan, whether :func:`ddlsim.workloads.decoder.param_gather.active` holds
        (asked once per distinct ZeRO stage and DP > 1)."""
        zero, multi = plans["zero"], plans["dp"] > 1
        on = np.zeros(len(plans), dtype=bool)
        for z in np.unique(zero):
            for dp in (1, 2):
                if param_gather.active(piece_config(ctx.cfg, 1, False, 1, "none", int(z), dp)):
                    on |= (zero == z) & (multi == (dp > 1))
        return on

    def _gathered(self, ctx: _Context, plans, param_bytes, on=None):
        """(exposed, overlapped) bytes of the ZeRO-1/2 parameter gather: where
        :meth:`_gather_active` holds for the plan (``on`` when the caller has it), its first
        bucket stays exposed (:func:`~ddlsim.workloads.decoder.param_gather.first_bucket`)."""
        on = self._gather_active(ctx, plans) if on is None else on
        cfg = ctx.cfg
        per = param_gather.gather_bytes_per_param(cfg.software, cfg.train.dtype, 2)
        exposed = param_gather.first_bucket(on, param_bytes, grad_bucket_bytes(
            cfg, plans["dp"], per))
        return exposed, np.where(on, param_bytes - exposed, 0.0)

    def _gather_bytes(self, ctx: _Context, plans, params, first):
        """Bytes of the ZeRO-1/2 parameter gather of ``params`` per plan on the first stage
        (``first`` True), the last (False) or the first stage's later chunks (None: the head
        alone where PP = 1), as :func:`~ddlsim.workloads.decoder.param_gather.stage_bytes`
        counts them: with FP8 parameters the layers' at one byte, the embedding's and the
        head's at ``ctx.dt``."""
        cfg, sh = ctx.cfg, ctx.shape
        t, pp = plans["tp"].astype(float), plans["pp"]
        one, every = pp == 1, np.full(len(plans), True)
        if first is None:
            edges = with_edges(sh, t, 0.0, ~every, one, pp)
        else:
            edges = with_edges(sh, t, 0.0, every if first else one, one if first else every, pp)
        return param_gather.gathered_bytes(cfg.software, cfg.train.dtype, ctx.dt, params,
                                           edges)

    def _update(self, ctx: _Context, plans, params, bwd_layer, coll, sm=None, active=None,
                first: bool = True, emb=0.0, tied=None):
        """(update block, data-parallel tail, seconds the last backward gains beside its
        buckets) of a stage holding ``params`` per rank; ``sm(C, layers)``: a run of
        backward layers' extra seconds beside ``C`` seconds of overlapped buckets
        (:func:`.smtaken.sm_taken`; None: not charged); ``active``:
        :meth:`_gather_active` when the caller has it; ``emb``: seconds of the embedding's
        backward, which the stage's backward counts after its layers and which the last
        overlapped bucket waits for (:meth:`~ddlsim.workloads.decoder.chunks.ChunkOps.
        _chunk_backward`): the tail is taken from its end; ``tied``: plans whose first and
        last stages meet at the tied embedding's all-reduce (:meth:`_tied_sync`), where the
        update's bucket waits, which run before it, are counted in the tail instead."""
        dp, zero, v = plans["dp"], plans["zero"], plans["v"]
        grad = params * ctx.gdt
        sharded = (zero > 0) & (dp > 1)
        update = optimizer_seconds(ctx, np.where(sharded, params / np.maximum(dp, 1), params))
        # the stack's DDP passes over the gradients (dpsync.GradSyncOps.ddp_pass_ops) and the
        # step's host waits (host_sync.HostSyncOps.step_sync_ops; none under ZeRO-3); with
        # overlapped buckets, each bucket's passes and wait run before its collective (below)
        synced = (dp > 1) & (zero < 3)
        overlapped = ctx.cfg.software.overlap_grad_reduce
        stack, spec = ctx.cfg.software.name, ctx.cfg.system.device.launch
        lead = (first | (plans["pp"] == 1)) & overlapped   # the first stage's first chunk
        passes_s, kernels = ddp_pass_times(stack, ctx.dev, grad,
                                           np.where(lead, grad * (1 - 1 / v), grad))
        update += np.where(synced, stream_times(passes_s, kernels, ctx.dev.launch), 0.0)
        n_buckets = np.where(synced, self._stage_buckets(ctx, plans, grad, first, lead), 0.0)
        update += np.where(zero < 3, host_sync_times(stack, ctx.dev.launch, spec, n_buckets),
                           0.0)
        op_rs = (zero == 1) | (zero == 2)
        gathers = op_rs & (dp > 1)
        update += coll("all_gather", "dp", self._gathered(
            ctx, plans, self._gather_bytes(ctx, plans, params, first), active)[0],
            gathers) * gathers
        if param_gather.fp8_params(ctx.cfg.software, ctx.cfg.train.dtype):   # their amaxes
            layers = (ctx.shape.layers // (plans["pp"] * v)) * v     # (.update.fp8_amax_op)
            update += coll("all_reduce", "dp", fp8_param_amax_bytes(4.0 * layers),
                           gathers) * gathers
        if overlapped:
            tail, gained = self._overlapped_tail(ctx, plans, grad, bwd_layer, coll, sm, first,
                                                 lead, emb)
        else:
            # each plan asks the collective it runs (the others' tails are 0 below)
            rs, ar = gathers, ~op_rs & synced
            n = buckets(grad, _bucket(ctx, plans, first, 0))
            per_bucket = grad / n
            tail = n * np.where(op_rs, coll("reduce_scatter", "dp", per_bucket, rs),
                                coll("all_reduce", "dp", per_bucket, ar))
            gained = 0.0
        tail = np.where(synced, tail, 0.0)
        if tied is not None and tied.any():   # the waits before the stages meet
            pre = np.where(tied, n_buckets * site_seconds(stack, ctx.dev.launch, spec,
                                                          "bucket"), 0.0)
            update, tail = update - pre, tail + pre
        return update, tail, np.where(synced, gained, 0.0)

    def _overlapped_tail(self, ctx: _Context, plans, grad, bwd_layer, coll, sm, first: bool,
                         lead, emb):
        """(data-parallel tail, seconds the runs gain beside the buckets) of the last
        backward of a stage holding ``grad`` bytes of gradients, whose chunks' buckets
        overlap the backward (parameters as :meth:`_update`; ``lead``: plans whose stage is
        the first stage, where chunk 0's buckets get their passes and waits before each run's
        collectives)."""
        stack, spec, v = ctx.cfg.software.name, ctx.cfg.system.device.launch, plans["v"]
        r = self._bucket_runs(ctx, plans, grad, coll, sm, not first)
        lc, n_seg, d = r.layers, r.segments, r.seconds
        # each run's buckets' passes and waits (dpsync.GradSyncOps.bucket_pass_ops) before
        # its collectives: a run's extra compute, the first run's by the backlog's shift
        # (the first stage's first chunk; every other chunk's in the update block)
        run = bucket_run_times(stack, ctx.dev, spec, r.size, r.per_seg)
        backlog = earlier_chunks(v, plans["pp"] * lc * bwd_layer, n_seg * d, lc, n_seg,
                                 bwd_layer)
        shift = np.where(lead, run, 0.0)
        runs = (r.extra[0] + shift, r.extra[1] + shift)
        tail = flow_shop_tail(lc, n_seg, bwd_layer, d, backlog=backlog - shift, extra=runs)
        tail += shift
        # the embedding's backward delays the last run's buckets alone (flow_shop_last)
        tail = np.where(lead, np.maximum(tail - emb, flow_shop_last(lc, n_seg, d, runs)
                                         + shift), tail)
        return tail, flow_shop_last(lc, n_seg, 0.0, r.extra)

    def _bucket_runs(self, ctx: _Context, plans, grad, coll, sm, later: bool,
                     where=None) -> "_Runs":
        """The overlapped buckets of chunk 0 of the first stage (or, ``later``, of a later
        stage) holding ``grad`` bytes of gradients, per plan, as
        :meth:`~ddlsim.workloads.decoder.dpsync.GradSyncOps.grad_sync_ops` cuts them
        (:func:`bucket_runs` of :func:`grad_bucket_bytes` on that stage and chunk);
        ``where``: the plans to time (the others' seconds 0)."""
        dp, zero, v = plans["dp"], plans["zero"], plans["v"]
        op_rs = (zero == 1) | (zero == 2)
        synced = (dp > 1) & (zero < 3) & (True if where is None else where)
        rs, ar = op_rs & synced, ~op_rs & synced   # each plan asks the collective it runs
        lc = ctx.shape.layers // (plans["pp"] * v)
        chunk = grad / v
        n_seg, per_seg = bucket_runs(chunk, _bucket(ctx, plans, not later, 0), lc)
        size = chunk / (n_seg * per_seg)
        d = per_seg * np.where(op_rs, coll("reduce_scatter", "dp", size, rs),
                               coll("all_reduce", "dp", size, ar))
        q = np.floor_divide(lc, n_seg)
        # runs gain beside the buckets before them: none with one run (Megatron-Core's later
        # stages: one bucket); at PP = 1 the later stage is the first, timed as such
        gains = (n_seg > 1) & synced & ((plans["pp"] > 1) if later else True)
        extra = (0.0, 0.0) if sm is None or not gains.any() else (
            np.where(gains, sm(d, q + 1), 0.0), np.where(gains, sm(d, q), 0.0))
        return _Runs(lc, n_seg, per_seg, size, d, extra)

    @staticmethod
    def _stage_buckets(ctx: _Context, plans, grad, first: bool, skip_first=False):
        """Gradient buckets of a stage holding ``grad`` bytes in one step, as
        :meth:`~ddlsim.workloads.decoder.host_sync.HostSyncOps.stage_buckets` counts them:
        each chunk's (``grad / VPP``) in buckets of :func:`grad_bucket_bytes` of its stage and
        chunk; ``skip_first`` (per plan): but chunk 0's."""
        v = plans["v"]
        head = np.where(skip_first, 0.0, buckets(grad / v, _bucket(ctx, plans, first, 0)))
        if not (v > 1).any():
            return head
        return head + (v - 1) * buckets(grad / v, _bucket(ctx, plans, first, 1))   # the rest

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


class _Runs(NamedTuple):
    """A chunk's overlapped buckets per plan (:meth:`DecoderVectors._bucket_runs`):
    ``layers`` of the chunk, cut into ``segments`` runs, each followed by ``per_seg``
    buckets of ``size`` bytes (``seconds`` on the dp stream), and ``extra``: (long, short)
    seconds a run of ``q + 1`` and of ``q`` layers after the first gains beside the buckets
    before it (:func:`.pipeline.flow_shop_tail`)."""

    layers: np.ndarray
    segments: np.ndarray
    per_seg: np.ndarray
    size: np.ndarray
    seconds: np.ndarray
    extra: tuple


def _bucket(ctx: _Context, plans, first, chunk: int):
    """Bytes of a gradient bucket of ``chunk`` on the first stage (``first``: a bool or a
    mask over plans; PP = 1 always) or a later one, per plan: :func:`grad_bucket_bytes` of
    stage 0 or 1 (every later stage buckets as stage 1)."""
    dp, first = plans["dp"], np.asarray(first) | (plans["pp"] == 1)
    return np.where(first, grad_bucket_bytes(ctx.cfg, dp, ctx.gdt, 0, chunk),
                    grad_bucket_bytes(ctx.cfg, dp, ctx.gdt, 1, chunk))


def _tied_on(ctx: _Context, plans) -> np.ndarray:
    """Per plan, whether the tied embedding's copies sit on two stages (tied, PP > 1)."""
    from ..workloads.decoder.tied_embedding import charged
    return charged(ctx.shape, 2) & (plans["pp"] > 1)


class _Collectives:
    """Seconds of the plans' collectives on their meshes' networks
    (:func:`.netcost.collective_seconds`), each asked once: call it as ``coll(op, family,
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
