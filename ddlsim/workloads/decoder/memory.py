"""Memory per device of a decoder-only transformer's pipeline stage: model states by ZeRO stage
(:func:`~ddlsim.workloads.memory.model_state_bytes`), activations per layer after Korthikanti
et al. 2022 (:meth:`DecoderShape.layer_activation_bytes`), the loss's logits on the last stage,
the embedding output on the first."""

from __future__ import annotations

from ...config import DTYPE_BYTES, RunConfig
from ..memory import MemoryBreakdown, inflight_chunks, model_state_bytes
from ..models.decoder import DecoderShape

__all__ = ["stage_memory"]


def stage_memory(cfg: RunConfig, shape: DecoderShape, stage: int, params: float) -> MemoryBreakdown:
    """Memory of one rank of pipeline ``stage`` holding ``params`` parameters."""
    p, t = cfg.parallel, cfg.train
    weights, grads, opt = model_state_bytes(params, cfg.dp, p.zero_stage, t.dtype, t.optimizer)
    layers_per_chunk = shape.layers // (p.pp * p.vpp)
    per_layer = shape.layer_activation_bytes(t.micro_batch_size, t.seq_length, p.tp,
                                             p.sequence_parallel, t.recompute)
    chunks = inflight_chunks(cfg, stage)
    acts = per_layer * layers_per_chunk * chunks
    if t.recompute == "full":  # one layer's full activations are rebuilt during its backward
        acts += shape.layer_activation_bytes(t.micro_batch_size, t.seq_length, p.tp,
                                             p.sequence_parallel, "none")
    sbh = t.micro_batch_size * t.seq_length * shape.hidden
    other = 0.0
    if stage == p.pp - 1:  # logits (16-bit) and fp32 softmax of the vocab-parallel loss
        other += t.micro_batch_size * t.seq_length * shape.vocab / p.tp * (2 + 4)
    if stage == 0:  # embedding output kept for dropout
        other += sbh * chunks / p.vpp
    if p.zero_stage == 3:  # two gathered layers live at once (current + prefetched)
        other += 2 * shape.layer_params / p.tp * DTYPE_BYTES[t.dtype]
    return MemoryBreakdown(weights, grads, opt, acts, other, cfg.system.device.memory_bytes, stage)
