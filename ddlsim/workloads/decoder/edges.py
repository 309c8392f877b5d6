"""The embedding and the output head of a decoder's pipeline stage: a mixin of
:class:`~ddlsim.workloads.decoder.builder.StageBuilder`; the attributes it reads (``shape``,
``tp``, ``b``, ``s``, ``dt``, ``dtype``, ``sw``, ``part``, ``structured``, ``act_bytes``) are
declared in :class:`.stage.StageBase`.
Megatron 1-D without context parallelism builds them here; every other plan takes them from
its partitioner."""

from __future__ import annotations

from ...simulator.kernels.step_passes import stack_cross_entropy
from ..trace import Collective, Compute, Op
from .batch_input import batch_input_ops, carries_mask
from .layerkernels import final_norm_op, logits_kernels, loss_op
from .embedding_grad import embedding_backward_op
from .fsdp import reduces_every_microbatch
from .oplists import extend_ops
from .stage import StageBase
from .wgrad import main_grad_bytes

__all__ = ["EdgeOps"]


class EdgeOps(StageBase):
    """Embedding lookup, logits GEMM, loss, and their backward (the lookup's:
    :mod:`.embedding_grad`)."""

    def embedding_forward(self, with_head: bool | None = None) -> list:
        """The first stage's loading of the micro-batch (:meth:`batch_ops`; ``with_head``:
        whether the rank holds the output layer too, default PP = 1), then the lookup."""
        ops = self.batch_ops("one" if (self.pp == 1 if with_head is None else with_head)
                             else "first")
        if self.structured:
            extend_ops(ops, self.part.embedding_ops(self.act_bytes))
            return ops
        ops.append(Compute("embedding", 0.0, 2 * self.act_bytes, kind="elementwise",
                           dtype=self.dtype))
        if self.tp > 1:  # vocab-parallel embedding: all-reduce of the looked-up rows
            ops.append(Collective("embedding.ar", "all_reduce", "tp", self.act_bytes))
        return ops

    def batch_ops(self, role: str) -> list:
        """One micro-batch's input copied to the device and broadcast over TP on a stage of
        ``role`` (``one``, ``first``, ``last``: :func:`.batch_input.batch_input_ops`), where
        the stack's batch carries the dataset's attention mask; else none. As ops when the
        plan's partitioner gives ops (its deps then follow them)."""
        if not carries_mask(self.sw):
            return []
        items = batch_input_ops(role, self.b, self.s, self.tp,
                                getattr(self.plan.device, "host_link", None), self.dtype)
        return [Op(x) for x in items] if self.structured else items

    def embedding_backward(self, with_head: bool | None = None) -> list:
        """The input embedding's backward and the accumulation of its weight gradient
        (:func:`.embedding_grad.embedding_backward_op`) on the rank's tokens (the lookup's
        rows: ``b·s``, split as the partitioner splits the lookup's output); ``with_head``:
        whether the rank holds the output layer too (default: PP = 1), which a tied weight
        shares."""
        with_head = self.pp == 1 if with_head is None else with_head
        split = self.part.embedding_split if self.structured else 1
        return [embedding_backward_op(
            self.b * self.s / split, self.shape.vocab / self.part.param_split,
            self.shape.hidden, self.dt, self.gdt, self.dtype, self.sw,
            self.tp if self.plan.tp_mode == "1d" else 1,
            bool(with_head and self.shape.tied_embeddings),
            not reduces_every_microbatch(self.plan))]

    def final_norm(self, backward: bool) -> Compute:
        """The final norm before the output head on the rank's tokens: ``s/cp`` positions,
        split as the partitioner splits a layer's element-wise ops (:func:`.final_norm_op`)."""
        t, sp = self.part.ew_split()
        return final_norm_op(self.shape, self.sw, self.b, self.s // self.part.cp, t, sp,
                             self.dt, self.dtype, backward)

    def head_forward(self) -> list:
        """The final norm, then the output head and the loss (:meth:`_head_forward`): payloads,
        or a partitioner's ops (their deps shifted past the norm's)."""
        head = self._head_forward()
        if not self.structured:
            return [self.final_norm(False), *head]
        ops = [Op(self.final_norm(False))]
        extend_ops(ops, head)
        return ops

    def head_backward(self) -> list:
        """The loss's and the output head's backward, then the final norm's."""
        return [*self._head_backward(), self.final_norm(True)]

    def _head_forward(self) -> list:
        if self.structured:
            return self.part.head_forward_ops()
        V, t, n = self.shape.vocab, self.tp, self.b * self.s
        ops: list[Compute | Collective] = [
            *self.part.head_gather(self.act_bytes),   # after an MLA layer (.partition.mla_1d)
            Compute("logits", self.shape.logits_forward_flops(self.b, self.s) / t,
                    dtype=self.dtype, kernels=logits_kernels(n, V / t, self.shape.hidden,
                                                             self.dtype, False)),
            loss_op(n, V / t, self.dt, self.dtype, stack_cross_entropy(self.sw), False)]
        if t > 1:  # vocab-parallel cross-entropy: max, sum-exp and target logit across TP
            ops.append(Collective("loss.ar", "all_reduce", "tp", 4.0 * self.b * self.s))
        return ops

    def _head_backward(self) -> list:
        emb = self.shape.vocab * self.shape.hidden / self.part.param_split
        if self.structured:
            return self.part.head_backward_ops(self.grad_accumulate_bytes(emb))
        bwd = logits_kernels(self.b * self.s, self.shape.vocab / self.tp, self.shape.hidden,
                             self.dtype, True, main_grad_bytes(self.sw, self.plan.train_dtype))
        return [loss_op(self.b * self.s, self.shape.vocab / self.tp, self.dt, self.dtype,
                        stack_cross_entropy(self.sw), True),
                Compute("bwd.logits", 2 * self.shape.logits_forward_flops(self.b, self.s) / self.tp,
                        dtype=self.dtype, kernels=bwd),
                Compute("bwd.grad_accumulate.embedding", 0.0, self.grad_accumulate_bytes(emb),
                        kind="elementwise", dtype=self.dtype)]

