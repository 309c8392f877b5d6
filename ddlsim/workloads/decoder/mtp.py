"""Multi-token prediction (MTP): DeepSeek-V3's extra prediction depths, as Megatron-Core runs
them (``model.mtp_num_layers``, Megatron's ``--mtp-num-layers``).

Per depth ``k`` (DeepSeek-V3 technical report, arXiv:2412.19437 §2.2; NVIDIA/Megatron-LM
d98e8a64 megatron/core/transformer/multi_token_prediction.py ``MultiTokenPredictionLayer``):
the shared input embedding looks up the tokens shifted by ``k``; ``enorm`` and ``hnorm`` (two
RMSNorms) normalise that embedding and the previous depth's hidden state; the two are
concatenated and projected ``2h → h`` by ``eh_proj`` (a column-parallel linear,
``gather_output=False``, then ``gather_from_tensor_model_parallel_region`` and, with sequence
parallelism, ``scatter_to_sequence_parallel_region``: ``_concat_embeddings`` lines
1331-1359); one transformer layer of the decoder's last layer's kind (an MoE layer in V3);
its final norm, the shared output head and the cross-entropy of the tokens shifted by
``k + 1``, scaled by ``mtp_loss_scaling_factor`` (a scalar).

Placement: the MTP stage builds its own copy of the input embedding when it is not the first
stage (gpt_model.py line 173: ``if self.pre_process or self.mtp_process``) and shares the output
head. ddlsim models MTP on the last pipeline stage, in its last chunk (:mod:`.pp_layout`
refuses a standalone MTP stage). The depth's transformer layer is one more layer of that
chunk (:func:`.split.chunk_layers`), so its ops, parameters, activations and place in
Megatron-Core's combined 1F1B are any other layer's (Megatron-Core's schedule plan builds an
MTP layer as a transformer layer's nodes, its head and loss as a post-process node:
megatron/core/models/common/model_chunk_schedule_plan.py lines 31-51 at d98e8a64); the rest of the depth (lookup, norms, projection, head, loss) runs
after the main head's forward and before its backward (:class:`MTPOps`), on the one compute
stream, where the order inside the chunk does not change its time.

Model FLOPs (the MFU numerator) as Megatron counts them (megatron/training/training.py
``num_floating_point_operations``, d98e8a64 lines 1042-1046 and 1288-1303): each depth one more
layer of the last layer's kind, ``3·2·(3h + 2h²)`` per token for the norms and the projection,
and one more logits GEMM.

Not modelled: the all-reduce of the MTP stage's embedding gradients with the first stage's
(finalize_model_grads.py line 146) and the eh_proj GEMM in FP8 (it runs in 16 bits here). A
structured tensor-parallel scheme, context parallelism, or MoE layers every n-th layer (the
depth's layer would not be of the last layer's kind) with MTP are refused
(:func:`.split.chunk_layers`).
"""

from __future__ import annotations

from ..trace import Collective, Compute, Op
from .layerkernels import logits_kernels
from .oplists import extend_ops
from .stage import StageBase
from .wgrad import main_grad_bytes

__all__ = ["MTPOps", "mtp_model_flops", "last_layer_is_moe", "with_mtp_memory"]


def last_layer_is_moe(shape) -> bool:
    """Whether an MTP layer is an MoE layer: Megatron-Core builds it as the decoder's last
    layer (training.py ``last_layer_is_moe``, d98e8a64 lines 1042-1045)."""
    return bool(shape.is_moe and shape.is_moe_layer(shape.layers - 1))


def mtp_model_flops(shape, batch: int, s: int, depths: int) -> float:
    """Training FLOPs of ``depths`` MTP depths for ``batch`` sequences of ``s`` tokens, as
    Megatron's ``num_floating_point_operations`` adds them: 3 × (one layer of the last
    layer's kind, the norms' ``3h`` and the projection's ``2h²`` FMAs per token, one logits
    GEMM) per depth."""
    if not depths:
        return 0.0
    h = shape.hidden
    per_seq = (shape.layer_forward_flops(1, s, moe=last_layer_is_moe(shape))
               + 2.0 * s * (3 * h + 2 * h * h) + shape.logits_forward_flops(1, s))
    return 3.0 * batch * depths * per_seq


class MTPOps(StageBase):
    """The MTP depths' ops other than their layers on the last stage, after its head (a mixin
    of ``StageBuilder``; ``self.mtp`` depths, 0 for none)."""

    mtp: int = 0

    def head_forward(self) -> list:
        """The main head's forward, then each MTP depth's (module docstring)."""
        head = super().head_forward()
        if not self.mtp:
            return head
        ops: list[Op] = []
        extend_ops(ops, head)
        for _ in range(self.mtp):
            extend_ops(ops, self._mtp_forward())
        return ops

    def head_backward(self) -> list:
        """Each MTP depth's backward (the last depth first), then the main head's."""
        head = super().head_backward()
        if not self.mtp:
            return head
        ops: list[Op] = []
        for _ in range(self.mtp):
            extend_ops(ops, self._mtp_backward())
        extend_ops(ops, head)
        return ops

    # ------------------------------------------------------------------ one depth
    def _local_tokens(self) -> float:
        return self.b * self.s / (self.tp if self.sp else 1)

    def _mtp_forward(self) -> list:
        h, t, n = self.shape.hidden, self.tp, self.b * self.s
        ops: list = [Compute("mtp.embedding", 0.0, 2 * self.act_bytes, kind="elementwise",
                             dtype=self.dtype)]
        if t > 1:   # the vocab-parallel lookup's all-reduce (as the input embedding's)
            ops.append(Collective("mtp.embedding.ar", "all_reduce", "tp", self.act_bytes))
        ops += [self.final_norm(False), self.final_norm(False),        # enorm, hnorm
                Compute("mtp.concat", 0.0, 2 * self._local_tokens() * 2 * h * self.dt,
                        kind="elementwise", dtype=self.dtype)]
        if t > 1 and self.sp:   # the column-parallel input gathered over the sequence
            ops.append(Collective("mtp.eh_proj.ag", "all_gather", "tp", 2 * self.act_bytes))
        ops.append(Compute("mtp.eh_proj", 2.0 * n * 2 * h * h / t, dtype=self.dtype,
                           kernels=logits_kernels(n, h / t, 2 * h, self.dtype, False)))
        if t > 1:   # gather_from_tensor_model_parallel_region: the output's hidden slices
            ops.append(Collective("mtp.eh_proj.gather", "all_gather", "tp", self.act_bytes))
        extend_ops(ops, [self.final_norm(False), *self._head_forward()])
        return ops

    def _mtp_backward(self) -> list:
        h, t, n = self.shape.hidden, self.tp, self.b * self.s
        ops: list = []
        extend_ops(ops, [*self._head_backward(), self.final_norm(True)])
        tail: list = []
        if t > 1 and self.sp:   # scatter_to_sequence_parallel_region's backward
            tail.append(Collective("mtp.bwd.scatter.ag", "all_gather", "tp", self.act_bytes))
        if t > 1 and self.sp:   # the input regathered for the weight gradient
            tail.append(Collective("mtp.bwd.eh_proj.ag.input", "all_gather", "tp",
                                   2 * self.act_bytes))
        main_grad = main_grad_bytes(self.sw, self.plan.train_dtype)
        tail.append(Compute("mtp.bwd.eh_proj", 2 * 2.0 * n * 2 * h * h / t, dtype=self.dtype,
                            kernels=logits_kernels(n, h / t, 2 * h, self.dtype, True,
                                                   main_grad)))
        if t > 1:   # the input gradient: reduce-scattered (SP) or all-reduced over TP
            tail.append(Collective("mtp.bwd.eh_proj.rs" if self.sp else "mtp.bwd.eh_proj.ar",
                                   "reduce_scatter" if self.sp else "all_reduce", "tp",
                                   2 * self.act_bytes))
        tail += [Compute("mtp.bwd.concat", 0.0, 2 * self._local_tokens() * 2 * h * self.dt,
                         kind="elementwise", dtype=self.dtype),
                 self.final_norm(True), self.final_norm(True),
                 *self.embedding_backward(with_head=False)]
        extend_ops(ops, tail)
        return ops

    # ------------------------------------------------------------------ parameters
    def mtp_params(self, stage: int) -> float:
        """Parameters the MTP depths add to one rank of ``stage`` besides their layers (which
        the split counts): per depth ``eh_proj``'s ``2h²/t`` and three norms' ``h`` (enorm,
        hnorm, the final norm), and, on a stage other than the first, the copy of the input
        embedding ``V·h/t``."""
        if not self.mtp or stage != self.pp - 1:
            return 0.0
        h = self.shape.hidden
        embedding = self.shape.vocab * h / self.tp if self.pp > 1 else 0.0
        return self.mtp * (2 * h * h / self.tp + 3 * h) + embedding


def with_mtp_memory(b, memories: list) -> list:
    """``memories`` (one :class:`~ddlsim.workloads.memory.MemoryBreakdown` per stage) with the
    MTP depths' logits and their temporaries beside the main head's on the last stage (as
    :func:`.memory.stage_activations` counts the head's; the depths' layers are counted with
    the chunk's layers)."""
    if not b.mtp:
        return memories
    from dataclasses import replace

    from ...simulator.kernels.step_passes import stack_cross_entropy
    from ..allocator import head_bytes, loss_bytes
    from ..framework_memory import framework
    plan, shape, sw = b.plan, b.shape, b.sw
    fm, bs = framework(sw.name), plan.micro_batch * plan.seq_length
    logits = loss_bytes(fm.logits_at(plan.tp, sw.compile, stack_cross_entropy(sw)),
                        plan.micro_batch, plan.seq_length, shape.vocab, plan.tp * plan.cp)
    head = bs * head_bytes(fm, shape.hidden, plan.tp, plan.sp) / plan.cp
    last = memories[-1]
    return [*memories[:-1], replace(last, other=last.other + b.mtp * (logits + head))]
