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
from ..workloads.decoder.zero3 import list_host_seconds, module_fetches, unit_live_elements
from ..simulator.kernels import kernel_device, op_time
from ..simulator.kernels.dtensor import regathers_input
from ..simulator.kernels.host import NO_LAUNCH, stream_times
from ..workloads.decoder.fp8linear import fp8_sp_gather
from ..workloads.decoder.layerkernels import compute_dtype
from ..workloads.decoder.wgrad import accumulate_pass_bytes
from .family import StageCosts, register_vector_family
from .kerneltimes import kernel_times
from .netcost import collective_seconds, mesh_networks
from .plans import RECOMPUTE
from .pipeline import earlier_chunks, flow_shop_last, flow_shop_tail
from .smtaken import extra_seconds, nccl_ctas, sm_taken
from .blocks import piece_config, stage_pieces
from ..workloads.decoder import param_gather
from ..workloads.decoder.builder import StageBuilder, with_edges
from ..workloads.decoder.host_sync import host_sync_times
from ..workloads.decoder.dpsync import (bucket_run_times, bucket_runs, buckets,
                                        ddp_pass_times, grad_bucket_bytes)
from .zero3 import Unit, zero3_time, zero3_units_time
from .zero3_edges import edge_units, price_gathers, price_reduces, root_unit
from ..workloads.decoder.zero3_fetch import persistent_gather_seconds, persistent_tensors
from .decodermemory import plans_memory

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
        from ..workloads.decoder.split import UNEVEN_FIELDS, is_uneven
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
        sh, dt = ctx.shape, ctx.dt
        pp, v, dp = plans["pp"], plans["v"], plans["dp"]
        meshes, mi = _unique_meshes(plans["tp"], pp, dp)
        net = mesh_networks(ctx.cfg, meshes) if nets is None else nets(meshes)
        algos = ctx.cfg.parallel.collective_algorithm

        def coll(op: str, family: str, nbytes, where=None) -> np.ndarray:
            """Seconds of one ``op`` of ``nbytes`` on each plan's ``family``; with ``where``
            (a mask), at those plans only (0 elsewhere), their networks' forms only."""
            # the same array asked again (act, grad bytes)
            key = (op, family, id(nbytes), None if where is None else id(where))
            if key not in done:
                size = np.broadcast_to(nbytes, pp.shape)
                if where is None:
                    t = collective_seconds(op, family, size, mi, net.nets, algos, memo,
                                           net.backend)
                else:
                    index = np.flatnonzero(where)
                    t = np.zeros(len(pp))
                    t[index] = _on_meshes(op, family, size[index], mi[index], net, algos, memos)
                done[key] = (nbytes, where, t)
            return done[key][-1]

        memo: dict = {}
        memos: dict = {}
        done: dict = {}

        def coll_at(op: str, family: str, nbytes: np.ndarray, index: np.ndarray):
            return collective_seconds(op, family, nbytes, mi[index], net.nets, algos, memo,
                                      net.backend)

        pieces = stage_pieces(ctx, plans, coll_at, net.backend)
        fwd, bwd = pieces.fwd, pieces.bwd
        head_f, head_b, gather = pieces.head_f, pieces.head_b, pieces.gather
        lc = sh.layers // (pp * v)
        F, B = v * lc * fwd, v * lc * bwd
        one = pp == 1
        emb = np.where(one, pieces.emb1, pieces.emb)   # after the batch's loading
        fwd_first = F + emb + np.where(one, head_f, (v - 1) * gather)
        bwd_first = B + np.where(one, head_b + pieces.emb_b1, v * gather + pieces.emb_b)
        fwd_last = np.where(one, fwd_first, F + v * gather + pieces.load_l + head_f)
        bwd_last = np.where(one, bwd_first, B + (v - 1) * gather + head_b)
        mid = pp >= 3
        fwd_mid = np.where(mid, F + v * gather, fwd_first)
        bwd_mid = np.where(mid, B + v * gather, bwd_first)
        p2p = net.hop_alpha_s[mi] + pieces.p2p_bytes * net.hop_s_per_byte[mi]
        wrap = net.wrap_alpha_s[mi] + pieces.p2p_bytes * net.wrap_s_per_byte[mi]
        ctas = nccl_ctas(ctx.cfg, net, mi)
        # the buckets' SMs: charged on the first stage (Megatron-Core buckets it alone)
        sm = sm_taken(ctx, pieces.fwd_gemm, pieces.bwd_gemm, ctas)[1]
        first_params = self.stage_params(ctx, plans, True)
        active = self._gather_active(ctx, plans)   # asked once for the three gathers below
        emb_b = np.where(one, pieces.emb_b1, pieces.emb_b)   # before the last bucket's sync
        upd_f, tail_f = self._update(ctx, plans, first_params, bwd, coll, sm, active,
                                     emb=emb_b)
        upd_l, tail_l = self._update(ctx, plans, self.stage_params(ctx, plans, False), bwd, coll,
                                     active=active, first=False, emb=np.where(one, emb_b, 0.0))
        # overlap_param_gather: stage 0's first forward block waits for the rest of the gather
        rest = self._gathered(ctx, plans, first_params * dt, active)[1]
        first_block = lc * fwd + emb + np.where(one & (v == 1), head_f, 0.0)
        late = rest > 0
        # its compute pays NCCL's SMs while the gather runs (.workloads.smcontention)
        g = coll("all_gather", "dp", rest, late)
        first_gemm = lc * pieces.fwd_gemm + pieces.emb_gemm + np.where(
            one & (v == 1), pieces.head_gemm, 0.0)
        taken = extra_seconds(ctx, first_gemm, g, ctas)
        delay = np.maximum(g - first_block, taken) * late
        upd_f, upd_l = upd_f + delay, upd_l + delay
        whole = self._zero3(ctx, plans, (emb, fwd, head_f, head_b, bwd, pieces.emb_b1), coll,
                            (pieces.fwd_gemm, pieces.bwd_gemm, ctas))
        # Megatron turns overlap_p2p_comm off without the interleaved schedule
        blocking = (v == 1) | (not ctx.cfg.software.overlap_p2p_comm)
        return StageCosts(fwd_first, fwd_mid, fwd_last, bwd_first, bwd_mid, bwd_last,
                          lc * bwd + gather, p2p, wrap, tail_f, tail_l, upd_f, upd_l, whole,
                          blocking)

    def stage_params(self, ctx: _Context, plans, first: bool) -> np.ndarray:
        """:meth:`StageBuilder.stage_params` of the first (or last) stage, per plan: its
        layers (an even split, ``L/(PP·VPP)`` per chunk) and the builder's own
        :func:`~ddlsim.workloads.decoder.builder.with_edges`."""
        sh = ctx.shape
        t, pp, v = plans["tp"].astype(float), plans["pp"], plans["v"]
        layers = (sh.layers // (pp * v)) * v * sh.layer_params / t
        one, every = pp == 1, np.full(len(plans), True)
        return with_edges(sh, t, layers, every if first else one, one if first else every, pp)

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
        exposed = param_gather.first_bucket(on, param_bytes, grad_bucket_bytes(
            ctx.cfg, plans["dp"], 2))
        return exposed, np.where(on, param_bytes - exposed, 0.0)

    def _optimizer(self, ctx: _Context, n_params) -> np.ndarray:
        """The builder's optimizer step (:meth:`StageBuilder.optimizer_op`) over ``n_params``
        parameters: its op's device time is linear in them, so one parameter's seconds times
        the count, and the op's one launch (:func:`~ddlsim.simulator.kernels.host.stream_times`)."""
        n = np.asarray(n_params, dtype=float)
        return stream_times(ctx.step_s * n, (n > 0).astype(float), ctx.dev.launch)

    def _update(self, ctx: _Context, plans, params, bwd_layer, coll, sm=None, active=None,
                first: bool = True, emb=0.0):
        """(update block, data-parallel tail) of a stage holding ``params`` per rank;
        ``sm(C, layers)``: a run of backward layers' extra seconds beside ``C`` seconds of
        overlapped buckets (:func:`.smtaken.sm_taken`; None: not charged); ``active``:
        :meth:`_gather_active` when the caller has it; ``emb``: seconds of the embedding's
        backward, which the stage's backward counts after its layers and which the last
        overlapped bucket waits for (:meth:`~ddlsim.workloads.decoder.chunks.ChunkOps.
        _chunk_backward`): the tail is taken from its end."""
        dp, zero, v = plans["dp"], plans["zero"], plans["v"]
        grad = params * ctx.gdt
        sharded = (zero > 0) & (dp > 1)
        update = self._optimizer(ctx, np.where(sharded, params / np.maximum(dp, 1), params))
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
        n_buckets = np.where(synced, np.where(
            lead, v - 1, self._stage_buckets(ctx, plans, grad, first)), 0.0)
        update += np.where(zero < 3, host_sync_times(stack, ctx.dev.launch, spec, n_buckets),
                           0.0)
        op_rs = (zero == 1) | (zero == 2)
        gathers = op_rs & (dp > 1)
        update += coll("all_gather", "dp",
                       self._gathered(ctx, plans, params * ctx.dt, active)[0], gathers) * gathers
        # each plan asks the collective it runs (the others' tails are 0 below)
        rs, ar = gathers, ~op_rs & (dp > 1) & (zero < 3)
        bucket = grad_bucket_bytes(ctx.cfg, dp, ctx.gdt)   # the first stage's first chunk
        if ctx.cfg.software.overlap_grad_reduce:
            lc = ctx.shape.layers // (plans["pp"] * v)
            chunk = grad / v
            n_seg, per_seg = bucket_runs(chunk, bucket, lc)
            size = chunk / (n_seg * per_seg)
            d = per_seg * np.where(op_rs, coll("reduce_scatter", "dp", size, rs),
                                   coll("all_reduce", "dp", size, ar))
            q = np.floor_divide(lc, n_seg)
            # each run's buckets' passes and waits (dpsync.GradSyncOps.bucket_pass_ops) before
            # its collectives: a run's extra compute, the first run's by the backlog's shift
            # (the first stage's first chunk; every other chunk's in the update block, above)
            run = bucket_run_times(stack, ctx.dev, spec, size, per_seg)
            extra = (0.0, 0.0) if sm is None else (sm(d, q + 1), sm(d, q))
            backlog = earlier_chunks(v, plans["pp"] * lc * bwd_layer, n_seg * d, lc, n_seg,
                                     bwd_layer)
            shift = np.where(lead, run, 0.0)
            runs = (extra[0] + shift, extra[1] + shift)
            tail = flow_shop_tail(lc, n_seg, bwd_layer, d, backlog=backlog - shift, extra=runs)
            tail += np.where(lead, run, 0.0)
            # the embedding's backward delays the last run's buckets alone (flow_shop_last)
            tail = np.where(lead, np.maximum(tail - emb, flow_shop_last(lc, n_seg, d, runs)
                                             + shift), tail)
        else:
            n = buckets(grad, bucket)
            per_bucket = grad / n
            tail = n * np.where(op_rs, coll("reduce_scatter", "dp", per_bucket, rs),
                                coll("all_reduce", "dp", per_bucket, ar))
        tail = np.where((dp > 1) & (zero < 3), tail, 0.0)
        return update, tail

    @staticmethod
    def _stage_buckets(ctx: _Context, plans, grad, first: bool):
        """Gradient buckets of a stage holding ``grad`` bytes in one step, as
        :meth:`~ddlsim.workloads.decoder.host_sync.HostSyncOps.stage_buckets` counts them: the
        first stage's first chunk in buckets of :func:`grad_bucket_bytes`, every other chunk
        (and every chunk of a later stage) one bucket."""
        v = plans["v"]
        lead = buckets(grad / v, grad_bucket_bytes(ctx.cfg, plans["dp"], ctx.gdt))
        return np.where(first | (plans["pp"] == 1), lead + v - 1, v)

    def _zero3(self, ctx: _Context, plans, parts, coll, gemm=None) -> np.ndarray:
        """ZeRO-3 (one stage), as :mod:`ddlsim.workloads.decoder.zero3` builds it: the
        builder's two streams (compute; gathers and reduce-scatters in issue order on ``dp``)
        run op by op over the layers — or, from module hooks, the modules' parts of the
        layers — of three micro-batches (:func:`zero3_time`, :func:`zero3_units_time`), later
        micro-batches repeat the third's period; then the optimizer on the 1/DP shard.
        ``gemm``: (a layer's forward and backward GEMM FLOPs, NCCL's channels on ``dp``)
        per plan: per-layer gathers take the layers' SMs as the builder's contention ops do
        (:mod:`ddlsim.workloads.smcontention`). ``parts``: the pieces' seconds (embedding,
        layer forward, head forward and backward, layer backward, the embedding's backward
        on a PP = 1 rank, which FSDP's root unit computes before its reduce-scatter)."""
        e, f, hf, hb, bw, eb = parts
        dp = plans["dp"]
        m = plans["gbs"] // np.maximum(plans["mbs"] * np.maximum(dp, 1), 1)
        on = (plans["zero"] == 3) & (dp > 1)
        if not on.any():
            return np.full(len(plans), np.nan)
        # the op-by-op recurrence runs over the ZeRO-3 plans only (a few of the grid)
        out = np.full(len(plans), np.nan)
        sw = ctx.cfg.software
        if sw.zero3_gather == "per_layer":
            nbytes = ctx.shape.layer_params / plans["tp"] * ctx.dt
            a = coll("all_gather", "dp", nbytes, on)
            r = coll("reduce_scatter", "dp", nbytes * ctx.gdt / ctx.dt, on)
            sm = None if gemm is None else sm_taken(ctx, *(_take(x, on) for x in gemm))
            out[on] = zero3_time(ctx.shape.layers, sw.zero3_prefetch_layers, m[on],
                                 tuple(_take(x, on) for x in (e, f, hf, hb, bw)),
                                 _take(a, on), _take(r, on), sm,
                                 root_unit(ctx, plans, on, coll, _take(eb, on)))
        else:
            full = plans["recompute"] == RECOMPUTE.index("full")
            fwd_u, rec_u, bwd_u = self._module_units(ctx, plans, on, coll, full)
            edges = edge_units(ctx, plans, on, coll, full, (e, hf, hb))   # .zero3_edges
            for rec in (False, True):   # the recomputation's units exist under full only
                sel = on & (full == rec)
                if sel.any():
                    units = [fwd_u, (rec_u if rec else []) + bwd_u]
                    fu, bu = ([Unit(*(_take(x, sel) for x in u)) for u in us] for us in units)
                    out[sel] = zero3_units_time(
                        ctx.shape.layers, sw.zero3_prefetch_modules, m[sel],
                        [Unit(*(_take(x, sel) for x in u)) for u in edges], fu, bu,
                        sw.zero3_gather == "per_tensor", sw.zero3_max_live_parameters)
        out[on] += self._optimizer(ctx, self.stage_params(ctx, plans, True)[on]
                                   / np.maximum(dp[on], 1))
        for tp in np.unique(plans["tp"][on]):   # DeepSpeed 2021's persistent parameters
            here = on & (plans["tp"] == tp)
            tensors = persistent_tensors(ctx.shape, int(tp), sw, ctx.shape.layers, True)
            out[here] += persistent_gather_seconds(sw, tensors, dp[here])
            if sw.zero3_gather == "per_tensor":   # refetched by the later micro-batches
                refetch = list_host_seconds(sw, dp[here], sum(tensors.values()), gather=True)
                for n, count in tensors.items():
                    refetch = refetch + count * coll("all_gather", "dp", n * ctx.dt, here)[here]
                out[here] += (m[here] - 1) * refetch
        return out

    def _module_units(self, ctx: _Context, plans, on, coll, full):
        """One layer's units under ZeRO-3 from module hooks, forward and backward, as
        :func:`ddlsim.workloads.decoder.zero3._module_units` cuts the layer: per unit its
        compute, its gathers (and their memory passes under ``per_tensor``) and its
        reduce-scatters (with the gradients' passes, on the compute stream under
        ``per_tensor``, before the reduce-scatters otherwise), per TP size and recomputation:
        (forward units, the recomputed forward's units, the backward's units)."""
        k, tp_f, tp_b, acc = _module_pieces(ctx, plans, coll)
        n, sw = len(plans), ctx.cfg.software
        zeros = lambda: np.zeros(n)  # noqa: E731
        sel = np.where(plans["recompute"] == RECOMPUTE.index("selective"), k["recompute"], 0.0)
        fwd_comp = {1: k["attn.qkv"], 2: k["attn.proj"] + tp_f, 4: k["mlp.fc1"],
                    5: k["mlp.fc2"] + tp_f + k["ew"]}
        bwd_comp = {5: sel + k["bwd.mlp.fc2"], 4: k["bwd.mlp.fc1"] + tp_b,
                    2: k["bwd.attn.proj"], 1: k["bwd.attn.qkv"] + tp_b + k["bwd.ew"] + acc}
        order_f, order_b = (1, 2, 4, 5), (5, 4, 2, 1)
        units = {key: Unit(zeros(), zeros(), np.zeros(n, bool), zeros(), np.zeros(n, bool),
                           zeros(), zeros(), zeros(), zeros())
                 for key in [("f", mo) for mo in order_f] + [("r", mo) for mo in order_f]
                 + [("b", mo) for mo in order_b]}
        synced = sw.zero3_gather == "per_tensor"
        for tp, rec in sorted({(int(t), bool(x)) for t, x in zip(plans["tp"][on], full[on])}):
            here = on & (plans["tp"] == tp) & (full == rec)
            for key, live in unit_live_elements(ctx.shape, tp, sw, rec).items():
                units[key].live[here] = live
            for fm in module_fetches(ctx.shape, tp, sw, rec):   # priced as the edges' units
                for visit, need in (("f", fm.forward), ("r", fm.recompute), ("b", fm.backward)):
                    price_gathers(ctx, plans, here, coll, units[(visit, fm.module)], need,
                                  synced)
                price_reduces(ctx, plans, here, coll, units[("b", fm.module)], fm.reduce,
                              synced)
        for visit, comp in (("f", fwd_comp), ("r", fwd_comp), ("b", bwd_comp)):
            for mo in comp:
                u = units[(visit, mo)]
                units[(visit, mo)] = u._replace(compute=u.compute + comp[mo])
        return ([units[("f", mo)] for mo in order_f], [units[("r", mo)] for mo in order_f],
                [units[("b", mo)] for mo in order_b])

    # ------------------------------------------------------------------ memory
    def memory(self, ctx: _Context, plans) -> tuple[np.ndarray, np.ndarray]:
        """:func:`ddlsim.workloads.decoder.memory.stage_memory` of the first and last stages
        (the others hold less), the larger per plan (:func:`.decodermemory.plans_memory`)."""
        used = plans_memory(ctx, plans, lambda first: self.stage_params(ctx, plans, first))
        return used, np.full(len(plans), ctx.capacity)


def _module_pieces(ctx: _Context, plans, coll):
    """(ops' kernel times, TP collectives of a layer's forward and backward, gradient
    accumulation) per plan, for ZeRO-3 from module hooks: the layer cut at its modules,
    which :func:`.blocks.stage_pieces` does not time (it times whole layers)."""
    sh, dt = ctx.shape, ctx.dt
    b, t = plans["mbs"].astype(float), plans["tp"].astype(float)
    sp = plans["sp"].astype(bool)
    k = kernel_times(ctx, plans["mbs"], plans["tp"], sp)
    act = b * ctx.s * sh.hidden * dt
    multi = t > 1
    # Transformer Engine gathers FP8 under SP (Megatron1D._gather_bytes)
    gather = act / dt if fp8_sp_gather(ctx.cfg.software, ctx.cfg.train.dtype, 2, True,
                                       sh) else act
    tp_f = np.where(sp, coll("reduce_scatter", "tp", act) + coll("all_gather", "tp", gather),
                    coll("all_reduce", "tp", act)) * multi
    # SP: the backward gathers each block's input again where it was not saved
    # (dtensor.regathers_input, per plan's recomputation)
    regather = np.array([regathers_input(ctx.cfg.software, r) for r in RECOMPUTE])
    tp_b = tp_f + np.where(sp & regather[plans["recompute"]],
                           coll("all_gather", "tp", gather), 0.0) * multi
    acc = accumulate_pass_bytes(ctx.cfg.software, dt, ctx.gdt)
    acc_s = stream_times(sh.layer_params / t * acc / ctx.dev.memory_Bps, float(acc > 0),
                         ctx.dev.launch)
    return k, tp_f, tp_b, acc_s


def _on_meshes(op: str, family: str, nbytes: np.ndarray, mesh_index: np.ndarray, net,
               algos, memos: dict) -> np.ndarray:
    """:func:`collective_seconds` of plans on the meshes ``mesh_index`` (into ``net.nets``)
    with the forms of those meshes' networks only (kept in ``memos`` per set of meshes): the
    same seconds, element by element, as over every mesh."""
    used, sub = np.unique(mesh_index, return_inverse=True)
    memo = memos.setdefault(used.tobytes(), {})
    return collective_seconds(op, family, nbytes, sub.reshape(-1), [net.nets[u] for u in used],
                              algos, memo, net.backend)


def _take(x, mask: np.ndarray) -> np.ndarray:
    """``x`` (an array over the plans, or a scalar) at the plans ``mask`` selects."""
    return np.broadcast_to(np.asarray(x), mask.shape)[mask]


def _unique_meshes(tp, pp, dp) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (TP, PP, DP) rows and each plan's index into them (one integer key per
    plan: sorting it is much faster than ``np.unique(axis=0)``)."""
    k = int(max(tp.max(), pp.max(), dp.max())) + 1
    keys, index = np.unique((tp * k + pp) * k + dp, return_inverse=True)
    meshes = np.stack([keys // (k * k), keys // k % k, keys % k], axis=1)
    return meshes, index.ravel()
