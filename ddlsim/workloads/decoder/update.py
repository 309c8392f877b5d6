"""The update block of a decoder's pipeline stage: the gradient synchronisation not overlapped
with the backward, the optimizer step, and the parameter redistribution of the chosen
data-parallel update (``parallel.dp_strategy``: DDP with ZeRO stages 0-3, reduce + broadcast,
sliced reduce + broadcast, reduce-scatter + all-gather). Mixed into
:class:`~ddlsim.workloads.decoder.builder.StageBuilder`; what it reads is declared in
:class:`.stage.StageBase`; an MoE stage whose experts sync over their own group takes
:class:`.moe_update.MoEUpdateOps`' block."""

from __future__ import annotations

from ..trace import Block, Collective, Compute, Op, Wait
from . import param_gather
from .stage import StageBase

__all__ = ["UpdateOps", "anchored"]


def anchored(ops: list[Op]) -> tuple[Op, ...]:
    """``ops`` with every op off the compute stream that has no dependency made to depend on
    op 0 (the block's "backward finished" wait)."""
    return tuple(Op(o.payload, o.stream, o.deps or (0,), o.repeat)
                 if o.stream != "compute" else o for o in ops)


class UpdateOps(StageBase):
    """The stage's ``update`` block (a mixin of ``StageBuilder``)."""

    def update_block(self, stage: int, root: bool, overlapped: bool) -> Block:
        """Gradient synchronisation not overlapped with backward, the optimizer step, and the
        parameter redistribution of the chosen data-parallel update.

        Parameters
        ----------
        stage : int
            Pipeline stage index.
        root : bool
            Whether this rank is the root of ``reduce_broadcast`` (it alone steps).
        overlapped : bool
            Whether the gradients were reduced during the backward (then only waited for).

        Returns
        -------
        Block
            The stage's ``update`` block.
        """
        p = self.plan
        params = self.stage_params(stage)
        if self.split_experts and (self.gdp > 1 or p.edp > 1):
            return self._expert_update_block(stage, overlapped, self.optimizer_op)
        if self.gdp == 1:     # the step's own waits (.host_sync) around it
            alone: list[Op] = []
            self.step_sync_ops(alone, 0, True)
            self._step_ops(alone, stage, params)
            self.step_sync_ops(alone, 0, False)
            return Block("update", "optimizer", tuple(alone))
        # ops[0] marks "backward finished": communication-stream ops below depend on it
        ops: list[Op] = [Op(Wait("backward.done", "compute"))]
        if p.dp_strategy == "ddp":
            self._ddp_update_ops(ops, stage, params, overlapped)
        elif p.dp_strategy == "reduce_broadcast":
            self._reduce_broadcast_ops(ops, params, root)
        elif p.dp_strategy == "sliced_reduce_broadcast":
            self._sliced_reduce_broadcast_ops(ops, params)
        else:  # reduce_scatter
            self._reduce_scatter_ops(ops, params)
        return Block("update", "optimizer", anchored(ops))

    def _ddp_update_ops(self, ops: list[Op], stage: int, params: float,
                        overlapped: bool) -> None:
        """Append DDP's update (ZeRO stages 0-3) of ``params`` parameters to ``ops``."""
        p = self.plan
        grad_bytes = params * self.gdt
        if overlapped:
            ops.append(Op(Wait("wait.grad", "dp")))
        elif p.zero_stage in (0, 1, 2):
            op = "all_reduce" if p.zero_stage == 0 else "reduce_scatter"
            ops += [*self.grad_sync_ops_flat(grad_bytes, op, self.grad_group),
                    Op(Wait("wait.grad", "dp"))]
        if p.zero_stage == 3:
            ops.append(Op(Wait("wait.grad", "dp")))  # ZeRO-3: gathers and RS share it
        shard = params / self.gdp if p.zero_stage else params
        # the buckets' passes and waits here, but the first chunk's overlapped ones
        # (before each run's collectives: .dpsync.GradSyncOps.bucket_pass_ops)
        moved = overlapped and stage == 0 and self.split[0][0] > 0
        waits = 0 if p.zero_stage == 3 else self.stage_buckets(stage, moved)
        self.step_sync_ops(ops, waits, True)
        self._step_ops(ops, stage, shard)
        self.step_sync_ops(ops, 0, False)
        if p.zero_stage == 3:   # DeepSpeed 2021 regathers its persistent parameters
            from .zero3_fetch import persistent_gather_ops
            ops += persistent_gather_ops(self, stage, len(ops) - 1)
        if p.zero_stage < 3:    # the DDP's passes over its gradient buffer (dpsync)
            ops += self.ddp_pass_ops(grad_bytes, grad_bytes * (
                1 - self.split[0][0] / sum(self.split[0]) if moved else 1))
        if p.zero_stage in (1, 2) and param_gather.fp8_params(self.sw, p.train_dtype):
            ops.append(self.fp8_amax_op(stage))     # the FP8 parameters' amaxes (.fp8_weights)
        if p.zero_stage in (1, 2):  # all of it, or its first bucket (.param_gather)
            gather = param_gather.first_bucket(p.param_gather_overlap,
                                               param_gather.stage_bytes(self, stage, params),
                                               p.param_bucket_bytes)
            ops.append(Op(Collective("params.all_gather", "all_gather", self.grad_group,
                                     gather)))

    def fp8_amax_op(self, stage: int) -> Op:
        """The all-reduce (max) of the stage's FP8 parameters' amaxes over the gradient group
        after the step casts its master shard (:func:`~ddlsim.simulator.kernels.fp8_weights.
        fp8_param_amax_bytes`: one fp32 per weight, the layers' four linears each)."""
        from ...simulator.kernels.fp8_weights import fp8_param_amax_bytes
        return Op(Collective("params.fp8_amax.all_reduce", "all_reduce", self.grad_group,
                             fp8_param_amax_bytes(4 * sum(self.split[stage]))))

    def _step_ops(self, ops: list[Op], stage: int, params: float) -> None:
        """Append the optimizer step over ``params`` parameters; under FSDP2 (ZeRO-3,
        ``torch_fsdp2``) DTensor's host time of a single-tensor step before it, on the
        ``host`` stream (:func:`.fsdp2_host.step_host_seconds`: the stage's parameter
        tensors, its layers' and edges')."""
        seconds = 0.0
        if self.plan.zero_stage == 3 and self.sw.zero3_implementation == "torch_fsdp2":
            from .fsdp2_host import edge_tensors, layer_tensors, step_host_seconds
            sh = self.shape
            layer = layer_tensors(sh, bool(self.sw.separate_projections))
            tensors = sum(self.split[stage]) * layer
            tensors += (edge_tensors(sh, ".embedding") if stage == 0 else 0) + \
                (edge_tensors(sh, ".head") if stage == self.pp - 1 else 0)
            seconds = step_host_seconds(self.plan.device.launch, self.sw.fused_optimizer,
                                        tensors)
        step = self.optimizer_op(params)
        if seconds:   # once the step may start: after the ops before it (the gradients' wait)
            ops.append(Op(Compute("optimizer.dtensor_host", 0.0, kind="elementwise",
                                  dtype="fp32", seconds=seconds), "host",
                          (len(ops) - 1,) if ops else ()))
            step = Op(step.payload, step.stream, (len(ops) - 1,), step.repeat)
        ops.append(step)

    def _reduce_broadcast_ops(self, ops: list[Op], params: float, root: bool) -> None:
        """Append the gradients reduced to rank 0, its step, and the parameters broadcast."""
        ops.append(Op(Collective("grad.reduce", "reduce", "dp", params * self.gdt, root=0)))
        if root:
            ops.append(self.optimizer_op(params))
        ops.append(Op(Collective("params.broadcast", "broadcast", "dp", params * self.dt,
                                 root=0)))

    def _sliced_reduce_broadcast_ops(self, ops: list[Op], params: float) -> None:
        """Append one reduce per DP rank's slice (each on its own stream), the step of the
        rank's slice, and one broadcast per slice."""
        dp = self.gdp
        for i in range(dp):
            ops.append(Op(Collective(f"grad.reduce.slice{i}", "reduce", "dp",
                                     params * self.gdt / dp, root=i), stream=f"dp.{i}"))
        ops += [Op(Wait(f"wait.slice{i}", f"dp.{i}")) for i in range(dp)]
        ops.append(self.optimizer_op(params / dp))
        base = len(ops) - 1
        for i in range(dp):
            ops.append(Op(Collective(f"params.broadcast.slice{i}", "broadcast", "dp",
                                     params * self.dt / dp, root=i), stream=f"dp.{i}",
                          deps=(base,)))
        ops += [Op(Wait(f"wait.bslice{i}", f"dp.{i}")) for i in range(dp)]

    def _reduce_scatter_ops(self, ops: list[Op], params: float) -> None:
        """Append the gradients reduce-scattered, the step of the rank's shard, and the
        parameters all-gathered."""
        ops.append(Op(Collective("grad.reduce_scatter", "reduce_scatter", "dp",
                                 params * self.gdt)))
        ops.append(self.optimizer_op(params / self.gdp))
        ops.append(Op(Collective("params.all_gather", "all_gather", "dp", params * self.dt)))
