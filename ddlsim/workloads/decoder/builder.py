"""One pipeline stage of a decoder-only transformer → blocks of trace ops (Megatron-LM layout,
DDP / ZeRO / the seed's DP update strategies).

Counts (FLOPs, bytes, parameters) come from :class:`~ddlsim.workloads.models.decoder.DecoderShape`,
so GPT, Llama, Mistral and Qwen2 share every line here: grouped-query attention shrinks the
K/V projections, a gated MLP has three matrices, RMSNorm and rotary positions drop parameters,
an untied output head adds its own ``V·h`` on the last stage.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from ...config import RunConfig
from ..models.decoder import DecoderShape
from ...simulator.kernels.dtensor import regathers_input
from ...simulator.kernels.elementwise import optimizer_bytes_per_param
from ..trace import Collective, Compute, Op
from . import tp_overlap
from .chunks import ChunkOps, as_ops
from .dpsync import GradSyncOps
from .early_stop import trimmed_recompute
from .edges import EdgeOps
from .host_sync import HostSyncOps
from .layerkernels import layer_kernels, recompute_op
from .moe import MoEOps
from .moe_update import MoEUpdateOps
from .mtp import MTPOps
from .param_gather import fp8_param_step_delta_bytes
from .plan import DecoderPlan, resolve_plan
from .sac import every_second_mm_op, forward_host, mixed_backward
from .split import mtp_depths
from .update import UpdateOps

__all__ = ["StageBuilder", "ADAM_BYTES_PER_PARAM", "as_ops", "with_edges"]


#: Bytes the optimizer step reads and writes per parameter (mixed-precision Adam: fp32 master
#: weights, momentum and variance read and written, 16-bit gradient read, 16-bit weight written).
ADAM_BYTES_PER_PARAM = 3 * 4 * 2 + 2 + 2


def with_edges(shape: DecoderShape, param_split, layer_params, first, last, pp):
    """Parameters on one rank of a stage: its layers' ``layer_params`` (TP-sharded), the input
    embedding (and learned positions) on the first stage, the final norm and the output head on
    the last: an untied head is its own ``V·h``; a tied one is Megatron's copy of the embedding
    on the last stage when PP > 1 (``share_embeddings_and_output_weights``). ``first``,
    ``last``, ``pp`` and ``param_split`` may be arrays over plans (the search tier's)."""
    vh = shape.vocab * shape.hidden / param_split
    n = layer_params
    pos = shape.max_positions * shape.hidden if shape.positions == "learned" else 0
    if isinstance(first, (bool, np.bool_)):
        if first:
            n += vh + pos
        if last:
            n += shape.norm_params + (vh if pp > 1 or not shape.tied_embeddings else 0)
        return n
    n = n + np.where(first, vh + pos, 0.0)
    head = shape.norm_params + np.where((pp > 1) | (not shape.tied_embeddings), vh, 0.0)
    return n + np.where(last, head, 0.0)


class StageBuilder(MTPOps, GradSyncOps, MoEOps, MoEUpdateOps, HostSyncOps, EdgeOps, ChunkOps,
                   UpdateOps):
    """Builds the blocks of one pipeline stage (MoE layers: :class:`.moe.MoEOps`, their
    parameters and update: :class:`.moe_update.MoEUpdateOps`; gradient
    buckets: :class:`.dpsync.GradSyncOps`; the host's waits in the step's own code:
    :class:`.host_sync.HostSyncOps`; embedding and head: :class:`.edges.EdgeOps`; a model
    chunk's forward and backward blocks: :class:`.chunks.ChunkOps`; the update block:
    :class:`.update.UpdateOps`).

    Parameters
    ----------
    plan : DecoderPlan
        The resolved plan (:func:`.plan.resolve_plan`; :meth:`from_config` resolves it): the
        builder and its mixins read it, through the names :class:`.stage.StageBase` declares,
        and nothing else of the run config.
    """

    def __init__(self, plan: DecoderPlan, mtp_layers: int = 0):
        super().__init__(plan)
        self._layer_ops: dict[tuple[bool, int], list[Op]] = {}
        #: multi-token-prediction depths on the last stage (:mod:`.mtp`; 0: none)
        self.mtp = mtp_layers

    @classmethod
    def from_config(cls, cfg: RunConfig, shape: DecoderShape) -> StageBuilder:
        """The builder of run ``cfg`` for a decoder of ``shape``.

        Parameters
        ----------
        cfg : RunConfig
            The validated run.
        shape : DecoderShape
            Its model's closed-form counts (``cfg.model.shape()``).

        Returns
        -------
        StageBuilder
            The builder of the plan :func:`.plan.resolve_plan` resolves, once.
        """
        return cls(resolve_plan(cfg, shape), mtp_depths(cfg))

    @cached_property
    def fwd_layer(self) -> list[Compute | Collective]:
        return self.layer_forward()

    @cached_property
    def bwd_layer(self) -> list[Compute | Collective]:
        return self.layer_backward()

    def layer_ops(self, backward: bool, repeat: int, n_moe: int | None = None,
                  first: int | None = None) -> list[Op]:
        """``repeat`` layers' forward (or backward) ops, each op repeated (ops are immutable,
        so every block and stage shares these lists). With MoE every ``period``-th layer is an
        MoE layer: ``repeat`` (a multiple of the period) layers are the dense layer's ops
        repeated ``repeat − repeat/period`` times and a loop of ``repeat/period`` MoE layers
        (:meth:`.moe.MoEOps.moe_layers`; nothing overlaps consecutive layers, so the order
        within the run does not matter); ``n_moe`` gives a chunk's own count (DeepSeek-V3's
        dense first layers: :func:`.layerkinds.moe_layers_in_chunk`). Under
        ``train.recompute_every_n_layers`` above 1, ``first`` (the rank's count of the first of
        these layers, from 0) says which are checkpointed (:func:`.sac.checkpointed_layers`);
        the others' backward is the plan's without recomputation."""
        if backward and self.plan.recompute_every_n_layers > 1:
            return mixed_backward(self, repeat, first)
        if n_moe is None:
            n_moe = repeat // self.period if self.shape.is_moe else 0
        key = (backward, repeat, n_moe)
        ops = self._layer_ops.get(key)
        if ops is None:
            ops = self._dense_layer_ops(backward, repeat - n_moe) if repeat > n_moe else []
            if n_moe:
                ops = [*ops, self.moe_layers(backward, n_moe)]
            self._layer_ops[key] = ops
        return ops

    def _dense_layer_ops(self, backward: bool, repeat: int) -> list[Op]:
        """``repeat`` dense layers: the partitioner's loop, TP-overlapped layers, or the
        builder's ops repeated."""
        overlap_on = self.plan.tp_overlap is not None
        if self.structured:
            overlap = (lambda body: tp_overlap.structured_body(self, backward, body)) \
                if overlap_on else None
            params = self.shape.dense_layer_params if self.shape.is_moe \
                else self.shape.layer_params
            return [self.part.layers(backward, repeat, self.grad_accumulate_bytes(
                params / self.part.param_split), overlap)]
        if not self.shape.is_moe:
            dense = self.bwd_layer if backward else self.fwd_layer
        else:    # an MoE model's dense layers (DeepSeek's first ones)
            dense = self.layer_backward(moe=False) if backward else self.layer_forward(moe=False)
        if overlap_on and (backward or self.plan.tp_overlap != "async"):
            # TE userbuffers, or the async backward: per-layer loop (the async forward
            # overlaps nothing and keeps the plain ops)
            return [tp_overlap.overlapped_layers(self, backward, repeat, dense)]
        return [Op(x, repeat=repeat) for x in dense]

    # ------------------------------------------------------------------ per-layer ops
    def _tp_comm(self, name: str) -> list[Collective]:
        """Megatron's f/g operators: an all-reduce, or reduce-scatter + all-gather with SP
        (:meth:`~.partition.megatron_1d.Megatron1D.tp_comm`)."""
        return self.part.tp_comm(name, self.act_bytes)

    def layer_forward(self, tag: str = "fwd", moe: bool | None = None) -> list[Compute | Collective]:
        """One layer's forward; ``moe`` picks an MoE layer (default: the kind all layers have)."""
        moe = self.shape.is_moe and self.period == 1 if moe is None else moe
        if moe:
            return self.moe_layer_payloads(False, tag)
        g = self.shape.layer_gemm_flops(self.b, self.s, moe=False if self.shape.is_moe else None)
        t, k = self.tp, self.kernels
        ew = sum(x.bytes for x in k["ew"])
        ops: list[Compute | Collective] = [
            *self._latent_gathers(tag),
            Compute(f"{tag}.attn", self._attn_flops(g), dtype=self.dtype,
                    kernels=k["attn"]),
            *self._tp_comm(f"{tag}.attn"),
            Compute(f"{tag}.mlp", g["mlp"] / t, dtype=self.dtype, kernels=k["mlp"]),
            *self.part.tp_comm(f"{tag}.mlp", self.act_bytes, ends_layer=True),
            Compute(f"{tag}.elementwise", 0.0, ew, kind="elementwise", dtype=self.dtype,
                    kernels=k["ew"]),
        ]
        if tag == "fwd":            # torch's SAC policy on the host, per ATen op (.sac)
            ops = forward_host(ops, self.sw, self.plan.recompute)
        return ops

    @cached_property
    def kernels(self) -> dict:
        """One dense layer's kernels on this rank (:func:`.layerkernels.layer_kernels`),
        computed once per builder (its plan is fixed)."""
        return layer_kernels(self.shape, self.sw, self.b, self.s, self.tp, self.sp,
                             self.plan.train_dtype, regathers_input(self.sw, self.plan.recompute),
                             self.plan.microbatches)

    def _attn_flops(self, g: dict[str, float]) -> float:
        """Q, K/V (smaller under GQA), the attention core and the output projection on this
        rank: a ``t``-th, but MLA's down projections, whole on the rank's tokens (a
        ``t``-th of them under sequence parallelism: :mod:`.partition.mla_1d`)."""
        total = (g["q"] + g["kv"]) + g["attn_core"] + g["proj"]
        if self.shape.mla is None or self.sp:
            return total / self.tp
        down = self.shape.mla.down_params(self.shape.hidden) * 2.0 * self.b * self.s
        return (total - down) / self.tp + down

    def _latent_gathers(self, tag: str) -> list[Collective]:
        """The all-gathers of MLA's latents before the fused attention op under sequence
        parallelism (:mod:`.partition.mla_1d`: the layer before gathers no hidden state for
        it); none otherwise."""
        if not self.part.latents:
            return []
        from .partition.mla_1d import latent_gathers
        return [c for kind in ("q_up", "kv_up")
                for c in latent_gathers(self.part, f"{tag}.attn", self.b * self.s, kind)]

    def _attention_backward_comm(self) -> list[Collective]:
        """The fused attention block's backward collectives: the column-parallel block's on
        ``b·s·h``, or MLA's (:func:`.partition.mla_1d.attention_backward`)."""
        if self.shape.mla is None:
            return self.part.tp_comm_backward("bwd.attn", self.act_bytes)
        from .partition.mla_1d import attention_backward
        return attention_backward(self.part, "bwd.attn", self.b * self.s)

    def layer_backward(self, moe: bool | None = None) -> list[Compute | Collective]:
        """One layer's backward (after recomputation); ``moe`` as :meth:`layer_forward`."""
        moe = self.shape.is_moe and self.period == 1 if moe is None else moe
        if moe:
            return self.moe_layer_payloads(True)
        g = self.shape.layer_gemm_flops(self.b, self.s, moe=False if self.shape.is_moe else None)
        t = self.tp
        recompute = self.plan.recompute
        ops: list[Compute | Collective] = []
        if recompute == "full":   # as far as the stack's checkpoint runs it (.early_stop)
            ops += trimmed_recompute(self, self.layer_forward("recompute", False))
        elif recompute == "selective":   # the attention core (Korthikanti et al. 2022 §5)
            ops.append(self._recompute_core(g, False))
            if self.plan.recompute_modules is not None:   # their TP collectives again
                from .recompute_comms import module_collectives
                ops += module_collectives(self, False)
        ew_kernels = self.kernels["bwd.ew"]
        ew = sum(x.bytes for x in ew_kernels)
        ops.append(Compute("bwd.mlp", 2 * g["mlp"] / t, dtype=self.dtype,
                           kernels=self.kernels["bwd.mlp"]))
        dense_p, expert_p = self.layer_rank_params(False) if self.shape.is_moe \
            else (self.shape.tp_rank_params(self.shape.layer_params, t), 0.0)
        ops += [
            *self.part.tp_comm_backward("bwd.mlp", self.act_bytes),
            Compute("bwd.attn", 2 * self._attn_flops(g), dtype=self.dtype,
                    kernels=self.kernels["bwd.attn"]),
            *self._attention_backward_comm(),
            Compute("bwd.elementwise", 0.0, ew, kind="elementwise", dtype=self.dtype,
                    kernels=ew_kernels),
            Compute("bwd.grad_accumulate", 0.0, self.grad_accumulate_bytes(dense_p + expert_p),
                    kind="elementwise", dtype=self.dtype),
        ]
        return ops

    def _recompute_core(self, g: dict, moe: bool) -> Compute:
        """Selective recomputation's op: of ``train.recompute_modules`` when given
        (:func:`.recompute_modules.recompute_op`), else :meth:`_plain_recompute_core`."""
        if self.plan.recompute_modules is not None:
            from .recompute_modules import recompute_op as modules_op
            return modules_op(self, g, moe)
        return self._plain_recompute_core(g, moe)

    def moe_layer_body(self, backward: bool, tag: str = "fwd") -> list[Op]:
        """:meth:`.moe.MoEOps.moe_layer_body`, its backward opened under
        ``train.recompute_modules`` by the recomputed MoE block (``moe``) and the modules
        recomputed beside ``core_attn`` (:func:`.recompute_modules.moe_extra_ops`)."""
        body = super().moe_layer_body(backward, tag)
        if not backward or self.plan.recompute_modules is None:
            return body
        from .partition.base import OpList
        from .recompute_modules import moe_extra_ops
        ops = OpList()
        ops.extend(moe_extra_ops(self))
        ops.extend(body)
        return ops.ops

    def _plain_recompute_core(self, g: dict, moe: bool) -> Compute:
        """The stack's selective recomputation (:func:`.layerkernels.recompute_op`: the
        attention core), or its op-level policy (:mod:`.sac`)."""
        if self.sw.selective_recompute == "every_second_mm" and not moe:
            return every_second_mm_op(self.shape, self.kernels, self.b, self.s, self.tp,
                                      self.dtype, self.plan.train_dtype, self.sw, self.sp)
        return recompute_op(self.shape, self.kernels, g["attn_core"] / self.tp, self.b, self.s,
                            self.tp, self.dt, self.dtype)

    # ------------------------------------------------------------------ parameters per stage
    def stage_params(self, stage: int) -> float:
        """Parameters held by one rank of ``stage`` (TP-sharded). The first stage holds the
        input embedding (and learned positions), the last the final norm and the output head:
        an untied head is its own ``V·h``; a tied one is Megatron's copy of the embedding on
        the last stage when PP > 1 (``share_embeddings_and_output_weights``)."""
        sh, t = self.shape, self.part.param_split
        if sh.is_moe:
            n = self.stage_expert_params(stage) + self._stage_nonexpert_layer_params(stage)
        elif sh.mla is not None and self.plan.tp_mode == "1d":   # a 2-D grid splits them
            n = sum(self.split[stage]) * sh.tp_rank_params(sh.layer_params, t)
        else:
            n = sum(self.split[stage]) * sh.layer_params / t
        # the MTP depths' (.mtp): their routed experts are in stage_expert_params
        return with_edges(sh, t, n, stage == 0, stage == self.pp - 1, self.pp) \
            + self.mtp_params(stage)

    def optimizer_op(self, n_params: float) -> Op:
        """The optimizer step over ``n_params`` parameters: 10 FLOPs and the optimizer's bytes
        (:func:`~ddlsim.simulator.kernels.optimizer_bytes_per_param`) per parameter, and with
        FP8 parameters the master shard's cast into them (:func:`.param_gather.
        fp8_param_step_delta_bytes`: the cast into them replaces the 16-bit copy)."""
        per_param = optimizer_bytes_per_param(self.plan.optimizer, self.sw.fused_optimizer,
                                              self.dt, self.gdt, self.plan.train_dtype == "fp16")
        fp8 = fp8_param_step_delta_bytes(self.sw, self.plan.train_dtype, n_params, self.dt)
        return Op(Compute("optimizer", 10.0 * n_params, per_param * n_params + fp8,
                          kind="optimizer", dtype="fp32"))
