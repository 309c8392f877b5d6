"""2-D tensor parallelism: Optimus, SUMMA on a ``q×q`` grid (Xu et al. 2021).

Xu, You et al. 2021, "An Efficient 2D Method for Training Super-Large Deep Learning Models"
(Optimus, arXiv:2104.05343), built on SUMMA (van de Geijn & Watts 1997). Rank ``(i, j)`` of
the grid holds block ``(i, j)`` of every activation ``A[M, K]`` (``M/q × K/q``: the batch
split over rows ``i``, the hidden or head dimension over columns ``j``) and of every weight
``B[K, N]`` (``K/q × N/q``). ``C = A·B`` takes ``q`` steps; at step ``l``:

* broadcast ``A[i, l]`` along row ``i`` (group ``tp_row``, ``M·K/q²`` elements),
* broadcast ``B[l, j]`` along column ``j`` (group ``tp_col``, ``K·N/q²``),
* ``C[i, j] += A[i, l]·B[l, j]`` (``2·M·N·K/q³`` FLOPs).

The backward is the paper's two transposed SUMMAs, ``q`` steps each:

* ``dA = dC·Bᵀ``: broadcast ``B[l, j]`` along columns, multiply, **reduce** the
  ``M/q × K/q`` partial ``dA[i, l]`` along row ``i`` to its owner ``(i, l)``;
* ``dB = Aᵀ·dC``: broadcast ``A[i, l]`` along rows, multiply, reduce the ``K/q × N/q``
  partial ``dB[l, j]`` along column ``j`` to ``(l, j)``.

Per GEMM and rank (nccl-tests sizes, ``e`` bytes per element): forward ``q·(MK + KN)/q²·e``,
backward twice that, ``3·(MK + KN)/q·e`` in all. The attention core is local (heads are split
over columns, whole sequences over rows); weights and every activation are split ``q²`` ways.

Choices the paper leaves open, and ours:

* **Overlap**: panels are double-buffered as in Colossal-AI's Optimus kernels
  (``Matmul_AB_2D``): step ``l + 1``'s broadcasts (streams ``tp_row``/``tp_col``) run during
  step ``l``'s multiply, and step ``l + 2``'s wait for step ``l``'s (two buffers); a backward
  reduce runs during the next step's multiply. The first two steps' broadcasts wait for the
  op that produced ``A``.
* **Not modelled** (``O(M/q)`` or ``O(N/q)`` bytes against ``O(MK/q²)``): LayerNorm's
  row-wise all-reduce of its statistics and the bias broadcasts and reductions.
* **Embedding and head**: the logits are one more SUMMA GEMM (``N = V``); the lookup
  all-reduces the ``M/q × h/q`` block over ``tp_col`` (the vocabulary is split over rows of
  the table) and the vocab-parallel cross-entropy all-reduces ``4·b·s/q`` bytes along rows.
"""

from __future__ import annotations

from typing import Any

from ...trace import Collective, Wait
from . import register_partitioner
from .base import LayerPartitioner
from .grid import grid_families
from .oplist import OpList

__all__ = ["Summa2D"]


@register_partitioner("2d")
class Summa2D(LayerPartitioner):
    """Optimus/SUMMA on a ``q×q`` grid (``tensor_parallel: {mode: 2d, q: 8}``)."""

    grid_keys = ("q",)
    #: layers of the grid (Tesseract's ``d``; 1 here)
    depth = 1

    def __init__(self, plan: Any):
        super().__init__(plan)
        self.q = self.spec.q
        self.depth = self._depth(self.spec)
        self.param_split = self.q * self.q

    @staticmethod
    def _depth(spec: Any) -> int:
        """Layers of the grid: Tesseract's ``d``, 1 for SUMMA."""
        return getattr(spec, "d", None) or 1

    @classmethod
    def grid_size(cls, spec: Any) -> int:
        return spec.q ** 2

    @property
    def rows(self) -> int:
        """Ways the batch is split: ``d·q`` (rows of all layers)."""
        return self.depth * self.q

    def families(self, mesh: Any) -> dict:
        """``tp_row`` (vary the column ``j``: the innermost, node-local axis), ``tp_col``
        (vary the row ``i``) and, with ``d > 1``, ``tp_dep`` (vary the layer ``k``)."""
        fam = grid_families(mesh, (self.depth, self.q, self.q), ("tp_dep", "tp_col", "tp_row"))
        return fam

    @classmethod
    def check(cls, spec: Any, shape: Any, micro_batch: int) -> None:
        sh, q, what = shape, spec.q, f"tensor_parallel.mode = {cls.mode!r}"
        rows = cls._depth(spec) * q
        for field, n in (("num_attention_heads", sh.heads), ("num_key_value_heads", sh.g),
                         ("hidden_size", sh.hidden), ("intermediate_size", sh.ffn)):
            if n % q:
                raise ValueError(f"model.{field} = {n} is not divisible by q = {q}: {what} "
                                 f"splits it over the {q} columns of its grid (whole heads per "
                                 "column); choose a q that divides it")
        if micro_batch % rows:
            raise ValueError(f"train.micro_batch_size = {micro_batch} is not divisible by the "
                             f"{rows} rows of the {what} grid: the batch is split over "
                             "them (whole sequences per rank, so that attention stays local, "
                             f"as in Optimus and Tesseract); use a multiple of {rows}")

    # ------------------------------------------------------------------ SUMMA
    def _steps(self, ops: OpList, name: str, bcasts: list[tuple[str, str, float]],
               gemm: tuple[float, float, float], reduce: tuple[str, float] | None,
               weight_grad: bool = False) -> None:
        """``q`` double-buffered SUMMA steps: ``bcasts`` = [(label, group, bytes)] per step,
        an optional ``reduce`` = (group, bytes) of each step's partial product;
        ``weight_grad``: the steps compute a weight gradient, which on a 1×1 grid without
        depth is the rank's whole gradient and accumulates as the stack's fused weight
        gradients do (:meth:`~.base.LayerPartitioner.weight_grad_op`)."""
        make = self.gemm_op
        if self.q == 1:   # a 1×1 grid: nothing to broadcast or reduce
            bcasts, reduce = [], None
            if weight_grad and self.depth == 1:
                make = self.weight_grad_op
        anchor = ops.last_compute()
        gemms: list[int] = []
        reds: list[int] = []
        for k in range(self.q):
            pre = (gemms[k - 2],) if k >= 2 else (() if anchor is None else (anchor,))
            got = tuple(ops.add(Collective(f"{name}.bcast_{lab}", "broadcast", grp, nb, root=k),
                                grp, pre) for lab, grp, nb in bcasts)
            free = (reds[k - 2],) if reduce and k >= 2 else ()
            gemms.append(ops.add(make(f"{name}.step", *gemm), deps=got + free))
            if reduce:
                grp, nb = reduce
                reds.append(ops.add(Collective(f"{name}.reduce", "reduce", grp, nb, root=k),
                                    grp, (gemms[-1],)))

    def _blocks(self, M: float, N: float, K: float) -> tuple[float, float, float]:
        """Bytes of one A block ``M/(dq) × K/q``, one B block ``K/q × N/q``, and the FLOPs
        of one step ``2·(M/dq)·(N/q)·(K/q)``."""
        q, r = self.q, self.rows
        return M / r * K / q * self.dt, K / q * N / q * self.dt, 2 * (M / r) * (N / q) * (K / q)

    def gemm_forward(self, ops: OpList, name: str, M: float, N: float, K: float,
                     row_parallel: bool) -> None:
        a, b, _ = self._blocks(M, N, K)
        m, n, k = M / self.rows, N / self.q, K / self.q
        self._steps(ops, name, [("A", "tp_row", a), ("B", "tp_col", b)], (m, n, k), None)

    def gemm_backward(self, ops: OpList, name: str, M: float, N: float, K: float,
                      row_parallel: bool) -> None:
        a, b, _ = self._blocks(M, N, K)
        m, n, k = M / self.rows, N / self.q, K / self.q
        self._steps(ops, f"{name}.dA", [("B", "tp_col", b)], (m, k, n), ("tp_row", a))
        self._steps(ops, f"{name}.dB", [("A", "tp_row", a)], (k, n, m), ("tp_col", b),
                    weight_grad=True)
        self._after_weight_grad(ops, name, b)
        if self.q > 1:   # dA is reduced: the next GEMM needs it
            ops.add(Wait(f"{name}.wait_row", "tp_row"))

    @property
    def grad_streams(self) -> tuple[str, ...]:
        """Streams of weight-gradient reductions, joined before the gradients are
        accumulated."""
        return ("tp_col",) if self.q > 1 else ()

    def _after_weight_grad(self, ops: OpList, name: str, b: float) -> None:
        """Tesseract's hook: the depth all-reduce of the weight gradient (none in 2-D)."""

    # ------------------------------------------------------------------ embedding and head
    def embedding_comm(self, act_bytes: float) -> list[Collective]:
        if self.q == 1:
            return []
        return [Collective("embedding.ar", "all_reduce", "tp_col",
                           act_bytes / (self.size * self.cp))]

    def loss_comm(self) -> list[Collective]:
        if self.q == 1:
            return []
        return [Collective("loss.ar", "all_reduce", "tp_row", 4.0 * self.b * self.s
                           / (self.rows * self.cp))]
