"""Memory per device: model states (split by ZeRO stage) and activations.

Model states with mixed-precision Adam (Rajbhandari et al. 2020, "ZeRO", §3.1 and Table 1):
16-bit weights 2Ψ, 16-bit gradients 2Ψ, fp32 master weights, momentum and variance 12Ψ
(K = 12). ZeRO-1 divides the optimizer states by N_d, ZeRO-2 also the gradients, ZeRO-3 also
the weights. In fp32 training the weights and gradients take 4Ψ each and Adam 8Ψ.

Activations: :meth:`GPTShape.layer_activation_bytes` per layer and micro-batch, times the
layers a stage holds, times the micro-batches in flight on that stage: ``m`` for GPipe,
``min(p − s, m)`` for 1F1B, and for the interleaved schedule the forward chunks issued before
the first backward (Korthikanti et al. 2022, §4.2.3: the first stage holds ``p`` micro-batches,
interleaving adds a factor ``1 + (p − 1)/(p·v)``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..config import DTYPE_BYTES, RunConfig
from .models.gpt import GPTShape
from .schedules import peak_inflight

__all__ = ["MemoryBreakdown", "model_state_bytes", "stage_memory", "inflight_chunks"]


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes on one device, by part."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    other: float
    capacity: float
    stage: int = 0

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.other

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def to_dict(self) -> dict[str, float]:
        d = asdict(self)
        d["total"] = self.total
        return d


def model_state_bytes(params: float, dp: int, zero_stage: int, dtype: str,
                      optimizer: str = "adam") -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) in bytes for ``params`` parameters on one rank."""
    w = DTYPE_BYTES[dtype]
    mixed = w < 4
    if optimizer == "adam":
        k = 12 if mixed else 8      # fp32 master + m + v, or m + v
    else:
        k = 8 if mixed else 4       # fp32 master + momentum, or momentum
    weights, grads, opt = w * params, w * params, k * params
    if zero_stage >= 1:
        opt /= dp
    if zero_stage >= 2:
        grads /= dp
    if zero_stage >= 3:
        weights /= dp
    return weights, grads, opt


def inflight_chunks(cfg: RunConfig, stage: int) -> int:
    """Largest number of (micro-batch, chunk) forwards held at once by ``stage``."""
    p = cfg.parallel
    return peak_inflight(p.schedule, stage, p.pp, cfg.num_microbatches, p.vpp)


def stage_memory(cfg: RunConfig, shape: GPTShape, stage: int, params: float) -> MemoryBreakdown:
    """Memory of one rank of pipeline ``stage`` holding ``params`` parameters."""
    p, t = cfg.parallel, cfg.train
    weights, grads, opt = model_state_bytes(params, cfg.dp, p.zero_stage, t.dtype, t.optimizer)
    layers_per_chunk = shape.L // (p.pp * p.vpp)
    per_layer = shape.layer_activation_bytes(t.micro_batch_size, t.seq_length, p.tp,
                                             p.sequence_parallel, t.recompute)
    chunks = inflight_chunks(cfg, stage)
    acts = per_layer * layers_per_chunk * chunks
    if t.recompute == "full":  # one layer's full activations are rebuilt during its backward
        acts += shape.layer_activation_bytes(t.micro_batch_size, t.seq_length, p.tp,
                                             p.sequence_parallel, "none")
    sbh = t.micro_batch_size * t.seq_length * shape.h
    other = 0.0
    if stage == p.pp - 1:  # logits (16-bit) and fp32 softmax of the vocab-parallel loss
        other += t.micro_batch_size * t.seq_length * shape.V / p.tp * (2 + 4)
    if stage == 0:  # embedding output kept for dropout
        other += sbh * chunks / p.vpp
    if p.zero_stage == 3:  # two gathered layers live at once (current + prefetched)
        other += 2 * shape.layer_params / p.tp * DTYPE_BYTES[t.dtype]
    return MemoryBreakdown(weights, grads, opt, acts, other, cfg.system.device.memory_bytes, stage)
