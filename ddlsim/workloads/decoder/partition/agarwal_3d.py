"""3-D tensor parallelism on a ``q×q×q`` cube (Agarwal et al. 1995; Bian et al. 2021).

Agarwal, Balle, Gustavson, Joshi, Palkar 1995, "A three-dimensional approach to parallel
matrix multiplication" (IBM J. Res. Dev. 39(5)), as used for transformers by Bian, Xu, Wang,
You 2021, "Maximizing Parallelism in Distributed Training for Huge Neural Networks"
(arXiv:2105.14450). ``p = q³`` ranks ``(x, y, z)``; the three cube axes are the group
families ``tp_x`` (the innermost, node-local axis), ``tp_y`` and ``tp_z``. An activation
``A[M, K]`` is split ``q²`` ways over its rows and ``q`` ways over its columns (``M/q² ×
K/q`` per rank), a weight ``B[K, N]`` into ``K/q² × N/q``. ``C = A·B`` is:

* all-gather ``A`` along ``tp_x`` → ``M/q × K/q`` (gathered size ``MK/q²`` elements),
* all-gather ``B`` along ``tp_y`` → ``K/q × N/q`` (``KN/q²``),
* multiply: ``2·MNK/q³`` FLOPs, a partial sum over the ``q`` slices of ``K``,
* reduce-scatter the ``M/q × N/q`` partial ``C`` along ``tp_z`` → ``M/q² × N/q``.

Backward: ``dA = dC·Bᵀ``: all-gather ``dC`` along ``tp_z`` (``MN/q²``) and ``B`` along
``tp_y`` again, multiply, reduce-scatter ``dA`` along ``tp_x`` (``MK/q²``); ``dB = Aᵀ·dC``:
all-gather ``A`` along ``tp_x`` again, multiply, reduce-scatter ``dB`` along ``tp_y``
(``KN/q²``). Per GEMM and rank: forward ``(MK + KN + MN)/q²·e`` bytes, backward
``(2MK + 2KN + MN)/q²·e``. Weights and every activation are split ``q³`` ways.

Choices the papers leave open, and ours:

* **Re-gather in the backward** rather than keep the gathered ``A`` and ``B`` from the
  forward: memory stays ``1/q³`` (the point of the scheme, Bian et al. §3), at ``(MK + KN)/q²``
  more bytes per GEMM.
* **Overlap** as in Colossal-AI's ``linear_3d``: the gathers and the forward reduce-scatter
  sit on the compute stream (each feeds or ends a multiply); in the backward the
  reduce-scatter of ``dA`` (stream ``tp_x``) overlaps the ``dB`` GEMM, that of ``dB``
  (stream ``tp_y``) the rest of the backward until the gradients are accumulated.
* The three axes are used the same way in every GEMM (the papers rotate them between
  consecutive layers so that each output is laid out as the next input needs; on a cube the
  volumes are the same).
* **Not modelled**: LayerNorm statistics and bias traffic (``O(M/q²)`` bytes). Embedding:
  an all-reduce of the rank's ``M/q² × h/q`` block along ``tp_y``; the loss all-reduces
  ``4·b·s/q²`` bytes along ``tp_x``.
"""

from __future__ import annotations

from typing import Any

from ...trace import Collective, Wait
from . import register_partitioner
from .base import LayerPartitioner
from .grid import grid_families
from .oplist import OpList

__all__ = ["Agarwal3D"]


@register_partitioner("3d")
class Agarwal3D(LayerPartitioner):
    """3-D tensor parallelism on a ``q×q×q`` cube (``tensor_parallel: {mode: 3d, q: 4}``)."""

    grid_keys = ("q",)

    @property
    def grad_streams(self) -> tuple[str, ...]:
        return ("tp_y",) if self.q > 1 else ()

    def __init__(self, plan: Any):
        super().__init__(plan)
        self.q = self.spec.q
        self.param_split = self.q ** 3

    @classmethod
    def grid_size(cls, spec: Any) -> int:
        return spec.q ** 3

    @property
    def rows(self) -> int:
        """Ways the batch is split: ``q²``."""
        return self.q * self.q

    def families(self, mesh: Any) -> dict:
        return grid_families(mesh, (self.q, self.q, self.q), ("tp_z", "tp_y", "tp_x"))

    @classmethod
    def check(cls, spec: Any, shape: Any, micro_batch: int) -> None:
        sh, q, what = shape, spec.q, "tensor_parallel.mode = '3d'"
        rows = q * q
        for field, n, k in (("num_attention_heads", sh.heads, q),
                            ("num_key_value_heads", sh.g, q),
                            ("hidden_size", sh.hidden, q * q),
                            ("intermediate_size", sh.ffn, q * q)):
            if n % k:
                raise ValueError(f"model.{field} = {n} is not divisible by {k}: {what} with "
                                 f"q = {q} splits it {k} ways (heads over one cube axis, weight "
                                 "rows over two); choose a q for which it divides")
        if micro_batch % rows:
            raise ValueError(f"train.micro_batch_size = {micro_batch} is not divisible by q² = "
                             f"{rows}: {what} splits the batch over two axes of its cube "
                             "(whole sequences per rank, so attention stays local); use a "
                             f"multiple of {rows}")

    def _sizes(self, M: float, N: float, K: float) -> tuple[float, float, float, float]:
        """Bytes of gathered ``A`` (``MK/q²``), ``B`` (``KN/q²``), the partial ``C``
        (``MN/q²``), and the multiply's FLOPs ``2MNK/q³``."""
        q2, e = self.q * self.q, self.dt
        return M * K / q2 * e, K * N / q2 * e, M * N / q2 * e, 2 * M * N * K / self.q ** 3

    def gemm_forward(self, ops: OpList, name: str, M: float, N: float, K: float,
                     row_parallel: bool) -> None:
        a, b, c, flops = self._sizes(M, N, K)
        if self.q == 1:   # one rank: the plain GEMM
            ops.add(self.gemm_op(name, M, N, K))
            return
        ops.add(Collective(f"{name}.ag_A", "all_gather", "tp_x", a))
        ops.add(Collective(f"{name}.ag_B", "all_gather", "tp_y", b))
        q = self.q
        ops.add(self.gemm_op(name, M / q, N / q, K / q))
        ops.add(Collective(f"{name}.rs_C", "reduce_scatter", "tp_z", c))

    def gemm_backward(self, ops: OpList, name: str, M: float, N: float, K: float,
                      row_parallel: bool) -> None:
        a, b, c, flops = self._sizes(M, N, K)
        if self.q == 1:
            ops.add(self.gemm_op(f"{name}.dA", M, K, N))
            ops.add(self.weight_grad_op(f"{name}.dB", K, N, M))
            return
        ops.add(Collective(f"{name}.ag_dC", "all_gather", "tp_z", c))
        ops.add(Collective(f"{name}.ag_B", "all_gather", "tp_y", b))
        q = self.q
        da = ops.add(self.gemm_op(f"{name}.dA", M / q, K / q, N / q))
        ops.add(Collective(f"{name}.rs_dA", "reduce_scatter", "tp_x", a), "tp_x", (da,))
        ops.add(Collective(f"{name}.ag_A", "all_gather", "tp_x", a))
        db = ops.add(self.gemm_op(f"{name}.dB", K / q, N / q, M / q))
        ops.add(Collective(f"{name}.rs_dB", "reduce_scatter", "tp_y", b), "tp_y", (db,))
        ops.add(Wait(f"{name}.wait_dA", "tp_x"))

    def embedding_comm(self, act_bytes: float) -> list[Collective]:
        if self.q == 1:
            return []
        return [Collective("embedding.ar", "all_reduce", "tp_y",
                           act_bytes / (self.size * self.cp))]

    def loss_comm(self) -> list[Collective]:
        if self.q == 1:
            return []
        return [Collective("loss.ar", "all_reduce", "tp_x",
                           4.0 * self.b * self.s / (self.rows * self.cp))]
