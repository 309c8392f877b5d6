"""The Mixture-of-Experts parts of a decoder stage: MoE layer ops (router, dispatch and combine
all-to-all on ``ep``, the local experts' GEMMs, shared experts), the tokens each expert
receives, parameters split into expert and non-expert, and the update that reduces expert
gradients over ``edp`` and the rest over ``dp`` (ZeRO per group). Mixed into
:class:`~ddlsim.workloads.decoder.builder.StageBuilder`, whose attributes (``shape``, ``tp``,
``ep``, ``b``, ``s``, ``dt``, ``period``, …) these methods read; docs/models.md tabulates the
sizes.
"""

from __future__ import annotations

from ..trace import Block, Collective, Compute, Op, Wait

__all__ = ["MoEOps"]


class MoEOps:
    """MoE layer ops and sizes of one pipeline stage (a mixin of ``StageBuilder``)."""

    # ------------------------------------------------------------------ MoE sizes
    def tokens(self) -> float:
        """Tokens of one micro-batch on one rank as the MoE layer routes them: ``b·s``, or
        ``b·s/t`` with sequence parallelism."""
        return self.b * self.s / (self.tp if self.sp else 1)

    def a2a_bytes(self) -> float:
        """Bytes one rank sends in one dispatch (or combine) all-to-all, nccl-tests
        convention: tokens × top-k × hidden × dtype bytes, × the capacity factor when not
        dropless (every expert slot is sent, padded or not; GShard, Switch)."""
        sh = self.shape
        return self.tokens() * sh.top_k * sh.hidden * self.dt * (sh.capacity_factor or 1.0)

    def expert_flops(self) -> float:
        """Forward FLOPs of the routed experts on one rank: the tokens each expert receives,
        ``expert_capacity(EP · b·s)`` (``k·tokens/E``, × capacity factor), times the ``E/EP``
        local experts, times ``2·m·h·f_e``, split over the expert-TP (= TP) ranks."""
        sh = self.shape
        per_expert = sh.expert_capacity(self.ep * self.b * self.s)
        return (per_expert * (sh.experts // self.ep) * 2 * sh.mlp_matrices * sh.hidden * sh.f_e
                / self.tp)

    def layer_rank_params(self, moe: bool) -> tuple[float, float]:
        """(non-expert, expert) parameters of one layer on one rank: the non-expert ones
        (attention, norms, router, shared experts) split over TP, the routed experts over
        EP × expert TP."""
        sh, t = self.shape, self.tp
        if not moe:
            return sh.dense_layer_params / t, 0.0
        experts = sh.experts * sh.mlp_params(sh.f_e)
        return (sh.moe_layer_params - experts) / t, experts / (self.ep * t)

    def _a2a(self, name: str) -> list[Collective]:
        if self.ep == 1:
            return []
        return [Collective(name, "all_to_all", "ep", self.a2a_bytes())]

    def moe_layer_forward(self, tag: str = "fwd") -> list[Compute | Collective]:
        """An MoE layer's forward: attention as in a dense layer; the router GEMM on the
        rank's tokens; dispatch all-to-all on ``ep``; the local experts' GEMMs; combine
        all-to-all; the shared experts as a dense MLP; TP communication around the block as
        around a dense MLP (expert TP = TP)."""
        sh, t, dt = self.shape, self.tp, self.dt
        g = sh.layer_gemm_flops(self.b, self.s, moe=True)
        ew = sh.layer_elementwise_bytes(self.b, self.s, t, self.sp, dt, moe=True)
        ops: list[Compute | Collective] = [
            Compute(f"{tag}.attn", self._attn_flops(g) / t, dtype=self.dtype),
            *self._tp_comm(f"{tag}.attn"),
            Compute(f"{tag}.router", g["router"] / (t if self.sp else 1), dtype=self.dtype),
            *self._a2a(f"{tag}.dispatch"),
            Compute(f"{tag}.experts", self.expert_flops(), dtype=self.dtype),
            *self._a2a(f"{tag}.combine"),
        ]
        if sh.shared_experts:
            ops.append(Compute(f"{tag}.shared_experts", g["shared_experts"] / t, dtype=self.dtype))
        ops += [*self._tp_comm(f"{tag}.mlp"),
                Compute(f"{tag}.elementwise", 0.0, ew, kind="elementwise", dtype=self.dtype)]
        return ops

    def _moe_backward(self, g: dict[str, float]) -> list[Compute | Collective]:
        """The MoE block's backward in reverse order: shared experts, combine's gradient
        (all-to-all), the experts (2 × forward), dispatch's gradient (all-to-all), router."""
        t = self.tp
        ops: list[Compute | Collective] = []
        if self.shape.shared_experts:
            ops.append(Compute("bwd.shared_experts", 2 * g["shared_experts"] / t, dtype=self.dtype))
        return ops + [
            *self._a2a("bwd.combine"),
            Compute("bwd.experts", 2 * self.expert_flops(), dtype=self.dtype),
            *self._a2a("bwd.dispatch"),
            Compute("bwd.router", 2 * g["router"] / (t if self.sp else 1), dtype=self.dtype)]

    def _stage_nonexpert_layer_params(self, stage: int) -> float:
        L, f = sum(self.split[stage]), self.period
        return ((L - L // f) * self.layer_rank_params(False)[0]
                + L // f * self.layer_rank_params(True)[0])

    def stage_expert_params(self, stage: int) -> float:
        """Routed-expert parameters held by one rank of ``stage``: ``E/EP`` experts of each
        of its MoE layers, split over expert TP (= TP). 0 for a dense model."""
        if not self.shape.is_moe:
            return 0.0
        return (sum(self.split[stage]) // self.period) * self.layer_rank_params(True)[1]

    def _expert_update_block(self, stage: int, overlapped: bool, step) -> Block:
        """DDP/ZeRO update of an MoE stage with EP > 1: the dense parameters' gradients are
        reduced (ZeRO: sharded, re-gathered) over ``dp``, the experts' over ``edp``, each on
        its own stream; the optimizer steps the dense shard ``1/DP`` and the expert shard
        ``1/EDP`` (ZeRO stages applied to each over its own group)."""
        zero = self.cfg.parallel.zero_stage
        expert = self.stage_expert_params(stage)
        dense = self.stage_params(stage) - expert
        edp = self.cfg.mesh.size("edp")
        ops: list[Op] = [Op(Wait("backward.done", "compute"))]
        if overlapped:
            ops += [Op(Wait("wait.grad", "dp")), Op(Wait("wait.grad.expert", "edp"))]
        elif zero in (0, 1, 2):
            op = "all_reduce" if zero == 0 else "reduce_scatter"
            ops += [*self.grad_sync_ops_flat(dense * self.gdt, op),
                    *self.grad_sync_ops_flat(expert * self.gdt, op, "edp"),
                    Op(Wait("wait.grad", "dp")), Op(Wait("wait.grad.expert", "edp"))]
        if zero == 3:
            ops += [Op(Wait("wait.grad", "dp")), Op(Wait("wait.grad.expert", "edp"))]
        ops.append(step(dense / self.dp + expert / edp if zero else dense + expert))
        if zero in (1, 2):
            ops += [Op(Collective("params.all_gather", "all_gather", "dp", dense * self.dt)),
                    Op(Collective("params.expert.all_gather", "all_gather", "edp",
                                  expert * self.dt))]
        anchored = tuple(Op(o.payload, o.stream, o.deps or (0,), o.repeat)
                         if o.stream != "compute" else o for o in ops)
        return Block("update", "optimizer", anchored)
