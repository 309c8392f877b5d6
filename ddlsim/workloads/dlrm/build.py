"""The trace of one DLRM training iteration, and its memory per rank.

Per micro-batch of ``b`` samples per rank (``B = b·p`` over the ``p`` ranks), every rank:

forward
    looks up and pools its embedding shards for all ``B`` samples; sends them to the ranks
    that own the samples (table- and column-wise: an all-to-all of ``B·width·w`` bytes, where
    ``width`` is the rank's pooled columns, ``b·width·w`` to each rank; when the widths differ
    between ranks, an uneven all-to-all indexed by sender, ``split_by="sender"``; row-wise: a
    reduce-scatter of the partial sums of every table, ``B·Σdim·w``); runs the bottom MLP on its ``b`` samples (while the embeddings
    travel, unless ``overlap_embedding_all_to_all: false``); then the interaction and the
    top MLP.
backward
    the top MLP, the interaction and the bottom MLP in reverse; the pooled-embedding
    gradients go back to the shard owners (table- and column-wise: the all-to-all of the
    same size, ``b·width_j·w`` to owner j, indexed by receiver when uneven; row-wise: an
    all-gather), started after the interaction's backward (or after
    the bottom MLP's with ``overlap_embedding_all_to_all: false``); then the embedding
    backward with its fused sparse update (rows touched = ``B·pooling``). In the last
    micro-batch, one gradient all-reduce per dense module (top MLP, cross network, bottom
    MLP) starts on the ``dp`` stream as soon as that module's backward is done, as
    dlrm_s_pytorch wraps each MLP in its own ``DistributedDataParallel``.
update
    wait for the all-reduces (``MPI_Waitall``), the dense optimizer step.

With ``overlap_grad_reduce: false`` the all-reduces run blocking at the start of the update.
With ``model.compute: proxy`` each compute part is one op lasting its ``proxy_timings`` value
plus the usleep's timer slack (:func:`~ddlsim.workloads.proxytime.usleep_s`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...config import DTYPE_BYTES
from ..memory import MemoryBreakdown, model_state_bytes
from ..proxytime import usleep_s
from ..trace import (Block, Collective, Compute, GroupFamily, Op, Program, RankClass, Step,
                     Wait, Workload, WorkloadMeta)
from .shape import (OPTIMIZER_FLOPS, OPTIMIZER_STATE_BYTES, DLRMShape, Linear, Shard,
                    shard_tables)

__all__ = ["RankWork", "rank_work", "build_dlrm_workload", "dlrm_memory", "INDEX_BYTES"]

#: Bytes per embedding index (int64, dlrm_s_pytorch and TorchRec KeyedJaggedTensor values).
INDEX_BYTES = 8


@dataclass(frozen=True)
class RankWork:
    """What one rank's embedding shards cost per micro-batch of ``B`` global samples."""

    lookups: float          # indices looked up (= rows touched by the sparse update)
    elements: float         # looked-up elements: Σ lookups · shard dim
    width: int              # pooled columns the rank produces per sample
    table_elements: int     # Σ rows · dim of its shards
    table_rows: int         # Σ rows of its shards


def rank_work(shards: list[Shard], samples: int) -> RankWork:
    """The embedding work of one rank per micro-batch.

    Parameters
    ----------
    shards : the rank's shards (:func:`~ddlsim.workloads.dlrm.shape.shard_tables`).
    samples : samples of one micro-batch over all ranks (``micro_batch_size · ranks``).

    Returns
    -------
    RankWork
        Lookups ``Σ samples·pooling·fraction`` (= rows touched by the sparse update),
        looked-up elements, pooled width, table elements and rows held.
    """
    look = [samples * s.pooling * s.fraction for s in shards]
    return RankWork(sum(look), sum(n * s.dim for n, s in zip(look, shards)),
                    sum(s.dim for s in shards), sum(s.rows * s.dim for s in shards),
                    sum(s.rows for s in shards))


class _Builder:
    """The blocks of one rank class."""

    def __init__(self, cfg, shape: DLRMShape, work: RankWork, widths: list[int]):
        self.cfg, self.shape, self.work, self.widths = cfg, shape, work, widths
        self.m, self.t = cfg.model, cfg.train
        self.p = cfg.world_size
        self.b = self.t.micro_batch_size
        self.B = self.b * self.p
        self.w = DTYPE_BYTES[self.t.dtype]
        self.proxy = self.m.compute == "proxy"

    # ---------------------------------------------------------------- compute ops
    def _part(self, part: str, name: str, flops: float, nbytes: float, kind: str) -> Compute:
        sec = usleep_s(self.m.proxy_timings[part]) if self.proxy else None
        return Compute(name, flops, nbytes, kind=kind, dtype=self.t.dtype, seconds=sec)

    def _linear(self, layer: Linear, factor: float, tag: str) -> Compute:
        nbytes = self.w * (layer.params + self.b * (layer.fan_in + layer.fan_out))
        return Compute(f"{layer.name}.{tag}", factor * layer.flops(self.b), factor * nbytes,
                       dtype=self.t.dtype)

    def _mlp(self, part: str, layers: tuple[Linear, ...], backward: bool) -> list[Op]:
        """One op per layer (model), or one op of the proxy's duration (proxy)."""
        tag = "bwd" if backward else "fwd"
        ops = [self._linear(l, (1.0 if i == 0 and part.startswith("bottom") else 2.0)
                            if backward else 1.0, tag) for i, l in enumerate(layers)]
        if backward:
            ops.reverse()
        if self.proxy:
            return [Op(self._part(part, f"{part.split('_')[0]}_mlp.{tag}",
                                  sum(c.flops for c in ops), sum(c.bytes for c in ops), "gemm"))]
        return [Op(c) for c in ops]

    def _interaction(self, backward: bool) -> Op:
        sh, b = self.shape, self.b
        flops = sh.interaction_backward_flops(b) if backward else sh.interaction_flops(b)
        nbytes = self.w * b * (sh.features * self.m.bottom_mlp[-1] + sh.interaction_out)
        part = "interaction_backward" if backward else "interaction_forward"
        return Op(self._part(part, f"interaction.{'bwd' if backward else 'fwd'}", flops,
                             nbytes, "gemm"))

    def _embedding(self, backward: bool) -> Op:
        wk, w = self.work, self.w
        if not backward:
            nbytes = wk.elements * w + self.B * wk.width * w + wk.lookups * INDEX_BYTES
            return Op(self._part("embedding_forward", "embedding.fwd", wk.elements, nbytes,
                                 "elementwise"))
        opt = self.m.embedding_optimizer
        state = {"sgd": 0.0, "adagrad": wk.elements, "rowwise_adagrad": wk.lookups}[opt]
        nbytes = (3 * wk.elements * w + 2 * state * OPTIMIZER_STATE_BYTES
                  + wk.lookups * INDEX_BYTES + self.B * wk.width * w)
        flops = wk.elements * (1 + OPTIMIZER_FLOPS[opt])  # gradient scatter + sparse update
        return Op(self._part("embedding_backward", "embedding.bwd+update", flops, nbytes,
                             "elementwise"))

    # ---------------------------------------------------------------- communication
    def _exchange(self, backward: bool) -> Collective:
        m, wk = self.m, self.work
        if m.sharding == "row_wise":
            nbytes = self.B * sum(self.shape.dims) * self.w
            return Collective("embedding.all_gather" if backward else "embedding.reduce_scatter",
                              "all_gather" if backward else "reduce_scatter", "emb", nbytes)
        name = f"embedding.all_to_all.{'bwd' if backward else 'fwd'}"
        if len(set(self.widths)) == 1:
            return Collective(name, "all_to_all", "emb", self.B * wk.width * self.w)
        # uneven widths: rank i sends b·width_i to every rank (forward) and receives b·width_i
        # from every rank (backward): the same vector, indexed by sender, then by receiver
        split = tuple(self.b * x * self.w for x in self.widths)
        return Collective(name, "all_to_all", "emb", sum(split), split_bytes=split,
                          split_by="receiver" if backward else "sender")

    def _grads(self) -> list[tuple[str, float]]:
        """(name, bytes) of the gradient all-reduces in the order their backward ends."""
        sh, w = self.shape, self.w
        out = [("top_mlp", sum(l.params for l in sh.top) * w)]
        if sh.cross_params:
            out.append(("cross_net", sh.cross_params * w))
        out.append(("bottom_mlp", sum(l.params for l in sh.bottom) * w))
        return out

    def _allreduce(self, name: str, nbytes: float) -> Collective:
        return Collective(f"{name}.grad.all_reduce", "all_reduce", "dp", nbytes)

    # ---------------------------------------------------------------- blocks
    def forward(self) -> Block:
        overlap = self.m.overlap_embedding_all_to_all
        ops = [self._embedding(False),
               Op(self._exchange(False), stream="a2a" if overlap else "compute", deps=(0,))]
        ops += self._mlp("bottom_mlp_forward", self.shape.bottom, False)
        if overlap:
            ops.append(Op(Wait("wait.embedding", "a2a")))
        ops.append(self._interaction(False))
        ops += self._mlp("top_mlp_forward", self.shape.top, False)
        return Block("F", "forward", tuple(ops))

    def backward(self, last: bool) -> Block:
        sh, overlap = self.shape, self.m.overlap_embedding_all_to_all
        reduce = last and self.cfg.software.overlap_grad_reduce
        grads = dict(self._grads())
        ops: list[Op] = []

        def grad(name: str, after: int) -> None:
            """The all-reduce of ``name``'s gradients, once op ``after`` produced them."""
            if reduce and name in grads:
                ops.append(Op(self._allreduce(name, grads[name]), stream="dp", deps=(after,)))

        ops += self._mlp("top_mlp_backward", sh.top, True)
        grad("top_mlp", len(ops) - 1)
        ops.append(self._interaction(True))
        inter = len(ops) - 1
        grad("cross_net", inter)
        if overlap:
            ops.append(Op(self._exchange(True), stream="a2a", deps=(inter,)))
        ops += self._mlp("bottom_mlp_backward", sh.bottom, True)
        grad("bottom_mlp", len(ops) - 1)
        ops.append(Op(self._exchange(True)) if not overlap else Op(Wait("wait.embedding", "a2a")))
        ops.append(self._embedding(True))
        return Block("BL" if last else "B", "backward", tuple(ops))

    def update(self) -> Block:
        sh, t = self.shape, self.t
        ops: list[Op] = []
        if self.cfg.software.overlap_grad_reduce:
            ops.append(Op(Wait("waitall.grads", "dp")))
        else:
            ops += [Op(self._allreduce(n, b)) for n, b in self._grads()]
        n = sh.dense_params
        states = {"adam": 2, "sgd": 1}[t.optimizer]       # Adam m and v; SGD momentum
        flops = {"adam": 10.0, "sgd": 3.0}[t.optimizer] * n
        nbytes = n * (3 * self.w + 2 * states * 4)          # w r/w, g r; fp32 states r/w
        ops.append(Op(self._part("optimizer", "optimizer.dense", flops, nbytes, "optimizer")))
        return Block("U", "optimizer", tuple(ops))

    def program(self, microbatches: int) -> Program:
        blocks = {b.name: b for b in (self.forward(), self.backward(False),
                                      self.backward(True), self.update())}
        steps = []
        for mb in range(microbatches):
            steps += [Step("F", mb), Step("BL" if mb == microbatches - 1 else "B", mb)]
        return Program(blocks, (*steps, Step("U")))


def _works(cfg, shape: DLRMShape) -> list[RankWork]:
    B = cfg.train.micro_batch_size * cfg.world_size
    return [rank_work(s, B) for s in shard_tables(cfg.model, cfg.world_size)]


def build_dlrm_workload(cfg) -> Workload:
    """The trace of one iteration (format: docs/trace.md; order: this module's docstring).

    Parameters
    ----------
    cfg : RunConfig
        A run config whose model is a ``dlrm`` section.

    Returns
    -------
    Workload
        One rank class per distinct shard work; group families ``dp`` (the mesh's, every
        rank) for the gradient all-reduces and ``emb`` (every rank, kind ``world``) for the
        embedding exchange.
    """
    shape = DLRMShape(cfg.model)
    p, t = cfg.world_size, cfg.train
    works = _works(cfg, shape)
    widths = [wk.width for wk in works]
    kinds = list(dict.fromkeys(works))  # distinct rank works, in rank order
    classes = []
    for i, wk in enumerate(kinds):
        ranks = tuple(r for r in range(p) if works[r] == wk)
        program = _Builder(cfg, shape, wk, widths).program(cfg.num_microbatches)
        classes.append(RankClass("ranks" if len(kinds) == 1 else f"ranks{i}", ranks, program))
    groups = dict(cfg.mesh.families())
    groups["emb"] = GroupFamily("emb", "world", np.arange(p, dtype=np.int64)[None, :])
    samples = t.global_batch_size
    flops = (shape.dense_forward_flops(samples) + shape.dense_backward_flops(samples)
             + 2 * shape.embedding_flops(samples))
    meta = WorkloadMeta(model=cfg.model.name, architecture="dlrm", samples=samples,
                        tokens=samples, model_flops=flops, dtype=t.dtype,
                        parameter_count=shape.params, microbatches=cfg.num_microbatches)
    return Workload(f"{cfg.model.name}-{cfg.model.sharding}-{p}ranks", p, groups,
                    tuple(classes), meta)


def dlrm_memory(cfg) -> list[MemoryBreakdown]:
    """Memory of one rank of each distinct shard set.

    weights: the rank's embedding shards and the replicated MLPs; gradients: the dense
    gradients and the sparse embedding gradients (one row per lookup); optimizer: the dense
    optimizer states (:func:`~ddlsim.workloads.memory.model_state_bytes`) and the embedding
    optimizer's (adagrad: 4 bytes per element, row-wise adagrad: 4 per row); activations:
    every layer's output per sample kept for backward, plus the pooled embeddings sent and
    received; other: the indices of one micro-batch.

    Parameters
    ----------
    cfg : RunConfig
        A run config whose model is a ``dlrm`` section.

    Returns
    -------
    list of MemoryBreakdown
        Bytes on one rank of each distinct shard set, in rank order.
    """
    shape = DLRMShape(cfg.model)
    m, t = cfg.model, cfg.train
    w, b = DTYPE_BYTES[t.dtype], t.micro_batch_size
    dw, dg, do = model_state_bytes(shape.dense_params, cfg.dp, 0, t.dtype, t.optimizer)
    per_sample = (m.dense_features + sum(m.bottom_mlp) + shape.features * m.bottom_mlp[-1]
                  + shape.interaction_activations() + sum(m.top_mlp))
    out = []
    for wk in dict.fromkeys(_works(cfg, shape)):
        state = {"sgd": 0, "adagrad": wk.table_elements,
                 "rowwise_adagrad": wk.table_rows}[m.embedding_optimizer]
        acts = w * (b * per_sample + b * cfg.world_size * wk.width + b * sum(shape.dims))
        out.append(MemoryBreakdown(
            weights=dw + wk.table_elements * w, gradients=dg + wk.elements * w,
            optimizer=do + state * OPTIMIZER_STATE_BYTES, activations=acts,
            other=wk.lookups * INDEX_BYTES, capacity=cfg.system.device.memory_bytes))
    return out
