"""The embedding's and the output head's ops on a layer partitioner's grid: the lookup and the
collectives after it, the logits GEMM, the vocab-parallel cross-entropy and its collectives,
their backward, and the pipeline boundary's send. A scheme overrides the collectives
(:meth:`EmbeddingHeadOps.embedding_comm`, :meth:`~EmbeddingHeadOps.loss_comm`) or the ops
themselves (Megatron's 1-D scheme)."""

from __future__ import annotations

from typing import Any

from ....simulator.kernels.step_passes import stack_cross_entropy
from ..layerkernels import loss_op
from ...trace import Compute, Op, Wait
from .oplist import OpList

__all__ = ["EmbeddingHeadOps"]


class EmbeddingHeadOps:
    """The embedding and head ops of :class:`.base.LayerPartitioner`, which sets what they
    read (declared below) and runs their GEMMs (its ``gemm_forward`` and ``gemm_backward``)."""

    #: the model's closed-form counts (``plan.shape``)
    shape: Any
    #: the software stack
    sw: Any
    #: ranks of the grid, and of the cp axis
    size: int
    cp: int
    #: the activations' dtype and bytes per element
    dtype: str
    dt: float
    #: ``M``: tokens of one micro-batch on one cp rank
    tokens: float
    #: streams of weight-gradient reductions, joined before the gradients are accumulated
    grad_streams: tuple[str, ...]

    #: ways the embedding output is split (memory of the first stage)
    @property
    def embedding_split(self) -> int:
        return self.size * self.cp

    def embedding_comm(self, act_bytes: float) -> list:
        """Collectives after the lookup (scheme-specific)."""
        return []

    def loss_comm(self) -> list:
        """Collectives of the vocab-parallel cross-entropy (scheme-specific)."""
        return []

    def embedding_ops(self, act_bytes: float) -> list[Op]:
        """The lookup: read + write the rank's block of the ``b·s·h`` output, then the
        scheme's collectives (``act_bytes``: the whole micro-batch's ``b·s·h`` bytes)."""
        ops = OpList()
        ops.add(Compute("embedding", 0.0, 2 * act_bytes / self.embedding_split,
                        kind="elementwise", dtype=self.dtype))
        for c in self.embedding_comm(act_bytes):
            ops.add(c)
        return ops.ops

    def head_forward_ops(self) -> list[Op]:
        """Logits as one more GEMM (``N = V``), the fp32 loss over the rank's logits, and
        the cross-entropy's reductions."""
        ops, sh = OpList(), self.shape
        self.gemm_forward(ops, "logits", self.tokens, sh.vocab, sh.hidden, False)
        ops.add(loss_op(self.tokens, sh.vocab / self.size, self.dt, self.dtype,
                        stack_cross_entropy(self.sw), False))
        for c in self.loss_comm():
            ops.add(c)
        return ops.ops

    def head_backward_ops(self, grad_accumulate_bytes: float) -> list[Op]:
        """The cross-entropy's backward, the logits GEMM's backward and the embedding
        gradient's accumulation."""
        ops, sh = OpList(), self.shape
        ops.add(loss_op(self.tokens, sh.vocab / self.size, self.dt, self.dtype,
                        stack_cross_entropy(self.sw), True))
        self.gemm_backward(ops, "bwd.logits", self.tokens, sh.vocab, sh.hidden, False)
        for stream in self.grad_streams:
            ops.add(Wait(f"bwd.logits.wait.{stream}", stream))
        ops.add(Compute("bwd.grad_accumulate.embedding", 0.0, grad_accumulate_bytes,
                        kind="elementwise", dtype=self.dtype))
        return ops.ops

    def boundary(self, act_bytes: float) -> tuple[float, float | None]:
        """Pipeline send size per rank, and the all-gather after the receive (1-D's
        scatter-gather) or None: the 2-D family sends its own block, ``b·s·h / (p·cp)``."""
        return act_bytes / (self.size * self.cp), None
