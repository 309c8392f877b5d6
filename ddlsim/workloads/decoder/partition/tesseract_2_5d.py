"""2.5-D tensor parallelism: Tesseract, SUMMA on ``d`` layers of a ``q×q`` grid.

Wang, Xu, Bian, You 2021, "2.5-dimensional distributed model training" (SUMMA2.5-LM;
later "Tesseract: Parallelize the Tensor Parallelism Efficiently", arXiv:2105.14500, ICPP
2022), after Solomonik & Demmel's 2.5-D matrix multiplication (2011). ``p = q²·d`` ranks;
rank ``(i, j, k)`` is row ``i``, column ``j`` of layer ``k``. An activation ``A[M, K]`` is
split into ``d·q × q`` blocks (the batch over the ``d·q`` rows of all layers, the hidden
dimension over the columns), so each layer holds ``M/d`` rows of it; a weight ``B[K, N]`` is
split ``q × q`` and **replicated over the d layers**. Each layer runs the SUMMA of
:class:`~.summa_2d.Summa2D` on its rows (the same ``q`` broadcast steps, with ``A`` blocks of
``M/(dq) × K/q``), so the layers work side by side with no traffic between them in the
forward. In the backward each layer's ``dB = Aᵀ·dC`` covers only its ``M/d`` rows: the full
gradient is the sum over the layers, an **all-reduce of the ``K/q × N/q`` block along the
depth** (group ``tp_dep``, size ``d``).

Per GEMM and rank: forward ``q·(MK/(dq²) + KN/q²)·e`` bytes, backward twice that, plus the
depth all-reduce of ``KN/q²·e``. With ``d = 1`` it is :class:`~.summa_2d.Summa2D` exactly.
Weights are split ``q²`` ways (replicated over depth), activations ``q²·d`` ways.

Choice the paper leaves open: the depth all-reduce is issued once per GEMM, as soon as its
``dB`` reduction is done, on stream ``tp_dep`` (it could also be deferred to the gradient
synchronisation, like data parallelism); the layer's weight-gradient accumulation waits for
it at the end of the layer. The rest (overlap, LayerNorm and bias traffic, embedding and head) is as in 2-D.
"""

from __future__ import annotations

from typing import Any

from ...trace import Collective
from . import register_partitioner
from .oplist import OpList
from .summa_2d import Summa2D

__all__ = ["Tesseract25D"]


@register_partitioner("2.5d")
class Tesseract25D(Summa2D):
    """Tesseract on a ``q×q×d`` grid (``tensor_parallel: {mode: 2.5d, q: 4, d: 4}``)."""

    grid_keys = ("q", "d")

    @classmethod
    def grid_size(cls, spec: Any) -> int:
        return spec.q ** 2 * spec.d

    def _after_weight_grad(self, ops: OpList, name: str, b: float) -> None:
        if self.depth == 1:
            return
        last = len(ops.ops) - 1      # the last dB reduce (stream tp_col)
        ops.add(Collective(f"{name}.dB.depth_ar", "all_reduce", "tp_dep", b), "tp_dep", (last,))

    @property
    def grad_streams(self) -> tuple[str, ...]:
        return super().grad_streams + (("tp_dep",) if self.depth > 1 else ())
