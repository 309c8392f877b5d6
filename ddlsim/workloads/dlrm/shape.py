"""Closed-form counts of a DLRM: parameters, per-layer FLOPs, embedding shards per rank.

Parameters (Naumov et al. 2019, arXiv:1906.00091, §2; TorchRec ``torchrec.models.dlrm``):

* embedding table t: ``rows_t · dim_t``;
* a linear layer ``n_in → n_out`` of either MLP: ``n_in · n_out + n_out`` (weights, bias);
* a DCN-v2 cross layer on ``D`` features (Wang et al. 2021, arXiv:2008.13535, eq. 1;
  TorchRec ``LowRankCrossNet``): full rank ``D² + D``, low rank r ``2·D·r + D``.

Forward FLOPs per sample: a linear layer ``2·n_in·n_out``; the dot interaction is the batched
product ``Z = X·Xᵀ`` of the ``F = T + 1`` feature vectors of width d (dlrm_s_pytorch's
``torch.bmm``, of which the pairs below the diagonal are kept): ``2·F²·d``; a cross layer
``2·D²`` (full) or ``4·D·r`` (low rank). Backward: twice the forward for every layer with
weights (input and weight gradients), except the first bottom-MLP layer, whose input (the dense
features) needs no gradient (1×); the dot interaction's backward ``dX = (dZ + dZᵀ)·X`` is one
product of the same size (1×).

Embedding work on a rank, per micro-batch of ``B_mb`` samples (the global micro-batch, since
each rank looks up its shards for every sample): ``B_mb · pooling · fraction`` lookups per
shard (``fraction`` = the shard's share of the table's rows for row-wise sharding, 1 else),
one add per looked-up element, and the same number of rows touched by the sparse update
(duplicates counted: rows touched = batch × pooling).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .schema import DLRMModel

__all__ = ["Linear", "Shard", "DLRMShape", "shard_tables", "OPTIMIZER_FLOPS",
           "OPTIMIZER_STATE_BYTES"]

#: FLOPs per touched element of the sparse update: sgd ``w −= lr·g`` (2); adagrad
#: ``G += g²`` (2) and ``w −= lr·g / (√G + ε)`` (5); row-wise adagrad: the row mean of g² (2)
#: and ``w −= (lr / (√G_row + ε))·g`` with the row factor computed once (2).
OPTIMIZER_FLOPS = {"sgd": 2, "adagrad": 7, "rowwise_adagrad": 4}
#: fp32 optimizer state per table element (adagrad) or per row (rowwise_adagrad), bytes.
OPTIMIZER_STATE_BYTES = 4


@dataclass(frozen=True, slots=True)
class Linear:
    """A fully connected layer ``fan_in → fan_out`` with a bias."""

    name: str
    fan_in: int
    fan_out: int

    @property
    def params(self) -> int:
        return self.fan_in * self.fan_out + self.fan_out

    def flops(self, samples: float) -> float:
        """Forward FLOPs for ``samples`` samples: ``2·samples·fan_in·fan_out``."""
        return 2.0 * samples * self.fan_in * self.fan_out


@dataclass(frozen=True, slots=True)
class Shard:
    """The part of table ``table`` a rank holds: ``rows × dim``, looked up for ``fraction`` of
    the table's indices."""

    table: int
    rows: int
    dim: int
    pooling: float
    fraction: float


def _chunks(n: int, p: int) -> list[tuple[int, int]]:
    """``n`` items over ``p`` ranks in contiguous runs, the first ``n mod p`` one longer:
    (start, count) per rank (facebookresearch/dlrm ``extend_distributed.get_my_slice``)."""
    k, m = divmod(n, p)
    return [(r * k + min(r, m), k + (r < m)) for r in range(p)]


def shard_tables(model: DLRMModel, p: int) -> list[list[Shard]]:
    """The shards of every rank ``0..p-1`` under ``model.sharding``.

    ``table_wise``: whole tables, contiguous runs of tables per rank (dlrm_s_pytorch's
    ``get_my_slice``). ``row_wise``: every table's rows split in contiguous runs over all ranks
    (TorchRec ``RwSharding``). ``column_wise``: every table's columns split evenly over all
    ranks (TorchRec ``CwSharding`` with one shard per rank; ``dim`` must be divisible by p).

    Parameters
    ----------
    model : DLRMModel
    p : int
        Ranks the tables are spread over.

    Returns
    -------
    list of list of Shard
        Per rank, its shards in table order.
    """
    tabs = [(t.rows, model.dim_of(t), t.pooling) for t in model.tables]
    if model.sharding == "table_wise":
        return [[Shard(i, *tabs[i][:2], tabs[i][2], 1.0) for i in range(s, s + n)]
                for s, n in _chunks(len(tabs), p)]
    if model.sharding == "row_wise":
        return [[Shard(i, n, d, pool, n / rows)
                 for i, (rows, d, pool) in enumerate(tabs)
                 for n in (_chunks(rows, p)[r][1],)] for r in range(p)]
    return [[Shard(i, rows, d // p, pool, 1.0) for i, (rows, d, pool) in enumerate(tabs)]
            for _ in range(p)]


class DLRMShape:
    """Layer shapes and counts of one :class:`DLRMModel`."""

    def __init__(self, model: DLRMModel):
        self.model = model
        self.dims = tuple(model.dim_of(t) for t in model.tables)
        self.features = len(model.tables) + 1  # F: the pooled embeddings and the dense vector

    @cached_property
    def bottom(self) -> tuple[Linear, ...]:
        return _mlp("bottom", self.model.dense_features, self.model.bottom_mlp)

    @cached_property
    def top(self) -> tuple[Linear, ...]:
        return _mlp("top", self.interaction_out, self.model.top_mlp)

    @property
    def cross_width(self) -> int:
        """D: the concatenated dense output and pooled embeddings."""
        return self.model.bottom_mlp[-1] + sum(self.dims)

    @property
    def interaction_out(self) -> int:
        """Width of the interaction's output, the top MLP's input: dot ``d + F(F∓1)/2``
        (dlrm_s_pytorch ``num_int``), cat ``F·d``, dcnv2 ``D`` (TorchRec ``DLRM_DCN``)."""
        m, F = self.model, self.features
        if m.interaction == "dot":
            pairs = F * (F + 1) // 2 if m.interaction_self else F * (F - 1) // 2
            return m.bottom_mlp[-1] + pairs
        if m.interaction == "cat":
            return F * m.bottom_mlp[-1]
        return self.cross_width

    @property
    def cross_params(self) -> int:
        m, D = self.model, self.cross_width
        if m.interaction != "dcnv2":
            return 0
        per = D * D + D if m.low_rank is None else 2 * D * m.low_rank + D
        return m.cross_layers * per

    def interaction_flops(self, samples: float) -> float:
        """Forward FLOPs of the interaction for ``samples`` samples."""
        m = self.model
        if m.interaction == "dot":
            return 2.0 * samples * self.features ** 2 * m.bottom_mlp[-1]
        if m.interaction == "cat":
            return 0.0
        D = self.cross_width
        per = 2.0 * D * D if m.low_rank is None else 4.0 * D * m.low_rank
        return samples * m.cross_layers * per

    def interaction_backward_flops(self, samples: float) -> float:
        """Dot: one product of the forward's size; cross layers: twice the forward."""
        f = self.interaction_flops(samples)
        return f if self.model.interaction == "dot" else 2.0 * f

    def interaction_activations(self) -> int:
        """Elements per sample the interaction keeps for backward (inputs excluded)."""
        m = self.model
        if m.interaction == "dot":
            return self.features ** 2 + self.interaction_out
        if m.interaction == "cat":
            return self.interaction_out
        return m.cross_layers * ((m.low_rank or 0) + self.cross_width)

    @property
    def embedding_params(self) -> int:
        return sum(t.rows * d for t, d in zip(self.model.tables, self.dims))

    @property
    def dense_params(self) -> int:
        return (sum(l.params for l in self.bottom) + sum(l.params for l in self.top)
                + self.cross_params)

    @property
    def params(self) -> int:
        return self.embedding_params + self.dense_params

    def dense_forward_flops(self, samples: float) -> float:
        return (sum(l.flops(samples) for l in self.bottom + self.top)
                + self.interaction_flops(samples))

    def dense_backward_flops(self, samples: float) -> float:
        first = self.bottom[0].flops(samples)
        return (2.0 * sum(l.flops(samples) for l in self.bottom + self.top) - first
                + self.interaction_backward_flops(samples))

    def embedding_flops(self, samples: float) -> float:
        """Adds of the pooled lookups of every table for ``samples`` samples."""
        return samples * sum(t.pooling * d for t, d in zip(self.model.tables, self.dims))


def _mlp(prefix: str, fan_in: int, widths: list[int]) -> tuple[Linear, ...]:
    ins = (fan_in, *widths[:-1])
    return tuple(Linear(f"{prefix}.{i}", a, b) for i, (a, b) in enumerate(zip(ins, widths)))
