"""What every part of a decoder's stage builder reads, declared once.

:class:`~ddlsim.workloads.decoder.builder.StageBuilder` is assembled from mixins
(:class:`.dpsync.GradSyncOps`, :class:`.moe.MoEOps`, :class:`.edges.EdgeOps`,
:class:`.chunks.ChunkOps`, :class:`.update.UpdateOps`, …); each subclasses
:class:`StageBase`, so every attribute a mixin reads is declared here: the resolved
:class:`~.plan.DecoderPlan` (``plan``), its fields under the short names the formulas use,
what the stage derives from them, and the methods one part calls on another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .fsdp import reduces_every_microbatch
from .wgrad import accumulate_pass_bytes

if TYPE_CHECKING:
    from ..trace import Compute, Op
    from .plan import DecoderPlan

__all__ = ["StageBase"]


class StageBase:
    """The plan of one stage builder and the names its formulas use.

    Parameters
    ----------
    plan : DecoderPlan
        The resolved plan (:func:`.plan.resolve_plan`).
    """

    def __init__(self, plan: DecoderPlan):
        #: the resolved plan: the only input of the builder and its mixins
        self.plan = plan
        self.shape = plan.shape
        #: ranks of the tp, pp, dp, cp, ep and expert-tp axes; ``v``: model chunks per stage
        self.tp, self.pp, self.v, self.dp = plan.tp, plan.pp, plan.vpp, plan.dp
        self.cp, self.ep, self.etp = plan.cp, plan.ep, plan.etp
        self.sp: bool = plan.sp
        #: sequences per micro-batch and tokens per sequence
        self.b, self.s = plan.micro_batch, plan.seq_length
        #: FP8 runs the linear GEMMs in FP8 only: the rest (and every byte) is bf16
        self.dtype: str = plan.dtype
        #: bytes per element of ``dtype``, and per gradient element (``grad_dtype_bytes``)
        self.dt, self.gdt = plan.dtype_bytes, plan.grad_dtype_bytes
        self.sw = plan.software
        #: transformer layers of each model chunk, ``split[stage][chunk]``
        self.split = plan.split
        #: the gradient group and its ranks (dp; dp × cp under CP; FSDP's shard group)
        self.grad_group, self.gdp = plan.grad_group, plan.grad_group_size
        #: one micro-batch's activations on one rank, bytes (``b·s·h`` × dtype bytes)
        self.act_bytes = self.b * self.s * plan.shape.hidden * self.dt
        #: expert gradients sync over their own group (edp) when the expert layout differs
        #: from the dense one (EP > 1 or expert TP ≠ TP); otherwise edp is the gradient group
        self.split_experts: bool = plan.shape.is_moe and (self.ep > 1 or self.etp != self.tp)
        #: layers per dense…MoE period (1: all layers alike)
        self.period: int = plan.shape.moe_layer_freq if plan.shape.is_moe else 1
        #: the resolved MoE options (None for a dense model)
        self.moe = plan.moe
        #: the tensor-parallel scheme: Megatron 1-D without context parallelism keeps the
        #: builder's own ops, every other plan takes its layers, embedding and head from it
        self.part = plan.partitioner
        self.structured: bool = self.part.structured
        self._ops: dict[tuple, Any] = {}

    def cached(self, key: tuple, make):
        """``make()``, built once per key: ops are immutable, so stages and chunks that need the
        same op share one object."""
        hit = self._ops.get(key)
        if hit is None:
            hit = self._ops[key] = make()
        return hit

    def grad_accumulate_bytes(self, params: float) -> float:
        """Memory traffic of adding one micro-batch's weight gradients of ``params``
        parameters into the accumulated gradients (:func:`.wgrad.accumulate_pass_bytes`);
        none where FSDP2 reduce-scatters every micro-batch's
        (:func:`.fsdp.reduces_every_microbatch`)."""
        if reduces_every_microbatch(self.plan):
            return 0.0
        return params * accumulate_pass_bytes(self.sw, self.dt, self.gdt)

    # ---------------------------------------------------- provided by the builder and mixins
    def layer_ops(self, backward: bool, repeat: int, n_moe: int | None = None,
                  first: int | None = None) -> list[Op]:
        """``repeat`` layers' ops (:meth:`.builder.StageBuilder.layer_ops`)."""
        raise NotImplementedError

    def stage_params(self, stage: int) -> float:
        """Parameters on one rank of ``stage`` (:meth:`.builder.StageBuilder.stage_params`)."""
        raise NotImplementedError

    def stage_expert_params(self, stage: int) -> float:
        """Routed-expert parameters on one rank of ``stage`` (:class:`.moe_update.MoEUpdateOps`)."""
        raise NotImplementedError

    def layer_rank_params(self, moe: bool) -> tuple[float, float]:
        """(non-expert, expert) parameters of one layer on one rank (:class:`.moe.MoEOps`)."""
        raise NotImplementedError

    def grad_sync_ops_flat(self, grad_bytes: float, op: str, group: str = "dp",
                           stage: int = 0) -> list[Op]:
        """Gradients reduced after the backward (:class:`.dpsync.GradSyncOps`)."""
        raise NotImplementedError

    def host_wait_ops(self, site: str, repeat: int = 1) -> list[Op]:
        """The stack's host waits at ``site`` (:class:`.host_sync.HostSyncOps`)."""
        raise NotImplementedError

    def step_sync_ops(self, ops: list, n_buckets: float, before_step: bool) -> None:
        """The update block's host waits (:class:`.host_sync.HostSyncOps`)."""
        raise NotImplementedError

    def stage_buckets(self, stage: int, skip_first: bool = False) -> int:
        """Gradient buckets of ``stage`` in one step (:class:`.host_sync.HostSyncOps`)."""
        raise NotImplementedError

    def ddp_pass_ops(self, grad_bytes: float, bucket_bytes: float | None = None) -> list[Op]:
        """The stack's DDP passes in the update block (:class:`.dpsync.GradSyncOps`)."""
        raise NotImplementedError

    def _recompute_core(self, g: dict, moe: bool) -> Compute:
        """Selective recomputation's op (:meth:`.builder.StageBuilder._recompute_core`)."""
        raise NotImplementedError

    def optimizer_op(self, n_params: float) -> Op:
        """The optimizer step (:meth:`.builder.StageBuilder.optimizer_op`)."""
        raise NotImplementedError

    def _expert_update_block(self, stage: int, overlapped: bool, step) -> Any:
        """An MoE stage's update block (:class:`.moe_update.MoEUpdateOps`)."""
        raise NotImplementedError

    def _overlapped_layers(self, sync_ops: list[Op], start: int, layers: int,
                           offset: int = 0, passes: bool = False) -> list[Op]:
        """Backward layers overlapping the gradient sync (:class:`.dpsync.GradSyncOps`)."""
        raise NotImplementedError

    def embedding_forward(self) -> list:
        """The embedding's forward (:class:`.edges.EdgeOps`)."""
        raise NotImplementedError

    def embedding_backward(self, with_head: bool | None = None) -> list:
        """The embedding's backward (:class:`.edges.EdgeOps`)."""
        raise NotImplementedError

    def head_forward(self) -> list:
        """The final norm, head and loss (:class:`.edges.EdgeOps`)."""
        raise NotImplementedError

    def head_backward(self) -> list:
        """The loss's, head's and final norm's backward (:class:`.edges.EdgeOps`)."""
        raise NotImplementedError
