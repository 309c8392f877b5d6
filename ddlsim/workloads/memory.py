"""Memory per device: the breakdown every workload family returns, and the model states
(split by ZeRO stage) and pipeline in-flight counts that families share.

Model states with mixed-precision Adam (Rajbhandari et al. 2020, "ZeRO", §3.1 and Table 1):
16-bit weights 2Ψ, 16-bit gradients 2Ψ, fp32 master weights, momentum and variance 12Ψ
(K = 12). ZeRO-1 divides the optimizer states by N_d, ZeRO-2 also the gradients, ZeRO-3 also
the weights. In fp32 training the weights and gradients take 4Ψ each and Adam 8Ψ.

Activations (decoder family, :mod:`ddlsim.workloads.decoder.memory`):
:meth:`DecoderShape.layer_activation_bytes` per layer and micro-batch, times the
layers a stage holds, times the micro-batches in flight on that stage: ``m`` for GPipe,
``min(p − s, m)`` for 1F1B, and for the interleaved schedule the forward chunks issued before
the first backward (Korthikanti et al. 2022, §4.2.3: the first stage holds ``p`` micro-batches,
interleaving adds a factor ``1 + (p − 1)/(p·v)``).
"""

from __future__ import annotations

import numpy as np

from dataclasses import asdict, dataclass

from ..config import DTYPE_BYTES, RunConfig
from .schedules import peak_inflight

__all__ = ["MemoryBreakdown", "PARTS", "model_state_bytes", "sharded", "inflight_chunks"]


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes on one device, by part (:data:`PARTS`).

    ``weights`` … ``other`` (temporaries such as the loss's logits) and ``buffers``
    (communication buffers: ZeRO-3/FSDP's gathered units and gradient buffers, ZeRO-1/2
    buckets) live in PyTorch's caching allocator and add up to :attr:`reserved`, what
    ``torch.cuda.max_memory_reserved()`` reports; ``context`` (the CUDA context and its
    kernels, :mod:`ddlsim.workloads.allocator`) is held outside it. :attr:`total`, the figure
    compared with ``capacity``, counts both."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    other: float
    capacity: float
    stage: int = 0
    buffers: float = 0.0
    context: float = 0.0

    @property
    def reserved(self) -> float:
        """Bytes in the caching allocator's segments (``max_memory_reserved``)."""
        return (self.weights + self.gradients + self.optimizer + self.activations + self.other
                + self.buffers)

    @property
    def total(self) -> float:
        return self.reserved + self.context

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def to_dict(self) -> dict[str, float]:
        d = asdict(self)
        d["reserved"] = self.reserved
        d["total"] = self.total
        return d


#: the parts of a :class:`MemoryBreakdown`, in the order reports list them
PARTS = ("weights", "gradients", "optimizer", "activations", "other", "buffers", "context")


def model_state_bytes(params: float, dp: int, zero_stage: int, dtype: str,
                      optimizer: str = "adam", grad_bytes: float | None = None,
                      fp32_params=False) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) in bytes for ``params`` parameters on one rank;
    ``grad_bytes`` per gradient element (default: the parameter dtype's). ``params``, ``dp``
    and ``zero_stage`` may be arrays over plans.

    ``fp32_params`` (mixed precision only; an array over plans allowed): the parameters
    themselves are kept in fp32 and are the optimizer's master copy, cast to ``dtype`` only
    when gathered, as PyTorch FSDP2 keeps its sharded parameters (``MixedPrecisionPolicy``:
    ``param_dtype`` is the dtype of the unsharded parameters, the sharded ones keep their
    original fp32): the weights take 4 B and the optimizer only its moments.
    """
    w = DTYPE_BYTES[dtype]
    mixed = w < 4
    if optimizer == "adam":
        k = 12 if mixed else 8      # fp32 master + m + v, or m + v
    else:
        k = 8 if mixed else 4       # fp32 master + momentum, or momentum
    g = w if grad_bytes is None else grad_bytes
    fp32 = np.where(fp32_params, 1.0, 0.0) if mixed else 0.0
    weights = (w + fp32 * (4 - w)) * params     # fp32 parameters take 4 B ...
    grads, opt = g * params, (k - 4 * fp32) * params    # ... and are the master copy
    out = (sharded(weights, zero_stage >= 3, dp), sharded(grads, zero_stage >= 2, dp),
           sharded(opt, zero_stage >= 1, dp))
    return tuple(_plain(x) for x in out)


def _plain(x):
    """A 0-d array as a float (one plan); arrays and floats as they are."""
    if isinstance(x, np.generic) or (isinstance(x, np.ndarray) and x.ndim == 0):
        return float(x)
    return x


def sharded(x, on, dp):
    """``x / dp`` where ``on``: a plain branch for one plan, element-wise for arrays of plans
    (the search tier calls the same rules with arrays)."""
    if isinstance(on, (bool, np.bool_)):
        return x / dp if on else x
    return np.where(on, x / dp, x)


def inflight_chunks(cfg: RunConfig, stage: int) -> int:
    """Largest number of (micro-batch, chunk) forwards held at once by ``stage``."""
    from .decoder.combined import active   # Megatron-Core's combined 1F1B: one more
    p = cfg.parallel
    return peak_inflight(p.schedule, stage, p.pp, cfg.num_microbatches, p.vpp, active(cfg),
                         cfg.microbatch_group)
