"""The data-parallel terms of a decoder stage on arrays of plans: the update block (the
optimizer step, the stack's DDP passes and host waits, the ZeRO-1/2 parameter gather), the
data-parallel tail of the last backward (its gradient buckets, overlapped or not) and the
overlapped parameter gather's delay of the first forward, each from the builder's own
counts (:mod:`ddlsim.workloads.decoder.dpsync`, :mod:`~ddlsim.workloads.decoder.host_sync`,
:mod:`~ddlsim.workloads.decoder.param_gather`) and timed on each plan's networks.

:class:`DataParallelTerms` is the part of :class:`~ddlsim.search.decoder.DecoderVectors`
that holds them; ``ctx`` is that family's context.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..simulator.kernels.fp8_weights import fp8_param_amax_bytes
from ..simulator.kernels.host import stream_times
from ..workloads.decoder import param_gather
from ..workloads.decoder.builder import with_edges
from ..workloads.decoder.dpsync import (bucket_run_times, bucket_runs, buckets,
                                        ddp_pass_times, grad_bucket_bytes)
from ..workloads.decoder.host_sync import host_sync_times, site_seconds
from .blocks import piece_config
from .decoder_zero3 import optimizer_seconds
from .pipeline import earlier_chunks, flow_shop_last, flow_shop_tail
from .smtaken import extra_seconds

if TYPE_CHECKING:
    from .decoder import _Context

__all__ = ["DataParallelTerms"]


class DataParallelTerms:
    """The update blocks, data-parallel tails and parameter-gather delays of
    :class:`~ddlsim.search.decoder.DecoderVectors` (its base class), per plan."""

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


class _Runs(NamedTuple):
    """A chunk's overlapped buckets per plan (:meth:`DataParallelTerms._bucket_runs`):
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
