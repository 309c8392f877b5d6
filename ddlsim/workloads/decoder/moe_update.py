"""The parameter split and the update of an MoE stage, as Megatron-Core runs them: routed
experts' parameters (held ``E/EP`` per rank, split over expert TP) against the rest, and the
update block that reduces the expert gradients over ``edp`` and the rest over the gradient
group (ZeRO stages applied per group). Mixed into
:class:`~ddlsim.workloads.decoder.builder.StageBuilder`; what it reads is declared in
:class:`.stage.StageBase`; the MoE layer's ops are :mod:`.moe`'s, docs/moe.md derives the
sizes."""

from __future__ import annotations

from ..trace import Block, Collective, Op, Wait
from . import param_gather
from .layerkinds import moe_layers_in_chunk, moe_layers_in_stage
from .stage import StageBase

__all__ = ["MoEUpdateOps"]


class MoEUpdateOps(StageBase):
    """Expert and non-expert parameters of a stage and the MoE stage's update block (a mixin
    of ``StageBuilder``; one layer's split, ``layer_rank_params``, is :class:`.moe.MoEOps`')."""

    def _nonexpert_params(self, layers: int, moe_layers: int) -> float:
        """Non-expert parameters on one rank (elements) of ``layers`` layers, ``moe_layers`` of
        them MoE layers: dense layers' whole, the MoE layers' attention, router and shared
        experts."""
        return ((layers - moe_layers) * self.layer_rank_params(False)[0]
                + moe_layers * self.layer_rank_params(True)[0])

    def _stage_nonexpert_layer_params(self, stage: int) -> float:
        """:meth:`_nonexpert_params` of ``stage``'s layers."""
        return self._nonexpert_params(sum(self.split[stage]),
                                      moe_layers_in_stage(self.shape, self.split, stage))

    def chunk_nonexpert_params(self, stage: int, chunk: int | None = None) -> float:
        """:meth:`_nonexpert_params` of model chunk ``chunk`` of ``stage`` (the whole stage
        when None)."""
        if chunk is None:
            return self._stage_nonexpert_layer_params(stage)
        n = moe_layers_in_chunk(self.shape, self.split, stage, chunk) if self.shape.is_moe else 0
        return self._nonexpert_params(self.split[stage][chunk], n)

    def chunk_expert_params(self, stage: int, chunk: int) -> float:
        """Routed-expert parameters of model chunk ``chunk`` of ``stage`` on one rank
        (:meth:`stage_expert_params` of its MoE layers)."""
        if not self.shape.is_moe:
            return 0.0
        return (moe_layers_in_chunk(self.shape, self.split, stage, chunk)
                * self.layer_rank_params(True)[1])

    def stage_expert_params(self, stage: int) -> float:
        """Routed-expert parameters held by one rank of ``stage``: ``E/EP`` experts of each
        of its MoE layers, split over expert TP. 0 for a dense model.

        Parameters
        ----------
        stage : int
            Pipeline stage index.

        Returns
        -------
        float
            Parameters (elements, not bytes).
        """
        if not self.shape.is_moe:
            return 0.0
        return moe_layers_in_stage(self.shape, self.split, stage) * self.layer_rank_params(True)[1]

    def _expert_update_block(self, stage: int, overlapped: bool, step) -> Block:
        """DDP/ZeRO update of an MoE stage whose expert layout differs from the dense one:
        the dense parameters' gradients are reduced (ZeRO: sharded, re-gathered) over the
        gradient group (``dp``, or ``dp × cp``), the experts' over ``edp``, each on its own
        stream; the optimizer steps the dense shard ``1/(DP·CP)`` and the expert shard
        ``1/EDP`` (ZeRO stages applied to each over its own group); the stack's DDP passes
        and host waits as the dense update block's, per synced buffer.

        Parameters
        ----------
        stage : int
            Pipeline stage index.
        overlapped : bool
            Whether the gradients were reduced during the backward (then only waited for).
        step : callable
            Maps the parameters (elements) the rank's optimizer steps to its step op.

        Returns
        -------
        Block
            The stage's ``update`` block.
        """
        zero = self.plan.zero_stage
        expert = self.stage_expert_params(stage)
        dense = self.stage_params(stage) - expert
        edp = self.plan.edp
        ops: list[Op] = [Op(Wait("backward.done", "compute"))]
        if overlapped:
            ops += [Op(Wait("wait.grad", "dp")), Op(Wait("wait.grad.expert", "edp"))]
        elif zero in (0, 1, 2):
            # without the overlap each bucket group's collective is synchronous, the dense
            # groups' before the experts' (Megatron-LM d98e8a64 distributed_data_parallel.py
            # lines 677-678; param_and_grad_buffer.py lines 806-808 and 682-685: async only
            # with overlap_grad_reduce): the experts' start when the dense ones end
            op = "all_reduce" if zero == 0 else "reduce_scatter"
            first = self.grad_sync_ops_flat(dense * self.gdt, op, self.grad_group, stage)
            after = (len(ops),) if first else ()
            ops += [*first, *(Op(o.payload, o.stream, after, o.repeat) for o in
                              self.grad_sync_ops_flat(expert * self.gdt, op, "edp", stage)),
                    Op(Wait("wait.grad", "dp")), Op(Wait("wait.grad.expert", "edp"))]
        if zero == 3:
            ops += [Op(Wait("wait.grad", "dp")), Op(Wait("wait.grad.expert", "edp"))]
        # the DDP's passes and host waits over both buffers, as the dense update block
        # charges them (.builder): Megatron-Core's expert_parallel_buffers have their own
        # buckets and run the same start_grad_sync and zero_grad_buffer
        moved = overlapped and stage == 0 and self.split[0][0] > 0
        synced = [b * self.gdt for b, n in ((dense, self.gdp), (expert, edp)) if n > 1]
        waits = 0 if zero == 3 else len(synced) * self.stage_buckets(stage, moved)
        self.step_sync_ops(ops, waits, True)
        ops.append(step(dense / self.gdp + expert / edp if zero else dense + expert))
        self.step_sync_ops(ops, 0, False)
        kept = 1 - self.split[0][0] / sum(self.split[0]) if moved else 1
        for grad in synced if zero < 3 else ():
            ops += self.ddp_pass_ops(grad, grad * kept)
        if zero in (1, 2):   # each buffer's gather, or its first bucket (.param_gather)
            per = param_gather.gather_bytes_per_param(self.sw, self.plan.train_dtype, self.dt)
            on, bucket = self.plan.param_gather_overlap, self.plan.param_bucket_bytes
            ops += [Op(Collective("params.all_gather", "all_gather", self.grad_group,
                                  param_gather.first_bucket(
                                      on, param_gather.stage_bytes(self, stage, dense),
                                      bucket))),
                    Op(Collective("params.expert.all_gather", "all_gather", "edp",
                                  param_gather.first_bucket(on, expert * per, bucket)))]
        anchored = tuple(Op(o.payload, o.stream, o.deps or (0,), o.repeat)
                         if o.stream != "compute" else o for o in ops)
        return Block("update", "optimizer", anchored)
